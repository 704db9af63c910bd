"""CUDA graphs of the fast encoder step, one per (mode, chunk shape, batch bucket), captured on first use.

A batched step launches a few hundred small kernels (24 layers x ~20 ops for the 600M model); at small batch
sizes their launch overhead rivals the work. A CUDA graph replays the whole step as one launch. Graphs need
static shapes, so a batch of B streams runs in the graph of the smallest bucket >= B (1, 2, 4, 8, ...),
padded with inert rows (zero features, no cached context) that the step computes independently of the real
rows and that are dropped from the outputs. Shapes outside the buckets, and any shape whose capture failed,
run eagerly; a failed capture is logged once with its reason and never retried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from loguru import logger

from pipecat_nemotron.asr.fast_step import FastEncoderStep

StepOutputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Powers of two up to ``max_batch``, and ``max_batch`` itself."""
    buckets, size = [], 1
    while size < max_batch:
        buckets.append(size)
        size *= 2
    return (*buckets, max_batch)


def pad_batch(
    tensors: tuple[torch.Tensor, ...], dims: tuple[int, ...], size: int
) -> tuple[torch.Tensor, ...]:
    """Pad each tensor with zeros along its batch dim (given per tensor) to ``size`` rows."""
    out = []
    for t, dim in zip(tensors, dims, strict=True):
        missing = size - t.size(dim)
        if missing:
            shape = list(t.shape)
            shape[dim] = missing
            t = torch.cat((t, t.new_zeros(shape)), dim=dim)
        out.append(t)
    return tuple(out)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]  # signal, lengths, kv, time, cached (static buffers)
    outputs: StepOutputs


#: Batch dim of (signal, lengths, kv cache, time cache, cached frames).
_INPUT_BATCH_DIMS = (0, 0, 1, 1, 0)
#: Batch dim of (encoded, lengths, kv cache, time cache, cached frames).
_OUTPUT_BATCH_DIMS = (0, 0, 1, 1, 0)


class GraphedEncoderStep:
    """The fast step with CUDA graphs for bucketed batch sizes (CUDA only).

    Args:
        step: The eager fast step (on a CUDA device).
        max_batch: Largest batch the engine runs (the largest bucket).

    """

    def __init__(self, step: FastEncoderStep, max_batch: int) -> None:
        self.step = step
        self.buckets = batch_buckets(max_batch)
        self._graphs: dict[tuple[int, ...], _Graph | None] = {}
        self._pool = torch.cuda.graph_pool_handle()
        #: Bytes of CUDA memory reserved by captures so far.
        self.captured_bytes = 0

    def __call__(self, *inputs: torch.Tensor, drop_extra_pre_encoded: int, right_context: int) -> StepOutputs:
        """:meth:`FastEncoderStep.__call__` on ``(signal, lengths, kv_cache, time_cache, cached_frames)``.

        The outputs stay valid until the next call.
        """
        batch, frames = inputs[0].size(0), inputs[0].size(-1)
        bucket = next((b for b in self.buckets if b >= batch), None)
        key = (right_context, drop_extra_pre_encoded, frames, bucket or 0, inputs[2].size(2))
        graph = self._graphs.get(key) if bucket is not None else None
        if bucket is not None and key not in self._graphs:
            graph = self._capture(key, pad_batch(inputs, _INPUT_BATCH_DIMS, bucket))
        if graph is None:
            return self.step(
                *inputs, drop_extra_pre_encoded=drop_extra_pre_encoded, right_context=right_context
            )
        for static, value, dim in zip(graph.inputs, inputs, _INPUT_BATCH_DIMS, strict=True):
            static.narrow(dim, 0, batch).copy_(value)
            if batch < static.size(dim):
                static.narrow(dim, batch, static.size(dim) - batch).zero_()
        graph.graph.replay()
        return tuple(  # type: ignore[return-value]
            out.narrow(dim, 0, batch) for out, dim in zip(graph.outputs, _OUTPUT_BATCH_DIMS, strict=True)
        )

    def _capture(self, key: tuple[int, ...], inputs: tuple[torch.Tensor, ...]) -> _Graph | None:
        right, drop, frames, bucket = key
        static = tuple(t.clone() for t in inputs)

        def run() -> StepOutputs:
            return self.step(*static, drop_extra_pre_encoded=drop, right_context=right)

        before = torch.cuda.memory_reserved()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # warm-up outside the graph (allocator, cached positions and masks)
                    run()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                outputs = run()
        except Exception as e:  # a shape that cannot be captured runs eagerly from now on
            logger.warning(
                f"CUDA graph capture failed for mode right={right}, {frames} frames, batch {bucket}: {e!r}"
            )
            self._graphs[key] = None
            return None
        grown = torch.cuda.memory_reserved() - before
        self.captured_bytes += max(0, grown)
        logger.info(
            f"Captured a CUDA graph of the encoder step: right context {right}, {frames} mel frames, batch {bucket} "
            f"(+{grown / 1e6:.1f} MB reserved, {self.captured_bytes / 1e6:.1f} MB for {len(self._graphs) + 1} graphs)"
        )
        captured = _Graph(graph, static, outputs)
        self._graphs[key] = captured
        return captured

    def describe(self) -> dict[str, Any]:
        """What was captured: graph count, failed shapes and reserved memory (bytes)."""
        return {
            "graphs": sum(g is not None for g in self._graphs.values()),
            "failed": [list(k) for k, g in self._graphs.items() if g is None],
            "captured_bytes": self.captured_bytes,
        }
