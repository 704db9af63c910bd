"""The Magpie scheduler's policy: which requests a step decodes, and what its results do. No torch, no I/O, no threads.

A turn is plan → execute → resolve, as the ASR's (:mod:`pipecat_nemotron.asr.policy`): :meth:`MagpiePolicy.plan`
picks the turn's work as a :class:`StepPlan` between steps; the worker (:mod:`~pipecat_nemotron.tts.magpie.scheduler`)
executes it on the model runner; :meth:`MagpiePolicy.opened`, :meth:`~MagpiePolicy.resolve`,
:meth:`~MagpiePolicy.emitted` and :meth:`~MagpiePolicy.fail` apply what the runner returned, and
:meth:`~MagpiePolicy.leave_ended` hands back the requests that ended. The policy only reads and writes
:class:`~pipecat_nemotron.tts.magpie.stream.Synthesis` records, so a test drives it step by step with a fake runner
(:mod:`~pipecat_nemotron.tts.magpie.fake_runner`).

The rules:

- **Admission**: first-in first-out, up to ``max_batch`` requests decoding at once. A turn that admits requests only
  opens them (the runner splits their text into token chunks) and runs no step, so requests that arrive meanwhile
  join the same prefill (a burst is one prefill, not a lone one and a batch that waits for it).
- **Leaving**: a cancelled request leaves at the next step boundary: its row is freed before that step runs (a
  queued one is skipped).
- **Text chunks**: a request's token chunks are decoded one after the other in its row; a row that ends its chunk
  (end of speech, or NeMo's ``max_decoder_steps``) starts the next chunk at the next step, prefilled with the
  turn's other joiners.
- **Ending**: ``truncated`` when its kept frames reach its budget (``max_duration_s``); ``completed`` when the row
  of its last chunk ends; ``failed`` alone when opening it or decoding its audio fails. A failed prefill fails the
  requests it was for; a failed step fails every row (the step's cache may be inconsistent).
- **Audio**: a request's audio is due for decode when its frames not yet decoded reach the size of its next audio
  chunk (:meth:`~pipecat_nemotron.tts.magpie.options.MagpieSynthesisOptions.chunk_frames_at`), or when it ends
  (the rest is flushed). The due requests of a step are decoded together.

A row keeps at most one codec frame per step (the fast step refuses frame stacking), so the frame budget is never
overshot: the step that reaches it ends the request.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass

from pipecat_nemotron.tts.magpie.stream import Synthesis


@dataclass
class StepPlan:
    """The work of one turn, picked between steps.

    Attributes:
        leaving: Requests that leave before this turn's step (cancelled): their rows are freed, they end
            ``cancelled``.
        opening: Requests admitted this turn: their text is split into token chunks (a turn that opens runs no
            step).
        starting: Requests whose next text chunk is prefilled before the step, all in one batched call.
        rows: Requests this turn's step decodes (each keeps at most one new codec frame), in admission order.

    """

    leaving: list[Synthesis]
    opening: list[Synthesis]
    starting: list[Synthesis]
    rows: list[Synthesis]

    @property
    def empty(self) -> bool:
        """Nothing to do: the worker waits for a request."""
        return not (self.leaving or self.opening or self.rows)


def audio_due(synthesis: Synthesis) -> bool:
    """Whether the request's frames not yet decoded fill its next audio chunk."""
    pending = synthesis.frames - synthesis.audio_frames
    return pending > 0 and pending >= synthesis.options.chunk_frames_at(synthesis.chunks)


