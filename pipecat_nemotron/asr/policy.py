"""The scheduler's policy: which work a step takes, and what its results do. Synchronous, no torch, no I/O.

:meth:`SchedulerPolicy.plan` turns the open streams into a :class:`~.step_plan.StepPlan`;
:meth:`SchedulerPolicy.resolve` applies a :class:`~.step_plan.StepOutput` to the streams and returns what the
loop must deliver (:class:`~.step_plan.Resolution`). Joins, leaves, finalizes and setting changes reach the
policy only between the two (the loop in :mod:`~pipecat_nemotron.asr.scheduler` awaits each step), so it
needs no lock and can be driven step by step by a test with a fake model.

The rules:

- **Fairness**: every stream with a ready chunk is a candidate; the ``max_batch_size`` oldest (by the time
  their audio, finalize or peek arrived) run, so no stream waits behind newer work.
- **Mode mixing**: one step runs one batched forward per (latency mode, first chunk or not, chunk length).
- **Finalize**: a pending final is a boundary: the chunks before it first, then one flush of the rest (or no
  model work at all when nothing is left); the next utterance starts at the boundary.
- **Peek**: like a final that does not end the utterance (a flush on copies of the caches, answered alone).
- **End of utterance**: a model's ``<EOU>`` (:mod:`~pipecat_nemotron.asr.eou`) becomes an ``eou`` record after
  the step's partial, for streams that asked; it ends nothing (``finalize()`` does).
- **Release**: a closed stream leaves at once; its slot is freed by the next step, and its ``close()``
  returns after that step (a step already running may still hold the stream's old slot).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

import numpy as np
from loguru import logger

from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.asr.boosting import BoostList
from pipecat_nemotron.asr.changes import apply_pending, request_change
from pipecat_nemotron.asr.errors import StreamClosedError, StreamFailedError
from pipecat_nemotron.asr.features import FeatureCursor
from pipecat_nemotron.asr.splits import choose_split, split_utterance
from pipecat_nemotron.asr.state import PendingPeek, StreamState
from pipecat_nemotron.asr.step_plan import (
    ItemOutput,
    Resolution,
    StepGroup,
    StepItem,
    StepOutput,
    StepPlan,
    StepStats,
    StreamEntry,
)
from pipecat_nemotron.asr.transcripts import TextModel, eou_update, final_update, partial_update, peek_record
from pipecat_nemotron.asr.types import Transcript
from pipecat_nemotron.asr.words import TokenTrace


class Frontend(Protocol):
    """Chunk geometry of the feature frontend (:class:`~pipecat_nemotron.asr.features.MelFrontend`)."""

    @property
    def hop(self) -> int:
        """Samples per mel frame."""
        ...

    def samples_needed(self, next_frame: int, num_frames: int) -> int:
        """Segment samples that must have arrived before frames ``[next_frame, next_frame+num_frames)`` exist."""
        ...

    def frames_available(self, end_sample: int) -> int:
        """Frames of a segment that ends at ``end_sample``."""
        ...

    def chunk_segment(self, cursor: FeatureCursor, num_frames: int) -> np.ndarray:
        """Audio for the cursor's next ``num_frames`` frames."""
        ...

    def final_segment(self, cursor: FeatureCursor, end_sample: int) -> tuple[np.ndarray, int]:
        """Audio and frame count of the frames left when the segment ends at ``end_sample``."""
        ...

    def advance(self, cursor: FeatureCursor, num_frames: int) -> None:
        """Mark ``num_frames`` frames consumed."""
        ...


class StepModel(TextModel, Protocol):
    """What the policy reads from the model runner: chunk geometry, text and words (never the weights)."""

    @property
    def frontend(self) -> Frontend:
        """The feature frontend."""
        ...

    def chunk_frames(self, state: StreamState) -> int:
        """Mel frames the stream's next regular chunk needs."""
        ...


