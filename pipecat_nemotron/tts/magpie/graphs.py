"""The fast Magpie step on a GPU: bf16 weights and CUDA graphs of the decoder step and the local transformer.

A step of the 357M model launches a few hundred small kernels (12 decoder layers, then the local transformer once
per codebook); at small batch sizes their launch overhead rivals the work. A CUDA graph replays one of those calls
as one launch. Graphs need static shapes, so :class:`GraphedMagpieStep` runs ``n`` slots in the graph of the
smallest bucket >= ``n`` (1, 2, 4, 8, ... up to the step's slot count), padded with inert slots that no row owns
(the cache keeps active slots at ``0..n-1``, so the padding writes only into free slots, which a joining row's
prefill overwrites). The decoder reads the cache's whole capacity under a mask, so one graph serves every frame
position until the cache grows; a growth (more positions, more text, more slots) drops the graphs, which are then
captured again on first use. Any capture that fails is logged once with its reason and that shape runs eagerly.

``capture=False`` runs the same padded, static-shape computation eagerly: on a CPU it checks everything but the
capture itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from loguru import logger

from pipecat_nemotron.tts.magpie.fast_step import FastMagpieStep

Outputs = tuple[torch.Tensor, ...]


def slot_buckets(max_slots: int) -> tuple[int, ...]:
    """Powers of two below ``max_slots``, and ``max_slots`` itself."""
    buckets, size = [], 1
    while size < max_slots:
        buckets.append(size)
        size *= 2
    return (*buckets, max_slots)


def bucket_for(count: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket holding ``count`` slots (None: more than the largest)."""
    return next((b for b in buckets if b >= count), None)


def cast_for_fast_step(model: Any, dtype: torch.dtype) -> None:
    """Cast the Magpie model to ``dtype``, leaving its codec in fp32 (NeMo decodes audio under fp32 autocast).

    Args:
        model: A loaded ``MagpieTTSModel``.
        dtype: ``torch.bfloat16`` or ``torch.float32``.

    """
    from pipecat_nemotron.tts.magpie._nemo_private import codec_parts

    model.to(dtype)
    codec, _converter = codec_parts(model)
    codec.to(torch.float32)


@dataclass
class _Graph:
    fn: Callable[..., Outputs]
    inputs: tuple[torch.Tensor, ...]  # static, padded to the bucket
    fills: tuple[float, ...]  # what padded slots hold, per input
    graph: Any = None  # torch.cuda.CUDAGraph when captured
    outputs: Outputs = ()


