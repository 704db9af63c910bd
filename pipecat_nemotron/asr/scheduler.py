"""The one task that owns the model: plan a step, run it off the loop, deliver its results.

A turn hands typed objects along, as vLLM's engine core does between schedule, execute and update: the policy
(:class:`~pipecat_nemotron.asr.policy.SchedulerPolicy`, synchronous) plans a
:class:`~pipecat_nemotron.asr.step_plan.StepPlan` on the loop, the model runner turns it into a
:class:`~pipecat_nemotron.asr.step_plan.StepOutput` on the worker thread, and the policy resolves the plan
with it on the loop. Joins, leaves, finalizes and setting changes reach the policy only between steps; while a
step runs, the event loop keeps accepting audio, which the next step picks up. This module holds only the loop,
the wake-up and the futures of ``close()`` calls.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

from loguru import logger

from pipecat_nemotron.asr.boosting import BoostList
from pipecat_nemotron.asr.errors import StreamClosedError
from pipecat_nemotron.asr.policy import SchedulerPolicy, StepModel
from pipecat_nemotron.asr.state import StreamState
from pipecat_nemotron.asr.step_plan import (
    Resolution,
    StepGroup,
    StepOutput,
    StepPlan,
    StepStats,
    StreamEntry,
)
from pipecat_nemotron.asr.transcripts import extended_utterance
from pipecat_nemotron.asr.types import Transcript

if TYPE_CHECKING:  # torch-backed
    from pipecat_nemotron.asr.language_id import UtteranceEvidence


class StepRunner(StepModel, Protocol):
    """The model runner as the loop uses it (:class:`~pipecat_nemotron.asr.runner.ModelRunner`)."""

    def run_step(self, groups: list[StepGroup], releases: list[int]) -> StepOutput:
        """Free the ``releases`` slots, then run one batched forward per group (worker thread)."""
        ...

    def final_language(self, stream_id: int, evidence: UtteranceEvidence | None) -> str | None:
        """The locale of an ``auto`` utterance at its final, from its evidence (worker thread)."""
        ...


__all__ = ["Scheduler", "StepRunner", "StepStats", "run_plan"]


def run_plan(runner: StepRunner, plan: StepPlan) -> StepOutput:
    """Run a planned step (worker thread): the forwards, the final language detections, the streams' new text.

    The text is built here, off the event loop, because detokenising and word alignment cost as much as a small
    forward. Nothing here writes stream state: it all goes into the output, which the policy applies.
    """
    output = runner.run_step(plan.groups, plan.releases)
    for state in plan.detections:
        output.detected_languages[state.stream_id] = runner.final_language(state.stream_id, state.evidence)
    for it in plan.items:
        out = output.items.get(it.state.stream_id)
        if out is not None and out.error is None and out.tokens and not it.peek:
            out.utterance = extended_utterance(it.state, out, runner)
    return output


class Scheduler:
    """Continuous batching over all open streams of one engine.

    Args:
        runner: The model runner (its model calls happen only on ``executor``'s single thread).
        executor: A single-thread executor; every model call happens there.
        max_batch_size: Most chunks per step.
        hard_reset: Reset caches and decoder state after each final (``finalize_mode="hard"``).
        max_utterance_s: Longest utterance, seconds: a longer one is split (:mod:`~pipecat_nemotron.asr.splits`);
            None: no limit.

    """

    def __init__(
        self,
        runner: StepRunner,
        executor: ThreadPoolExecutor,
        max_batch_size: int,
        hard_reset: bool,
        max_utterance_s: float | None = None,
    ) -> None:
        self.runner = runner
        self.executor = executor
        self.policy = SchedulerPolicy(runner, max_batch_size, hard_reset, max_utterance_s)
        self.step_listeners: list[Callable[[StepStats], None]] = []
        self.error: BaseException | None = None
        self._wake = asyncio.Event()
        #: ``close()`` futures of closed streams, resolved once a step freed their slots.
        self._close_waiters: dict[int, list[asyncio.Future[None]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopping = False  # stop() cancelled the task: pending requests end as "stopped", not "cancelled"

    @property
    def streams(self) -> dict[int, StreamEntry]:
        """Open streams by id."""
        return self.policy.streams

    @property
    def steps(self) -> int:
        """Steps that ran a forward."""
        return self.policy.steps

    @property
    def recent_ttf_ms(self) -> deque[float]:
        """Recent time-to-final values, ms."""
        return self.policy.recent_ttf_ms

    # ---- control, called from the event loop ---------------------------------------------------------------

    def start(self) -> None:
        """Start the scheduler task."""
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="nemotron-asr-scheduler")

    async def stop(self) -> None:
        """Stop the task; fail whatever is still pending."""
        if self._task is not None:
            self._stopping = True
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._end_all(StreamClosedError("the engine was stopped"))

    def _end_all(self, error: BaseException) -> None:
        """End every stream with ``error`` and resolve every pending close: no step will run again."""
        self.policy.end_all(error)
        self._resolve_close_waiters()

    def _resolve_close_waiters(self) -> None:
        """Let every waiting ``close()`` return."""
        for futures in self._close_waiters.values():
            for fut in futures:
                if not fut.done():
                    fut.set_result(None)
        self._close_waiters.clear()

    def wake(self) -> None:
        """Tell the scheduler there may be work."""
        self._wake.set()

    def add(
        self,
        state: StreamState,
        push: Callable[[Transcript], None],
        end: Callable[[BaseException | None], None],
    ) -> None:
        """Register a stream (its slot is taken on its first step)."""
        self.policy.add(state, push, end)

    def release(self, state: StreamState, error: BaseException | None = None) -> asyncio.Future[None]:
        """Close a stream (:meth:`SchedulerPolicy.release`); the future resolves once its slot is free.

        It resolves at once when no step will run again (the task is not running).
        """
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.policy.release(state, error)
        if state.stream_id in self.policy.closing and self._task is not None and not self._task.done():
            self._close_waiters.setdefault(state.stream_id, []).append(fut)
            self._wake.set()
        else:
            fut.set_result(None)
        return fut

    def request_language(self, state: StreamState, language: str | None, prompt_index: int | None) -> None:
        """Change a stream's language from its first utterance without a word (:mod:`~.changes`)."""
        if self.policy.request(state, language=(language, prompt_index)):
            self._wake.set()

    def request_boost(self, state: StreamState, boost: BoostList) -> None:
        """Change a stream's boost list (empty: none) from its first utterance without a word (:mod:`~.changes`)."""
        if self.policy.request(state, boost=boost):
            self._wake.set()

    def request_latency(self, state: StreamState, latency_ms: int) -> None:
        """Change a stream's mode from its first utterance without a word (:mod:`~.changes`)."""
        if self.policy.request(state, latency_ms=latency_ms):
            self._wake.set()

    # ---- the loop ----------------------------------------------------------------------------------------

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while not (plan := self.policy.plan()).empty:
                    output = StepOutput()
                    if plan.runs_model:
                        output = await loop.run_in_executor(self.executor, self._execute, plan)
                    self._deliver(self.policy.resolve(plan, output))
                    # Let pushes and other tasks run between steps, even under sustained load.
                    await asyncio.sleep(0)
        except asyncio.CancelledError:
            # Cancelled without stop() (the event loop is shutting down, e.g. asyncio.run after an error):
            # streams still closing wait on releases only this task resolves.
            self._end_all(
                StreamClosedError(
                    "the engine was stopped"
                    if self._stopping
                    else "the engine's scheduler was cancelled; the engine is not running"
                )
            )
            raise
        except BaseException as e:  # a bug in the scheduler itself: fail every stream loudly
            logger.exception(f"ASR scheduler crashed: {e!r}")
            self.error = e
            self.policy.crash(e)
            self._resolve_close_waiters()  # no step will free their slots: their close() calls return now
            raise

    def _execute(self, plan: StepPlan) -> StepOutput:
        return run_plan(self.runner, plan)

    def _deliver(self, done: Resolution) -> None:
        """Push the resolved updates, return the ``close()`` calls whose slots are free, report the stats."""
        for entry, update in done.updates:
            entry.push(update)
        for sid in done.released:
            for fut in self._close_waiters.pop(sid, []):
                if not fut.done():
                    fut.set_result(None)
        if done.stats is not None:
            for listener in self.step_listeners:
                listener(done.stats)