def fail_requests(state: StreamState, error: BaseException) -> None:
    """Fail the stream's pending finalize and peek requests with ``error`` and forget them."""
    for pending in (*state.finals, *state.peeks):
        if pending.future is not None and not pending.future.done():
            pending.future.set_exception(error)
    state.finals.clear()
    state.peeks.clear()


def apply_output(state: StreamState, out: ItemOutput, *, peek: bool) -> None:
    """Write one step's output into its stream: the one place the results of a model step change stream state.

    The worker thread only reads stream state; this runs on the loop, between steps (vLLM's
    ``update_from_output``).

    Args:
        state: The stream.
        out: Its item's output (without an error).
        peek: The item was a peek: only the decoder's boosting-tree binding carries over.

    """
    state.dec_state = out.dec_state
    if peek:
        return
    state.encoder_started = True
    state.decoded_frames = out.decoded_frames
    if out.utterance is not None:
        state.tokens, state.text = out.utterance.tokens, out.utterance.text
        state.trace, state.words = out.utterance.trace, out.utterance.words
    if out.evidence is not None:
        state.evidence = out.evidence
    if out.detected_language is not None:
        state.detected_language = out.detected_language


def settle(state: StreamState) -> None:
    """Wake whoever waits for the stream's chunk in flight to be delivered (``ASRStream.settled``)."""
    waiters, state.step_waiters = state.step_waiters, []
    for fut in waiters:
        if not fut.done():
            fut.set_result(None)


def end_stream(entry: StreamEntry, requests_error: BaseException, error: BaseException | None) -> None:
    """The one way a stream ends: fail its pending requests, mark it closed, end its updates with ``error``."""
    fail_requests(entry.state, requests_error)
    entry.state.closed = True
    settle(entry.state)
    entry.end(error)


