"""Continuous batching for :class:`~pipecat_nemotron.magpie.engine.MagpieEngine` on the fast step.

The engine's worker thread runs :meth:`FastBatcher.serve`: it blocks while idle, admits queued requests (up to
``max_batch`` at once, the rest wait first-in first-out), and runs one :class:`FastMagpieStep` step at a time in
which every admitted request advances one codec frame. Requests join and leave only between steps; a cancelled
request leaves at the next one, a finished one as soon as its last frame is decoded. Each request samples with its
own ``torch.Generator``, so its audio does not depend on which requests share its steps.

Long text is split into chunks as NeMo's ``do_tts`` does; each chunk is decoded as its own sequence, one after
the other, in the request's row (NeMo's multi-chunk carry-over of text history and alignment is not kept).
"""

from __future__ import annotations

import collections
import queue
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from loguru import logger

from pipecat_nemotron.magpie.fast_step import FastMagpieStep, Row, RowSampling

if TYPE_CHECKING:
    from pipecat_nemotron.magpie.engine import MagpieEngine
    from pipecat_nemotron.magpie.stream import SynthesisStream
    from pipecat_nemotron.magpie.streaming import StreamingDecoder


@dataclass
class _Active:
    """One admitted request: its text chunks, current row, codec decoder and frame budget."""

    stream: SynthesisStream
    chunks: list[torch.Tensor]
    speaker: int
    sampling: RowSampling
    decoder: StreamingDecoder
    max_frames: int
    row: Row | None = None
    next_chunk: int = 0
    delivered: int = 0  # Frames of the current row handed to the codec decoder.


