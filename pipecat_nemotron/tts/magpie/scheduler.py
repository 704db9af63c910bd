"""The worker of a Magpie engine: the one thread that runs the model, one turn at a time.

A turn hands typed objects along, as the ASR's scheduler does (:mod:`pipecat_nemotron.asr.scheduler`): the policy
(:class:`~pipecat_nemotron.tts.magpie.policy.MagpiePolicy`, synchronous, no torch) plans a
:class:`~pipecat_nemotron.tts.magpie.policy.StepPlan`; the worker executes it on the model runner (free the leaving
rows; open the joiners, or prefill the starting rows and run one decoder step); the policy resolves the step's
outcome and names the requests whose audio is due; the worker decodes their audio in one codec call and hands it,
and the ends, to the callers' :class:`~pipecat_nemotron.tts.magpie.stream.SynthesisStream` handles.

Requests reach the policy only between turns: :meth:`MagpieScheduler.submit` (any thread) queues them, and the
worker moves them in before each plan. The runner is :class:`~pipecat_nemotron.tts.magpie.runner.MagpieRunner` (the
fast step), :class:`~pipecat_nemotron.tts.magpie.fake_runner.FakeRunner` (tests), or, for ``step="nemo"``,
:class:`~pipecat_nemotron.tts.magpie.nemo_step.NemoStep`, which runs each admitted request to its end in NeMo's own
loop (the policy then admits one at a time).

Every wait ends: a stopped worker (closed, or dead of an error of its own) cancels or fails every request it holds and
every one queued, and refuses new ones.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
from loguru import logger

from pipecat_nemotron.tts.magpie.errors import MagpieEngineError
from pipecat_nemotron.tts.magpie.policy import MagpiePolicy, StepPlan
from pipecat_nemotron.tts.magpie.stream import AudioChunk, Synthesis, SynthesisStream

__all__ = ["MagpieScheduler", "StepRunner", "WholeRunner"]


class StepRunner(Protocol):
    """The model side of the fast step, keyed by request id (:class:`~.runner.MagpieRunner`)."""

    sample_rate: int
    samples_per_frame: int
    max_row_steps: int

    def open(self, synthesis: Synthesis) -> int:
        """Split the request's text into token chunks; return how many."""
        ...

    def prefill(self, starting: Sequence[Synthesis]) -> None:
        """Start each request's ``text_chunk`` in a new row, in one batched call (raises: none started)."""
        ...

    def step(self) -> set[int]:
        """One decoder step for every row; the ids whose row ended at end of speech (no frame kept)."""
        ...

    def decode(self, request_ids: Sequence[int]) -> list[np.ndarray | None]:
        """Each request's audio of the frames not yet decoded, in one codec call."""
        ...

    def remove(self, request_id: int) -> None:
        """Forget a request and free its row (idempotent)."""
        ...

    def reset(self) -> None:
        """Drop every row (after a failed step)."""
        ...


class WholeRunner(Protocol):
    """A runner that takes each request to its end in one call (:class:`~.nemo_step.NemoStep`)."""

    sample_rate: int
    samples_per_frame: int

    def synthesize(self, synthesis: Synthesis, deliver: Callable[[Synthesis, np.ndarray | None], None]) -> None:
        """Run the request to its end, handing out its audio; set ``synthesis.ending`` (raises: it failed)."""
        ...


