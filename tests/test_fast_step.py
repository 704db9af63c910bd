"""Our encoder step against NeMo's: the same encoder output, the same transcripts, half the cost of its waste."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import torch

from pipecat_nemotron.agent.wav_input import read_float32, read_pcm16
from pipecat_nemotron.asr import EngineConfig, NemotronEngine
from pipecat_nemotron.asr.config import LATENCY_MODES, LEFT_CONTEXT_FRAMES
from pipecat_nemotron.asr.fast_step import FastEncoderStep, nemo_encoder_step
from pipecat_nemotron.asr.loading import load_asr_model
from pipecat_nemotron.bench.audio import transcribe_clips
from pipecat_nemotron.bench.wer import normalize_text, word_errors
from pipecat_nemotron.models import DEMO_AUDIO_DIR, TINY_MODEL_PATH

HELDOUT = TINY_MODEL_PATH.parents[2] / "tests" / "assets" / "heldout"
MODES = sorted(LATENCY_MODES)


@pytest.fixture(scope="module")
def random_model(tiny_random_model) -> Any:
    return load_asr_model(
        EngineConfig(model=str(tiny_random_model), device="cpu"), torch.device("cpu"), torch.float32
    )


def _nemo_step(encoder: Any, signal, lengths, caches, drop: int):
    return nemo_encoder_step(encoder, signal, lengths, *caches, drop_extra_pre_encoded=drop)


@pytest.mark.parametrize("latency_ms", MODES)
@torch.inference_mode()
def test_fast_step_output_equals_nemo_step(random_model: Any, latency_ms: int) -> None:
    """First chunk, steady state and a short finalize flush, batch 1 and three streams at different fills."""
    encoder = random_model.encoder
    right = LATENCY_MODES[latency_ms]
    encoder.set_default_att_context_size([LEFT_CONTEXT_FRAMES, right])
    cfg = encoder.streaming_cfg
    fast = FastEncoderStep(encoder)
    features = encoder._feat_in
    generator = torch.Generator().manual_seed(latency_ms)

    for batch, fills in ((1, [0]), (3, [0, 23, LEFT_CONTEXT_FRAMES])):
        nemo_caches = list(encoder.get_initial_cache_state(batch))
        # Streams that already hold some context: random cached layer inputs, valid for the last `fill` frames.
        nemo_caches[0].normal_(generator=generator)
        nemo_caches[1].normal_(generator=generator)
        nemo_caches[2] = torch.tensor(fills)
        fast_caches = [
            fast.project_layer_inputs(nemo_caches[0]),
            nemo_caches[1].clone(),
            nemo_caches[2].clone(),
        ]
        steps = [("first", int(cfg.chunk_size[0]), 0)]
        steps += [
            ("steady", int(cfg.chunk_size[1]) + int(cfg.pre_encode_cache_size[1]), cfg.drop_extra_pre_encoded)
        ] * 3
        steps += [("flush", int(cfg.pre_encode_cache_size[1]) + 3, cfg.drop_extra_pre_encoded)]
        for kind, frames, drop in steps:
            signal = torch.randn(batch, features, frames, generator=generator)
            lengths = torch.full((batch,), frames)
            if batch > 1 and kind == "flush":
                lengths[1] -= 2  # a stream whose last chunk is shorter than its neighbours'
            ours = fast(signal, lengths, *fast_caches, drop_extra_pre_encoded=drop, right_context=right)
            theirs = _nemo_step(encoder, signal, lengths, nemo_caches, drop)
            assert torch.equal(ours[1], theirs[1]), (kind, batch)
            assert torch.equal(ours[4], theirs[4]), (kind, batch)
            diff = (ours[0] - theirs[0]).abs().max().item()
            assert diff <= 1e-5, f"{latency_ms} ms, {kind}, batch {batch}: max |diff| {diff:.2e}"
            assert (ours[3] - theirs[3]).abs().max().item() <= 1e-5
            assert (ours[2] - fast.project_layer_inputs(theirs[2])).abs().max().item() <= 1e-5
            nemo_caches, fast_caches = list(theirs[2:]), list(ours[2:])


#: Every 4th held-out clip (50 of 200, both voice splits): the suite's representative subset. The whole set in
#: every mode, and bf16 on it, is ``scripts/check_fast_step.py`` (docs/BENCHMARKS.md).
HELDOUT_STRIDE = 4


def _heldout_texts(config: EngineConfig, manifest: list[dict], modes: list[int]) -> dict[int, list[str]]:
    clips = [read_pcm16(HELDOUT / e["audio"]) for e in manifest]
    return asyncio.run(transcribe_clips(config, clips, modes))


@pytest.fixture(scope="module")
def heldout_manifest() -> list[dict]:
    return json.loads((HELDOUT / "manifest.json").read_text())[::HELDOUT_STRIDE]


@pytest.fixture(scope="module")
def nemo_step_texts(heldout_manifest: list[dict]) -> dict[int, list[str]]:
    config = EngineConfig(model=str(TINY_MODEL_PATH), device="cpu", max_streams=32, encoder_step="nemo")
    return _heldout_texts(config, heldout_manifest, MODES)


def test_fast_step_transcribes_the_heldout_set_like_nemo_step(
    heldout_manifest: list[dict], nemo_step_texts: dict[int, list[str]]
) -> None:
    config = EngineConfig(model=str(TINY_MODEL_PATH), device="cpu", max_streams=32, encoder_step="fast")
    fast_texts = _heldout_texts(config, heldout_manifest, MODES)
    for mode in MODES:
        differing = [
            (e["audio"], a, b)
            for e, a, b in zip(heldout_manifest, nemo_step_texts[mode], fast_texts[mode], strict=True)
            if a != b
        ]
        assert not differing, f"{mode} ms: {differing[:3]}"


def test_bf16_wer_within_one_point_of_fp32(
    heldout_manifest: list[dict], nemo_step_texts: dict[int, list[str]]
) -> None:
    config = EngineConfig(model=str(TINY_MODEL_PATH), device="cpu", max_streams=32, dtype="bfloat16")
    bf16_texts = _heldout_texts(config, heldout_manifest, [160])[160]
    words = sum(len(normalize_text(e["text"]).split()) for e in heldout_manifest)

    def wer(texts: list[str]) -> float:
        return (
            100.0
            * sum(word_errors(e["text"], t) for e, t in zip(heldout_manifest, texts, strict=True))
            / words
        )

    fp32, bf16 = wer(nemo_step_texts[160]), wer(bf16_texts)
    print(f"held-out WER at 160 ms: fp32 {fp32:.2f}%, bf16 (fast step) {bf16:.2f}%")
    assert abs(bf16 - fp32) <= 1.0, (fp32, bf16)


async def test_fast_step_cache_holds_keys_and_values(tiny_random_model) -> None:
    """The slot of a fast-step stream holds projected keys and values: one more layer-input cache's worth."""
    sizes = {}
    for step in ("fast", "nemo"):
        config = EngineConfig(
            model=str(tiny_random_model), device="cpu", max_streams=2, encoder_step=step, warmup=False
        )
        async with NemotronEngine(config) as engine:
            sizes[step] = engine.info.cache_bytes_per_stream
            assert engine.info.encoder_step == step
    layers, d_model = 4, 128  # the tiny architecture
    assert sizes["fast"] - sizes["nemo"] == layers * LEFT_CONTEXT_FRAMES * d_model * 4


