"""The Magpie scheduler's policy, turn by turn, on a scripted model runner (no NeMo model, no worker thread).

Each test drives :class:`MagpieScheduler` by hand (``pull`` then ``turn``: plan → execute → resolve) over a
:class:`~pipecat_nemotron.tts.magpie.fake_runner.FakeRunner` and real :class:`SynthesisStream` handles, so it can act
between any two steps. A fake request's text is split into text chunks at ``"|"``; each word is one codec frame, and
each frame's audio is its code repeated, so a request's audio reads back as its codes.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

from pipecat_nemotron.tts.magpie import MagpieEngineError, MagpieSynthesisError, MagpieSynthesisOptions
from pipecat_nemotron.tts.magpie.fake_runner import FakeRunner, fake_code
from pipecat_nemotron.tts.magpie.policy import MagpiePolicy, StepPlan
from pipecat_nemotron.tts.magpie.scheduler import MagpieScheduler
from pipecat_nemotron.tts.magpie.stream import Synthesis, SynthesisStream

#: The fake codec: 100 frames a second, 10 samples each.
RATE, SAMPLES = 1000, 10


def words(n: int) -> str:
    return " ".join(["w"] * n)


def options(frames: int = 400, **kwargs) -> MagpieSynthesisOptions:
    """Options allowing exactly ``frames`` codec frames of the fake codec (100 frames a second, clear of rounding)."""
    return MagpieSynthesisOptions(max_duration_s=(frames - 0.5) / 100, **kwargs)


def make(max_batch: int = 4, **runner) -> tuple[MagpieScheduler, FakeRunner]:
    fake = FakeRunner(RATE, SAMPLES, **runner)
    scheduler = MagpieScheduler("test", max_batch)
    scheduler.bind(fake)
    return scheduler, fake


def submit(scheduler: MagpieScheduler, text: str, **kwargs) -> SynthesisStream:
    stream = SynthesisStream(Synthesis(text, 0, "en", kwargs.pop("opts", None) or options(**kwargs)))
    scheduler.submit(stream)
    return stream


def turn(scheduler: MagpieScheduler) -> bool:
    """One turn of the worker's loop: the queued requests join, then plan → execute → resolve."""
    scheduler.pull()
    return scheduler.turn()


def run_until_idle(scheduler: MagpieScheduler, limit: int = 1000) -> int:
    for turns in range(limit):
        if not turn(scheduler):
            return turns
    raise AssertionError(f"still busy after {limit} turns")


def codes_of(stream: SynthesisStream) -> list[int]:
    """The codes a finished stream's audio carries (each frame is SAMPLES samples equal to its code)."""
    chunks = list(stream)
    assert all(c.sample_rate == RATE and len(c.audio) == c.num_frames * SAMPLES for c in chunks)
    audio = np.concatenate([c.audio for c in chunks]) if chunks else np.zeros(0, np.int16)
    return [int(x) for x in audio[::SAMPLES]]


def expected(stream: SynthesisStream, frames: int) -> list[int]:
    return [fake_code(stream.id, k) for k in range(frames)]


def test_admission_is_first_in_first_out_up_to_max_batch() -> None:
    scheduler, fake = make(max_batch=2)
    a, b, c, d = (submit(scheduler, words(n)) for n in (3, 5, 2, 2))
    run_until_idle(scheduler)
    assert all(len(rows) <= 2 for rows in fake.steps)
    assert fake.opened == [a.id, b.id, c.id, d.id]
    assert fake.steps[0] == [a.id, b.id]
    # c takes a's row when a ends (3 frames, then its end-of-speech step), d takes b's.
    first_c = next(i for i, rows in enumerate(fake.steps) if c.id in rows)
    assert first_c == 4 and a.id not in fake.steps[first_c]
    assert fake.removed.index(a.id) < fake.removed.index(c.id)
    for stream, frames in ((a, 3), (b, 5), (c, 2), (d, 2)):
        assert stream.status == "completed" and codes_of(stream) == expected(stream, frames)
    assert scheduler.pending == 0 and scheduler.active == 0


def test_an_admitting_turn_only_opens_so_a_burst_shares_one_prefill() -> None:
    """Requests submitted while the first of a burst is opened (its text tokenised) join its prefill."""
    scheduler, fake = make(max_batch=4)
    burst: list[SynthesisStream] = []

    def arrive(synthesis: Synthesis) -> None:
        if not burst:
            burst.extend(submit(scheduler, words(2)) for _ in range(3))

    fake.on_open = arrive
    first = submit(scheduler, words(2))
    assert turn(scheduler) and fake.opened == [first.id] and fake.prefills == [] and fake.steps == []
    assert turn(scheduler) and fake.opened == [first.id] + [s.id for s in burst] and fake.prefills == []
    assert turn(scheduler)
    assert fake.prefills == [[first.id] + [s.id for s in burst]] and len(fake.steps) == 1
    run_until_idle(scheduler)
    assert len(fake.prefills) == 1 and all(s.status == "completed" for s in [first, *burst])


