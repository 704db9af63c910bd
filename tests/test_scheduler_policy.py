"""The scheduler's policy, step by step, on a scripted model runner (no NeMo model, no scheduler task).

Each test drives :class:`SchedulerPolicy` by hand (plan → run → resolve) through real :class:`ASRStream`
handles, whose owner is :class:`~pipecat_nemotron.asr.fake_runner.ManualOwner` (it implements the
stream's ``StreamOwner`` contract), so a test can act between the plan of a step and its results, where the scheduler task never lets
a user act in a reproducible way.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import numpy as np
import pytest

from pipecat_nemotron.asr import StreamClosedError, StreamFailedError, Transcript
from pipecat_nemotron.asr.fake_runner import ManualOwner, fake_token
from pipecat_nemotron.asr.stream import ASRStream


def audio(seconds: float) -> np.ndarray:
    return np.zeros(int(round(seconds * 16000)), dtype=np.float32)


def drain(stream: ASRStream) -> list:
    """The updates queued for ``stream`` so far (without waiting)."""
    q = stream.updates_queue
    items = list(q._items)  # noqa: SLF001  (a peek at the queue without consuming it through the loop)
    q._items.clear()  # noqa: SLF001
    return items


def expected_tokens(stream_id: int, chunks: list[tuple[int, int]]) -> list[int]:
    return [fake_token(stream_id, start, frames) for start, frames in chunks if frames > 0]


async def test_oldest_audio_goes_first_when_the_batch_is_full() -> None:
    """Batch of one: the chunks are served in the order their audio arrived, across streams, none starves."""
    owner = ManualOwner(max_batch_size=1)
    a, b = owner.open(), owner.open()
    await a.push(audio(0.6))
    await b.push(audio(0.6))
    await a.push(audio(0.6))
    plans = owner.run_until_idle()
    served = [(p.items[0].state.stream_id, p.items[0].ready_at) for p in plans]
    assert [t for _, t in served] == sorted(t for _, t in served)
    assert {sid for sid, _ in served} == {a.stream_id, b.stream_id}
    assert all(len(p.items) == 1 for p in plans)
    # a's first push is served before any of b's audio, b's before a's second push.
    order = [sid for sid, _ in served]
    first_b = order.index(b.stream_id)
    assert order[:first_b] == [a.stream_id] * first_b and first_b >= 2
    assert a.backlog_ms < 200 and b.backlog_ms < 200


async def test_every_ready_stream_runs_while_the_batch_has_room() -> None:
    owner = ManualOwner(max_batch_size=3)
    streams = [owner.open() for _ in range(3)]
    for s in streams:
        await s.push(audio(1.0))
    plans = owner.run_until_idle()
    assert all(len(p.items) == 3 for p in plans)


async def test_modes_mix_in_one_step_one_forward_per_mode_and_shape() -> None:
    owner = ManualOwner(max_batch_size=8)
    fast, slow1, slow2 = owner.open(80), owner.open(160), owner.open(160)
    for s in (fast, slow1, slow2):
        await s.push(audio(0.5))
    plan, _ = owner.step()
    keys = sorted((g.latency_ms, g.items[0].first, g.items[0].num_frames, len(g.items)) for g in plan.groups)
    assert keys == [(80, True, 9, 1), (160, True, 17, 2)]
    late = owner.open(160)
    await late.push(audio(0.5))
    plan, _ = owner.step()
    keys = sorted((g.latency_ms, g.items[0].first, g.items[0].num_frames, len(g.items)) for g in plan.groups)
    assert keys == [(80, False, 8, 1), (160, False, 16, 2), (160, True, 17, 1)]
    assert plan.latency_modes.count(160) == 2 and len(owner.runner.steps[-1].groups) == 3


async def test_finalize_flushes_the_utterance_and_the_next_one_starts_at_its_boundary() -> None:
    owner = ManualOwner()
    s = owner.open()
    await s.push(audio(1.03))
    final_future = s.finalize_nowait()
    await s.push(audio(0.3))  # after the boundary: the next utterance
    owner.run_until_idle()
    final = final_future.result()
    assert isinstance(final, Transcript)
    assert final.utterance_audio_ms == pytest.approx(1030.0) and final.utterance == 0 and final.start_ms == 0.0
    # chunks: 17 frames, then 16 each, then the flush of what is left of 103 frames.
    chunks = [(0, 17), (17, 16), (33, 16), (49, 16), (65, 16), (81, 16), (97, 6)]
    assert list(final.tokens) == expected_tokens(s.stream_id, chunks)
    updates = drain(s)
    finals = [u for u in updates if u.is_final]
    assert len(finals) == 1 and finals[0] is final  # one record: what finalize() resolves with is the final update
    assert all(not u.is_final for u in updates[: updates.index(finals[0])])
    following = s.finalize_nowait()
    owner.run_until_idle()
    assert following.result().utterance == 1 and following.result().start_ms == pytest.approx(1030.0)


async def test_a_final_with_nothing_left_to_decode_needs_no_model_step() -> None:
    owner = ManualOwner()
    s = owner.open()
    fut = s.finalize_nowait()
    plan, _ = owner.step()
    assert plan.immediate and not plan.runs_model and owner.runner.steps == []
    assert fut.result().text == "" and fut.result().utterance_audio_ms == 0.0


async def test_peek_answers_the_final_text_and_leaves_the_stream_as_it_was() -> None:
    async def run(peek_at: float | None) -> tuple[Transcript | None, Transcript]:
        owner = ManualOwner()
        s = owner.open()
        await s.push(audio(1.03))
        peek = s.peek_nowait() if peek_at is not None else None
        owner.run_until_idle()
        await s.push(audio(0.5))
        fut = s.finalize_nowait()
        owner.run_until_idle()
        return (peek.result() if peek is not None else None), fut.result()

    peeked, final = await run(1.03)
    _, unpeeked = await run(None)
    assert final.tokens == unpeeked.tokens and final.text == unpeeked.text
    owner = ManualOwner()
    s = owner.open()
    await s.push(audio(1.03))
    short = s.finalize_nowait()
    owner.run_until_idle()
    assert peeked is not None and peeked.tokens == short.result().tokens and peeked.utterance_audio_ms == 1030.0


async def test_a_peek_after_a_pending_final_is_about_the_next_utterance() -> None:
    owner = ManualOwner()
    s = owner.open()
    await s.push(audio(0.5))
    final = s.finalize_nowait()
    await s.push(audio(0.5))
    peek = s.peek_nowait()
    owner.run_until_idle()
    assert final.result().utterance == 0
    assert peek.result().utterance == 1 and peek.result().utterance_audio_ms == pytest.approx(500.0)


async def test_a_stream_closed_mid_step_gets_nothing_and_frees_its_slot_before_the_next_forward() -> None:
    """One slot: a stream closed while its chunk is in the step; a new stream takes the slot in the next step."""
    owner = ManualOwner(slots=1)
    old = owner.open()
    await old.push(audio(1.0))
    owner.step()  # old takes the slot
    assert [u.is_final for u in drain(old)] == [False]
    pending = old.finalize_nowait()
    plan = owner.policy.plan()
    assert old.in_flight and [it.state.stream_id for it in plan.items] == [old.stream_id]
    output = owner.run(plan)
    await old.close()  # while the step "runs"
    assert old.closed and isinstance(pending.exception(), StreamClosedError)
    new = owner.open()
    await new.push(audio(1.0))
    done = owner.resolve(plan, output)
    assert not old.in_flight and drain(old) == [] and done.released == []
    plan, done = owner.step()
    assert plan.releases == [old.stream_id] and plan.closing == [old.stream_id]
    assert done.released == [old.stream_id]
    assert [it.state.stream_id for it in plan.items] == [new.stream_id]
    fut = new.finalize_nowait()
    owner.run_until_idle()
    assert fut.result().tokens and owner.runner.peak_slots == 1


async def test_a_failed_forward_fails_its_stream_alone() -> None:
    owner = ManualOwner()
    good, bad = owner.open(), owner.open()
    for s in (good, bad):
        await s.push(audio(0.5))
    owner.runner.fail_streams.add(bad.stream_id)
    bad_final, good_final = bad.finalize_nowait(), good.finalize_nowait()
    owner.run_until_idle()
    assert isinstance(bad_final.exception(), StreamFailedError) and bad.closed
    with pytest.raises(StreamFailedError):
        await bad.updates_queue.get()
    assert good_final.result().tokens and not good.closed
    # The failed stream's slot is released once, by the step after the one that failed it (the first); the good
    # stream keeps its slot.
    steps = owner.runner.steps
    assert bad.stream_id in [sid for _, _, _, ids, _ in steps[0].groups for sid in ids]
    assert [i for i, step in enumerate(steps) if bad.stream_id in step.releases] == [1]
    assert all(good.stream_id not in step.releases for step in steps)
    assert set(owner.runner.slots.held) == {good.stream_id}


async def test_capacity_a_full_pool_fails_the_extra_stream_and_closing_frees_a_slot() -> None:
    owner = ManualOwner(slots=2)
    streams = [owner.open() for _ in range(3)]
    for s in streams:
        await s.push(audio(0.3))
    owner.run_until_idle()
    failed = [s for s in streams if s.closed]
    assert len(failed) == 1 and owner.runner.peak_slots == 2
    survivor = next(s for s in streams if not s.closed)
    await survivor.close()
    late = owner.open()
    await late.push(audio(0.3))
    fut = late.finalize_nowait()
    owner.run_until_idle()
    assert fut.result().tokens and owner.runner.peak_slots == 2


async def test_a_latency_change_waits_for_the_next_utterance_once_a_word_was_emitted() -> None:
    owner = ManualOwner()
    s = owner.open(160)
    await s.push(audio(0.5))
    owner.run_until_idle()
    assert s.tokens  # the fake emits a word per chunk
    s.set_latency(80)
    assert s.latency_ms == 160
    fut = s.finalize_nowait()
    owner.run_until_idle()
    assert fut.result().latency_ms == 160 and s.latency_ms == 80


async def test_forced_splits_come_through_the_updates_in_order() -> None:
    owner = ManualOwner(max_utterance_s=2.0)
    s = owner.open()
    await s.push(audio(5.0))
    fut = s.finalize_nowait()
    owner.run_until_idle()
    forced = [u for u in drain(s) if u.is_final and u.forced]
    assert len(forced) >= 2 and [u.utterance for u in forced] == list(range(len(forced)))
    assert fut.result().utterance == len(forced)
    joined = [t for u in forced for t in u.tokens] + list(fut.result().tokens)
    chunks = [(0, 17)] + [(17 + 16 * i, 16) for i in range(30)] + [(497, 3)]
    assert joined == expected_tokens(s.stream_id, chunks)


async def test_stop_fails_every_pending_request() -> None:
    owner = ManualOwner()
    s = owner.open()
    await s.push(audio(0.5))
    fut, peek = s.finalize_nowait(), s.peek_nowait()
    owner.policy.end_all(StreamClosedError("stopped"))
    await asyncio.sleep(0)
    assert isinstance(fut.exception(), StreamClosedError) and isinstance(peek.exception(), StreamClosedError)
    assert s.closed and owner.policy.streams == {}


def test_the_policy_and_the_loop_import_without_torch() -> None:
    """The policy is plain Python: importing it (and the scheduler loop) loads neither torch nor NeMo."""
    code = (
        "import sys\n"
        "import pipecat_nemotron.asr.policy, pipecat_nemotron.asr.scheduler\n"
        "print(sorted(m for m in ('torch', 'nemo') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


async def test_a_peek_with_nothing_left_to_flush_is_answered_without_the_model() -> None:
    owner = ManualOwner()
    s = owner.open()
    peek = s.peek_nowait()
    plan = owner.plan()
    assert plan.empty and peek.done() and owner.runner.steps == []
    assert peek.result().text == "" and peek.result().utterance == 0


async def test_a_latency_change_is_checked_against_the_model_once_and_refused_whole() -> None:
    """``set_latency`` is validated by the owner alone; a refused value leaves nothing pending."""
    from pipecat_nemotron.asr.config import validate_latency_ms

    modes = ManualOwner().runner.modes
    for bad in (200, 160.0, True, "160"):
        with pytest.raises(ValueError, match=r"\[80, 160, 560, 1120\]"):
            validate_latency_ms(bad, modes)  # type: ignore[arg-type]
    owner = ManualOwner()
    s = owner.open(160)
    with pytest.raises(ValueError, match="loaded model's modes"):
        s.set_latency(200)
    assert s._state.pending_latency_ms is None  # noqa: SLF001