def _stream_tokens(model: Any, features: torch.Tensor, right: int, fast: FastEncoderStep | None) -> list[int]:
    """Chunk whole-utterance mel the cache-aware way and decode; the encoder step is ours or NeMo's."""
    from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis

    encoder = model.encoder
    encoder.set_default_att_context_size([LEFT_CONTEXT_FRAMES, right])
    cfg = encoder.streaming_cfg
    keep, first = int(cfg.pre_encode_cache_size[1]), int(cfg.chunk_size[0])
    caches = list((fast or encoder).get_initial_cache_state(1))
    tokens: list[int] = []
    state = None
    start, end = 0, first
    while start < features.size(-1):
        lo = max(0, start - keep) if start else 0
        chunk = features[:, :, lo:end]
        lengths = torch.tensor([chunk.size(-1)])
        drop = cfg.drop_extra_pre_encoded if start else 0
        if fast is not None:
            out = fast(chunk, lengths, *caches, drop_extra_pre_encoded=drop, right_context=right)
        else:
            out = _nemo_step(encoder, chunk, lengths, caches, drop)
        caches = list(out[2:])
        previous = [Hypothesis(score=0.0, y_sequence=None, dec_state=state)] if state is not None else None
        (hyp,) = model.decoding.rnnt_decoder_predictions_tensor(
            encoder_output=out[0], encoded_lengths=out[1], return_hypotheses=True, partial_hypotheses=previous
        )
        state = hyp.dec_state
        tokens += [int(t) for t in torch.as_tensor(hyp.y_sequence).reshape(-1).tolist()]
        start, end = end, end + int(cfg.chunk_size[1])
    return tokens


