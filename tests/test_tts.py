"""MagpieTTSService and its engine, on a tiny random MagpieTTSModel built once per session (CPU, no download)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    MAGPIE_CODEC_RATE,
    MAGPIE_SAMPLES_PER_FRAME,
    HoldSecondChunk,
    MagpieAdmissionGate,
    magpie_options_for,
    one_torch_thread,
)
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InterruptionFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSUpdateSettingsFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.tests.utils import run_test
from pipecat.transcriptions.language import Language
from pipecat.workers.runner import WorkerRunner

from pipecat_nemotron.tts.magpie import (
    LANGUAGES,
    VOICES,
    MagpieEngine,
    MagpieSynthesisOptions,
    SynthesisStream,
    normalize_language,
    normalize_voice,
    shared_magpie_engines,
)
from pipecat_nemotron.tts.magpie import loading as magpie_loading
from pipecat_nemotron.tts.service import MagpieTTSService

TEXT = "Hello there, this is a test of streaming speech synthesis."
@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def engine(tiny_magpie: tuple[Path, Path]):
    magpie, codec = tiny_magpie
    engine = MagpieEngine(str(magpie), device="cpu", codec_model_path=str(codec))
    engine.wait_until_ready(timeout=300)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def nemo_engine(tiny_magpie: tuple[Path, Path]):
    """NeMo's own step (``generate_speech``), one request at a time."""
    magpie, codec = tiny_magpie
    engine = MagpieEngine(str(magpie), device="cpu", codec_model_path=str(codec), step="nemo")
    engine.wait_until_ready(timeout=300)
    yield engine
    engine.close()


def collect(stream: SynthesisStream) -> np.ndarray:
    chunks = [chunk.audio for chunk in stream]
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)


# Validation and construction errors.


def test_voice_and_language_validation() -> None:
    assert normalize_voice("Aria") == "aria"
    assert normalize_language("en-US") == "en"
    assert normalize_language(Language.ZH_CN) == "zh"
    assert normalize_language("cmn") == "zh"
    with pytest.raises(ValueError, match="allowed voices: john, sofia, aria, jason, leo"):
        normalize_voice("bob")
    with pytest.raises(ValueError, match="allowed languages: en, es, de, fr, it, vi, zh"):
        normalize_language("ja")
    assert set(VOICES) == {"john", "sofia", "aria", "jason", "leo"} and len(LANGUAGES) == 7
    with pytest.raises(ValueError, match="max_duration_s"):
        MagpieSynthesisOptions(max_duration_s=0)
    with pytest.raises(ValueError, match="chunk_frames"):
        MagpieSynthesisOptions(chunk_frames=0)


def test_service_construction_errors(engine: MagpieEngine, tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(ValueError, match="allowed voices"):
        MagpieTTSService(engine=engine, settings=MagpieTTSService.Settings(voice="bob"))
    with pytest.raises(ValueError, match="allowed languages"):
        MagpieTTSService(engine=engine, settings=MagpieTTSService.Settings(language="ja"))
    with pytest.raises(ValueError, match=r"MagpieTTSService\(model=\.\.\.\)"):
        MagpieTTSService(engine=engine, settings=MagpieTTSService.Settings(model="other"))
    with pytest.raises(TypeError, match="MagpieSynthesisOptions"):
        MagpieTTSService(engine=engine, options={"max_duration_s": 1.0})  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="Magpie checkpoint not found"):
        MagpieTTSService(model=str(tmp_path / "missing.nemo"))
    with pytest.raises(FileNotFoundError, match="codec_model_path="):
        MagpieTTSService(model=str(engine.model_name), codec_model_path=str(tmp_path / "missing_codec.nemo"))
    find_spec = magpie_loading.importlib.util.find_spec
    monkeypatch.setattr(
        magpie_loading.importlib.util, "find_spec", lambda name: None if name == "jieba" else find_spec(name)
    )
    with pytest.raises(ImportError, match=r'\(jieba[^)]*\): pip install "pipecat-nemotron\[tts\]"'):
        MagpieTTSService()  # The released hub checkpoint needs the [tts] extra's Mandarin G2P modules.
    monkeypatch.setattr(magpie_loading.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match=r'pip install "pipecat-nemotron\[tts\]"'):
        MagpieTTSService(model=str(engine.model_name))

    service = MagpieTTSService(
        engine=engine, settings=MagpieTTSService.Settings(voice="Leo", language=Language.DE_DE)
    )
    assert (service._settings.voice, service._settings.language) == ("leo", "de")