def test_the_plan_is_typed_and_names_each_rows_work() -> None:
    """The policy alone: a plan lists who leaves, who is opened, who starts a text chunk, who steps."""
    policy = MagpiePolicy(max_batch=2, max_row_steps=500, sample_rate=RATE, samples_per_frame=SAMPLES)
    a, b, c = (Synthesis(t, 0, "en", options()) for t in ("a", "b", "c"))
    for s in (a, b, c):
        policy.submit(s)
    plan = policy.plan()
    assert isinstance(plan, StepPlan) and (plan.opening, plan.starting, plan.rows) == ([a, b], [], [])
    policy.opened(a, 2)
    policy.opened(b, 1)
    plan = policy.plan()
    assert (plan.opening, plan.starting, plan.rows) == ([], [a, b], [a, b])
    b.cancelled = True
    plan = policy.plan()
    assert plan.leaving == [b] and b.ending == "cancelled" and plan.opening == [c]


def test_a_cancel_frees_the_row_at_the_next_step() -> None:
    scheduler, fake = make(max_batch=2)
    victim, other = submit(scheduler, words(20)), submit(scheduler, words(6))
    while len(fake.steps) < 3:
        turn(scheduler)
    victim.cancel()
    steps = len(fake.steps)
    assert turn(scheduler)
    assert fake.removed == [victim.id] and fake.steps[steps:] == [[other.id]]
    assert victim.status == "cancelled" and victim.stats.frames == 3
    waiting = submit(scheduler, words(4))
    waiting.cancel()  # Skipped: never opened.
    run_until_idle(scheduler)
    assert waiting.status == "cancelled" and waiting.stats.started_at is None and waiting.id not in fake.opened
    assert codes_of(victim) == expected(victim, 2)  # Its first chunk; a cancel drops the frames not yet decoded.
    assert other.status == "completed" and codes_of(other) == expected(other, 6)


def test_a_request_whose_decode_or_open_fails_fails_alone() -> None:
    scheduler, fake = make(max_batch=3)
    good = submit(scheduler, words(5), first_chunk_frames=2, chunk_frames=2)
    bad = submit(scheduler, words(5), first_chunk_frames=2, chunk_frames=2)
    unopenable = submit(scheduler, words(5))
    fake.fail_decode.add(bad.id)
    fake.fail_open.add(unopenable.id)
    run_until_idle(scheduler)
    assert bad.status == "failed" and unopenable.status == "failed"
    with pytest.raises(MagpieSynthesisError, match="scripted decode failure"):
        list(bad)
    with pytest.raises(MagpieSynthesisError, match="scripted open failure"):
        list(unopenable)
    # The batched decode failed, then each due request was decoded alone.
    assert fake.decodes[:3] == [[good.id, bad.id], [good.id], [bad.id]]
    assert good.status == "completed" and codes_of(good) == expected(good, 5)
    assert bad.id in fake.removed and unopenable.id not in fake.opened


def test_a_failed_step_fails_every_row_and_a_failed_prefill_the_rows_it_started() -> None:
    scheduler, fake = make(max_batch=4)
    a, b = submit(scheduler, words(9)), submit(scheduler, words(9))
    while len(fake.steps) < 2:
        turn(scheduler)
    late = submit(scheduler, words(3))
    assert turn(scheduler)  # late is opened
    fake.fail_prefill = RuntimeError("scripted prefill failure")
    assert turn(scheduler)  # its prefill fails; a and b step on
    assert late.status == "failed" and fake.steps[-1] == [a.id, b.id]
    fake.fail_step = RuntimeError("scripted step failure")
    assert turn(scheduler)
    assert a.status == b.status == "failed" and fake.resets == 1
    after = submit(scheduler, words(2))
    run_until_idle(scheduler)
    assert after.status == "completed" and codes_of(after) == expected(after, 2)


def test_truncation_at_the_frame_budget_flushes_the_frames_kept() -> None:
    scheduler, fake = make()
    stream = submit(scheduler, words(30), frames=5, first_chunk_frames=2, chunk_frames=4)
    run_until_idle(scheduler)
    assert stream.status == "truncated" and stream.stats.frames == 5 and len(fake.steps) == 5
    chunks = list(stream)
    assert [(c.first_frame, c.num_frames) for c in chunks] == [(0, 2), (2, 3)]
    assert [int(x) for c in chunks for x in c.audio[::SAMPLES]] == expected(stream, 5)


