"""A scripted stand-in for the Magpie model runner: the scheduler runs on it without a model (tests, bug hunts).

:class:`FakeRunner` has :class:`~pipecat_nemotron.tts.magpie.runner.MagpieRunner`'s step interface and its rules (a
request's rows take its text chunks in turn, a prefill replaces the request's previous row, a failed prefill starts
no row, a failed step loses every row, a decode hands out each request's frames not yet decoded), but no weights:

- a request's text is split into text chunks at ``"|"`` (an empty text has none); a chunk of ``n`` words keeps ``n``
  codec frames, then its row ends at end of speech (step ``n + 1``), unless NeMo's step limit
  (``max_row_steps``) ends it first;
- frame ``k`` of request ``i`` (counted over the whole request) has the code :func:`fake_code` ``(i, k)``, and
  decodes to ``samples_per_frame`` int16 samples equal to it, so a test reads a request's codes back from its
  audio.

It can fail chosen requests' open or decode, the next prefill or step, and hold each step until a test lets it go
(``gate``), announcing the rows of the step it holds (``entered``), to place a cancel exactly while a step runs.
Plain Python and numpy: no torch.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pipecat_nemotron.tts.magpie.stream import Synthesis

#: Codes of a fake request's frames stay below this (they are int16 audio samples).
CODE_RANGE = 30_000


def fake_code(request_id: int, frame: int) -> int:
    """The code of frame ``frame`` (counted over the request) of request ``request_id``."""
    return (request_id * 1000 + frame) % CODE_RANGE


@dataclass
class _FakeRequest:
    """What the fake holds per opened request."""

    chunk_frames: list[int]
    codes: list[int] = field(default_factory=list)
    decoded: int = 0
    row_frames: int = -1  # Frames the current row keeps before end of speech; -1: no row.
    row_steps: int = 0


class FakeRunner:
    """The model runner's step interface over scripted codes (see the module docstring).

    Args:
        sample_rate: Codec output rate, Hz.
        samples_per_frame: Audio samples per codec frame.
        max_row_steps: Steps after which a row ends without end of speech (NeMo's ``max_decoder_steps``).

    """

    def __init__(self, sample_rate: int = 1000, samples_per_frame: int = 10, max_row_steps: int = 500) -> None:
        self.sample_rate = sample_rate
        self.samples_per_frame = samples_per_frame
        self.max_row_steps = max_row_steps
        self._requests: dict[int, _FakeRequest] = {}
        #: Request ids in each prefill call, in order.
        self.prefills: list[list[int]] = []
        #: Request ids with a row in each step, in order.
        self.steps: list[list[int]] = []
        #: Request ids in each decode call, in order (a failed batched call, then one call per request).
        self.decodes: list[list[int]] = []
        #: Request ids opened and removed, in order.
        self.opened: list[int] = []
        self.removed: list[int] = []
        #: Resets (after a failed step).
        self.resets = 0
        #: Requests whose open or decode raises.
        self.fail_open: set[int] = set()
        self.fail_decode: set[int] = set()
        #: When set: the next prefill, or step, raises it (once).
        self.fail_prefill: BaseException | None = None
        self.fail_step: BaseException | None = None
        #: Called with each request as it is opened (e.g. to submit more requests meanwhile).
        self.on_open: Callable[[Synthesis], None] | None = None
        #: When set: each step waits for a permit; ``entered`` receives its rows' ids as it starts waiting.
        self.gate: threading.Semaphore | None = None
        self.entered: queue.Queue[list[int]] = queue.Queue()

    @property
    def rows(self) -> list[int]:
        """Ids of the requests that have a row now."""
        return [i for i, r in self._requests.items() if r.row_frames >= 0]

    def codes(self, request_id: int) -> list[int]:
        """The codes a request's rows kept so far."""
        return list(self._requests[request_id].codes)

    # ---- the step interface -------------------------------------------------------------------------------

    def open(self, synthesis: Synthesis) -> int:
        """Split the text at ``"|"``; a chunk speaks one frame per word."""
        if self.on_open is not None:
            self.on_open(synthesis)
        if synthesis.id in self.fail_open:
            raise RuntimeError(f"scripted open failure of #{synthesis.id}")
        chunks = synthesis.text.split("|") if synthesis.text else []
        self._requests[synthesis.id] = _FakeRequest([len(chunk.split()) for chunk in chunks])
        self.opened.append(synthesis.id)
        return len(chunks)

    def prefill(self, starting: Sequence[Synthesis]) -> None:
        """Start each request's ``text_chunk`` in a new row (none if the scripted failure is due)."""
        error, self.fail_prefill = self.fail_prefill, None
        for synthesis in starting:
            self._requests[synthesis.id].row_frames = -1
        if error is not None:
            raise error
        self.prefills.append([s.id for s in starting])
        for synthesis in starting:
            request = self._requests[synthesis.id]
            request.row_frames = request.chunk_frames[synthesis.text_chunk]
            request.row_steps = 0

    def step(self) -> set[int]:
        """One step for every row: keep the next frame, or end at end of speech.

        Raises:
            AssertionError: A row that had ended was stepped (the scheduler must free or restart it first).

        """
        rows = self.rows
        gate = self.gate
        if gate is not None:
            self.entered.put(rows)
            gate.acquire()
        error, self.fail_step = self.fail_step, None
        if error is not None:
            raise error
        self.steps.append(rows)
        ended = set()
        for request_id in rows:
            request = self._requests[request_id]
            if request.row_steps > request.row_frames or request.row_steps >= self.max_row_steps:
                raise AssertionError(f"the row of #{request_id} was stepped after it ended")
            request.row_steps += 1
            if request.row_steps > request.row_frames:
                ended.add(request_id)
            else:
                request.codes.append(fake_code(request_id, len(request.codes)))
        return ended

    def decode(self, request_ids: Sequence[int]) -> list[np.ndarray | None]:
        """Each request's frames not yet decoded, as ``samples_per_frame`` samples per frame equal to its code."""
        self.decodes.append(list(request_ids))
        failing = self.fail_decode.intersection(request_ids)
        if failing:
            raise RuntimeError(f"scripted decode failure of {sorted(failing)}")
        audio: list[np.ndarray | None] = []
        for request_id in request_ids:
            request = self._requests[request_id]
            new = request.codes[request.decoded :]
            request.decoded = len(request.codes)
            audio.append(np.repeat(np.array(new, dtype=np.int16), self.samples_per_frame) if new else None)
        return audio

    def remove(self, request_id: int) -> None:
        """Forget a request (idempotent)."""
        if self._requests.pop(request_id, None) is not None:
            self.removed.append(request_id)

    def reset(self) -> None:
        """Drop every row (after a failed step)."""
        self.resets += 1
        for request in self._requests.values():
            request.row_frames = -1