def test_loading_names_the_missing_codec(tiny_magpie: tuple[Path, Path]) -> None:
    magpie, _ = tiny_magpie  # The codec was moved away from the path stored in the checkpoint.
    with pytest.raises(FileNotFoundError, match="Pass codec_model_path="):
        magpie_loading.load_magpie_model(str(magpie), "cpu")


def test_a_magpie_saved_with_its_codec_beside_loads_wherever_the_pair_goes(
    tiny_magpie: tuple[Path, Path], tmp_path: Path
) -> None:
    """The bundled tiny Magpie's packing: the checkpoint names its codec by file name, resolved beside it."""
    import torch

    magpie, codec = tiny_magpie
    saved, _ = magpie_loading.save_with_codec_beside(magpie, codec, tmp_path / "pair" / "m.nemo", "c.nemo")
    moved = tmp_path / "elsewhere"
    shutil.move(tmp_path / "pair", moved)

    loaded = magpie_loading.load_magpie_model(str(moved / saved.name), "cpu")
    original = magpie_loading.load_magpie_model(str(magpie), "cpu", codec_model_path=str(codec))
    assert loaded.cfg.codecmodel_path == str(moved / "c.nemo")
    mine, theirs = loaded.state_dict(), original.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)

    (moved / "c.nemo").unlink()
    with pytest.raises(FileNotFoundError, match=r"c\.nemo"):
        magpie_loading.load_magpie_model(str(moved / saved.name), "cpu")
    with pytest.raises(ValueError, match="file name ending in .nemo"):
        magpie_loading.save_with_codec_beside(magpie, codec, tmp_path / "x.nemo", "sub/c.nemo")


def test_nim_service_construction() -> None:
    """The out-of-process alternative: Pipecat's gRPC client for a local Magpie NIM (no server needed to build)."""
    from pipecat.services.nvidia.tts import NvidiaTTSService

    with pytest.warns(DeprecationWarning):
        nim = NvidiaTTSService(
            server="localhost:50051", use_ssl=False, voice_id="Magpie-Multilingual.EN-US.Aria"
        )
    assert nim._settings.voice == "Magpie-Multilingual.EN-US.Aria"
    assert (nim._server, nim._use_ssl) == ("localhost:50051", False)
    nim = NvidiaTTSService(
        server="localhost:50051",
        use_ssl=False,
        settings=NvidiaTTSService.Settings(voice="Magpie-Multilingual.EN-US.Aria"),
    )
    assert nim._settings.voice == "Magpie-Multilingual.EN-US.Aria"


# The private NeMo members, isolated in magpie/_nemo_private.py.


def test_private_nemo_members_still_work(engine: MagpieEngine) -> None:
    """Fails loudly when a NeMo upgrade moves what frame-level streaming hooks into."""
    import torch

    from pipecat_nemotron.tts.magpie import _nemo_private

    model = engine.model
    _nemo_private.check_compatibility(model)
    with pytest.raises(_nemo_private.NeMoCompatibilityError, match="nemo_toolkit 3.0"):
        _nemo_private.check_compatibility(object())

    kept: list[int] = []
    model.inference_parameters.max_decoder_steps = 6
    try:
        with _nemo_private.frame_hook(model, lambda frames: kept.append(frames.shape[-1])) as calls:
            audio, audio_len = model.do_tts("Hi.", language="en", speaker_index=0)
    finally:
        model.inference_parameters.max_decoder_steps = 500
    assert calls[0] == 6 and kept == [1] * 6, "the hook no longer sees one call per decoding step"
    assert int(audio_len[0]) == 6 * MAGPIE_SAMPLES_PER_FRAME
    assert "_check_eos_and_update_state" not in vars(model), "the hook was not removed"

    codes = torch.randint(0, model.codebook_size, (model.num_audio_codebooks, 12))
    assert _nemo_private.codes_to_audio(model, codes).shape == (12 * MAGPIE_SAMPLES_PER_FRAME,)


# Streaming.