def test_text_chunks_are_decoded_one_after_the_other_in_the_requests_row() -> None:
    scheduler, fake = make(max_batch=2)
    stream = submit(scheduler, "one two|three four five|six", first_chunk_frames=1, chunk_frames=2)
    other = submit(scheduler, words(12))
    run_until_idle(scheduler)
    assert stream.status == "completed" and stream.stats.text_chunks == 3
    assert [ids for ids in fake.prefills if stream.id in ids] == [[stream.id, other.id], [stream.id], [stream.id]]
    # Each chunk's frames, then its end-of-speech step: 3 + 4 + 2 steps; the audio runs on across chunks.
    assert sum(stream.id in rows for rows in fake.steps) == 9
    assert codes_of(stream) == expected(stream, 6)
    assert other.status == "completed" and codes_of(other) == expected(other, 12)


def test_a_row_at_nemos_step_limit_keeps_its_frame_and_moves_on() -> None:
    scheduler, fake = make(max_row_steps=3)
    stream = submit(scheduler, "a b c d e|f")
    run_until_idle(scheduler)
    assert stream.status == "completed" and codes_of(stream) == expected(stream, 4)
    assert len(fake.steps) == 3 + 2


def test_audio_chunks_follow_the_options_and_the_last_is_flushed_at_completion() -> None:
    scheduler, _ = make()
    stream = submit(scheduler, words(23), first_chunk_frames=2, chunk_frames=3, max_chunk_frames=8)
    run_until_idle(scheduler)
    chunks = list(stream)
    assert [c.num_frames for c in chunks] == [2, 3, 6, 8, 4]
    assert [c.first_frame for c in chunks] == [0, 2, 5, 11, 19]
    assert stream.status == "completed" and stream.stats.chunks == 5 and stream.stats.audio_frames == 23


def test_an_empty_text_completes_without_a_step() -> None:
    scheduler, fake = make()
    stream = submit(scheduler, "")
    run_until_idle(scheduler)
    assert stream.status == "completed" and list(stream) == [] and fake.steps == []


def test_the_worker_thread_frees_a_cancelled_row_before_its_next_step_and_cancels_all_at_close() -> None:
    """On a real worker thread: a cancel made while a step runs takes the row out of the very next step; close()
    cancels the running and the queued requests, and later submits are refused."""
    scheduler, fake = make(max_batch=2)
    gate = fake.gate = threading.Semaphore(0)
    victim, other = submit(scheduler, words(50)), submit(scheduler, words(50))
    worker = threading.Thread(target=scheduler.serve, name="magpie-test-worker")
    worker.start()
    try:
        assert fake.entered.get(timeout=30) == [victim.id, other.id]
        victim.cancel()  # while the step runs
        fake.gate.release()
        assert fake.entered.get(timeout=30) == [other.id]
        assert victim.wait(timeout=30) and victim.status == "cancelled"
        queued = [submit(scheduler, words(5)) for _ in range(3)]
        scheduler.close()
        gate.release()
        worker.join(timeout=30)
        assert not worker.is_alive()
    finally:  # Never leave the worker waiting at the gate.
        scheduler.close()
        fake.gate = None
        gate.release(100)
        worker.join(timeout=30)
    assert other.status == "cancelled" and all(s.status == "cancelled" for s in queued)
    assert all(s.stats.started_at is None for s in queued)
    with pytest.raises(MagpieEngineError, match="closed"):
        submit(scheduler, words(1))


def test_a_worker_that_dies_fails_every_request_and_refuses_new_ones() -> None:
    """A worker killed by an error of its own (here: an exception that is not an Exception) ends every wait."""
    scheduler, fake = make(max_batch=1)
    fake.fail_step = KeyboardInterrupt()
    running, queued = submit(scheduler, words(5)), submit(scheduler, words(5))
    worker = threading.Thread(target=lambda: pytest.raises(KeyboardInterrupt, scheduler.serve))
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert running.status == queued.status == "failed"
    with pytest.raises(MagpieSynthesisError, match="worker stopped"):
        list(queued)
    with pytest.raises(MagpieEngineError, match="stopped"):
        submit(scheduler, words(1))
    assert scheduler.stopped and not scheduler.closed  # the registry replaces an engine whose worker stopped


def test_the_policy_the_scheduler_and_the_fake_import_without_torch() -> None:
    code = (
        "import sys\n"
        "import pipecat_nemotron.tts.magpie.policy, pipecat_nemotron.tts.magpie.scheduler\n"
        "import pipecat_nemotron.tts.magpie.fake_runner\n"
        "print(sorted(m for m in ('torch', 'nemo') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
