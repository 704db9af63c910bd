"""Continuous batching for :class:`~pipecat_nemotron.tts.magpie.engine.MagpieEngine` on the fast step.

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

from pipecat_nemotron.tts.magpie.fast_step import FastMagpieStep, Row, RowSampling
from pipecat_nemotron.tts.magpie.streaming import flush_together

if TYPE_CHECKING:
    from pipecat_nemotron.tts.magpie.engine import MagpieEngine
    from pipecat_nemotron.tts.magpie.stream import SynthesisStream
    from pipecat_nemotron.tts.magpie.streaming import StreamingDecoder


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
        self._step = self._new_step()
        self._active: list[_Active] = []
        self._waiting: collections.deque[SynthesisStream] = collections.deque()
        self._jobs: queue.Queue[SynthesisStream | None] | None = None
        self.steps = 0
        self.prefills = 0  # Batched prefill calls (one per group of joiners).

    def _new_step(self) -> FastMagpieStep:
        """A fresh step on the model: CUDA-graphed on a CUDA device (unless the engine has ``cuda_graphs=False``)."""
        engine = self._engine
        if engine._cuda_graphs and str(engine.device).startswith("cuda"):
            from pipecat_nemotron.tts.magpie.graphs import GraphedMagpieStep

            return GraphedMagpieStep(engine.model, max_slots=2 * self._max_batch)
        return FastMagpieStep(engine.model, max_slots=2 * self._max_batch)

    @property
    def step(self) -> FastMagpieStep:
        """The step object decoding the active requests (replaced by a fresh one after a failed step)."""
        return self._step

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
        self._jobs = jobs
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
        """Admit waiting requests up to ``max_batch``; their first chunks are prefilled in one batched call."""
        joining: list[_Active] = []
        while True:
            while self._waiting and len(self._active) + len(joining) < self._max_batch:
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
                    joining.append(item)
            # Requests submitted while those were tokenised join the same prefill: otherwise a burst splits into a
            # lone prefill and a batch that waits for it (seconds for the 357M model on CPU).
            if not joining or len(self._active) + len(joining) >= self._max_batch or not self._pull():
                break
        self._active.extend(joining)
        self._next_rows(joining)

    def _pull(self) -> bool:
        """Move requests already queued to the waiting line (the stop sentinel stays queued); True if any came."""
        jobs, came = self._jobs, False
        while jobs is not None:
            try:
                stream = jobs.get_nowait()
            except queue.Empty:
                break
            if stream is None:
                jobs.put(None)  # serve()'s next drain stops; close() refuses submits after it.
                break
            self._waiting.append(stream)
            came = True
        return came

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
        return item

    def _next_rows(self, items: list[_Active]) -> None:
        """Start each request's next text chunk, all in one batched prefill; a request with none left completes.

        A failed prefill fails the requests it was for (the step's other rows are untouched: it only appends).
        """
        starting = []
        for item in items:
            if item.row is not None:
                self._step.remove_row(item.row)
                item.row = None
            if item.next_chunk < len(item.chunks):
                starting.append(item)
            else:
                self._leave(item, "completed")
        if not starting:
            return
        self.prefills += 1
        try:
            with torch.inference_mode():
                rows = self._step.add_rows(
                    [(i.chunks[i.next_chunk], i.speaker, i.sampling) for i in starting]
                )
        except Exception as e:
            logger.opt(exception=e).error(f"{self._engine}: starting {len(starting)} syntheses failed: {e}")
            for item in starting:
                self._leave(item, "failed", e)
            return
        for item, row in zip(starting, rows, strict=True):
            item.row = row
            item.next_chunk += 1
            item.delivered = 0

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
        self._step = self._new_step()

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
            self._step = self._new_step()
            return
        self.steps += 1
        self._deliver()

    def _deliver(self) -> None:
        """Hand every request its new frames, then move finished requests on (next chunk, truncated, completed).

        The audio chunks due this step, of every row, are decoded in one codec call.
        """
        due: list[_Active] = []
        moving: list[_Active] = []
        ending: dict[int, str] = {}
        for item in self._active:
            row, stats = item.row, item.stream.stats
            assert row is not None
            chunk_due = False
            while item.delivered < len(row.codes) and stats.frames < item.max_frames:
                chunk_due |= item.decoder.append(row.codes[item.delivered])
                item.delivered += 1
                stats.frames += 1
            if stats.frames >= item.max_frames:
                ending[id(item)] = "truncated"
            elif row.done and item.next_chunk >= len(item.chunks):
                ending[id(item)] = "completed"
            elif row.done:
                moving.append(item)
            if chunk_due or id(item) in ending:
                due.append(item)
        self._decode_due(due)
        for item in [i for i in self._active if id(i) in ending]:
            self._leave(item, ending[id(item)])
        self._next_rows([i for i in moving if i in self._active])

    def _decode_due(self, items: list[_Active]) -> None:
        """Decode and emit the pending audio of ``items`` in one codec call.

        If the batched call fails, each is decoded alone, so a request whose decode fails fails alone.
        """
        if not items:
            return
        try:
            with torch.inference_mode():
                audio = flush_together(self._engine._decode_batch, [i.decoder for i in items])
        except Exception as e:
            logger.opt(exception=e).warning(f"{self._engine}: a batched codec decode failed ({e}); one at a time")
            audio = None
        for index, item in enumerate(items):
            try:
                with torch.inference_mode():
                    chunk = audio[index] if audio is not None else item.decoder.flush()
                self._engine._emit(item.stream, item.decoder, chunk)
            except Exception as e:
                logger.opt(exception=e).error(f"{self._engine}: decoding #{item.stream.id} failed: {e}")
                self._leave(item, "failed", e)


def describe(batcher: FastBatcher | None) -> dict[str, Any]:
    """Counters for logs and benchmarks (empty when the engine runs NeMo's step)."""
    if batcher is None:
        return {}
    return {"active": batcher.active, "waiting": batcher.waiting, "steps": batcher.steps, "prefills": batcher.prefills}