def test_prefix_decodes_like_full_decode(engine: MagpieEngine) -> None:
    """The codec decoder is causal: any prefix of frames decodes to the prefix of the full decode."""
    import functools

    import torch

    from pipecat_nemotron.tts.magpie._nemo_private import codes_to_audio
    from pipecat_nemotron.tts.magpie.streaming import measure_decoder_context

    model = engine.model
    generator = torch.Generator().manual_seed(1)
    codes = torch.randint(0, model.codebook_size, (model.num_audio_codebooks, 30), generator=generator)
    full = codes_to_audio(model, codes)
    for prefix in (1, 2, 7, 29):
        prefix_audio = codes_to_audio(model, codes[:, :prefix])
        # Equal up to float rounding (convolutions of different lengths round differently): ~1e-7, while one int16
        # step is 3e-5.
        assert (prefix_audio - full[: prefix * MAGPIE_SAMPLES_PER_FRAME]).abs().max() < 1e-6
    probe = measure_decoder_context(
        functools.partial(codes_to_audio, model),
        num_codebooks=model.num_audio_codebooks,
        codebook_size=model.codebook_size,
        samples_per_frame=MAGPIE_SAMPLES_PER_FRAME,
        device=torch.device("cpu"),
    )
    assert probe.causal and probe.context_frames is not None and 0 < probe.context_frames < 30
    assert engine.decode_context_frames == 0, "the tiny codec should decode with per-request codec states"


@pytest.mark.parametrize("stateful", [True, False], ids=["codec-state", "left-context"])
def test_a_batch_of_rows_decodes_to_the_samples_each_decodes_alone(engine: MagpieEngine, stateful: bool) -> None:
    """One codec call for the chunks of many rows (different lengths and histories) gives each row's own audio,
    and each row's chunks, concatenated, are the whole-utterance decode of its frames.

    Both ways of decoding a chunk: after the row's codec state (each convolution's last inputs), or after its
    re-decoded left context. Equal to one int16 step: the float audio differs by ~1e-7 (rounding), as a prefix
    decode does.
    """
    import torch

    from pipecat_nemotron.tts.magpie._nemo_private import codes_to_audio
    from pipecat_nemotron.tts.magpie.codec_stream import CodecDecoding
    from pipecat_nemotron.tts.magpie.streaming import flush_together, to_int16

    model = engine.model
    codec = CodecDecoding(model, stateful=stateful, context_frames=None, name="test")
    assert (codec.streaming is not None) == stateful and (codec.context_frames == 0) == stateful
    generator = torch.Generator().manual_seed(2)
    codes = [
        torch.randint(0, model.codebook_size, (model.num_audio_codebooks, n), generator=generator)
        for n in (3, 9, 17, 30, 41)
    ]

    def decoders() -> list:
        return [codec.new_decoder(magpie_options_for(1)) for _ in codes]

    def close(a: np.ndarray, b: np.ndarray) -> bool:  # Float rounding only (batch, padding, lengths): 1 step.
        return a.shape == b.shape and np.abs(a.astype(np.int32) - b.astype(np.int32)).max() <= 1

    batched, alone = decoders(), decoders()
    streamed: list[list[np.ndarray]] = [[] for _ in codes]
    for stop in (2, 6, 7, 12, 30, 41):  # First chunks, then chunks after histories that differ per row, the rest.
        for frames, pair in zip(codes, zip(batched, alone, strict=True), strict=True):
            for decoder in pair:
                while decoder.frames < min(stop, frames.shape[1]):
                    decoder.append(frames[:, decoder.frames])
        together = flush_together(codec.decode_batch, batched)
        for index, (decoder, audio) in enumerate(zip(alone, together, strict=True)):
            own = decoder.flush()
            assert (own is None) == (audio is None)
            if own is not None:
                assert close(own, audio)
                streamed[index].append(audio)
    assert [d.emitted_frames for d in batched] == [c.shape[1] for c in codes]
    for frames, chunks in zip(codes, streamed, strict=True):
        assert close(np.concatenate(chunks), to_int16(codes_to_audio(model, frames)))


