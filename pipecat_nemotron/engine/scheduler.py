"""The one task that owns the model: plan a step, run it off the loop, deliver its results.

Between steps (and only then) the scheduler applies joins, leaves, finalizes and latency changes. While a
step runs on the worker thread, the event loop keeps accepting audio; that audio is picked up by the next step.

One turn of the loop hands typed objects along, as vLLM's engine core does between schedule, execute and
update: :meth:`Scheduler._plan` turns the open :class:`StreamEntry` objects into a :class:`StepPlan` (on the
loop), :meth:`Scheduler._execute` runs the plan's groups through :meth:`ModelRunner.run_step` (on the worker
thread), and :meth:`Scheduler._resolve` delivers the plan's results to the streams (on the loop).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from loguru import logger

from pipecat_nemotron.engine.audio import MODEL_SAMPLE_RATE, SAMPLES_PER_MS
from pipecat_nemotron.engine.changes import apply_pending, request_change
from pipecat_nemotron.engine.errors import StreamClosedError, StreamFailedError
from pipecat_nemotron.engine.runner import ModelRunner, StepGroup, StepItem
from pipecat_nemotron.engine.splits import choose_split, split_utterance
from pipecat_nemotron.engine.state import PendingPeek, StreamState
from pipecat_nemotron.engine.step_plan import StepPlan, StepStats, StreamEntry
from pipecat_nemotron.engine.types import FinalTranscript, PeekTranscript, TranscriptUpdate
from pipecat_nemotron.engine.words import utterance_confidence


def _fail_finals(state: StreamState, error: BaseException) -> None:
    """Fail the stream's pending finalize and peek requests with ``error`` and forget them."""
    for pending in (*state.finals, *state.peeks):
        if not pending.future.done():
            pending.future.set_exception(error)
    state.finals.clear()
    state.peeks.clear()