class MagpiePolicy:
    """Continuous batching of synthesis requests, one decoder step at a time.

    Args:
        max_batch: Requests decoded together; later ones wait first-in first-out.
        max_row_steps: Decoder steps after which a row ends without end of speech (NeMo's ``max_decoder_steps``).
        sample_rate: Codec output rate, Hz (for the frame budget of ``max_duration_s``).
        samples_per_frame: Audio samples per codec frame.

    """

    def __init__(self, max_batch: int, max_row_steps: int, sample_rate: int, samples_per_frame: int) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.max_batch = max_batch
        self.max_row_steps = max_row_steps
        self.sample_rate = sample_rate
        self.samples_per_frame = samples_per_frame
        #: Requests waiting for a row, oldest first.
        self.waiting: deque[Synthesis] = deque()
        #: Admitted requests, in admission order (opened or being opened; each has a row once prefilled).
        self.active: list[Synthesis] = []
        #: Admitted requests whose next text chunk is due for prefill, in the order they became due.
        self._starting: list[Synthesis] = []

    @property
    def idle(self) -> bool:
        """No request is waiting or admitted."""
        return not self.waiting and not self.active

    # ---- joins and leaves (between steps) --------------------------------------------------------------------

    def submit(self, synthesis: Synthesis) -> None:
        """Queue a request (it is admitted first-in first-out)."""
        self.waiting.append(synthesis)

    def cancel_all(self) -> None:
        """Cancel every waiting and admitted request (the engine is stopping): they leave at the next plan."""
        for synthesis in (*self.waiting, *self.active):
            synthesis.cancelled = True

    # ---- plan -------------------------------------------------------------------------------------------------

    def plan(self) -> StepPlan:
        """Pick this turn's work: cancelled requests leave, waiting ones are admitted, or rows step."""
        leaving = [s for s in (*self.active, *self.waiting) if s.cancelled]
        for synthesis in leaving:
            synthesis.ending = "cancelled"
        if leaving:
            self.active = [s for s in self.active if not s.cancelled]
            self.waiting = deque(s for s in self.waiting if not s.cancelled)
            self._starting = [s for s in self._starting if not s.cancelled]
        opening: list[Synthesis] = []
        while self.waiting and len(self.active) < self.max_batch:
            synthesis = self.waiting.popleft()
            synthesis.max_frames = synthesis.options.max_frames(self.sample_rate, self.samples_per_frame)
            self.active.append(synthesis)
            opening.append(synthesis)
        if opening:
            return StepPlan(leaving, opening, [], [])
        starting, self._starting = self._starting, []
        return StepPlan(leaving, [], starting, list(self.active))

    # ---- resolve ----------------------------------------------------------------------------------------------

    def opened(self, synthesis: Synthesis, text_chunks: int) -> None:
        """The runner opened a request: ``text_chunks`` token chunks (none: it completes with no audio)."""
        synthesis.text_chunks = text_chunks
        synthesis.text_chunk = 0
        synthesis.row_steps = 0
        if text_chunks == 0:
            synthesis.ending = "completed"
        else:
            self._starting.append(synthesis)

    def fail(self, synthesis: Synthesis, error: BaseException) -> None:
        """The request fails (alone): it leaves at :meth:`leave_ended`."""
        synthesis.ending = "failed"
        synthesis.error = error
        if synthesis in self._starting:
            self._starting.remove(synthesis)

    def fail_all(self, error: BaseException) -> None:
        """Every admitted request fails (the runner's state is lost)."""
        for synthesis in self.active:
            if synthesis.ending is None:
                self.fail(synthesis, error)

    def resolve(self, plan: StepPlan, ended: Collection[int]) -> list[Synthesis]:
        """Apply a step: each row kept a frame unless it ended at end of speech (``ended``: request ids).

        Returns:
            The requests whose audio is due for decode (those that end this step included), in row order.

        """
        due: list[Synthesis] = []
        for synthesis in plan.rows:
            if synthesis.ending is not None:  # failed in this turn's prefill
                continue
            synthesis.row_steps += 1
            row_done = synthesis.id in ended
            if not row_done:
                synthesis.frames += 1
                row_done = synthesis.row_steps >= self.max_row_steps
            last_chunk = synthesis.text_chunks is None or synthesis.text_chunk + 1 >= synthesis.text_chunks
            if synthesis.frames >= synthesis.max_frames:
                synthesis.ending = "truncated"
            elif row_done and last_chunk:
                synthesis.ending = "completed"
            elif row_done:
                synthesis.text_chunk += 1
                synthesis.row_steps = 0
                self._starting.append(synthesis)
            if synthesis.ending is not None or audio_due(synthesis):
                due.append(synthesis)
        return due

    def emitted(self, synthesis: Synthesis, frames: int) -> int:
        """Count an audio chunk of ``frames`` codec frames handed to the request; return its first frame's index."""
        first = synthesis.audio_frames
        synthesis.audio_frames += frames
        synthesis.chunks += 1
        return first

    def leave_ended(self) -> list[Synthesis]:
        """Remove and return the admitted requests that ended (their last audio is out)."""
        ended = [s for s in self.active if s.ending is not None]
        if ended:
            self.active = [s for s in self.active if s.ending is None]
            self._starting = [s for s in self._starting if s.ending is None]
        return ended