def test_codec_states_stream_a_decoder_of_the_released_codecs_shape() -> None:
    """A ``CausalHiFiGANDecoder`` shaped like the released nano codec's (upsampling 8, 8, 4, 2, 2; kernels 3, 7, 11
    with dilations 1, 3, 5; half-snake activations), random weights: chunks of two rows with different lengths
    decoded from their states equal each row's whole decode."""
    import torch
    from nemo.collections.tts.modules.audio_codec_modules import CausalHiFiGANDecoder

    from pipecat_nemotron.tts.magpie.codec_stream import (
        CodecState,
        decode_latents,
        decoder_unsupported_reason,
    )

    torch.manual_seed(0)
    decoder = CausalHiFiGANDecoder(
        input_dim=32,
        up_sample_rates=(8, 8, 4, 2, 2),
        base_channels=64,
        resblock_kernel_sizes=(3, 7, 11),
        resblock_dilation_sizes=(1, 3, 5),
        activation="half_snake",
        output_activation="clamp",
    ).eval()
    assert decoder_unsupported_reason(decoder) is None
    latents = torch.randn(2, 32, 12)
    with torch.inference_mode():
        whole = decoder(inputs=latents, input_len=torch.tensor([12, 12]))[0]
        states, streamed = [CodecState(), CodecState()], [[], []]
        for start, stop in ((0, 2), (2, 3), (3, 7), (7, 12)):
            lens = torch.tensor([stop - start, max(0, min(stop, 9) - start)])  # Row 1 stops at frame 9.
            rows = [i for i in range(2) if lens[i] > 0]
            chunk = torch.zeros(len(rows), 32, stop - start)
            for k, i in enumerate(rows):
                chunk[k, :, : int(lens[i])] = latents[i, :, start : start + int(lens[i])]
            audio = decode_latents(decoder, chunk, lens[rows], [states[i] for i in rows])
            for k, i in enumerate(rows):
                streamed[i].append(audio[k])
    samples = 1024
    assert torch.allclose(torch.cat(streamed[0]), whole[0], atol=1e-5)
    assert torch.allclose(torch.cat(streamed[1]), whole[1, : 9 * samples], atol=1e-5)


