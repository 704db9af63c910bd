"""Our KV-cached Magpie step against NeMo's own ``generate_speech`` (tiny random models, CPU, fp32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import one_torch_thread

from pipecat_nemotron.tts.magpie.fast_step import FastMagpieStep, RowSampling, unsupported_reason
from pipecat_nemotron.tts.magpie.loading import load_magpie_model
from pipecat_nemotron.tts.magpie.tiny import english_tokens, inference_parameters

TEXTS = [
    "Hello there, this is a test of speech.",
    "The quick brown fox jumps over the lazy dog.",
    "Short one.",
    "A slightly longer sentence, with a comma and more words in it.",
]


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def tiny_model(tiny_magpie: tuple[Path, Path]) -> Any:
    magpie, codec = tiny_magpie
    return load_magpie_model(str(magpie), "cpu", str(codec))


@pytest.fixture(scope="module")
def family_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A small random model of the released 357M shape family (no decoder position embeddings, 16-wide xattn)."""
    from pipecat_nemotron.tts.magpie.tiny import SMALL_RELEASED_FAMILY_SHAPE, build_tiny_magpie

    magpie, codec = build_tiny_magpie(
        tmp_path_factory.mktemp("family"), seed=3, end_of_speech_bias=0.0, shape=SMALL_RELEASED_FAMILY_SHAPE
    )
    return load_magpie_model(str(magpie), "cpu", str(codec))


