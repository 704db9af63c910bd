"""Randomized churn: open / push / finalize / peek / change / close in any interleaving; every future resolves.

Seeded and bounded (a plain ``random.Random`` loop; the project does not depend on hypothesis): a failure
names its seed, and the same seed replays the same interleaving.

Two levels:

- the policy stepped by hand (:class:`~pipecat_nemotron.asr.fake_runner.ManualOwner`): requests land
  anywhere, including between a step's plan and its results, in an order fixed by the seed;
- the whole engine on the scripted runner (:class:`~pipecat_nemotron.asr.fake_runner.FakeEngine`): six
  concurrent streams with random early closes, as in the soak that once saw a ``finalize()`` go unanswered;
  there the scheduler task and its worker thread choose the interleaving.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest

from pipecat_nemotron.asr import (
    CapacityError,
    EngineConfig,
    StreamClosedError,
    StreamFailedError,
    Transcript,
)
from pipecat_nemotron.asr.fake_runner import FAKE_MODES, FakeEngine, ManualOwner
from pipecat_nemotron.asr.step_plan import StepOutput, StepPlan
from pipecat_nemotron.asr.stream import ASRStream

#: Waits in the engine-level churn fail after this long (a liveness guard, not a timing assertion), seconds.
HANG_S = 30.0


def audio(rng: random.Random, most_s: float = 0.4) -> np.ndarray:
    return np.zeros(rng.randrange(0, int(most_s * 16000) + 1), dtype=np.float32)


@dataclass
class Ledger:
    """Every request made and how it must end."""

    finals: list[tuple[int, asyncio.Future]] = field(default_factory=list)
    peeks: list[tuple[int, asyncio.Future]] = field(default_factory=list)

    def unresolved(self) -> list[str]:
        return [
            f"{kind} of stream {sid}"
            for kind, items in (("finalize", self.finals), ("peek", self.peeks))
            for sid, fut in items
            if not fut.done()
        ]


def check_outcomes(ledger: Ledger, seed: int) -> None:
    """Every request ended; none failed (the fake fails nothing); each stream's finals come in order."""
    assert not ledger.unresolved(), f"seed {seed}: unresolved {ledger.unresolved()}"
    utterances: dict[int, list[int]] = {}
    for sid, fut in ledger.finals + ledger.peeks:
        if fut.cancelled():
            continue
        error = fut.exception()
        assert error is None or isinstance(error, StreamClosedError), f"seed {seed}: stream {sid}: {error!r}"
    for sid, fut in ledger.finals:
        if not fut.cancelled() and fut.exception() is None:
            final = fut.result()
            assert isinstance(final, Transcript)
            utterances.setdefault(sid, []).append(final.utterance)
    for sid, seen in utterances.items():
        assert seen == sorted(set(seen)), f"seed {seed}: stream {sid} finals out of order: {seen}"