def test_growing_chunks_double_up_to_the_cap_and_give_the_same_audio(engine: MagpieEngine) -> None:
    """``max_chunk_frames``: chunks of 2, 4, 8, 16, 16 frames then the rest; concatenated, the whole decode."""
    import torch

    from pipecat_nemotron.tts.magpie._nemo_private import codes_to_audio
    from pipecat_nemotron.tts.magpie.codec_stream import CodecDecoding
    from pipecat_nemotron.tts.magpie.streaming import to_int16

    model = engine.model
    codes = torch.randint(
        0, model.codebook_size, (model.num_audio_codebooks, 50), generator=torch.Generator().manual_seed(3)
    )
    options = MagpieSynthesisOptions(first_chunk_frames=2, chunk_frames=4, max_chunk_frames=16)
    decoder = CodecDecoding(model, stateful=True, context_frames=None, name="test").new_decoder(options)
    chunks = [audio for t in range(50) if (audio := decoder.push(codes[:, t])) is not None]
    chunks.append(decoder.flush())
    assert [len(c) // MAGPIE_SAMPLES_PER_FRAME for c in chunks] == [2, 4, 8, 16, 16, 4]
    whole = to_int16(codes_to_audio(model, codes))
    assert np.abs(np.concatenate(chunks).astype(np.int32) - whole.astype(np.int32)).max() <= 1
    with pytest.raises(ValueError, match="max_chunk_frames"):
        MagpieSynthesisOptions(chunk_frames=4, max_chunk_frames=3)


def test_a_codec_the_state_cannot_follow_warns_and_decodes_with_left_context(engine: MagpieEngine) -> None:
    """A codec decoder whose left padding is not zeros (reflect) cannot be streamed from a state: refused, named."""
    from loguru import logger

    from pipecat_nemotron.tts.magpie.codec_stream import CodecDecoding, unsupported_reason

    model = engine.model  # The engine is idle; its padding mode is restored below.
    assert unsupported_reason(model) is None
    pre_conv = model._codec_helper.codec_model.audio_decoder.pre_conv
    warnings: list[str] = []
    sink = logger.add(lambda message: warnings.append(str(message)), level="WARNING")
    try:
        pre_conv.extra_pad_mode = "reflect"
        assert "pre_conv" in (unsupported_reason(model) or "")
        codec = CodecDecoding(model, stateful=True, context_frames=15, name="test")
    finally:
        pre_conv.extra_pad_mode = "constant"
        logger.remove(sink)
    assert codec.streaming is None and codec.context_frames == 15
    assert any("stateful codec decode does not support" in w and "pre_conv" in w for w in warnings)
    assert codec.new_decoder(magpie_options_for(1)).state is None


def test_streamed_audio_equals_offline_synthesis(nemo_engine: MagpieEngine) -> None:
    """On NeMo's step, chunked streaming gives NeMo's own do_tts output (same seed, same codes), sample for sample."""
    import torch

    engine = nemo_engine
    assert engine.step == "nemo"
    frames = 20
    torch.manual_seed(123)
    stream = engine.submit(TEXT, voice="jason", language="en", options=magpie_options_for(frames))
    streamed = collect(stream)
    assert stream.status == "truncated"  # The tiny model never ends speech on its own.

    model = engine.model
    torch.manual_seed(123)
    model.inference_parameters.max_decoder_steps = frames
    try:
        offline, offline_len = model.do_tts(TEXT, language="en", speaker_index=VOICES["jason"])
    finally:
        model.inference_parameters.max_decoder_steps = 500
    offline_pcm = (offline[0, : int(offline_len[0])].clamp(-1, 1) * 32767).round().to(torch.int16).numpy()

    assert streamed.dtype == np.int16 and streamed.shape == (frames * MAGPIE_SAMPLES_PER_FRAME,)
    assert np.abs(streamed.astype(np.int32) - offline_pcm.astype(np.int32)).max() <= 1


def test_first_audio_arrives_before_the_sentence_is_synthesised(engine: MagpieEngine) -> None:
    frames = 40
    stream = engine.submit(TEXT, options=magpie_options_for(frames, first_chunk_frames=2, chunk_frames=4))
    chunks = list(stream)
    assert [c.num_frames for c in chunks] == [2] + [4] * 9 + [2]
    assert [c.first_frame for c in chunks] == [0] + list(range(2, 40, 4))
    assert all(c.sample_rate == MAGPIE_CODEC_RATE and c.audio.dtype == np.int16 for c in chunks)
    stats = stream.stats
    assert stats.frames == frames and stats.chunks == len(chunks)
    # The first chunk (2 of 40 frames) was handed out while the model was still generating the rest.
    assert stats.started_at < stats.first_audio_at < stats.finished_at


def test_end_of_speech_frames_are_dropped(engine: MagpieEngine) -> None:
    """With the end token forced, NeMo ends at its 4-frame minimum; the end frame carries no audio."""
    import torch

    from pipecat_nemotron.tts.magpie.tiny import set_end_of_speech_bias

    set_end_of_speech_bias(engine.model, 30.0)
    try:
        torch.manual_seed(5)
        stream = engine.submit("Short.", options=magpie_options_for(40))
        audio = collect(stream)
        torch.manual_seed(5)
        offline, offline_len = engine.model.do_tts("Short.", language="en", speaker_index=VOICES["aria"])
    finally:
        set_end_of_speech_bias(engine.model, -30.0)
    assert stream.status == "completed"
    assert audio.shape == (4 * MAGPIE_SAMPLES_PER_FRAME,) == (int(offline_len[0]),)


@pytest.mark.parametrize("which", ["fast", "nemo"])
def test_cancel_stops_within_one_frame_and_frees_the_model(
    engine: MagpieEngine, nemo_engine: MagpieEngine, which: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engine if which == "fast" else nemo_engine
    hold = HoldSecondChunk(monkeypatch, TEXT)
    stream = engine.submit(TEXT, options=MagpieSynthesisOptions(max_duration_s=20.0))
    queued = engine.submit("Never spoken.", options=magpie_options_for(4))
    first = next(iter(stream))
    assert first.first_frame == 0
    queued.cancel()
    stream.cancel()  # the worker is held before the second chunk: the request cannot have finished
    frames_at_cancel = stream.stats.frames
    hold.release()
    assert stream.wait(timeout=10)
    assert stream.status == "cancelled"
    assert stream.stats.frames <= frames_at_cancel + 1
    assert stream.stats.frames < 431  # 20 s of frames were allowed.
    assert queued.wait(timeout=10) and queued.status == "cancelled" and queued.stats.frames < 4
    if which == "nemo":  # One at a time: the queued request never started.
        assert queued.stats.started_at is None and list(queued) == []

    after = engine.submit("Next please.", options=magpie_options_for(3))
    assert len(collect(after)) == 3 * MAGPIE_SAMPLES_PER_FRAME and after.status == "truncated"
    assert not engine.busy and engine.pending == 0


def test_nemo_step_serves_requests_fifo_one_at_a_time(nemo_engine: MagpieEngine) -> None:
    engine = nemo_engine
    streams = [engine.submit(f"Session {i}.", options=magpie_options_for(3)) for i in range(3)]
    for stream in streams:
        assert stream.wait(timeout=30)
    for earlier, later in zip(streams, streams[1:], strict=False):
        assert earlier.stats.finished_at <= later.stats.started_at


async def test_async_iteration_does_not_block_the_loop(engine: MagpieEngine, monkeypatch) -> None:
    # The worker cannot start the request until a task on the event loop lets it, and that task can only run
    # once the consumer awaits a chunk (none exists yet): a wait that blocked the loop would leave the worker at
    # the gate until its liveness guard gave up.
    gate = MagpieAdmissionGate(monkeypatch, TEXT)

    async def let_the_worker_go() -> None:
        await gate.wait_entered()
        gate.open()

    opener = asyncio.create_task(let_the_worker_go())
    try:
        chunks = [chunk async for chunk in engine.submit(TEXT, options=magpie_options_for(12))]
    finally:
        gate.open()
    await opener
    assert not gate.timed_out  # the loop ran the opener while the consumer waited for the first chunk
    assert sum(c.num_frames for c in chunks) == 12


# The Pipecat service.


async def test_service_streams_resampled_audio(engine: MagpieEngine, monkeypatch) -> None:
    submitted: list[tuple[str, str]] = []
    original_submit = engine.submit

    def spy(text: str, **kwargs) -> SynthesisStream:
        submitted.append((kwargs["voice"], kwargs["language"]))
        return original_submit(text, **kwargs)

    monkeypatch.setattr(engine, "submit", spy)
    frames = 11
    service = MagpieTTSService(engine=engine, options=magpie_options_for(frames))
    down, up = await run_test(
        service,
        frames_to_send=[
            TTSUpdateSettingsFrame(delta=MagpieTTSService.Settings(voice="Sofia", language=Language.FR_FR)),
            TTSUpdateSettingsFrame(delta=MagpieTTSService.Settings(voice="bob")),
            TTSSpeakFrame(text=TEXT),
        ],
        pipeline_params=PipelineParams(audio_out_sample_rate=16000),
    )
    assert submitted == [("sofia", "fr")]
    errors = [f for f in up if isinstance(f, ErrorFrame)]
    assert len(errors) == 1 and "allowed voices" in errors[0].error
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    assert any(isinstance(f, TTSStartedFrame) for f in down) and any(
        isinstance(f, TTSStoppedFrame) for f in down
    )
    assert (
        len(audio) > 1
        and {f.sample_rate for f in audio} == {16000}
        and {f.num_channels for f in audio} == {1}
    )
    total = sum(len(f.audio) for f in audio) // 2
    assert total == round(frames * MAGPIE_SAMPLES_PER_FRAME * 16000 / MAGPIE_CODEC_RATE)


async def test_service_at_codec_rate_passes_audio_through(engine: MagpieEngine) -> None:
    service = MagpieTTSService(engine=engine, options=magpie_options_for(5), sample_rate=MAGPIE_CODEC_RATE)
    down, _ = await run_test(service, frames_to_send=[TTSSpeakFrame(text="Hi.")])
    audio = b"".join(f.audio for f in down if isinstance(f, TTSAudioRawFrame))
    assert len(audio) == 2 * 5 * MAGPIE_SAMPLES_PER_FRAME


class _Sink(FrameProcessor):
    """Keeps the audio and interruption frames that reach the end of the pipeline, in order.

    When the interruption arrives it calls ``at_interruption()`` and keeps the result (what the engine had done
    by the time the interruption left the TTS service).
    """

    def __init__(self, at_interruption: Callable[[], object]) -> None:
        super().__init__()
        self.frames: list[Frame] = []
        self.first_audio = asyncio.Event()
        self.interrupted = asyncio.Event()
        self._at_interruption = at_interruption
        self.seen_at_interruption: object = None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.frames.append(frame)
            self.first_audio.set()
        elif isinstance(frame, InterruptionFrame):
            self.frames.append(frame)
            self.seen_at_interruption = self._at_interruption()
            self.interrupted.set()
        await self.push_frame(frame, direction)


async def test_interruption_stops_synthesis_promptly(engine: MagpieEngine, monkeypatch) -> None:
    streams: list[SynthesisStream] = []
    original_submit = engine.submit

    def spy(text: str, **kwargs) -> SynthesisStream:
        streams.append(original_submit(text, **kwargs))
        return streams[-1]

    monkeypatch.setattr(engine, "submit", spy)
    service = MagpieTTSService(engine=engine, options=MagpieSynthesisOptions(max_duration_s=20.0))
    sink = _Sink(at_interruption=lambda: (streams[0].cancelled, streams[0].stats.frames))
    worker = PipelineWorker(Pipeline([service, sink]), cancel_on_idle_timeout=False)
    runner = WorkerRunner()
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    try:
        await worker.queue_frame(TTSSpeakFrame(text=TEXT))
        await asyncio.wait_for(sink.first_audio.wait(), timeout=30)  # liveness guards, not timings
        await worker.queue_frame(InterruptionFrame())
        await asyncio.wait_for(sink.interrupted.wait(), timeout=30)
        (stream,) = streams
        assert await asyncio.to_thread(stream.wait, 30)
        # The service cancelled the request before it passed the interruption on...
        cancelled_then, frames_then = sink.seen_at_interruption
        assert cancelled_then and stream.status == "cancelled"
        # ...and the engine stopped it at its next step: at most the frame of the step then running followed
        # (the tiny model never ends the speech: it would have run on to 20 s, 431 frames).
        assert stream.stats.frames <= frames_then + 1 < 431
        # Its row is freed: the engine is idle.
        assert not engine.busy and engine.pending == 0
    finally:
        await worker.queue_frame(EndFrame())
        await asyncio.wait_for(run, timeout=30)
    # Every frame before the EndFrame has passed the sink: no audio of the interrupted reply came after the
    # interruption.
    interruption = next(i for i, f in enumerate(sink.frames) if isinstance(f, InterruptionFrame))
    assert interruption > 0 and not any(isinstance(f, TTSAudioRawFrame) for f in sink.frames[interruption:])


async def test_services_share_one_engine_per_model(tiny_magpie: tuple[Path, Path], monkeypatch) -> None:
    magpie, codec = tiny_magpie
    first = MagpieTTSService(model=str(magpie), device="cpu", codec_model_path=str(codec))
    second = MagpieTTSService(model=str(magpie), device="cpu", codec_model_path=str(codec))
    shared = first.engine
    try:
        assert second.engine is shared and shared_magpie_engines.refs(shared) == 2
        await shared.wait_ready()
        await first.cleanup()
        await second.cleanup()
        # A bot server keeps the model loaded between sessions.
        assert shared_magpie_engines.refs(shared) == 0 and not shared.closed
        third = MagpieTTSService(model=str(magpie), device="cpu", codec_model_path=str(codec))
        assert third.engine is shared
        monkeypatch.setattr(shared_magpie_engines, "unload_when_unused", True)
        await third.cleanup()
        assert shared.closed
    finally:
        shared_magpie_engines.close_all()


async def test_preload_keeps_the_model_loaded_for_the_process(tiny_magpie: tuple[Path, Path]) -> None:
    from pipecat_nemotron.tts.magpie import SharedMagpieEngines

    magpie, codec = tiny_magpie
    registry = SharedMagpieEngines(unload_when_unused=True)
    try:
        engine = await registry.preload(str(magpie), device="cpu", codec_model_path=str(codec))
        assert engine.ready and registry.refs(engine) == 1
        assert await registry.preload(str(magpie), device="cpu", codec_model_path=str(codec)) is engine
        assert registry.refs(engine) == 1
        session = registry.acquire(str(magpie), device="cpu", codec_model_path=str(codec))
        assert session is engine
        registry.release(session)
        assert not engine.closed and registry.refs(engine) == 1  # preloaded: stays despite unload_when_unused
    finally:
        registry.close_all()
    with pytest.raises(FileNotFoundError):
        await registry.preload(str(magpie.parent / "missing.nemo"), device="cpu")