class FastBatcher:
    """Owns a :class:`FastMagpieStep` and the requests it is decoding (engine worker thread only)."""

    def __init__(self, engine: MagpieEngine, *, max_batch: int) -> None:
        """Bind to a loaded engine.

        Args:
            engine: The engine whose model, codec decoder and stream bookkeeping to use.
            max_batch: Requests decoded together; later ones wait first-in first-out.

        """
        self._engine = engine
        self._max_batch = max_batch
        self._step = FastMagpieStep(engine.model, max_slots=2 * max_batch)
        self._active: list[_Active] = []
        self._waiting: collections.deque[SynthesisStream] = collections.deque()
        self.steps = 0

    @property
    def active(self) -> int:
        """Requests being decoded now."""
        return len(self._active)

    @property
    def waiting(self) -> int:
        """Requests admitted to the engine but waiting for a free row (over ``max_batch``)."""
        return len(self._waiting)

    def serve(self, jobs: queue.Queue[SynthesisStream | None]) -> None:
        """Run until the ``None`` sentinel arrives (then cancel whatever is left)."""
        while not self._drain(jobs, block=not self._active and not self._waiting):
            try:
                self._admit()
                self._drop_cancelled()
                if self._active:
                    self.run_step()
            except Exception as e:  # A bug here must fail the requests, not leave them waiting forever.
                logger.opt(exception=e).error(f"{self._engine}: the Magpie scheduler failed: {e}")
                self._fail_all(e)
        for item in [*self._active]:
            self._leave(item, "cancelled")
        while self._waiting:
            self._waiting.popleft()._finish("cancelled")

    def run_until_idle(self, stream: SynthesisStream) -> None:
        """Decode ``stream`` alone to its end (the warm-up)."""
        self._waiting.append(stream)
        self._admit()
        while self._active:
            self.run_step()

    def _drain(self, jobs: queue.Queue[SynthesisStream | None], *, block: bool) -> bool:
        """Move queued requests to the waiting line; True when the stop sentinel came."""
        while True:
            try:
                stream = jobs.get() if block else jobs.get_nowait()
            except queue.Empty:
                return False
            block = False
            if stream is None:
                return True
            self._waiting.append(stream)

    def _admit(self) -> None:
        while self._waiting and len(self._active) < self._max_batch:
            stream = self._waiting.popleft()
            if stream.cancelled or self._engine.closed:
                stream._finish("cancelled")
                continue
            try:
                item = self._start(stream)
            except Exception as e:
                logger.opt(exception=e).error(f"{self._engine}: synthesis #{stream.id} failed to start: {e}")
                stream._finish("failed", e)
                continue
            if item is not None:
                self._active.append(item)

    def _start(self, stream: SynthesisStream) -> _Active | None:
        engine = self._engine
        request = stream._request
        stream.stats.started_at = time.perf_counter()
        stream._status = "running"
        chunks = engine._text_chunks(request)
        if not chunks:
            stream._finish("completed")
            return None
        seed = request.options.seed if request.options.seed is not None else secrets.randbits(63)
        generator = torch.Generator(device=self._step.device).manual_seed(seed)
        params = engine.model.inference_parameters
        sampling = RowSampling(
            float(params.temperature), int(params.topk), request.options.use_cfg, generator
        )
        item = _Active(
            stream=stream,
            chunks=chunks,
            speaker=request.speaker_index,
            sampling=sampling,
            decoder=engine._new_decoder(request.options),
            max_frames=request.options.max_frames(engine.sample_rate, engine.samples_per_frame),
        )
        self._next_row(item)
        return item

    def _next_row(self, item: _Active) -> bool:
        """Start the request's next text chunk; False when none is left."""
        if item.row is not None:
            self._step.remove_row(item.row)
            item.row = None
        if item.next_chunk >= len(item.chunks):
            return False
        with torch.inference_mode():
            item.row = self._step.add_row(item.chunks[item.next_chunk], item.speaker, item.sampling)
        item.next_chunk += 1
        item.delivered = 0
        return True

    def _drop_cancelled(self) -> None:
        for item in [i for i in self._active if i.stream.cancelled or self._engine.closed]:
            self._leave(item, "cancelled")

    def _leave(self, item: _Active, status: str, error: BaseException | None = None) -> None:
        if item.row is not None:
            self._step.remove_row(item.row)
            item.row = None
        if item in self._active:
            self._active.remove(item)
        if status in ("completed", "truncated"):
            try:
                with torch.inference_mode():
                    self._engine._emit(item.stream, item.decoder, item.decoder.flush())
            except Exception as e:
                logger.opt(exception=e).error(f"{self._engine}: decoding #{item.stream.id} failed: {e}")
                status, error = "failed", e
        if status == "truncated" and not item.stream._request.internal:
            logger.warning(
                f"{self._engine}: synthesis #{item.stream.id} stopped at "
                f"max_duration_s={item.stream._request.options.max_duration_s} without the model ending the speech"
            )
        item.stream._finish(status, error)

    def _fail_all(self, error: BaseException) -> None:
        """Fail every active request and start from a fresh step (its cache may be inconsistent)."""
        for item in [*self._active]:
            item.row = None
            self._leave(item, "failed", error)
        self._step = FastMagpieStep(self._engine.model, max_slots=2 * self._max_batch)

    def run_step(self) -> None:
        """One decoder step for every active request, then hand out the new frames' audio."""
        try:
            with torch.inference_mode():
                out = self._step.forward()
                self._step.advance(out)
        except Exception as e:
            logger.opt(exception=e).error(
                f"{self._engine}: a Magpie step failed for {len(self._active)} requests: {e}"
            )
            for item in [*self._active]:
                self._leave(item, "failed", e)
            self._step = FastMagpieStep(self._engine.model, max_slots=2 * self._max_batch)
            return
        self.steps += 1
        for item in [*self._active]:
            self._deliver(item)

    def _deliver(self, item: _Active) -> None:
        """Decode the request's new frame (if any) and move it on: next chunk, truncated or completed."""
        row, stats = item.row, item.stream.stats
        assert row is not None
        try:
            while item.delivered < len(row.codes) and stats.frames < item.max_frames:
                frame = row.codes[item.delivered]
                item.delivered += 1
                stats.frames += 1
                with torch.inference_mode():
                    self._engine._emit(item.stream, item.decoder, item.decoder.push(frame))
        except Exception as e:
            logger.opt(exception=e).error(f"{self._engine}: decoding #{item.stream.id} failed: {e}")
            self._leave(item, "failed", e)
            return
        if stats.frames >= item.max_frames:
            self._leave(item, "truncated")
            return
        if not row.done:
            return
        try:
            more = self._next_row(item)
        except Exception as e:
            logger.opt(exception=e).error(f"{self._engine}: synthesis #{item.stream.id} failed: {e}")
            self._leave(item, "failed", e)
            return
        if not more:
            self._leave(item, "completed")


def describe(batcher: FastBatcher | None) -> dict[str, Any]:
    """Counters for logs and benchmarks (empty when the engine runs NeMo's step)."""
    if batcher is None:
        return {}
    return {"active": batcher.active, "waiting": batcher.waiting, "steps": batcher.steps}