@pytest.mark.slow
@torch.inference_mode()
def test_600m_architecture_fast_step_decodes_like_nemo_step(tmp_path) -> None:
    """The real architecture (24 layers, d_model 1024, random weights): the same tokens in the 160 ms mode."""
    from omegaconf import OmegaConf

    from pipecat_nemotron.asr.architectures import NEMOTRON_600M, asr_model_config, train_tokenizer
    from pipecat_nemotron.runtime.nemo_logs import quiet_nemo

    with quiet_nemo():
        from nemo.collections.asr.models import EncDecRNNTBPEModel

        torch.manual_seed(0)
        tokenizer = train_tokenizer(tmp_path / "tokenizer")
        model = EncDecRNNTBPEModel(
            cfg=OmegaConf.create(asr_model_config(str(tokenizer), NEMOTRON_600M))
        ).eval()
    audio = torch.from_numpy(read_float32(DEMO_AUDIO_DIR / "demo_timer.wav")[: 2 * 16000])[None]
    features, _ = model.preprocessor(input_signal=audio, length=torch.tensor([audio.size(-1)]))
    model.encoder.set_default_att_context_size([LEFT_CONTEXT_FRAMES, LATENCY_MODES[160]])
    fast = FastEncoderStep(model.encoder)
    ours = _stream_tokens(model, features, LATENCY_MODES[160], fast)
    theirs = _stream_tokens(model, features, LATENCY_MODES[160], None)
    assert len(theirs) > 20  # random weights emit many tokens: a strong comparison
    assert ours == theirs


def _steady_inputs(encoder: Any, fast: FastEncoderStep, batch: int, seed: int) -> tuple[torch.Tensor, ...]:
    cfg = encoder.streaming_cfg
    generator = torch.Generator().manual_seed(seed)
    frames = int(cfg.chunk_size[1]) + int(cfg.pre_encode_cache_size[1])
    channel, time_cache, _ = encoder.get_initial_cache_state(batch)
    channel.normal_(generator=generator)
    time_cache.normal_(generator=generator)
    signal = torch.randn(batch, encoder._feat_in, frames, generator=generator)
    cached = torch.full((batch,), LEFT_CONTEXT_FRAMES)
    return signal, torch.full((batch,), frames), fast.project_layer_inputs(channel), time_cache, cached


@torch.inference_mode()
def test_padding_a_batch_to_its_graph_bucket_leaves_real_rows_unchanged(random_model: Any) -> None:
    """The CUDA-graph path runs 3 streams in the batch-4 graph with an inert row; checked eagerly on CPU."""
    from pipecat_nemotron.asr.cuda_graphs import batch_buckets, pad_batch

    assert batch_buckets(12) == (1, 2, 4, 8, 12)
    encoder = random_model.encoder
    encoder.set_default_att_context_size([LEFT_CONTEXT_FRAMES, LATENCY_MODES[160]])
    fast = FastEncoderStep(encoder)
    inputs = _steady_inputs(encoder, fast, 3, seed=1)
    drop = encoder.streaming_cfg.drop_extra_pre_encoded
    plain = fast(*inputs, drop_extra_pre_encoded=drop, right_context=LATENCY_MODES[160])
    padded = fast(
        *pad_batch(inputs, (0, 0, 1, 1, 0), 4), drop_extra_pre_encoded=drop, right_context=LATENCY_MODES[160]
    )
    for ours, full, dim in zip(plain, padded, (0, 0, 1, 1, 0), strict=True):
        assert torch.isfinite(full.float()).all()
        assert (ours.float() - full.narrow(dim, 0, 3).float()).abs().max().item() <= 1e-5


@pytest.mark.gpu
@torch.inference_mode()
def test_cuda_graph_step_equals_eager_step(tiny_random_model) -> None:
    from pipecat_nemotron.asr.cuda_graphs import GraphedEncoderStep

    device = torch.device("cuda")
    model = load_asr_model(EngineConfig(model=str(tiny_random_model), device="cuda"), device, torch.float32)
    encoder = model.encoder
    encoder.set_default_att_context_size([LEFT_CONTEXT_FRAMES, LATENCY_MODES[160]])
    fast = FastEncoderStep(encoder)
    graphed = GraphedEncoderStep(fast, max_batch=8)
    drop = encoder.streaming_cfg.drop_extra_pre_encoded
    for batch in (1, 3, 8):
        inputs = tuple(t.to(device) for t in _steady_inputs(encoder, fast, batch, seed=batch))
        for _ in range(2):  # the first call captures, the second replays
            eager = fast(*inputs, drop_extra_pre_encoded=drop, right_context=LATENCY_MODES[160])
            replayed = graphed(*inputs, drop_extra_pre_encoded=drop, right_context=LATENCY_MODES[160])
            for a, b in zip(eager, replayed, strict=True):
                assert (a.float() - b.float()).abs().max().item() <= 1e-4
    assert graphed.describe()["graphs"] == 3


@pytest.mark.gpu
async def test_gpu_engine_with_graphs_and_graph_decoder_transcribes_the_demo() -> None:
    expected = json.loads((DEMO_AUDIO_DIR / "transcripts.json").read_text())["demo_weather.wav"]
    config = EngineConfig(model=str(TINY_MODEL_PATH), device="cuda", max_streams=4, cuda_graph_decoder=True)
    async with NemotronEngine(config) as engine:
        final = await engine.transcribe(read_pcm16(DEMO_AUDIO_DIR / "demo_weather.wav"), latency_ms=160)
    assert normalize_text(final.text) == normalize_text(expected)
