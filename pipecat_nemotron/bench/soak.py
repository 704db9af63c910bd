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
from pathlib import Path
from typing import Any

import numpy as np

from pipecat_nemotron.bench import common

NAME = "soak"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of this benchmark."""
    common.add_common_args(parser)
    parser.add_argument("--streams", type=int, default=4, help="concurrent streams (default: 4)")
    parser.add_argument("--minutes", type=float, default=2.0, help="duration, minutes (default: 2)")
    parser.add_argument("--latency", type=int, default=560, help="latency mode, ms (default: 560)")
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
    parser.add_argument("--manifest", type=Path, default=None, help="audio manifest (default: held-out set)")


async def session(
    engine: Any,
    index: int,
    audio: np.ndarray,
    latency_ms: int,
    t0: float,
    stop_at: float,
    utterance_s: float,
    finals: list[tuple[float, float]],
    pace: common.PaceStats,
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
        while t0 + fed / common.SAMPLE_RATE < stop_at:
            n = int(utterance_s * rng.uniform(0.5, 1.5) * common.SAMPLE_RATE)
            piece = np.take(audio, np.arange(pos, pos + n), mode="wrap")
            pos = (pos + n) % audio.size
            await common.feed_realtime(
                stream, piece, t0 + fed / common.SAMPLE_RATE, stop_at=stop_at, stats=pace
            )
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
        out.append((loop.time(), common.rss_bytes(), common.gpu_bytes()))
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


async def bench(spec: common.ModelSpec, args: argparse.Namespace, device: str) -> dict[str, Any]:
    """Run the soak on one engine and analyse it."""
    from pipecat_nemotron.engine import EngineConfig, NemotronEngine

    clips, source = common.load_clips(args.manifest)
    audio = np.concatenate(
        [np.concatenate([c.audio, np.zeros(int(0.3 * common.SAMPLE_RATE), np.float32)]) for c in clips]
    )
    engine = NemotronEngine(
        EngineConfig(
            model=str(spec.path),
            device=device,
            max_streams=args.streams,
            max_batch_size=args.streams,
            finalize_mode="soft",
            warmup=True,
        )
    )
    await engine.start()
    loop = asyncio.get_running_loop()
    steps: list[tuple[float, float, float, int]] = []
    finals: list[tuple[float, float]] = []
    memory: list[tuple[float, int, int | None]] = []
    pace = common.PaceStats()
    chunk_ms = engine.chunk_ms(args.latency)
    duration = args.minutes * 60.0
    try:
        engine.add_step_listener(
            lambda s: steps.append((loop.time(), s.queue_ms_max + s.step_ms, s.step_ms, s.batch_size))
        )
        t0 = loop.time() + 0.1
        stop_at = t0 + duration
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample_memory(stop, args.sample_s, memory))
        meter = common.Meter()
        with meter:
            await asyncio.gather(
                *(
                    session(
                        engine,
                        i,
                        audio,
                        args.latency,
                        t0 + (i / args.streams) * chunk_ms / 1000.0,
                        stop_at,
                        args.utterance_s,
                        finals,
                        pace,
                    )
                    for i in range(args.streams)
                )
            )
        stop.set()
        await sampler
        info = engine.info
    finally:
        await engine.stop()

    def rel(t: float) -> float:
        return t - t0

    fit_from = args.warmup_frac * duration
    st = [(rel(t), lag, step, b) for t, lag, step, b in steps if 0.0 <= rel(t) <= duration]
    fit = [(t, lag) for t, lag, _s, _b in st if t >= fit_from]
    lag_slope = common.linear_slope([t / 60.0 for t, _ in fit], [lag for _, lag in fit])
    lag_bins = binned([t for t, *_ in st], [lag for _, lag, *_ in st], max(5.0, duration / 24))
    p99_fit = [(t, v) for t, v in zip(lag_bins["t"], lag_bins["p99"], strict=True) if t >= fit_from]
    p99_slope = common.linear_slope([t / 60.0 for t, _ in p99_fit], [v for _, v in p99_fit])
    mem = [(rel(t), rss, gpu) for t, rss, gpu in memory]
    mem_fit = [m for m in mem if m[0] >= fit_from]
    rss_slope = common.linear_slope([t / 60.0 for t, *_ in mem_fit], [rss / 1e6 for _, rss, _ in mem_fit])
    gpu_vals = [(t, g) for t, _, g in mem_fit if g is not None]
    gpu_slope = common.linear_slope([t / 60.0 for t, _ in gpu_vals], [g / 1e6 for _, g in gpu_vals])
    span_min = (duration - fit_from) / 60.0
    lag_growth = None if lag_slope is None else lag_slope * span_min
    rss_growth = None if rss_slope is None else rss_slope * span_min
    rss_mean_mb = float(np.mean([rss for _, rss, _ in mem_fit])) / 1e6 if mem_fit else 0.0
    lag_limit = max(5.0, 0.1 * chunk_ms)
    rss_limit = max(32.0, 0.02 * rss_mean_mb)
    lag_stats = common.summarize([lag for _, lag, *_ in st])
    return {
        "model": spec.as_dict(),
        "audio_source": source,
        "streams": args.streams,
        "minutes": args.minutes,
        "latency_ms": args.latency,
        "chunk_ms": chunk_ms,
        "engine": {
            "device": info.device,
            "dtype": info.dtype,
            "cache_bytes_per_stream": info.cache_bytes_per_stream,
        },
        "steps": len(st),
        "finals": len(finals),
        "chunk_lag_ms": lag_stats,
        "step_ms": common.summarize([s for _, _, s, _ in st]),
        "batch_size": common.summarize([b for *_, b in st]),
        "ttf_ms": common.summarize([ttf for _, ttf in finals]),
        "feeder_late_max_ms": pace.late_max_ms,
        "cpu_util": meter.cpu_s / max(meter.wall_s, 1e-9),
        "fit_from_s": fit_from,
        "lag_slope_ms_per_min": lag_slope,
        "lag_p99_slope_ms_per_min": p99_slope,
        "lag_growth_ms": lag_growth,
        "rss_slope_mb_per_min": rss_slope,
        "rss_growth_mb": rss_growth,
        "gpu_slope_mb_per_min": gpu_slope,
        "rss_mb": {"start": mem[0][1] / 1e6 if mem else None, "end": mem[-1][1] / 1e6 if mem else None},
        "limits": {"lag_growth_ms": lag_limit, "rss_growth_mb": rss_limit},
        "no_growth": bool(
            lag_growth is not None
            and rss_growth is not None
            and lag_growth <= lag_limit
            and rss_growth <= rss_limit
        ),
        "series": {
            "lag_bins": lag_bins,
            "memory": [
                {
                    "t": round(t, 2),
                    "rss_mb": round(r / 1e6, 2),
                    "gpu_mb": None if g is None else round(g / 1e6, 2),
                }
                for t, r, g in mem
            ],
        },
        "_steps": st,
    }


def plot(result: dict[str, Any], steps: Sequence[tuple[float, float, float, int]]) -> Any:
    """Chunk lag over time (per step, binned p50/p99, fit) and memory over time."""
    fig, axes = common.new_figure(2, 1, (10.0, 6.5))
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
    table = common.format_table(
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
    device = common.resolve_device(args.device)
    result = common.result_header(NAME, args)
    spec = common.resolve_model(args.model, args.models_dir)
    with common.bench_context(args):
        result.update(asyncio.run(bench(spec, args, device)))
    steps = result.pop("_steps")
    common.finish(args.out, NAME, result, plot(result, steps), summary(result))
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point: ``python -m pipecat_nemotron.bench soak [options]``."""
    parser = argparse.ArgumentParser(prog=f"python -m pipecat_nemotron.bench {NAME}", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