class ManualChurn:
    """One seeded run against the policy stepped by hand."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.slots = self.rng.choice([1, 2, 3])
        self.owner = ManualOwner(
            max_batch_size=self.rng.choice([1, 2, 4]),
            slots=self.slots,
            hard_reset=self.rng.random() < 0.5,
            max_utterance_s=self.rng.choice([None, 2.0]),
        )
        self.streams: list[ASRStream] = []
        self.ledger = Ledger()

    async def act(self) -> None:
        """One random request."""
        rng, owner = self.rng, self.owner
        live = [s for s in self.streams if not s.closed]
        if not live or (len(owner.policy.streams) < self.slots and rng.random() < 0.15):
            if len(owner.policy.streams) < self.slots:  # the engine's capacity check
                self.streams.append(owner.open(rng.choice(sorted(FAKE_MODES))))
            return
        s = rng.choice(live)
        kind = rng.choices(["push", "finalize", "peek", "latency", "language", "close"], [8, 3, 2, 1, 1, 1])[0]
        if kind == "push":
            await s.push(audio(rng))
        elif kind == "finalize":
            self.ledger.finals.append((s.stream_id, s.finalize_nowait()))
        elif kind == "peek":
            self.ledger.peeks.append((s.stream_id, s.peek_nowait()))
        elif kind == "latency":
            s.set_latency(rng.choice(sorted(FAKE_MODES)))
        elif kind == "language":
            s.set_language(rng.choice([None, "en-US"]))
        else:
            await s.close()

    async def step(self) -> None:
        """A step, with requests landing between its plan and its results half of the time."""
        plan: StepPlan = self.owner.plan()
        for _ in range(self.rng.choice([0, 0, 1, 3])):
            await self.act()
        output = self.owner.run(plan) if plan.runs_model else StepOutput()
        for _ in range(self.rng.choice([0, 0, 1, 3])):
            await self.act()
        self.owner.resolve(plan, output)

    async def run(self, actions: int) -> None:
        for _ in range(actions):
            if self.rng.random() < 0.3:
                await self.step()
            else:
                await self.act()
        for s in self.streams:  # end: every stream finalizes, the policy drains, every stream closes
            if not s.closed:
                self.ledger.finals.append((s.stream_id, s.finalize_nowait()))
        self.owner.run_until_idle()
        for s in self.streams:
            await s.close()
        self.owner.run_until_idle()
        await asyncio.sleep(0)


@pytest.mark.parametrize("seed", range(30))
async def test_policy_churn_resolves_every_request(seed: int) -> None:
    """Random requests between and inside steps: every finalize and peek ends, no stream fails for a slot."""
    churn = ManualChurn(seed)
    await churn.run(actions=300)
    check_outcomes(churn.ledger, seed)
    assert churn.owner.policy.streams == {} and churn.owner.policy.closing == {}
    assert churn.owner.runner.peak_slots <= churn.slots and not churn.owner.runner.slots.held


async def stream_cycles(
    engine: FakeEngine, rng: random.Random, cycles: int, ledger: Ledger, log: Callable[[str], None]
) -> None:
    """One user: open a stream, push, finalize, peek, change mode, close early at random; ``cycles`` times."""
    for cycle in range(cycles):
        while True:
            try:
                stream = engine.open_stream(latency_ms=rng.choice(sorted(FAKE_MODES)))
                break
            except CapacityError:
                await asyncio.sleep(0.001)
        close_early = rng.random() < 0.3
        for _ in range(rng.randrange(1, 8)):
            kind = rng.choices(["push", "finalize", "peek", "latency", "language", "wait"], [6, 2, 1, 1, 1, 2])[0]
            if kind == "push":
                await stream.push(audio(rng))
            elif kind == "finalize":
                ledger.finals.append((stream.stream_id, stream.finalize_nowait()))
            elif kind == "peek":
                ledger.peeks.append((stream.stream_id, stream.peek_nowait()))
            elif kind == "latency":
                stream.set_latency(rng.choice(sorted(FAKE_MODES)))
            elif kind == "language":
                stream.set_language(rng.choice([None, "en"]))
            else:
                await asyncio.sleep(rng.choice([0, 0.0005, 0.002]))
        if not close_early:
            fut = stream.finalize_nowait()
            ledger.finals.append((stream.stream_id, fut))
            try:
                await asyncio.wait_for(asyncio.shield(fut), HANG_S)
            except TimeoutError:
                log(f"cycle {cycle}: finalize of stream {stream.stream_id} unanswered after {HANG_S} s")
        await asyncio.wait_for(stream.close(), HANG_S)


@pytest.mark.parametrize("seed", range(3))
async def test_engine_churn_six_streams_every_future_resolves(seed: int) -> None:
    """Six concurrent users with random early closes on the real scheduler task: nothing is left hanging."""
    rng = random.Random(seed)
    config = EngineConfig(
        model="fake",
        device="cpu",
        max_streams=6,
        max_batch_size=rng.choice([2, 6]),
        finalize_mode=rng.choice(["soft", "hard"]),
        max_utterance_s=rng.choice([None, 2.0]),
        warmup=False,
    )
    ledger, problems = Ledger(), []
    async with FakeEngine(config) as engine:
        users = [
            stream_cycles(engine, random.Random(seed * 100 + i), 60, ledger, problems.append) for i in range(6)
        ]
        await asyncio.gather(*users)
        assert not problems, f"seed {seed}: {problems}"
        check_outcomes(ledger, seed)
        assert engine.open_streams == 0
        assert engine.fake.peak_slots <= 6
        failed = [f for _, f in ledger.finals if f.done() and not f.cancelled() and f.exception()]
        assert not any(isinstance(e.exception(), StreamFailedError) for e in failed)


async def test_a_close_waiting_for_its_slot_returns_when_the_scheduler_crashes() -> None:
    """A ``close()`` waits for the next step to free the slot; if that step crashes the scheduler, it returns."""
    engine = FakeEngine(EngineConfig(model="fake", device="cpu", max_streams=2, warmup=False))
    await engine.start()
    runner = engine.fake
    stream, other = engine.open_stream(), engine.open_stream()
    runner.hold = threading.Event()
    await stream.push(np.zeros(16000, dtype=np.float32))
    await asyncio.to_thread(runner.entered.wait, HANG_S)  # a step is running, holding stream's chunk
    pending = other.finalize_nowait()
    closing = asyncio.ensure_future(stream.close())
    for _ in range(100):  # loop passes, not time: close() runs until it waits
        if stream.closed:
            break
        await asyncio.sleep(0)
    # The close is registered (the stream no longer counts as open), and it waits for the step that frees the
    # slot: the step in progress is held on the worker thread, so nothing else can have let it return.
    assert stream.closed and engine.open_streams == 1
    assert runner.entered.is_set() and not closing.done()
    runner.crash = RuntimeError("scripted scheduler bug")
    runner.hold.set()
    await asyncio.wait_for(closing, HANG_S)
    assert isinstance(engine.error, RuntimeError)
    with pytest.raises(StreamFailedError, match="crashed"):
        await asyncio.wait_for(pending, HANG_S)
    with pytest.raises(RuntimeError, match="scripted"):  # stop() reports what crashed the scheduler
        await engine.stop()


async def test_stop_ends_a_pending_final_saying_the_engine_was_stopped() -> None:
    """A final still owed when the engine stops fails with the reason a user can act on: the engine stopped."""
    engine = FakeEngine(EngineConfig(model="fake", device="cpu", max_streams=2, warmup=False))
    await engine.start()
    runner = engine.fake
    stream = engine.open_stream()
    runner.hold = threading.Event()
    await stream.push(np.zeros(16000, dtype=np.float32))
    await asyncio.to_thread(runner.entered.wait, HANG_S)  # a step is running: the final below stays owed
    pending = stream.finalize_nowait()
    stopping = asyncio.ensure_future(engine.stop())
    for _ in range(100):  # loop passes, not time: stop() cancels the scheduler, which waits on the held step
        if stopping.done() or pending.done():
            break
        await asyncio.sleep(0)
    runner.hold.set()
    await asyncio.wait_for(stopping, HANG_S)
    with pytest.raises(StreamClosedError, match="the engine was stopped"):
        await asyncio.wait_for(pending, HANG_S)