class Scheduler:
    """Continuous batching over all open streams of one engine.

    Args:
        runner: The model runner (used only from ``executor``'s single thread).
        executor: A single-thread executor; every model call happens there.
        max_batch_size: Most chunks per step.
        hard_reset: Reset caches and decoder state after each final (``finalize_mode="hard"``).
        max_utterance_s: Longest utterance, seconds: a longer one is split (:mod:`~pipecat_nemotron.engine.splits`);
            None: no limit.

    """

    def __init__(
        self,
        runner: ModelRunner,
        executor: ThreadPoolExecutor,
        max_batch_size: int,
        hard_reset: bool,
        max_utterance_s: float | None = None,
    ) -> None:
        self.runner = runner
        self.executor = executor
        self.max_batch_size = max_batch_size
        self.hard_reset = hard_reset
        hop = runner.frontend.hop
        #: Longest utterance in mel frames (None: unbounded).
        self.max_utterance_frames = (
            None if max_utterance_s is None else int(max_utterance_s * MODEL_SAMPLE_RATE) // hop
        )
        #: Open streams by id.
        self.streams: dict[int, StreamEntry] = {}
        self.step_listeners: list[Callable[[StepStats], None]] = []
        self._wake = asyncio.Event()
        self._pending_releases: dict[int, list[asyncio.Future[None]]] = {}
        self._reset_slots: set[int] = set()
        self._task: asyncio.Task[None] | None = None
        self.steps = 0
        #: Recent time-to-final values, ms (warm-up included), for ``NemotronEngine.finalize_ms_percentile``.
        self.recent_ttf_ms: deque[float] = deque(maxlen=512)
        self.error: BaseException | None = None

    # ---- control, called from the event loop ---------------------------------------------------------------

    def start(self) -> None:
        """Start the scheduler task."""
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="nemotron-asr-scheduler")

    async def stop(self) -> None:
        """Stop the task; fail whatever is still pending."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._end_all(StreamClosedError("the engine was stopped"))

    def _end_all(self, error: BaseException) -> None:
        """End every stream with ``error`` and resolve every pending release: no step will run again."""
        for entry in list(self.streams.values()):
            self._end(entry, error, None)
        self.streams.clear()
        for futures in self._pending_releases.values():
            for fut in futures:
                if not fut.done():
                    fut.set_result(None)
        self._pending_releases.clear()

    def wake(self) -> None:
        """Tell the scheduler there may be work."""
        self._wake.set()

    def add(
        self,
        state: StreamState,
        push: Callable[[TranscriptUpdate], None],
        end: Callable[[BaseException | None], None],
    ) -> None:
        """Register a stream (its slot is taken on its first step)."""
        self.streams[state.stream_id] = StreamEntry(state, push, end)

    def release(self, state: StreamState, error: BaseException | None = None) -> asyncio.Future[None]:
        """Close a stream: fail its pending finals, end its updates, free its slot before the next step.

        The stream stops counting as open at once (``streams`` no longer holds it), so a new stream may open
        in its place right away: the runner zeroes the old cache slot at the start of the next step, before
        that step's forward assigns slots to new streams. The returned future resolves once that has happened.
        """
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = self.streams.pop(state.stream_id, None)
        if error is not None and state.error is None:
            state.error = error
        finals_error = (
            StreamFailedError(f"stream {state.stream_id} failed: {error}")
            if error is not None
            else StreamClosedError(f"stream {state.stream_id} was closed before its final")
        )
        if entry is None:  # already released: resolve with that release
            state.closed = True
            _fail_finals(state, finals_error)
            if state.stream_id in self._pending_releases:
                self._pending_releases[state.stream_id].append(fut)
            else:
                fut.set_result(None)
            return fut
        self._end(entry, finals_error, state.error if error is not None else None)
        if self._task is None or self._task.done():  # no step will free the slot: nothing waits for one
            fut.set_result(None)
            return fut
        self._pending_releases.setdefault(state.stream_id, []).append(fut)
        self._wake.set()
        return fut

    def request_language(self, state: StreamState, language: str | None, prompt_index: int | None) -> None:
        """Change a stream's language from its first utterance without a word (:mod:`~.changes`)."""
        request_change(state, language=(language, prompt_index))
        self._apply_pending(state)

    def request_latency(self, state: StreamState, latency_ms: int) -> None:
        """Change a stream's mode from its first utterance without a word (:mod:`~.changes`)."""
        request_change(state, latency_ms=latency_ms)
        self._apply_pending(state)

    def _apply_pending(self, state: StreamState) -> None:
        """Apply the stream's pending change if it may apply now (between steps, or off the running step)."""
        if apply_pending(state, self.runner.frontend.hop, self.hard_reset):
            self._reset_slots.add(state.stream_id)
            self._wake.set()

    @staticmethod
    def _settle(state: StreamState) -> None:
        """Wake whoever waits for the stream's chunk in flight to be delivered (``ASRStream.settled``)."""
        waiters, state.step_waiters = state.step_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    @staticmethod
    def _end(entry: StreamEntry, finals_error: BaseException, error: BaseException | None) -> None:
        """The one way a stream ends: fail its pending finals, mark it closed, end its updates with ``error``."""
        _fail_finals(entry.state, finals_error)
        entry.state.closed = True
        Scheduler._settle(entry.state)
        entry.end(error)

    # ---- the loop ----------------------------------------------------------------------------------------

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while not (plan := self._plan()).empty:
                    step_ms = 0.0
                    if plan.runs_model:
                        step_ms = await loop.run_in_executor(self.executor, self._execute, plan)
                    self._resolve(plan, step_ms)
                    # Let pushes and other tasks run between steps, even under sustained load.
                    await asyncio.sleep(0)
        except asyncio.CancelledError:
            # Cancelled without stop() (the event loop is shutting down, e.g. asyncio.run after an error):
            # streams still closing wait on releases only this task resolves.
            self._end_all(
                StreamClosedError("the engine's scheduler was cancelled; the engine is not running")
            )
            raise
        except BaseException as e:  # a bug in the scheduler itself: fail every stream loudly
            logger.exception(f"ASR scheduler crashed: {e!r}")
            self.error = e
            crash = StreamFailedError(f"ASR scheduler crashed: {e!r}")
            for entry in list(self.streams.values()):
                self._end(entry, crash, crash)
            raise

    def _plan(self) -> StepPlan:
        """Pick this step's work. Runs on the loop, between steps."""
        closing = list(self._pending_releases)
        releases = closing + sorted(self._reset_slots - set(closing))
        self._reset_slots.clear()
        candidates: list[StepItem] = []
        immediate: list[StreamState] = []
        for entry in self.streams.values():
            if entry.state.closed:
                continue
            item = self._next_item(entry.state)
            if isinstance(item, StepItem):
                candidates.append(item)
            elif item is not None:
                immediate.append(item)
        candidates.sort(key=lambda it: it.ready_at)
        items = candidates[: self.max_batch_size]
        by_key: dict[tuple[int, bool, int], list[StepItem]] = {}
        for it in items:
            if not it.peek:  # a peek reads the audio without consuming it
                self.runner.frontend.advance(it.state.cursor, it.num_frames)
                it.state.utterance_frames += it.num_frames
            it.state.in_flight = True
            by_key.setdefault((it.state.latency_ms, it.first, it.num_frames), []).append(it)
        groups = [StepGroup(key[0], group) for key, group in by_key.items()]
        return StepPlan(items, groups, immediate, releases, closing)

    def _next_item(self, state: StreamState) -> StepItem | StreamState | None:
        """The stream's next chunk if its audio is ready; the stream itself if a final needs no model step.

        A pending peek acts as a boundary that does not end the utterance: the chunks before it come first, then
        one flush of the rest on copies of the stream's caches (a peek item), then decoding goes on as before.
        """
        frontend = self.runner.frontend
        limit, at_boundary = state.segment_limit()
        peek = self._next_peek(state)
        if peek is not None:
            limit = peek.boundary - state.segment_origin
        frames = self.runner.chunk_frames(state)
        need = frontend.samples_needed(state.cursor.next_frame, frames)
        first = not state.encoder_started
        # Token frames count from the utterance's start (the feature segment may start later or earlier).
        start = state.cursor.next_frame + (state.segment_origin - state.utterance_origin) // frontend.hop
        if need <= limit:
            ready_at = state.arrival_time(state.segment_origin + need)
            segment = frontend.chunk_segment(state.cursor, frames)
            return StepItem(state, segment, frames, first, False, ready_at, start)
        if peek is not None:
            segment, frames = frontend.final_segment(state.cursor, limit)
            return StepItem(state, segment, frames, first, False, peek.requested_at, start, peek=True)
        if not at_boundary:
            return None
        segment, frames = frontend.final_segment(state.cursor, limit)
        if frames <= 0:
            return state
        return StepItem(state, segment, frames, first, True, state.finals[0].requested_at, start)

    def _next_peek(self, state: StreamState) -> PendingPeek | None:
        """The stream's first pending peek that needs a model step; peeks with nothing to flush are answered.

        A peek waits for the finals requested before it (it belongs to the utterance after them).
        """
        while state.peeks:
            peek = state.peeks[0]
            if peek.future.done():  # the caller stopped waiting
                state.peeks.popleft()
            elif peek.utterance != state.utterance_index:
                return None
            elif self.runner.frontend.frames_available(peek.boundary - state.segment_origin) > (
                state.cursor.next_frame
            ):
                return peek
            else:  # every frame it covers is decoded: the text so far is the answer
                self._finish_peek(state, [], time.monotonic())
        return None

    def _finish_peek(self, state: StreamState, new_tokens: list[int], now: float) -> None:
        """Answer the stream's first pending peek: its tokens so far plus the peek flush's ``new_tokens``."""
        pending = state.peeks.popleft()
        tokens = state.tokens + new_tokens
        if pending.future.done():
            return
        pending.future.set_result(
            PeekTranscript(
                text=self.runner.detokenize(tokens) if new_tokens else state.text,
                utterance=pending.utterance,
                audio_ms=(pending.boundary - state.utterance_origin) / SAMPLES_PER_MS,
                latency_ms=state.latency_ms,
                language=state.language,
                peek_ms=(now - pending.requested_at) * 1000.0,
                tokens=tuple(tokens),
            )
        )

    def _execute(self, plan: StepPlan) -> float:
        """Run the step on the worker thread and detokenise the streams whose tokens changed."""
        step_ms = self.runner.run_step(plan.groups, plan.releases)
        for state in plan.detections:
            self.runner.detect_final_language(state)
        for it in plan.items:
            if it.error is None and it.new_tokens and not it.peek:
                state = it.state
                state.tokens.extend(it.new_tokens)
                state.text = self.runner.detokenize(state.tokens)
                state.trace.extend(it.new_frames, it.new_confidence)
                state.words = self.runner.aligner.words(
                    state.tokens, state.trace, state.utterance_origin / SAMPLES_PER_MS
                )
        return step_ms

    def _resolve(self, plan: StepPlan, step_ms: float) -> None:
        """Deliver results and apply what happens between steps. Runs on the loop."""
        now = time.monotonic()
        for sid in plan.closing:  # not plan.releases: see StepPlan.closing
            for fut in self._pending_releases.pop(sid, []):
                if not fut.done():
                    fut.set_result(None)
        queue_max = 0.0
        finals = 0
        for it in plan.items:
            queue_ms = self._deliver(it, now, step_ms)
            if queue_ms is not None:
                queue_max = max(queue_max, queue_ms)
                finals += 1 if it.final else 0
                finals += self._split_if_long(it.state)
            self._apply_pending(it.state)
            self._settle(it.state)
        for state in plan.immediate:
            entry = self.streams.get(state.stream_id)
            if entry is not None and not state.closed:
                self._finish_utterance(entry, now, 0.0)
                finals += 1
        if plan.items:
            self.steps += 1
            modes = plan.latency_modes
            stats = StepStats(
                step_ms, len(plan.items), len(modes), queue_max, len(self.streams), finals, modes
            )
            for listener in self.step_listeners:
                listener(stats)

    def _deliver(self, it: StepItem, now: float, step_ms: float) -> float | None:
        """Hand one item's result to its stream: a partial, or its final. Returns its queue time, ms.

        Returns None (nothing delivered) if the stream was closed meanwhile or its forward failed (then the
        stream is failed alone).
        """
        state = it.state
        state.in_flight = False
        entry = self.streams.get(state.stream_id)
        if entry is None or state.closed:
            return None
        if it.error is not None:
            logger.error(f"ASR stream {state.stream_id} failed in a model step: {it.error!r}")
            self.release(state, StreamFailedError(f"model step failed: {it.error!r}"))
            return None
        queue_ms = max(0.0, (now - it.ready_at) * 1000.0 - step_ms)
        if it.peek:
            self._finish_peek(state, it.new_tokens, now)
            return queue_ms
        hop_s = self.runner.frontend.hop / MODEL_SAMPLE_RATE
        state.audio_seconds += it.num_frames * hop_s
        if it.new_tokens and not it.final:
            entry.push(
                TranscriptUpdate(
                    text=state.text,
                    is_final=False,
                    utterance=state.utterance_index,
                    latency_ms=state.latency_ms,
                    language=state.language,
                    queue_ms=queue_ms,
                    step_ms=step_ms,
                    lag_ms=(now - it.ready_at) * 1000.0,
                    words=state.words,
                    confidence=utterance_confidence(state.words),
                    start_ms=state.utterance_origin / SAMPLES_PER_MS,
                )
            )
        if it.final:
            self._finish_utterance(entry, now, step_ms)
        return queue_ms

    def _finish_utterance(self, entry: StreamEntry, now: float, step_ms: float) -> None:
        state = entry.state
        pending = state.finals.popleft()
        ttf_ms = (now - pending.requested_at) * 1000.0
        self.recent_ttf_ms.append(ttf_ms)
        boundary_rel = pending.boundary - state.segment_origin
        audio_ms = (pending.boundary - state.utterance_origin) / SAMPLES_PER_MS
        utterance = state.utterance_index
        start_ms = state.utterance_origin / SAMPLES_PER_MS
        words = self.runner.aligner.words(state.tokens, state.trace, start_ms, audio_ms)
        confidence = utterance_confidence(words)
        final = FinalTranscript(
            text=state.text,
            ttf_ms=ttf_ms,
            audio_ms=audio_ms,
            utterance=utterance,
            latency_ms=state.latency_ms,
            language=state.language,
            detected_language=state.detected_language,
            tokens=tuple(state.tokens),
            words=words,
            confidence=confidence,
            start_ms=start_ms,
        )
        entry.push(
            TranscriptUpdate(
                text=state.text,
                is_final=True,
                utterance=utterance,
                latency_ms=state.latency_ms,
                language=state.language,
                detected_language=state.detected_language,
                step_ms=step_ms,
                ttf_ms=ttf_ms,
                words=words,
                confidence=confidence,
                start_ms=start_ms,
                audio_ms=audio_ms,
                tokens=tuple(state.tokens),
            )
        )
        # The next utterance starts a new feature segment at the boundary.
        state.cursor = state.cursor.split_at(boundary_rel)
        state.segment_origin = state.utterance_origin = pending.boundary
        state.tokens = []
        state.text = ""
        state.trace.reset()
        state.words = ()
        state.utterance_frames = 0
        state.utterance_index = utterance + 1
        state.evidence = None
        state.detected_language = None
        if self.hard_reset:
            state.encoder_started = False
            state.dec_state = None
            self._reset_slots.add(state.stream_id)
        self._apply_pending(state)
        if not pending.future.done():
            pending.future.set_result(final)
        if state.cursor.end:
            self._wake.set()

    def _split_if_long(self, state: StreamState) -> int:
        """Split the stream's utterance if it reached ``max_utterance_s`` (:mod:`~.splits`); 1 if it did."""
        entry = self.streams.get(state.stream_id)
        if self.max_utterance_frames is None or entry is None or state.closed:
            return 0
        hop = self.runner.frontend.hop
        decoded = state.cursor.next_frame + (state.segment_origin - state.utterance_origin) // hop
        split = choose_split(
            state.tokens,
            state.trace.frames,
            self.runner.aligner.starts_word,
            decoded,
            self.max_utterance_frames,
        )
        if split is None:
            return 0
        entry.push(split_utterance(state, split, self.runner))
        return 1