class GraphedMagpieStep(FastMagpieStep):
    """:class:`FastMagpieStep` whose decoder step and local transformer run as CUDA graphs per batch bucket.

    Not thread-safe, like the step: the engine's worker thread owns it.
    """

    def __init__(self, model: Any, *, max_slots: int = 32, capture: bool | None = None) -> None:
        """Bind to a loaded model.

        Args:
            model: A loaded ``MagpieTTSModel`` in eval mode (on CUDA to capture).
            max_slots: Slots allocated up front; also the largest bucket (more slots run eagerly).
            capture: Capture CUDA graphs (default: when the model is on CUDA); False runs the padded static-shape
                computation eagerly.

        """
        super().__init__(model, max_slots=max_slots)
        self.capture = self.device.type == "cuda" if capture is None else capture
        self.buckets = slot_buckets(max_slots)
        if self._lt is not None:  # Static shapes: it reruns its few positions (<= codebooks + 1), uncached.
            self._lt.by_position = False
        self._graphs: dict[tuple[Any, ...], _Graph | None] = {}
        self._layout: tuple[int, ...] = ()
        self._pool = torch.cuda.graph_pool_handle() if self.capture else None
        #: Bytes of CUDA memory reserved by the captures so far.
        self.captured_bytes = 0
        self.captures = 0

    def describe(self) -> dict[str, Any]:
        """What was captured: live graphs, failed shapes, captures made and reserved memory (bytes)."""
        return {
            "graphs": sum(g is not None for g in self._graphs.values()),
            "failed": [list(map(str, k)) for k, g in self._graphs.items() if g is None],
            "captures": self.captures,
            "captured_bytes": self.captured_bytes,
        }

    # The two graphed calls.

    def _decode_rows(
        self, emb: torch.Tensor, positions: torch.Tensor, prior: torch.Tensor | None, n: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        bucket = bucket_for(n, self.buckets)
        if bucket is None or bucket > self._cache.xmask.shape[0]:
            return super()._decode_rows(emb, positions, prior, n)
        capacity, text = self._cache.capacity, self._cache.xmask.shape[1]
        key = ("decoder", bucket, capacity, text, prior is not None)
        inputs = (emb, positions) if prior is None else (emb, positions, prior)

        def run(emb: torch.Tensor, positions: torch.Tensor, *prior: torch.Tensor) -> Outputs:
            keys = torch.arange(capacity, device=positions.device)
            mask = (keys[None, :] <= positions)[:, None, None, :]
            slots = torch.arange(bucket, device=positions.device)
            return self._run_layers(
                emb, positions, slots, mask, capacity, prior[0] if prior else None, read=slice(0, bucket)
            )

        out = self._replay(key, run, inputs, (0.0, 0.0, 1.0), n, bucket)
        if out is None:
            return super()._decode_rows(emb, positions, prior, n)
        return out[0], out[1]

    def _lt_logits(self, x: torch.Tensor, codebook: int) -> torch.Tensor:
        n = x.shape[0]
        bucket = bucket_for(n, self.buckets)
        if bucket is None:
            return super()._lt_logits(x, codebook)
        key = ("local transformer", bucket, codebook, x.shape[1])
        eager = super()._lt_logits

        def run(x: torch.Tensor) -> Outputs:
            return (eager(x, codebook),)

        out = self._replay(key, run, (x,), (0.0,), n, bucket)
        return super()._lt_logits(x, codebook) if out is None else out[0]

    # Capture and replay.

    def _replay(
        self,
        key: tuple[Any, ...],
        fn: Callable[..., Outputs],
        inputs: tuple[torch.Tensor, ...],
        fills: tuple[float, ...],
        n: int,
        bucket: int,
    ) -> Outputs | None:
        """Run ``fn`` on ``inputs`` padded to ``bucket`` rows through its graph.

        Returns the first ``n`` rows of each output (copies), or None when the shape cannot be graphed.
        """
        self._check_layout()
        graph = self._graphs.get(key)
        if key not in self._graphs:
            graph = self._graphs[key] = self._build(key, fn, inputs, fills, bucket)
        if graph is None:
            return None
        for static, value, fill in zip(graph.inputs, inputs, graph.fills, strict=False):
            static[:n].copy_(value)
            static[n:].fill_(fill)
        if graph.graph is not None:
            graph.graph.replay()
            outputs = graph.outputs
        else:
            outputs = graph.fn(*graph.inputs)
        return tuple(o[:n].clone() for o in outputs)

    def _build(
        self,
        key: tuple[Any, ...],
        fn: Callable[..., Outputs],
        inputs: tuple[torch.Tensor, ...],
        fills: tuple[float, ...],
        bucket: int,
    ) -> _Graph | None:
        static = []
        for value, fill in zip(inputs, fills, strict=False):
            padded = value.new_full((bucket, *value.shape[1:]), fill)
            padded[: value.shape[0]] = value
            static.append(padded)
        entry = _Graph(fn, tuple(static), fills)
        if not self.capture:
            return entry
        before = torch.cuda.memory_reserved(self.device)
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):  # Warm-up outside the graph; it writes the same K/V the replay will write.
                    fn(*entry.inputs)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                entry.outputs = fn(*entry.inputs)
        except Exception as e:  # This shape runs eagerly from now on.
            logger.warning(f"CUDA graph capture of the Magpie {key[0]} failed for {key[1:]}: {e!r}")
            return None
        entry.graph = graph
        grown = max(0, torch.cuda.memory_reserved(self.device) - before)
        self.captured_bytes += grown
        self.captures += 1
        logger.info(
            f"Captured a CUDA graph of the Magpie {key[0]}: bucket {bucket} slots, shape {key[2:]} "
            f"(+{grown / 1e6:.1f} MB reserved, {self.captured_bytes / 1e6:.1f} MB for {self.captures} captures)"
        )
        return entry

    def _check_layout(self) -> None:
        """Drop the graphs when the cache was reallocated (they point at its old tensors)."""
        layers = self._cache.layers
        layout = (
            layers[0]["k"].data_ptr(),
            layers[-1]["v"].data_ptr(),
            layers[0]["xk"].data_ptr(),
            layers[-1]["xv"].data_ptr(),
            self._cache.xmask.data_ptr(),
        )
        if layout != self._layout:
            if self._graphs:
                logger.debug(f"The Magpie KV cache grew: dropping {len(self._graphs)} CUDA graphs")
            self._graphs.clear()
            self._layout = layout
