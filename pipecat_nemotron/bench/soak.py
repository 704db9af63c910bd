"""``soak``: N streams for T minutes, like real sessions; chunk lag and memory must not grow.

Every stream loops over the audio in real time (20 ms frames paced against a monotonic deadline) and ends an
utterance every few seconds (``finalize_nowait()``, while audio keeps flowing, as a VAD-driven session does).
Recorded over time: per step the chunk lag (``queue + step``, worst stream of the step), step time and batch size;
every second the process RSS (and GPU memory on CUDA); every final its time-to-final.

Drift is the least-squares slope over time (ms per minute for lag, MB per minute for memory), fitted after a
warm-up (the first ``--warmup-frac`` of the run, when allocators and caches fill). The run passes when the lag
grows by less than 10% of a chunk (or 5 ms) and RSS by less than 2% (or 32 MB) over the fitted span.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.bench import common, output, stats
from pipecat_nemotron.bench.audio import PaceStats, feed_realtime, load_clips
from pipecat_nemotron.runtime.devices import resolve_device

NAME = "soak"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of this benchmark."""
    common.add_common_args(parser, latency_default=560)
    parser.add_argument("--streams", type=int, default=4, help="concurrent streams (default: 4)")
    parser.add_argument("--minutes", type=float, default=2.0, help="duration, minutes (default: 2)")
    parser.add_argument(
        "--utterance-s", type=float, default=4.0, help="mean utterance length, s (0.5x-1.5x) (default: 4)"
    )
    parser.add_argument(
        "--warmup-frac",
        type=float,
        default=0.2,
        help="share of the run left out of the drift fits (default: 0.2)",
    )
    parser.add_argument(
        "--sample-s", type=float, default=1.0, help="memory sampling interval, s (default: 1)"
    )


async def session(
    engine: Any,
    index: int,
    audio: np.ndarray,
    latency_ms: int,
    t0: float,
    stop_at: float,
    utterance_s: float,
    finals: list[tuple[float, float]],
    pace: PaceStats,
) -> None:
    """One looping session: real-time audio, a ``finalize_nowait()`` every ``~utterance_s`` seconds."""
    loop = asyncio.get_running_loop()
    rng = np.random.default_rng(index)
    stream = engine.open_stream(latency_ms=latency_ms)
    pending: list[asyncio.Future[Any]] = []
    pos = int(rng.integers(0, audio.size))  # each session starts somewhere else in the audio
    fed = 0  # samples pushed: the feeder's clock is t0 + fed / 16 kHz (no drift across utterances)

    def on_final(fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            finals.append((loop.time(), fut.result().ttf_ms))

    drain = asyncio.create_task(_drain(stream))
    try:
        while t0 + fed / MODEL_SAMPLE_RATE < stop_at:
            n = int(utterance_s * rng.uniform(0.5, 1.5) * MODEL_SAMPLE_RATE)
            piece = np.take(audio, np.arange(pos, pos + n), mode="wrap")
            pos = (pos + n) % audio.size
            await feed_realtime(stream, piece, t0 + fed / MODEL_SAMPLE_RATE, stop_at=stop_at, stats=pace)
            fed += n
            fut = stream.finalize_nowait()
            fut.add_done_callback(on_final)
            pending.append(fut)
            pending = [f for f in pending if not f.done()]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 30.0)
    finally:
        await stream.close()
        drain.cancel()


async def _drain(stream: Any) -> None:
    """Read a stream's updates so nothing piles up (the queue coalesces partials anyway)."""
    with contextlib.suppress(Exception):
        async for _ in stream.updates():
            pass