class SchedulerPolicy:
    """Continuous batching over all open streams of one engine, one step at a time.

    Args:
        model: Chunk geometry, text and words of the loaded model.
        max_batch_size: Most chunks per step.
        hard_reset: Reset caches and decoder state after each final (``finalize_mode="hard"``).
        max_utterance_s: Longest utterance, seconds: a longer one is split (:mod:`~pipecat_nemotron.asr.splits`);
            None: no limit.

    """

    def __init__(
        self,
        model: StepModel,
        max_batch_size: int,
        hard_reset: bool,
        max_utterance_s: float | None = None,
    ) -> None:
        self.model = model
        self.max_batch_size = max_batch_size
        self.hard_reset = hard_reset
        #: Longest utterance in mel frames (None: unbounded).
        self.max_utterance_frames = (
            None if max_utterance_s is None else int(max_utterance_s * MODEL_SAMPLE_RATE) // model.frontend.hop
        )
        #: Open streams by id.
        self.streams: dict[int, StreamEntry] = {}
        #: Closed streams whose slots the next step frees, in closing order (a dict as an ordered set).
        self.closing: dict[int, None] = {}
        #: Open streams whose slots the next step zeroes (a hard-mode decode restart).
        self.resets: set[int] = set()
        #: Steps that ran a forward.
        self.steps = 0
        #: Recent time-to-final values, ms (warm-up included), for ``NemotronEngine.finalize_ms_percentile``.
        self.recent_ttf_ms: deque[float] = deque(maxlen=512)

    # ---- joins, leaves and changes (between steps) -----------------------------------------------------

    def add(
        self,
        state: StreamState,
        push: Callable[[Transcript], None],
        end: Callable[[BaseException | None], None],
    ) -> None:
        """Register a stream (its slot is taken on its first step)."""
        self.streams[state.stream_id] = StreamEntry(state, push, end)

    def release(self, state: StreamState, error: BaseException | None = None) -> None:
        """Close a stream: fail its pending requests, end its updates, free its slot in the next step.

        The stream stops counting as open at once, so a new stream may open in its place right away: the
        runner zeroes the old slot at the start of the next step, before that step's forwards assign slots to
        new streams. Idempotent: a second release only fails requests made since (there are none once closed).
        """
        entry = self.streams.pop(state.stream_id, None)
        if error is not None and state.error is None:
            state.error = error
        requests_error = (
            StreamFailedError(f"stream {state.stream_id} failed: {error}")
            if error is not None
            else StreamClosedError(f"stream {state.stream_id} was closed before its final")
        )
        if entry is None:  # already released
            state.closed = True
            fail_requests(state, requests_error)
            return
        end_stream(entry, requests_error, state.error if error is not None else None)
        self.closing[state.stream_id] = None

    def end_all(self, error: BaseException) -> list[int]:
        """End every stream with ``error`` (no step will run again); returns the ids still waiting to close."""
        for entry in list(self.streams.values()):
            end_stream(entry, error, None)
        self.streams.clear()
        closing, self.closing = list(self.closing), {}
        return closing

    def crash(self, error: BaseException) -> None:
        """Fail every open stream with ``error``: the scheduler itself failed."""
        crash = StreamFailedError(f"ASR scheduler crashed: {error!r}")
        for entry in list(self.streams.values()):
            end_stream(entry, crash, crash)

    def request(
        self,
        state: StreamState,
        latency_ms: int | None = None,
        language: tuple[str | None, int | None] | None = None,
        boost: BoostList | None = None,
    ) -> bool:
        """Record a mode, language or boost-list change (:mod:`~.changes`) and apply it if it may apply now.

        Returns:
            True if a step is due (the decode restarts, which needs the slot zeroed).

        """
        request_change(state, latency_ms=latency_ms, language=language, boost=boost)
        return self._apply_pending(state)

    def _apply_pending(self, state: StreamState) -> bool:
        """Apply the stream's pending change if it may apply now (between steps, or off the running step)."""
        if apply_pending(state, self.model.frontend.hop, self.hard_reset):
            self.resets.add(state.stream_id)
            return True
        return False

    # ---- plan ---------------------------------------------------------------------------------------------

    def plan(self) -> StepPlan:
        """Pick this step's work and mark its streams in flight."""
        closing = list(self.closing)
        releases = closing + sorted(self.resets - set(closing))
        self.resets.clear()
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
                self.model.frontend.advance(it.state.cursor, it.num_frames)
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
        frontend = self.model.frontend
        limit, at_boundary = state.segment_limit()
        peek = self._next_peek(state)
        if peek is not None:
            limit = peek.boundary - state.segment_origin
        frames = self.model.chunk_frames(state)
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
            elif self.model.frontend.frames_available(peek.boundary - state.segment_origin) > (
                state.cursor.next_frame
            ):
                return peek
            else:  # every frame it covers is decoded: the text so far is the answer
                self._finish_peek(state, [], time.monotonic())
        return None

    def _finish_peek(self, state: StreamState, new_tokens: list[int], now: float) -> None:
        """Answer the stream's first pending peek: its tokens so far plus the peek flush's ``new_tokens``."""
        pending = state.peeks.popleft()
        if not pending.future.done():
            pending.future.set_result(peek_record(state, pending, new_tokens, now, self.model))

    # ---- resolve ------------------------------------------------------------------------------------------

    def resolve(self, plan: StepPlan, output: StepOutput) -> Resolution:
        """Apply a step's output: deliver partials, finals and peeks; finish what needed no model step."""
        now = time.monotonic()
        for sid in plan.closing:  # not plan.releases: see StepPlan.closing
            self.closing.pop(sid, None)
        done = Resolution(released=list(plan.closing))
        queue_max = 0.0
        finals = 0
        for it in plan.items:
            queue_ms = self._deliver(it, output.of(it), now, output.step_ms, done)
            if queue_ms is not None:
                queue_max = max(queue_max, queue_ms)
                finals += 1 if it.final else 0
                finals += self._split_if_long(it.state, done)
            self._apply_pending(it.state)
            settle(it.state)
        for state in plan.immediate:
            entry = self.streams.get(state.stream_id)
            if entry is not None and not state.closed:
                if state.stream_id in output.detected_languages:
                    state.detected_language = output.detected_languages[state.stream_id]
                self._finish_utterance(entry, now, 0.0, done)
                finals += 1
        if plan.items:
            self.steps += 1
            modes = plan.latency_modes
            done.stats = StepStats(
                output.step_ms, len(plan.items), len(modes), queue_max, len(self.streams), finals, modes
            )
        return done

    def _deliver(
        self, it: StepItem, out: ItemOutput, now: float, step_ms: float, done: Resolution
    ) -> float | None:
        """Hand one item's result to its stream: a partial, or its final. Returns its queue time, ms.

        Returns None (nothing delivered) if the stream was closed meanwhile or its forward failed (then the
        stream is failed alone).
        """
        state = it.state
        state.in_flight = False
        entry = self.streams.get(state.stream_id)
        if entry is None or state.closed:
            return None
        if out.error is not None:
            logger.error(f"ASR stream {state.stream_id} failed in a model step: {out.error!r}")
            self.release(state, StreamFailedError(f"model step failed: {out.error!r}"))
            return None
        queue_ms = max(0.0, (now - it.ready_at) * 1000.0 - step_ms)
        apply_output(state, out, peek=it.peek)
        if it.peek:
            self._finish_peek(state, out.tokens, now)
            return queue_ms
        state.audio_seconds += it.num_frames * self.model.frontend.hop / MODEL_SAMPLE_RATE
        if out.tokens and not it.final:
            done.updates.append((entry, partial_update(state, queue_ms, step_ms, (now - it.ready_at) * 1000.0)))
        if out.eou_frame is not None and state.eou:  # the model's own end of utterance, before the step's final
            end = state.finals[0].boundary if it.final else None
            done.updates.append((entry, eou_update(state, out.eou_frame, self.model.frontend.hop, step_ms, end)))
        if it.final:
            self._finish_utterance(entry, now, step_ms, done)
        return queue_ms

    def _finish_utterance(self, entry: StreamEntry, now: float, step_ms: float, done: Resolution) -> None:
        """End the stream's current utterance at its first pending final's boundary; start the next one."""
        state = entry.state
        pending = state.finals.popleft()
        ttf_ms = (now - pending.requested_at) * 1000.0
        self.recent_ttf_ms.append(ttf_ms)
        final = final_update(state, pending, ttf_ms, step_ms, self.model)
        done.updates.append((entry, final))
        # The next utterance starts a new feature segment at the boundary.
        state.cursor = state.cursor.split_at(pending.boundary - state.segment_origin)
        state.segment_origin = state.utterance_origin = pending.boundary
        state.tokens = []
        state.text = ""
        state.trace = TokenTrace()
        state.words = ()
        state.utterance_frames = 0
        state.utterance_index += 1
        state.evidence = None
        state.detected_language = None
        if self.hard_reset:
            state.encoder_started = False
            state.dec_state = None
            self.resets.add(state.stream_id)
        self._apply_pending(state)
        if pending.future is not None and not pending.future.done():
            pending.future.set_result(final)

    def _split_if_long(self, state: StreamState, done: Resolution) -> int:
        """Split the stream's utterance if it reached ``max_utterance_s`` (:mod:`~.splits`); 1 if it did."""
        entry = self.streams.get(state.stream_id)
        if self.max_utterance_frames is None or entry is None or state.closed:
            return 0
        hop = self.model.frontend.hop
        decoded = state.cursor.next_frame + (state.segment_origin - state.utterance_origin) // hop
        split = choose_split(
            state.tokens,
            state.trace.frames,
            self.model.aligner.starts_word,
            decoded,
            self.max_utterance_frames,
        )
        if split is None:
            return 0
        done.updates.append((entry, split_utterance(state, split, self.model, hop)))
        return 1