class MagpieScheduler:
    """Queues requests from any thread; serves them on the engine's worker thread, one turn at a time.

    Args:
        name: The engine, for log lines.
        max_batch: Requests decoded together on the fast step.

    """

    def __init__(self, name: str, max_batch: int) -> None:
        self.name = name
        self.max_batch = max_batch
        self.policy: MagpiePolicy | None = None
        self.runner: StepRunner | None = None
        self.whole: WholeRunner | None = None
        #: Decoder steps run.
        self.steps = 0
        #: Batched prefill calls (one per group of rows starting a text chunk).
        self.prefills = 0
        self._jobs: queue.Queue[SynthesisStream | None] = queue.Queue()
        # Orders submit() against close() and the worker's stop, so nothing is queued that no one will serve.
        self._lock = threading.Lock()
        self._closing = False
        self._stopped = False
        #: Handles of the requests in the policy, by id.
        self._streams: dict[int, SynthesisStream] = {}

    # ---- any thread -------------------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closing

    @property
    def stopped(self) -> bool:
        """Whether the worker has stopped serving (after :meth:`close`, or an error of its own): nothing more runs."""
        return self._stopped

    @property
    def pending(self) -> int:
        """Requests waiting for a row (queued, or in the policy's waiting line)."""
        return self._jobs.qsize() + (len(self.policy.waiting) if self.policy is not None else 0)

    @property
    def active(self) -> int:
        """Requests being synthesised now."""
        return len(self.policy.active) if self.policy is not None else 0

    def submit(self, stream: SynthesisStream) -> None:
        """Queue a request (thread-safe, never blocks).

        Raises:
            MagpieEngineError: The engine is closed, or its worker stopped.

        """
        with self._lock:
            if self._closing or self._stopped:
                raise MagpieEngineError(f"{self.name} is closed" if self._closing else f"{self.name} stopped")
            self._jobs.put(stream)

    def close(self) -> None:
        """Refuse new requests and tell the worker to stop: it cancels every request at its next step boundary."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._jobs.put(None)
        policy = self.policy
        if policy is not None:  # The running ones stop at their next frame (NeMo's step checks in its frame hook).
            for synthesis in [*policy.active]:  # A copy: the worker may be changing the list.
                synthesis.cancelled = True

    # ---- the worker thread ------------------------------------------------------------------------------------

    def bind(self, runner: StepRunner) -> None:
        """Serve with the fast step's ``runner``: up to ``max_batch`` requests per step."""
        self.runner = runner
        self.policy = MagpiePolicy(self.max_batch, runner.max_row_steps, runner.sample_rate, runner.samples_per_frame)

    def bind_whole(self, runner: WholeRunner) -> None:
        """Serve with NeMo's step: one request at a time, each to its end."""
        self.whole = runner
        self.policy = MagpiePolicy(1, 0, runner.sample_rate, runner.samples_per_frame)

    def run_alone(self, stream: SynthesisStream) -> None:
        """Serve ``stream`` alone to its end, on this thread (the warm-up, before :meth:`serve`; queued ones wait)."""
        self._admit(stream)
        while not stream.done and self.turn():
            pass

    def serve(self) -> None:
        """Serve requests until :meth:`close`; then cancel whatever is left. Every request ends, whatever happens.

        Blocks while there is nothing to do; requests join between turns (:meth:`pull`).
        """
        try:
            while not self.pull(block=self._policy().idle):
                self.turn()
        finally:
            self.stop(MagpieEngineError(f"{self.name}: the worker stopped"))

    def refuse(self, error: BaseException) -> None:
        """Fail every request until :meth:`close` (the model did not load)."""
        try:
            while True:
                stream = self._jobs.get()
                if stream is None:
                    break
                stream.finish("failed", error)
        finally:
            self.stop(error)

    def pull(self, *, block: bool = False) -> bool:
        """Move the queued requests into the policy (between turns); True when :meth:`close` was called.

        Args:
            block: Wait for the first one (the worker is idle).

        """
        while True:
            try:
                stream = self._jobs.get() if block else self._jobs.get_nowait()
            except queue.Empty:
                return False
            block = False
            if stream is None:
                return True
            self._admit(stream)

    def turn(self) -> bool:
        """One turn: plan, execute on the runner, resolve. Returns False when there was nothing to do."""
        policy = self._policy()
        plan = policy.plan()
        if plan.empty:
            return False
        try:
            self._end(plan.leaving)
            if plan.opening:
                self._open(plan.opening)
            elif plan.rows:
                self._step(plan)
        except Exception as e:  # A bug here must fail the requests, not leave them waiting forever.
            logger.opt(exception=e).error(f"{self.name}: the Magpie scheduler failed: {e}")
            policy.fail_all(e)
            if self.runner is not None:
                self.runner.reset()
        self._end(policy.leave_ended())
        return True

    def _policy(self) -> MagpiePolicy:
        if self.policy is None:
            raise RuntimeError("the scheduler has no runner: bind() one first")
        return self.policy

    def _admit(self, stream: SynthesisStream) -> None:
        self._streams[stream.id] = stream
        self._policy().submit(stream.synthesis)

    def _open(self, opening: list[Synthesis]) -> None:
        """Start the admitted requests: the fast step opens them (a later turn prefills them); NeMo's runs each."""
        policy = self._policy()
        for synthesis in opening:
            self._streams[synthesis.id].start()
            try:
                if self.whole is not None:
                    self.whole.synthesize(synthesis, self._deliver)
                    continue
                assert self.runner is not None
                policy.opened(synthesis, self.runner.open(synthesis))
            except Exception as e:
                logger.opt(exception=e).error(f"{self.name}: synthesis #{synthesis.id} failed: {e}")
                policy.fail(synthesis, e)

    def _step(self, plan: StepPlan) -> None:
        """Prefill the starting rows, run one decoder step, decode the audio that became due."""
        policy, runner = self._policy(), self.runner
        assert runner is not None
        if plan.starting:
            self.prefills += 1
            try:
                runner.prefill(plan.starting)
            except Exception as e:
                logger.opt(exception=e).error(f"{self.name}: starting {len(plan.starting)} syntheses failed: {e}")
                for synthesis in plan.starting:
                    policy.fail(synthesis, e)
        rows = [s for s in plan.rows if s.ending is None]
        if not rows:
            return
        try:
            ended = runner.step()
        except Exception as e:
            logger.opt(exception=e).error(f"{self.name}: a Magpie step failed for {len(rows)} requests: {e}")
            for synthesis in rows:
                policy.fail(synthesis, e)
            runner.reset()
            return
        self.steps += 1
        self._decode(policy.resolve(plan, ended))

    def _decode(self, due: list[Synthesis]) -> None:
        """Decode and hand out the due audio in one codec call; if it fails, one request at a time (failing alone)."""
        if not due:
            return
        runner = self.runner
        assert runner is not None
        try:
            audio: list[np.ndarray | None] | None = runner.decode([s.id for s in due])
        except Exception as e:
            logger.opt(exception=e).warning(f"{self.name}: a batched codec decode failed ({e}); one at a time")
            audio = None
        for index, synthesis in enumerate(due):
            try:
                chunk = audio[index] if audio is not None else runner.decode([synthesis.id])[0]
            except Exception as e:
                logger.opt(exception=e).error(f"{self.name}: decoding #{synthesis.id} failed: {e}")
                self._policy().fail(synthesis, e)
                continue
            self._deliver(synthesis, chunk)

    def _deliver(self, synthesis: Synthesis, audio: np.ndarray | None) -> None:
        """Hand one decoded chunk (None: nothing decoded) to the request's caller."""
        if audio is None:
            return
        frames = len(audio) // self._policy().samples_per_frame
        first = self._policy().emitted(synthesis, frames)
        chunk = AudioChunk(audio, self._policy().sample_rate, first, frames)
        self._streams[synthesis.id].emit(chunk)

    def _end(self, ended: list[Synthesis]) -> None:
        """Free the rows of requests that ended and end their streams."""
        for synthesis in ended:
            if self.runner is not None:
                try:
                    self.runner.remove(synthesis.id)
                except Exception as e:  # The row stays taken until a reset; the request still ends.
                    logger.opt(exception=e).error(f"{self.name}: freeing the row of #{synthesis.id} failed: {e}")
            stream = self._streams.pop(synthesis.id, None)
            if stream is None:
                continue
            if synthesis.ending == "truncated" and not synthesis.internal:
                logger.warning(
                    f"{self.name}: synthesis #{synthesis.id} stopped at "
                    f"max_duration_s={synthesis.options.max_duration_s} without the model ending the speech"
                )
            stream.finish(synthesis.ending or "failed", synthesis.error)

    def stop(self, error: BaseException) -> None:
        """No turn will run again (the worker is ending): refuse new requests; end every request held or queued.

        Closed: they end ``cancelled`` (the admitted ones leave through a last turn, freeing their rows). The worker
        ends for another reason (an error of its own): they end ``failed`` with ``error``. Idempotent.
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            closing = self._closing
        policy = self.policy
        if closing and policy is not None:
            policy.cancel_all()
            try:
                while not policy.idle and self.turn():
                    pass
            except BaseException as e:  # The runner is unusable: end the rest without it.
                logger.opt(exception=e).error(f"{self.name}: stopping failed: {e}")
        status, reason = ("cancelled", None) if closing else ("failed", error)
        for stream in list(self._streams.values()):
            if not stream.done:
                stream.finish(status, reason)
        self._streams.clear()
        while True:
            try:
                stream = self._jobs.get_nowait()
            except queue.Empty:
                break
            if stream is not None:
                stream.finish(status, reason)