async def sample_memory(
    stop: asyncio.Event, every_s: float, out: list[tuple[float, int, int | None]]
) -> None:
    """Append ``(loop time, RSS bytes, GPU bytes)`` every ``every_s`` until ``stop`` is set."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    i = 0
    while not stop.is_set():
        out.append((loop.time(), stats.rss_bytes(), stats.gpu_bytes()))
        i += 1
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, start + i * every_s - loop.time()))


def binned(t: Sequence[float], y: Sequence[float], width: float) -> dict[str, list[float]]:
    """p50/p99 of ``y`` in bins of ``width`` along ``t``."""
    if not t:
        return {"t": [], "p50": [], "p99": []}
    ta, ya = np.asarray(t), np.asarray(y)
    edges = np.arange(0.0, float(ta.max()) + width, width)
    out: dict[str, list[float]] = {"t": [], "p50": [], "p99": []}
    for lo in edges:
        sel = ya[(ta >= lo) & (ta < lo + width)]
        if sel.size:
            out["t"].append(float(lo + width / 2))
            out["p50"].append(float(np.percentile(sel, 50)))
            out["p99"].append(float(np.percentile(sel, 99)))
    return out


@dataclass
class Recording:
    """What one soak run recorded, times in loop seconds.

    Attributes:
        t0: Loop time the sessions started.
        duration_s: Length of the run, s.
        chunk_ms: Chunk length of the latency mode, ms.
        steps: ``(time, chunk lag ms, step ms, batch size)`` per engine step.
        finals: ``(time, ttf ms)`` per final.
        memory: ``(time, RSS bytes, GPU bytes or None)`` per sample.
        pace: How well the feeders kept to real time.
        meter: Wall and CPU time of the sessions.
        info: The engine's description.

    """

    t0: float
    duration_s: float
    chunk_ms: float
    steps: list[tuple[float, float, float, int]] = field(default_factory=list)
    finals: list[tuple[float, float]] = field(default_factory=list)
    memory: list[tuple[float, int, int | None]] = field(default_factory=list)
    pace: PaceStats = field(default_factory=PaceStats)
    meter: stats.Meter = field(default_factory=stats.Meter)
    info: Any = None


async def record(engine: Any, audio: np.ndarray, args: argparse.Namespace) -> Recording:
    """Run ``args.streams`` looping sessions on a started engine for ``args.minutes``, sampling memory."""
    loop = asyncio.get_running_loop()
    rec = Recording(
        t0=loop.time() + 0.1, duration_s=args.minutes * 60.0, chunk_ms=engine.chunk_ms(args.latency)
    )
    engine.add_step_listener(
        lambda s: rec.steps.append((loop.time(), s.queue_ms_max + s.step_ms, s.step_ms, s.batch_size))
    )
    stop_at = rec.t0 + rec.duration_s
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_memory(stop, args.sample_s, rec.memory))
    with rec.meter:
        await asyncio.gather(
            *(
                session(
                    engine,
                    i,
                    audio,
                    args.latency,
                    rec.t0 + (i / args.streams) * rec.chunk_ms / 1000.0,
                    stop_at,
                    args.utterance_s,
                    rec.finals,
                    rec.pace,
                )
                for i in range(args.streams)
            )
        )
    stop.set()
    await sampler
    rec.info = engine.info
    return rec


def lag_analysis(rec: Recording, fit_from: float) -> dict[str, Any]:
    """Chunk lag over the run: per-step samples (s from the start), binned percentiles and their slopes."""
    st = [(t - rec.t0, lag, step, b) for t, lag, step, b in rec.steps if 0.0 <= t - rec.t0 <= rec.duration_s]
    fit = [(t, lag) for t, lag, _s, _b in st if t >= fit_from]
    lag_bins = binned([t for t, *_ in st], [lag for _, lag, *_ in st], max(5.0, rec.duration_s / 24))
    p99_fit = [(t, v) for t, v in zip(lag_bins["t"], lag_bins["p99"], strict=True) if t >= fit_from]
    return {
        "steps": st,
        "bins": lag_bins,
        "slope": stats.linear_slope([t / 60.0 for t, _ in fit], [lag for _, lag in fit]),
        "p99_slope": stats.linear_slope([t / 60.0 for t, _ in p99_fit], [v for _, v in p99_fit]),
    }


def memory_analysis(rec: Recording, fit_from: float) -> dict[str, Any]:
    """Memory over the run: samples (s from the start), RSS and GPU slopes after ``fit_from``, mean RSS."""
    mem = [(t - rec.t0, rss, gpu) for t, rss, gpu in rec.memory]
    mem_fit = [m for m in mem if m[0] >= fit_from]
    gpu_vals = [(t, g) for t, _, g in mem_fit if g is not None]
    return {
        "samples": mem,
        "rss_slope": stats.linear_slope(
            [t / 60.0 for t, *_ in mem_fit], [rss / 1e6 for _, rss, _ in mem_fit]
        ),
        "gpu_slope": stats.linear_slope([t / 60.0 for t, _ in gpu_vals], [g / 1e6 for _, g in gpu_vals]),
        "rss_mean_mb": float(np.mean([rss for _, rss, _ in mem_fit])) / 1e6 if mem_fit else 0.0,
    }


def analyse(rec: Recording, args: argparse.Namespace) -> dict[str, Any]:
    """The result of a soak run: statistics, growth over the fitted span against its limits, and series."""
    fit_from = args.warmup_frac * rec.duration_s
    lag, mem = lag_analysis(rec, fit_from), memory_analysis(rec, fit_from)
    st, samples = lag["steps"], mem["samples"]
    span_min = (rec.duration_s - fit_from) / 60.0
    lag_growth = None if lag["slope"] is None else lag["slope"] * span_min
    rss_growth = None if mem["rss_slope"] is None else mem["rss_slope"] * span_min
    lag_limit = max(5.0, 0.1 * rec.chunk_ms)
    rss_limit = max(32.0, 0.02 * mem["rss_mean_mb"])
    return {
        "steps": len(st),
        "finals": len(rec.finals),
        "chunk_lag_ms": stats.summarize([lag for _, lag, *_ in st]),
        "step_ms": stats.summarize([s for _, _, s, _ in st]),
        "batch_size": stats.summarize([b for *_, b in st]),
        "ttf_ms": stats.summarize([ttf for _, ttf in rec.finals]),
        "feeder_late_max_ms": rec.pace.late_max_ms,
        "cpu_util": rec.meter.cpu_s / max(rec.meter.wall_s, 1e-9),
        "fit_from_s": fit_from,
        "lag_slope_ms_per_min": lag["slope"],
        "lag_p99_slope_ms_per_min": lag["p99_slope"],
        "lag_growth_ms": lag_growth,
        "rss_slope_mb_per_min": mem["rss_slope"],
        "rss_growth_mb": rss_growth,
        "gpu_slope_mb_per_min": mem["gpu_slope"],
        "rss_mb": {
            "start": samples[0][1] / 1e6 if samples else None,
            "end": samples[-1][1] / 1e6 if samples else None,
        },
        "limits": {"lag_growth_ms": lag_limit, "rss_growth_mb": rss_limit},
        "no_growth": bool(
            lag_growth is not None
            and rss_growth is not None
            and lag_growth <= lag_limit
            and rss_growth <= rss_limit
        ),
        "series": {
            "lag_bins": lag["bins"],
            "memory": [
                {
                    "t": round(t, 2),
                    "rss_mb": round(r / 1e6, 2),
                    "gpu_mb": None if g is None else round(g / 1e6, 2),
                }
                for t, r, g in samples
            ],
        },
        "_steps": st,
    }


async def bench(spec: common.ModelSpec, args: argparse.Namespace, device: str) -> dict[str, Any]:
    """Run the soak on one engine and analyse it."""
    clips, source = load_clips(args.manifest)
    gap = np.zeros(int(0.3 * MODEL_SAMPLE_RATE), np.float32)
    audio = np.concatenate([np.concatenate([c.audio, gap]) for c in clips])
    async with common.bench_engine(spec.path, device, args.streams, "soft") as engine:
        rec = await record(engine, audio, args)
    info = rec.info
    return {
        "model": spec.as_dict(),
        "audio_source": source,
        "streams": args.streams,
        "minutes": args.minutes,
        "latency_ms": args.latency,
        "chunk_ms": rec.chunk_ms,
        "engine": {
            "device": info.device,
            "dtype": info.dtype,
            "cache_bytes_per_stream": info.cache_bytes_per_stream,
        },
        **analyse(rec, args),
    }


def plot(result: dict[str, Any], steps: Sequence[tuple[float, float, float, int]]) -> Any:
    """Chunk lag over time (per step, binned p50/p99, fit) and memory over time."""
    fig, axes = output.new_figure(2, 1, (10.0, 6.5))
    ax = axes[0][0]
    if steps:
        t = np.asarray([s[0] for s in steps]) / 60.0
        ax.scatter(t, [s[1] for s in steps], s=2, alpha=0.25, color="0.5", label="chunk lag per step")
    b = result["series"]["lag_bins"]
    ax.plot(np.asarray(b["t"]) / 60.0, b["p50"], "-", label="p50")
    ax.plot(np.asarray(b["t"]) / 60.0, b["p99"], "-", label="p99")
    if result["lag_slope_ms_per_min"] is not None and steps:
        fit = [s for s in steps if s[0] >= result["fit_from_s"]]
        if fit:
            tt = np.asarray([s[0] for s in fit]) / 60.0
            c = np.polyfit(tt, [s[1] for s in fit], 1)
            ax.plot(tt, np.polyval(c, tt), "k--", lw=1, label=f"fit {c[0]:+.2f} ms/min")
    ax.axhline(result["chunk_ms"], color="r", ls=":", lw=1, label=f"chunk {result['chunk_ms']:.0f} ms")
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.set_title(
        f"Soak: {result['streams']} streams x {result['minutes']:g} min, {result['latency_ms']} ms mode"
    )
    ax.legend(fontsize=8, loc="upper right")
    ax = axes[1][0]
    mem = result["series"]["memory"]
    ax.plot([m["t"] / 60.0 for m in mem], [m["rss_mb"] for m in mem], label="RSS MB")
    if any(m["gpu_mb"] is not None for m in mem):
        ax2 = ax.twinx()
        ax2.plot([m["t"] / 60.0 for m in mem], [m["gpu_mb"] for m in mem], color="g", label="GPU MB")
        ax2.set_ylabel("GPU allocated MB")
    slope = result["rss_slope_mb_per_min"]
    ax.set_title(f"Memory (RSS slope {slope:+.2f} MB/min after warm-up)" if slope is not None else "Memory")
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS MB")
    return fig


def summary(result: dict[str, Any]) -> str:
    """Markdown table and verdict."""
    lag = result["chunk_lag_ms"]
    table = output.format_table(
        [
            "streams",
            "minutes",
            "mode ms",
            "steps",
            "finals",
            "lag p50 ms",
            "lag p99 ms",
            "lag slope ms/min",
            "p99 slope ms/min",
            "RSS slope MB/min",
            "TTF p50 ms",
        ],
        [
            [
                result["streams"],
                result["minutes"],
                result["latency_ms"],
                result["steps"],
                result["finals"],
                lag["p50"],
                lag["p99"],
                result["lag_slope_ms_per_min"],
                result["lag_p99_slope_ms_per_min"],
                result["rss_slope_mb_per_min"],
                result["ttf_ms"]["p50"],
            ]
        ],
    )
    verdict = "no growth" if result["no_growth"] else "GROWTH (or too short to fit)"
    return (
        f"{table}\n{verdict}: lag {result['lag_growth_ms'] or 0:+.2f} ms (limit {result['limits']['lag_growth_ms']:.0f}), "
        f"RSS {result['rss_growth_mb'] or 0:+.1f} MB (limit {result['limits']['rss_growth_mb']:.0f}) over the fitted span"
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark; write JSON and PNG under ``args.out``; return the result."""
    device = resolve_device(args.device)
    result = output.result_header(NAME, args)
    spec = common.resolve_model(args.model, args.models_dir)
    with common.bench_context(args):
        result.update(asyncio.run(bench(spec, args, device)))
    steps = result.pop("_steps")
    output.finish(args.out, NAME, result, plot(result, steps), summary(result))
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point: ``python -m pipecat_nemotron.bench soak [options]``."""
    return common.bench_main(NAME, __doc__, add_arguments, run, argv)
