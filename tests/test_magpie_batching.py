"""Continuous batching in MagpieEngine (fast step) on the tiny random Magpie: joins, leaves, seeds, FIFO waits."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    MAGPIE_SAMPLES_PER_FRAME,
    HoldSecondChunk,
    MagpieAdmissionGate,
    magpie_options_for,
    one_torch_thread,
)

from pipecat_nemotron.tts.magpie import (
    MagpieEngine,
    MagpieEngineError,
    MagpieSynthesisOptions,
    SynthesisStream,
)
from pipecat_nemotron.tts.magpie.options import uses_guidance


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def engine(tiny_magpie: tuple[Path, Path]):
    magpie, codec = tiny_magpie
    engine = MagpieEngine(str(magpie), device="cpu", codec_model_path=str(codec), max_batch=4)
    engine.wait_until_ready(timeout=300)
    assert engine.step == "fast"
    yield engine
    engine.close()


def collect(stream: SynthesisStream) -> np.ndarray:
    chunks = [chunk.audio for chunk in stream]
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)


def same_audio(a: np.ndarray, b: np.ndarray) -> bool:
    """The same codes decoded: equal to one int16 step (the codec decodes all rows' chunks in one call, and its
    float rounding, ~1e-7, depends on the batch)."""
    return a.shape == b.shape and int(np.abs(a.astype(np.int32) - b.astype(np.int32)).max(initial=0)) <= 1


def test_constructor_validates_step_and_batch(tiny_magpie: tuple[Path, Path]) -> None:
    magpie, codec = tiny_magpie
    with pytest.raises(ValueError, match="step must be"):
        MagpieEngine(str(magpie), codec_model_path=str(codec), step="faster")
    with pytest.raises(ValueError, match="max_batch"):
        MagpieEngine(str(magpie), codec_model_path=str(codec), max_batch=0)
    with pytest.raises(ValueError, match="stateful_codec"):
        MagpieEngine(str(magpie), codec_model_path=str(codec), stateful_codec="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed"):
        MagpieSynthesisOptions(seed=-1)


def test_requests_advance_together_one_frame_per_step(engine: MagpieEngine, monkeypatch) -> None:
    """Two 12-frame requests admitted together take 12 steps, not 24 (one frame each per step)."""
    gate = MagpieAdmissionGate(monkeypatch, "Session one.")
    before = engine.steps, engine.prefills
    first = engine.submit("Session one.", options=magpie_options_for(12))
    assert gate.entered.wait(60)  # the worker is admitting the first: the second is queued before it goes on
    second = engine.submit("Session two.", options=magpie_options_for(12))
    gate.open()
    audio = [collect(s) for s in (first, second)]
    assert not gate.timed_out
    assert [len(a) for a in audio] == [12 * MAGPIE_SAMPLES_PER_FRAME] * 2
    steps, prefills = engine.steps - before[0], engine.prefills - before[1]
    assert (steps, prefills) == (12, 1)  # one prefill for both, then one frame each per step
    assert second.stats.started_at < first.stats.finished_at and first.stats.started_at < second.stats.finished_at


def test_seeded_request_is_the_same_alone_and_in_a_batch_joining_at_different_times(
    engine: MagpieEngine,
) -> None:
    options = magpie_options_for(16, seed=1234)
    alone = collect(engine.submit("The seeded sentence.", options=options))

    others = [engine.submit("Another voice, first.", options=magpie_options_for(30, seed=1))]
    next(iter(others[0]))  # It is running; the next ones join at different steps.
    others.append(engine.submit("A second one.", options=magpie_options_for(25)))
    next(iter(others[1]))
    seeded = engine.submit("The seeded sentence.", options=options)
    others.append(engine.submit("A third one joins with it.", options=magpie_options_for(20)))
    in_batch = collect(seeded)
    for other in others:
        collect(other)
    assert same_audio(alone, in_batch)
    different = collect(engine.submit("The seeded sentence.", options=dataclasses.replace(options, seed=99)))
    assert not np.array_equal(alone, different)


def test_guidance_follows_the_request_else_the_checkpoints_scale(engine: MagpieEngine) -> None:
    """No ``use_cfg``: guided at the tiny model's scale 2.5, as asked for explicitly; a scale of 1 turns it off."""
    assert uses_guidance(MagpieSynthesisOptions(), 2.5)
    assert not uses_guidance(MagpieSynthesisOptions(), 1.0)
    assert not uses_guidance(MagpieSynthesisOptions(use_cfg=False), 2.5)
    assert uses_guidance(MagpieSynthesisOptions(use_cfg=True), 1.0)
    with pytest.raises(ValueError, match="use_cfg"):
        MagpieSynthesisOptions(use_cfg="no")  # type: ignore[arg-type]

    def say(use_cfg: bool | None) -> np.ndarray:
        return collect(engine.submit("Guided or not.", options=magpie_options_for(12, seed=7, use_cfg=use_cfg)))

    default = say(None)
    assert same_audio(default, say(True))
    assert not same_audio(default, say(False))


