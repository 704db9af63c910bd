"""The typed objects one scheduler turn hands along: the plan of a step, what the model returned, the stats.

A turn is plan → execute → resolve (as vLLM's engine core goes schedule → execute → update): the policy
(:mod:`~pipecat_nemotron.asr.policy`) turns the open streams into a :class:`StepPlan`, the model runner
turns the plan's groups into a :class:`StepOutput`, and the policy resolves the plan with that output. Requests
and results are separate objects: the runner never writes into the plan. Plain data only: no torch here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pipecat_nemotron.asr.state import StreamState
from pipecat_nemotron.asr.types import Transcript, WordTiming
from pipecat_nemotron.asr.words import TokenTrace

if TYPE_CHECKING:  # torch-backed
    from pipecat_nemotron.asr.language_id import UtteranceEvidence


@dataclass(frozen=True)
class StepItem:
    """One stream's work in a step (a request: its result comes back as an :class:`ItemOutput`).

    Attributes:
        state: The stream.
        segment: Audio covering the chunk's frames (see :class:`~pipecat_nemotron.asr.features.MelFrontend`).
        num_frames: Mel frames of the chunk.
        first: The stream has no encoder context yet: no pre-encode cache, nothing dropped.
        final: The chunk ends an utterance (partial length allowed).
        ready_at: Monotonic time its audio had arrived (a final's or peek's: when it was requested).
        start_frame: Mel frame, counted from the utterance's start, where the chunk starts.
        peek: The chunk flushes the utterance for a peek, on copies (nothing is written back).

    """

    state: StreamState
    segment: np.ndarray
    num_frames: int
    first: bool
    final: bool
    ready_at: float
    start_frame: int = 0
    peek: bool = False


@dataclass
class StepGroup:
    """Items that share one batched forward: same mode, same chunk kind and length."""

    latency_ms: int
    items: list[StepItem]


@dataclass(frozen=True)
class UtteranceText:
    """The current utterance's text once a step's tokens are added (built on the worker thread).

    Attributes:
        tokens: Token ids of the utterance.
        text: Detokenised ``tokens``.
        trace: Encoder frame and confidence of each of ``tokens``.
        words: ``tokens`` as timed words.

    """

    tokens: list[int]
    text: str
    trace: TokenTrace
    words: tuple[WordTiming, ...]


@dataclass
class ItemOutput:
    """What the model step produced for one item: everything the step changes of its stream.

    The worker thread never writes stream state: the policy applies this between steps
    (:meth:`~pipecat_nemotron.asr.policy.SchedulerPolicy.resolve`), the one place step results are written.

    Attributes:
        tokens: The new token ids.
        frames: Where each new token was emitted: the last mel frame (from the utterance's start) its encoder
            frame covers.
        confidence: Confidence of each new token, in [0, 1].
        error: The exception the item's forward raised (then the other fields are empty).
        dec_state: RNNT decoder state to continue from (a peek's: the state before its flush, moved to the start
            of a new boosting tree if the stream's list changed); None: start of sequence.
        decoded_frames: Encoder frames decoded since ``dec_state`` was None (not a peek's).
        utterance: The utterance's text with the new tokens (None: no new tokens, or a peek).
        evidence: An ``auto`` stream's utterance as kept for language detection, with this chunk (None: unchanged).
        detected_language: At an ``auto`` stream's final: the locale detected (None: none).
        eou_frame: Where the model emitted ``<EOU>`` in this step (the step's first), on the same grid as
            ``frames``; None: it did not (or the model has no such token). Not in ``tokens``: markers never are
            (:mod:`~pipecat_nemotron.asr.eou`).

    """

    tokens: list[int] = field(default_factory=list)
    frames: list[int] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    error: BaseException | None = None
    dec_state: Any = None
    decoded_frames: int = 0
    utterance: UtteranceText | None = None
    evidence: UtteranceEvidence | None = None
    detected_language: str | None = None
    eou_frame: int | None = None


@dataclass
class StepOutput:
    """What one model step returned.

    Attributes:
        step_ms: Wall time of the step (all groups), ms.
        items: Output of each item of the plan, by stream id (a stream has at most one item per step).
        detected_languages: The language detected for each of the plan's ``detections`` (finals with nothing left
            to decode), by stream id.

    """

    step_ms: float = 0.0
    items: dict[int, ItemOutput] = field(default_factory=dict)
    detected_languages: dict[int, str | None] = field(default_factory=dict)

    def of(self, item: StepItem) -> ItemOutput:
        """The output of ``item``; an error output if the step returned none for it (a runner bug)."""
        out = self.items.get(item.state.stream_id)
        if out is None:
            return ItemOutput(error=RuntimeError("the model step returned no result for this stream"))
        return out


@dataclass(frozen=True)
class StepStats:
    """What one scheduler step did.

    Attributes:
        step_ms: Wall time of the model step (all groups), ms.
        batch_size: Stream chunks in the step.
        groups: Batched forwards in the step (one per latency mode and chunk shape).
        queue_ms_max: Longest time a chunk in this step waited for it, ms.
        open_streams: Streams open when the step ran.
        finals: Utterances finalized by the step.
        latency_modes: Latency mode of each group, ms.

    """

    step_ms: float
    batch_size: int
    groups: int
    queue_ms_max: float
    open_streams: int
    finals: int
    latency_modes: tuple[int, ...] = ()


@dataclass
class StreamEntry:
    """One open stream as the scheduler holds it.

    Attributes:
        state: The stream's state.
        push: Delivers a transcript update to the stream's reader.
        end: Ends the stream's updates (with the error that failed it, or None).

    """

    state: StreamState
    push: Callable[[Transcript], None]
    end: Callable[[BaseException | None], None]


@dataclass
class StepPlan:
    """The work of one step, picked between steps.

    Attributes:
        items: The stream chunks the step decodes, oldest first (at most ``max_batch_size``).
        groups: ``items`` split into batched forwards (same latency mode, chunk kind and length).
        immediate: Streams whose pending final has nothing left to decode: finished without the model.
        releases: Stream ids whose cache slots are zeroed and freed before the step's forwards.
        closing: The ``releases`` of closed streams (the rest are resets of open streams): their close
            futures resolve after this step. A stream closed while this step runs may take a new slot in it,
            so its release waits for the next step's plan.

    """

    items: list[StepItem]
    groups: list[StepGroup]
    immediate: list[StreamState]
    releases: list[int]
    closing: list[int]

    @property
    def empty(self) -> bool:
        """Nothing to do: the loop waits for the next wake-up."""
        return not self.groups and not self.immediate and not self.releases

    @property
    def runs_model(self) -> bool:
        """The step needs the worker thread (forwards to run, slots to free, languages to detect)."""
        return bool(self.groups or self.releases or self.detections)

    @property
    def detections(self) -> list[StreamState]:
        """``immediate`` streams whose final still needs its language detected (``auto`` on the worker)."""
        return [s for s in self.immediate if s.evidence is not None and s.detected_language is None]

    @property
    def latency_modes(self) -> tuple[int, ...]:
        """Latency mode of each group, ms."""
        return tuple(group.latency_ms for group in self.groups)


@dataclass
class Resolution:
    """What resolving a step leaves the loop to do (the policy changes stream state; the loop delivers).

    Attributes:
        updates: Transcript updates to push, in order, with the stream each is for.
        released: Ids of the closed streams whose slots the step freed: their ``close()`` calls may return.
        stats: The step's stats (None when it ran no forward).

    """

    updates: list[tuple[StreamEntry, Transcript]] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    stats: StepStats | None = None
