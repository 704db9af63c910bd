"""NemotronSTTService in real Pipecat pipelines: frames, finals, TTFS, latency changes, shared engines."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest
from helpers import audio_frames, finals_of, latency_change_turns, noise_clip, to_pcm16, turn
from pipecat.frames.frames import (
    CancelFrame,
    ErrorFrame,
    InterimTranscriptionFrame,
    InterruptionFrame,
    MetricsFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.metrics.metrics import TTFBMetricsData
from pipecat.pipeline.worker import PipelineParams
from pipecat.tests.utils import SleepFrame, run_test

from pipecat_nemotron.asr import EngineConfig, NemotronEngine
from pipecat_nemotron.asr.shared import SharedEngines
from pipecat_nemotron.bench.wer import normalize_text
from pipecat_nemotron.observers.metrics import ASRFinalizeMetricsData
from pipecat_nemotron.stt import NemotronSTTService


@pytest.fixture
async def engine(engine_factory, tiny_random_model):
    return await engine_factory(tiny_random_model)


@pytest.mark.serial
async def test_frames_in_order_final_equals_engine_and_ttfs(engine: NemotronEngine) -> None:
    pcm = to_pcm16(noise_clip(1.6, seed=61))
    expected = await engine.transcribe(pcm, latency_ms=160)
    stt = NemotronSTTService(engine=engine, latency_ms=160)
    down, _ = await run_test(
        stt,
        frames_to_send=[SleepFrame(sleep=0.2), *turn(pcm)],
        pipeline_params=PipelineParams(enable_metrics=True),
        start_timeout=5.0,
    )
    finals = finals_of(down)
    assert len(finals) == 1 and finals[0].finalized
    assert finals[0].text == expected.text and finals[0].language is not None and finals[0].timestamp
    interims = [f for f in down if isinstance(f, InterimTranscriptionFrame)]
    assert interims, "no interim transcripts"
    final_index = down.index(finals[0])
    assert all(down.index(i) < final_index for i in interims)
    lengths = [len(i.text) for i in interims]
    assert lengths == sorted(lengths)
    assert all(finals[0].text.startswith(i.text.rstrip()) for i in interims)
    metrics = [d for f in down if isinstance(f, MetricsFrame) for d in f.data]
    ttfs = [d for d in metrics if isinstance(d, TTFBMetricsData) and d.processor == stt.name]
    assert ttfs and ttfs[-1].value > 0
    finalize = [d for d in metrics if isinstance(d, ASRFinalizeMetricsData)]
    assert len(finalize) == 1 and 0 < finalize[0].value < ttfs[-1].value + 1
    assert engine.open_streams == 0


async def test_two_turns_with_latency_change_between(engine: NemotronEngine) -> None:
    a, b = to_pcm16(noise_clip(1.2, seed=62)), to_pcm16(noise_clip(1.4, seed=63))
    modes: list[int] = []
    engine.add_step_listener(lambda stats: modes.extend(stats.latency_modes))
    stt = NemotronSTTService(engine=engine, latency_ms=160)
    down, _ = await run_test(stt, frames_to_send=latency_change_turns(a, b), start_timeout=5.0)
    finals = finals_of(down)
    assert [f.finalized for f in finals] == [True, True]
    assert stt.latency_ms == 560
    assert 160 in modes and 560 in modes
    assert modes.index(560) > modes.index(160)
    # Each turn is only its own audio: the engine's own stream, given a then b with a final after each (the
    # service's soft finalize keeps one stream across turns), says the same, turn by turn.
    stream = engine.open_stream(latency_ms=160)
    try:
        await stream.push(a)
        expected = [(await stream.finalize()).text]
        stream.set_latency(560)
        await stream.push(b)
        expected.append((await stream.finalize()).text)
    finally:
        await stream.close()
    assert all(expected) and expected[0] != expected[1]
    assert [f.text for f in finals] == expected


async def test_two_sessions_share_one_engine_without_mixing(tiny_random_model) -> None:
    registry = SharedEngines()
    config = EngineConfig(model=str(tiny_random_model), device="cpu", max_streams=4)
    clips = [to_pcm16(noise_clip(1.3, seed=64)), to_pcm16(noise_clip(1.1, seed=65))]
    services = [NemotronSTTService(engine_config=config, registry=registry) for _ in clips]
    try:
        # Load once up front (as a bot server would), so the sessions' timing does not include the load.
        await registry.release(await registry.acquire(config))
        results = await asyncio.gather(
            *(
                run_test(s, frames_to_send=[SleepFrame(sleep=0.1), *turn(c, wait=2.5)], start_timeout=5.0)
                for s, c in zip(services, clips, strict=True)
            )
        )
        assert len(registry.engines) == 1
        engine = registry.engines[0]
        assert engine.steps > 0 and engine.open_streams == 0
        for (down, _), clip in zip(results, clips, strict=True):
            expected = await engine.transcribe(clip, latency_ms=160)
            assert [f.text for f in finals_of(down)] == [expected.text]
    finally:
        await registry.close_all()


async def test_cancel_mid_utterance_frees_the_slot(engine: NemotronEngine) -> None:
    stt = NemotronSTTService(engine=engine)
    pcm = to_pcm16(noise_clip(1.0, seed=66))
    await run_test(
        stt,
        frames_to_send=[
            SleepFrame(sleep=0.2),
            VADUserStartedSpeakingFrame(),
            *audio_frames(pcm),
            SleepFrame(sleep=0.3),
            CancelFrame(),
        ],
        send_end_frame=False,
        start_timeout=5.0,
    )
    assert engine.open_streams == 0
    assert stt.stream is None


async def test_end_of_session_finalizes_once(engine: NemotronEngine) -> None:
    pcm = to_pcm16(noise_clip(1.2, seed=69))
    expected = await engine.transcribe(pcm, latency_ms=160)
    stt = NemotronSTTService(engine=engine)
    # The session ends while the user is still speaking: the last words still arrive, once.
    down, _ = await run_test(
        stt,
        frames_to_send=[SleepFrame(sleep=0.2), VADUserStartedSpeakingFrame(), *audio_frames(pcm)],
        start_timeout=5.0,
    )
    finals = finals_of(down)
    assert [f.text for f in finals] == [expected.text] and finals[0].finalized
    assert engine.open_streams == 0


async def test_interruption_keeps_the_words(engine: NemotronEngine) -> None:
    pcm = to_pcm16(noise_clip(1.5, seed=67))
    expected = await engine.transcribe(pcm, latency_ms=160)
    frames = audio_frames(pcm)
    half = len(frames) // 2
    stt = NemotronSTTService(engine=engine)
    down, _ = await run_test(
        stt,
        frames_to_send=[
            SleepFrame(sleep=0.2),
            VADUserStartedSpeakingFrame(),
            *frames[:half],
            InterruptionFrame(),
            *frames[half:],
            VADUserStoppedSpeakingFrame(stop_secs=0.2),
            SleepFrame(sleep=1.5),
        ],
        start_timeout=5.0,
    )
    assert [f.text for f in finals_of(down)] == [expected.text]


async def test_turn_without_speech_yields_no_final(tiny_quiet_model) -> None:
    async with NemotronEngine(EngineConfig(model=str(tiny_quiet_model), device="cpu", max_streams=2)) as eng:
        silence = np.zeros(16000, dtype=np.int16).tobytes()
        assert (await eng.transcribe(silence)).text == ""  # precondition: this model hears nothing in silence
        down, _ = await run_test(
            NemotronSTTService(engine=eng),
            frames_to_send=[SleepFrame(sleep=0.2), *turn(silence, wait=1.0)],
            start_timeout=5.0,
        )
    assert finals_of(down) == []


async def test_audio_before_the_engine_is_ready_is_kept(tiny_random_model) -> None:
    registry = SharedEngines()
    config = EngineConfig(model=str(tiny_random_model), device="cpu", max_streams=2, warmup=False)
    pcm = to_pcm16(noise_clip(1.0, seed=68))
    stt = NemotronSTTService(engine_config=config, registry=registry)
    try:
        # No sleep: audio and the end of turn arrive while the model is still loading.
        down, _ = await run_test(stt, frames_to_send=turn(pcm, wait=0.5), start_timeout=5.0)
        expected = await registry.engines[0].transcribe(pcm, latency_ms=160)
        assert [f.text for f in finals_of(down)] == [expected.text]
    finally:
        await registry.close_all()


def test_construction_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match=r"\[80, 160, 560, 1120\]"):
        NemotronSTTService(latency_ms=100)
    with pytest.raises(ValueError, match="device"):
        NemotronSTTService(device="tpu")
    stt = NemotronSTTService(model="/does/not/exist.nemo")  # nothing loads at construction
    assert stt.latency_ms == 160
    # The name and docs must make "local, in process" obvious next to Pipecat's remote NvidiaSTTService.
    import pipecat_nemotron.stt as stt_module

    assert NemotronSTTService.__doc__.startswith("Local, in-process")
    assert "remote" in stt_module.__doc__ and "NvidiaSTTService" in stt_module.__doc__


# ---- a session that ends while the model loads (cold process) ------------------------------------------------


def _demo_turns() -> tuple[list[bytes], list[str]]:
    import json
    import wave

    from pipecat_nemotron.models import DEMO_AUDIO_DIR

    texts = json.loads((DEMO_AUDIO_DIR / "transcripts.json").read_text())
    clips = []
    for name in ("demo_math.wav", "demo_timer.wav"):
        with wave.open(str(DEMO_AUDIO_DIR / name), "rb") as w:
            clips.append(w.readframes(w.getnframes()))
    return clips, [texts["demo_math.wav"], texts["demo_timer.wav"]]


def _cold_turns(clips: list[bytes]) -> list:
    """Two turns sent as fast as a pipeline takes them, then (run_test's) EndFrame: no time for a cold load."""
    frames: list = []
    for pcm in clips:
        frames += [
            VADUserStartedSpeakingFrame(),
            *audio_frames(pcm),
            VADUserStoppedSpeakingFrame(stop_secs=0.2),
        ]
    return frames


async def test_session_ending_while_the_model_loads_delivers_every_final() -> None:
    from pipecat_nemotron.models import TINY_MODEL_PATH as TRAINED_MODEL

    clips, texts = _demo_turns()
    registry = SharedEngines()  # nothing loaded: this session's StartFrame starts the load
    config = EngineConfig(model=str(TRAINED_MODEL), device="cpu", max_streams=2)
    stt = NemotronSTTService(engine_config=config, registry=registry)
    try:
        down, up = await run_test(stt, frames_to_send=_cold_turns(clips), start_timeout=5.0)
        assert [normalize_text(f.text) for f in finals_of(down)] == [normalize_text(t) for t in texts]
        assert all(f.finalized for f in finals_of(down))
        assert not [f for f in up if isinstance(f, ErrorFrame)]
        assert registry.engines[0].open_streams == 0
    finally:
        await registry.close_all()


async def test_load_past_load_wait_reports_the_dropped_audio() -> None:
    from pipecat_nemotron.models import TINY_MODEL_PATH as TRAINED_MODEL

    clips, _ = _demo_turns()
    seconds = sum(len(c) for c in clips) / 32000
    registry = SharedEngines()
    config = EngineConfig(model=str(TRAINED_MODEL), device="cpu", max_streams=2)
    stt = NemotronSTTService(engine_config=config, registry=registry, load_wait_s=0.01)
    try:
        down, up = await run_test(stt, frames_to_send=_cold_turns(clips), start_timeout=5.0)
    finally:
        await registry.close_all()
    assert finals_of(down) == []
    errors = [f.error for f in up if isinstance(f, ErrorFrame)]
    assert len(errors) == 1, errors
    assert f"{seconds:.1f} s of audio were not transcribed" in errors[0] and "load_wait_s" in errors[0]


async def test_failed_load_reports_the_dropped_audio(tmp_path) -> None:
    corrupt = tmp_path / "corrupt.nemo"
    corrupt.write_bytes(b"not a tar archive" * 100)
    pcm = to_pcm16(noise_clip(1.0, seed=70))
    registry = SharedEngines()
    stt = NemotronSTTService(engine_config=EngineConfig(model=str(corrupt), device="cpu"), registry=registry)
    down, up = await run_test(stt, frames_to_send=_cold_turns([pcm]), start_timeout=5.0)
    assert finals_of(down) == []
    errors = [f.error for f in up if isinstance(f, ErrorFrame)]
    assert errors and "corrupt.nemo" in errors[0], errors
    # Audio received before the failure is reported with it, audio received after it at the end: all of it.
    reported = [
        float(m) for e in errors for m in re.findall(r"([0-9.]+) s (?:more )?of this session's audio", e)
    ]
    assert abs(sum(reported) - 1.0) <= 0.05, errors


async def test_preloaded_engine_serves_sessions_and_stays_loaded(tiny_random_model) -> None:
    registry = SharedEngines(unload_when_unused=True)
    config = EngineConfig(model=str(tiny_random_model), device="cpu", max_streams=2)
    engine = await registry.preload(config)
    assert engine.running and registry.refs(engine) == 1
    assert await registry.preload(config) is engine and registry.refs(engine) == 1
    pcm = to_pcm16(noise_clip(1.2, seed=71))
    expected = await engine.transcribe(pcm)
    try:
        down, _ = await run_test(
            NemotronSTTService(engine_config=config, registry=registry),
            frames_to_send=_cold_turns([pcm]),  # no time to load: the preloaded engine serves at once
            start_timeout=5.0,
        )
        assert [f.text for f in finals_of(down)] == [expected.text]
        # The session released its reference; the preloaded engine stays loaded despite unload_when_unused.
        assert registry.engines == [engine] and engine.running and registry.refs(engine) == 1
    finally:
        await registry.close_all()