def test_cancelling_mid_batch_leaves_the_other_rows_unchanged(engine: MagpieEngine, monkeypatch) -> None:
    texts = ["First of three.", "Second of three, the cancelled one.", "Third of three."]
    options = [magpie_options_for(20, seed=10 + i) for i in range(3)]
    alone = [collect(engine.submit(t, options=o)) for t, o in zip(texts, options, strict=True)]

    # The worker is held as it hands the victim its second chunk (6 of its 20 frames): it cannot finish the
    # victim before the cancel, however the machine schedules the test's thread and the worker.
    hold = HoldSecondChunk(monkeypatch, texts[1])
    streams = [engine.submit(t, options=o) for t, o in zip(texts, options, strict=True)]
    victim = iter(streams[1])
    next(victim)
    streams[1].cancel()
    hold.release()
    audio = [collect(s) for s in streams]
    assert streams[1].status == "cancelled" and len(audio[1]) < len(alone[1])
    assert same_audio(audio[0], alone[0]) and same_audio(audio[2], alone[2])
    assert not engine.busy and engine.pending == 0


def test_a_burst_is_prefilled_in_one_call_even_when_it_arrives_while_the_first_starts(
    engine: MagpieEngine, monkeypatch
) -> None:
    """Requests that arrive while the first of a burst is being started (its text tokenised) join its prefill.

    Otherwise the first is prefilled alone and the others wait for it before theirs (seconds for the 357M model
    on a CPU). The worker is held inside the first request's tokenisation while the others are submitted.
    """
    gate = MagpieAdmissionGate(monkeypatch, "Session one.")
    before = engine.prefills
    first = engine.submit("Session one.", options=magpie_options_for(3))
    assert gate.entered.wait(60), "the worker never started the first request"
    assert first.stats.started_at is not None and first.status == "running"  # admitted, not yet prefilled
    others = [engine.submit(f"Session {name}.", options=magpie_options_for(3)) for name in ("two", "three", "four")]
    gate.open()
    streams = [first, *others]
    for stream in streams:
        assert stream.wait(timeout=60) and stream.status == "truncated"  # a liveness guard
    assert not gate.timed_out
    assert engine.prefills - before == 1, "the burst was split over several prefills"
    assert [s.stats.frames for s in streams] == [3] * 4


def test_requests_over_max_batch_wait_fifo_and_report_their_wait(tiny_magpie: tuple[Path, Path]) -> None:
    magpie, codec = tiny_magpie
    engine = MagpieEngine(str(magpie), device="cpu", codec_model_path=str(codec), max_batch=2, warmup=False)
    try:
        engine.wait_until_ready(timeout=300)
        streams = [engine.submit(f"Request {name}.", options=magpie_options_for(8)) for name in "abcd"]
        for stream in streams:
            assert stream.wait(timeout=60) and stream.status == "truncated"
        a, b, c, d = (s.stats for s in streams)
        # The first two ran together; the third started only when a row freed up, the fourth after it.
        assert a.started_at < b.finished_at and b.started_at < a.finished_at
        assert c.started_at >= min(a.finished_at, b.finished_at)
        assert d.started_at >= c.started_at
        assert c.queue_wait_s > a.queue_wait_s and d.queue_wait_s > b.queue_wait_s
    finally:
        engine.close()


def test_an_unsupported_model_warns_and_falls_back_to_nemos_step(tmp_path: Path) -> None:
    from loguru import logger

    from pipecat_nemotron.tts.magpie.tiny import TINY_SHAPE, build_tiny_magpie

    magpie, codec = build_tiny_magpie(tmp_path, shape=dataclasses.replace(TINY_SHAPE, decoder_kernel=3))
    messages: list[str] = []
    sink = logger.add(lambda m: messages.append(str(m)), level="WARNING")
    engine = MagpieEngine(str(magpie), device="cpu", codec_model_path=str(codec), warmup=False)
    try:
        engine.wait_until_ready(timeout=300)
        assert engine.step == "nemo"
        assert any("does not support" in m and "kernel" in m for m in messages)
        assert (
            len(collect(engine.submit("Still speaks.", options=magpie_options_for(3)))) == 3 * MAGPIE_SAMPLES_PER_FRAME
        )
    finally:
        logger.remove(sink)
        engine.close()


# A load that fails must end every wait with an error (issue 22, item 1).


async def test_wait_ready_raises_when_loading_fails(tmp_path: Path) -> None:
    bad = tmp_path / "broken.nemo"
    bad.write_bytes(b"not a nemo archive")
    engine = MagpieEngine(str(bad), device="cpu", warmup=False)
    with pytest.raises(MagpieEngineError, match="loading failed"):
        await asyncio.wait_for(engine.wait_ready(), timeout=120)
    engine.close()


async def test_wait_ready_raises_when_the_worker_dies_before_loading(
    tiny_magpie: tuple[Path, Path], monkeypatch
) -> None:
    """A worker thread that stops before the model is ready (here: its log filter fails) must not hang waiters."""
    import contextlib

    from pipecat_nemotron.tts.magpie import engine as engine_module

    @contextlib.contextmanager
    def broken_quiet_nemo(level: int):
        raise RuntimeError("log setup failed")
        yield

    monkeypatch.setattr(engine_module, "quiet_nemo", broken_quiet_nemo)
    magpie, codec = tiny_magpie
    engine = MagpieEngine(str(magpie), device="cpu", codec_model_path=str(codec), warmup=False)
    with pytest.raises(MagpieEngineError, match="worker thread stopped"):
        await asyncio.wait_for(engine.wait_ready(), timeout=20)
    with pytest.raises(MagpieEngineError, match="worker thread stopped"):
        engine.wait_until_ready(timeout=20)