def nemo_run(
    model: Any, text: torch.Tensor, *, use_cfg: bool, kv_cache: bool, seed: int = 0
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """NeMo's generate_speech on one sentence: its codes ``(C, T)`` and each step's CFG-combined logits."""
    logits: list[torch.Tensor] = []
    original = model._run_chunked_forward_with_cfg

    def record(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        logits.append(result[0][0, -1].clone())
        return result

    model._run_chunked_forward_with_cfg = record
    torch.manual_seed(seed)
    try:
        with torch.inference_mode():
            model.decoder.reset_cache(use_cache=kv_cache)
            out = model.generate_speech(
                {"text": text[None], "text_lens": torch.tensor([text.shape[0]]), "speaker_indices": 2},
                chunk_state=model.create_chunk_state(1),
                end_of_text=[True],
                beginning_of_text=True,
                use_cfg=use_cfg,
                use_local_transformer_for_inference=True,
            )
    finally:
        model.decoder.reset_cache(use_cache=False)
        del model._run_chunked_forward_with_cfg
    return out.predicted_codes[0, :, : int(out.predicted_codes_lens[0])], logits


def fast_greedy(model: Any, text: torch.Tensor, *, use_cfg: bool) -> torch.Tensor:
    step = FastMagpieStep(model)
    with torch.inference_mode():
        row = step.add_row(text, 2, RowSampling(0.7, 1, use_cfg))
        while not row.done:
            step.advance(step.forward())
    return torch.stack(row.codes, -1) if row.codes else torch.zeros(model.num_audio_codebooks, 0)


def test_supported_models(tiny_model: Any, family_model: Any) -> None:
    assert unsupported_reason(tiny_model) is None and unsupported_reason(family_model) is None
    assert "decoder" in unsupported_reason(object())
    with pytest.raises(ValueError, match="does not support"):
        FastMagpieStep(object())


@pytest.mark.parametrize("use_cfg", [True, False], ids=["cfg", "no-cfg"])
def test_teacher_forced_logits_equal_nemo(tiny_model: Any, use_cfg: bool) -> None:
    """Fed NeMo's own sampled frames, our step's logits equal NeMo's at every step (first frame, frame 50, ...).

    Four rows join at different steps (0, 7, 19, 33), so the batch mixes positions and text lengths. The reference
    is NeMo's generate_speech with its decoder in NeMo's KV-cache mode (the attention prior of each frame's own step).
    """
    model = tiny_model
    texts = [english_tokens(model, t) for t in TEXTS]
    with inference_parameters(model, max_decoder_steps=60):
        refs = [nemo_run(model, t, use_cfg=use_cfg, kv_cache=True, seed=i) for i, t in enumerate(texts)]
    joins = [0, 7, 19, 33]
    step = FastMagpieStep(model)
    rows: dict[int, Any] = {}
    worst = [0.0] * 4
    checked = [0] * 4
    with inference_parameters(model, max_decoder_steps=60), torch.inference_mode():
        for t in range(60 + joins[-1]):
            for i, join in enumerate(joins):
                if t == join:
                    rows[i] = step.add_row(texts[i], 2, RowSampling(0.7, 80, use_cfg))
            out = step.forward()
            forced = {}
            for i, row in rows.items():
                if row.done:
                    continue
                k = row.step
                index = out.rows.index(row)
                worst[i] = max(worst[i], float((out.logits[index] - refs[i][1][k]).abs().max()))
                checked[i] += 1
                forced[id(row)] = refs[i][0][:, k]
            step.advance(out, forced=forced)
            for row in [r for r in rows.values() if r.done and r.slot >= 0]:
                step.remove_row(row)
    assert checked == [60] * 4
    assert max(worst) < 1e-4, worst


def test_first_frame_equals_nemo_without_cache(tiny_model: Any) -> None:
    """Before any attention prior exists, NeMo's cache-less forward gives the same first-frame logits."""
    text = english_tokens(tiny_model, TEXTS[0])
    with inference_parameters(tiny_model, max_decoder_steps=1):
        _, logits = nemo_run(tiny_model, text, use_cfg=True, kv_cache=False)
    step = FastMagpieStep(tiny_model)
    with torch.inference_mode():
        step.add_row(text, 2, RowSampling(0.7, 1, True))
        out = step.forward()
    assert float((out.logits[0] - logits[0]).abs().max()) < 1e-4


@pytest.mark.parametrize("which", ["tiny", "family"])
def test_greedy_codes_equal_generate_speech(tiny_model: Any, family_model: Any, which: str) -> None:
    """Top-k 1: the same codes as NeMo's generate_speech, sentence by sentence.

    Against NeMo's KV-cache mode always; against its cache-less loop with the attention prior off (with the prior
    on, that loop re-applies each step's prior to every past frame, which no cache reproduces).
    """
    model = tiny_model if which == "tiny" else family_model
    from pipecat_nemotron.tts.magpie.tiny import set_end_of_speech_bias

    set_end_of_speech_bias(model, 0.0)  # Random weights: end of speech comes when it comes.
    try:
        with inference_parameters(model, topk=1, max_decoder_steps=40):
            for text in TEXTS[:3]:
                ids = english_tokens(model, text)
                ref, _ = nemo_run(model, ids, use_cfg=True, kv_cache=True)
                assert torch.equal(fast_greedy(model, ids, use_cfg=True), ref), text
            with inference_parameters(model, apply_attention_prior=False):
                ids = english_tokens(model, TEXTS[1])
                ref, _ = nemo_run(model, ids, use_cfg=True, kv_cache=False)
                assert torch.equal(fast_greedy(model, ids, use_cfg=True), ref)
    finally:
        set_end_of_speech_bias(model, -30.0 if which == "tiny" else 0.0)


@pytest.mark.gpu
def test_fast_step_on_cuda_matches_nemo_on_cuda(tiny_magpie: tuple[Path, Path]) -> None:
    """On CUDA (fp32), teacher-forced logits of our step follow NeMo's cached generate_speech on the same device."""
    magpie, codec = tiny_magpie
    model = load_magpie_model(str(magpie), "cuda", str(codec))
    text = english_tokens(model, TEXTS[0]).cuda()
    with inference_parameters(model, max_decoder_steps=30):
        codes, logits = nemo_run(model, text, use_cfg=True, kv_cache=True)
        step = FastMagpieStep(model)
        row = step.add_row(text, 2, RowSampling(0.7, 80, True, torch.Generator(device="cuda").manual_seed(0)))
        worst = 0.0
        for k in range(30):
            out = step.forward()
            worst = max(worst, float((out.logits[0] - logits[k]).abs().max()))
            step.advance(out, forced={id(row): codes[:, k]})
    assert worst < 1e-3, worst


def decode_all(step: FastMagpieStep, rows: list[Any]) -> list[torch.Tensor]:
    with torch.inference_mode():
        while not all(r.done for r in rows):
            step.advance(step.forward())
            for row in [r for r in rows if r.done and r.slot >= 0]:
                step.remove_row(row)
    return [torch.stack(r.codes, -1) if r.codes else torch.zeros(8, 0, dtype=torch.long) for r in rows]


@pytest.mark.parametrize("which", ["tiny", "family"])
def test_joiners_admitted_together_decode_as_admitted_alone(tiny_model: Any, family_model: Any, which: str) -> None:
    """Four requests prefilled in one batched call (texts of different lengths, CFG and not, greedy and seeded)
    give the codes each gives admitted alone, and the same first-frame logits."""
    model = tiny_model if which == "tiny" else family_model
    texts = [english_tokens(model, t) for t in TEXTS]
    speakers = [2, 0, 4, 2]

    def sampling(i: int) -> RowSampling:
        return RowSampling(0.7, 1 if i % 2 else 80, i != 2, torch.Generator().manual_seed(100 + i))

    with inference_parameters(model, max_decoder_steps=25):
        alone, first_alone = [], []
        for i, text in enumerate(texts):
            step = FastMagpieStep(model)
            with torch.inference_mode():
                row = step.add_row(text, speakers[i], sampling(i))
                first_alone.append(step.forward().logits[0])
            alone.append(decode_all(step, [row])[0])
        step = FastMagpieStep(model)
        with torch.inference_mode():
            rows = step.add_rows([(t, speakers[i], sampling(i)) for i, t in enumerate(texts)])
            first = step.forward().logits
        together = decode_all(step, rows)
    for i in range(4):
        assert float((first[i] - first_alone[i]).abs().max()) < 1e-5, i
        assert torch.equal(together[i], alone[i]), i
    assert sum(t.shape[1] for t in together) > 40  # They did decode (not all ended at once).


@pytest.mark.slow
def test_greedy_codes_equal_generate_speech_at_the_released_357m_shape(tmp_path: Path) -> None:
    """The released architecture (12 decoder layers of 768, 110-frame speaker context, ...) with random weights:
    top-k 1 codes equal NeMo's generate_speech (KV-cache mode) on a short sentence, 6 frames (~40 s of CPU, most of
    it building the random model; scripts/check_magpie_step.py runs more sentences and frames)."""
    from pipecat_nemotron.tts.magpie.tiny import RELEASED_SHAPE, build_tiny_codec, random_magpie

    model = random_magpie(build_tiny_codec(tmp_path), seed=7, end_of_speech_bias=0.0, shape=RELEASED_SHAPE)
    assert model.decoder.n_layers == 12 and model.baked_context_embedding_len[0] == 110
    with inference_parameters(model, topk=1, max_decoder_steps=6):
        ids = english_tokens(model, "Hello there.")
        ref, _ = nemo_run(model, ids, use_cfg=True, kv_cache=True)
        assert ref.shape[1] > 0
        assert torch.equal(fast_greedy(model, ids, use_cfg=True), ref)
