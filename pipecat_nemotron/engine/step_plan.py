"""The typed objects one scheduler turn hands along: the plan of a step, the streams it serves, its stats."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipecat_nemotron.engine.runner import StepGroup, StepItem
from pipecat_nemotron.engine.state import StreamState
from pipecat_nemotron.engine.types import TranscriptUpdate


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
    push: Callable[[TranscriptUpdate], None]
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
