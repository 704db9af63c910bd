"""``concurrency``: how many real-time streams one engine keeps up with, what a batched step costs, memory per stream.

Two parts:

1. **Batched step cost** (direct): for each latency mode, ``k`` = 1/4/16 streams get their audio at once, so
   every step batches exactly ``k`` chunks; the median step time of those regular steps is reported, and the
   ratio ``step(16) / step(1)`` (target: <= 3).
2. **Real-time streams**: N = 1, 2, 4, 8, ... streams, each pushing 20 ms frames paced against a monotonic
   deadline (start times staggered over one chunk, like independent users), for ``--seconds``. Per step:
   batch size, step time, queue wait, and chunk lag (``queue + step``: from the chunk's last sample arriving to
   its result; the worst stream of the step). ``Transcript.lag_ms`` of every update is recorded too.
   N is real time when the p99 chunk lag stays under the chunk length and no stream is left behind (backlog at
   the end under two chunks); doubling stops at the first N that is not.

Memory per stream: measured (RSS / GPU-allocated growth with N streams open and running, divided by N: slots
are preallocated, so this is the per-stream state beyond the cache) and computed (``cache_bytes_per_stream`` of
the engine's preallocated slot pool).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.asr.config import LATENCY_MODES
from pipecat_nemotron.bench import common, output, stats
from pipecat_nemotron.bench.audio import (
    Clip,
    PaceStats,
    feed_realtime,
    load_clips,
    loop_audio,
    wait_caught_up,
)
from pipecat_nemotron.runtime.devices import resolve_device

NAME = "concurrency"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of this benchmark."""
    common.add_common_args(parser, latency_default=160)
    parser.add_argument(
        "--streams",
        type=int,
        nargs="+",
        default=None,
        help="stream counts to try (default: 1, 2, 4, ... doubling up to --max-n, stopping at the first that "
        "is not real time)",
    )
    parser.add_argument("--max-n", type=int, default=512, help="largest N when doubling (default: 512)")
    parser.add_argument("--seconds", type=float, default=8.0, help="real-time audio per N, s (default: 8)")
    parser.add_argument(
        "--keep-going", action="store_true", help="try every N even after one is not real time"
    )
    parser.add_argument(
        "--step-batches",
        type=int,
        nargs="*",
        default=[1, 4, 16],
        help="batch sizes of the direct step measurement (default: 1 4 16; none to skip)",
    )
    parser.add_argument(
        "--step-modes",
        type=int,
        nargs="*",
        default=sorted(LATENCY_MODES),
        help="latency modes of the direct step measurement (default: all four)",
    )
    parser.add_argument(
        "--step-seconds", type=float, default=6.0, help="audio per stream in the direct step measurement, s"
    )


# ---- part 1: batched step cost ----------------------------------------------------------------------------


async def measure_batched_steps(
    engine: Any, audio: np.ndarray, modes: Sequence[int], batches: Sequence[int]
) -> list[dict[str, Any]]:
    """Median step time of regular steps batching exactly ``k`` streams, per mode and ``k``.

    Each of ``k`` streams gets ``audio`` at once (faster than real time), so the scheduler batches all ``k``
    chunks in every step. The first step (first-chunk shape) and the finalize step are excluded.
    """
    rows: list[dict[str, Any]] = []
    for mode in modes:
        for k in batches:
            steps: list[Any] = []
            engine.add_step_listener(steps.append)
            streams = [engine.open_stream(latency_ms=mode) for _ in range(k)]
            try:
                for s in streams:
                    await s.push(audio)
                await asyncio.gather(*(s.finalize() for s in streams))
            finally:
                engine.remove_step_listener(steps.append)
                for s in streams:
                    await s.close()
            regular = [s.step_ms for s in steps[1:] if s.batch_size == k and s.groups == 1 and s.finals == 0]
            step = stats.summarize(regular)
            rows.append(
                {
                    "latency_ms": mode,
                    "batch": k,
                    "steps": step["n"],
                    "step_ms_p50": step["p50"],
                    "step_ms_mean": step["mean"],
                    "chunk_ms": engine.chunk_ms(mode),
                }
            )
            print(
                f"[bench] step {mode} ms x{k}: {step['p50'] or float('nan'):.1f} ms (n={step['n']})",
                flush=True,
            )
    for row in rows:
        one = next((r for r in rows if r["latency_ms"] == row["latency_ms"] and r["batch"] == 1), None)
        row["ratio_vs_1"] = stats.ratio(row["step_ms_p50"], one["step_ms_p50"] if one else None)
        row["step_ms_per_stream"] = stats.ratio(row["step_ms_p50"], float(row["batch"]))
    return rows


# ---- part 2: real-time streams ----------------------------------------------------------------------------


async def run_realtime(
    engine: Any, clips: Sequence[Clip], n: int, latency_ms: int, seconds: float
) -> dict[str, Any]:
    """N real-time streams for ``seconds``; returns step/lag statistics, memory growth and the verdict."""
    loop = asyncio.get_running_loop()
    chunk_ms = engine.chunk_ms(latency_ms)
    steps: list[tuple[float, Any]] = []

    def on_step(s: Any) -> None:
        steps.append((loop.time(), s))

    rss0, gpu0 = stats.rss_bytes(), stats.gpu_bytes()
    streams = [engine.open_stream(latency_ms=latency_ms) for _ in range(n)]
    update_lags: list[float] = []

    async def consume(stream: Any) -> None:
        with contextlib.suppress(Exception):
            async for u in stream.updates():
                if not u.is_final:
                    update_lags.append(u.lag_ms)

    consumers = [asyncio.create_task(consume(s)) for s in streams]
    total = loop_audio(clips, seconds * 2 + 1.0, gap_s=0.3)
    per_stream = int(seconds * MODEL_SAMPLE_RATE)
    t0 = loop.time() + 0.05
    stop_at = t0 + seconds
    pace = PaceStats()
    engine.add_step_listener(on_step)
    meter = stats.Meter()
    try:
        with meter:
            feeders = []
            for i, s in enumerate(streams):
                offset = int(
                    MODEL_SAMPLE_RATE * (i * 0.731 % max(1.0, seconds))
                )  # different audio per stream
                start = t0 + (i / n) * chunk_ms / 1000.0  # staggered like independent users
                feeders.append(feed_realtime(s, total[offset : offset + per_stream], start, stats=pace))
            await asyncio.gather(*feeders)
        backlog_end = max(s.backlog_ms for s in streams)
        rss1, gpu1 = stats.rss_bytes(), stats.gpu_bytes()
        with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(wait_caught_up(s, 60.0) for s in streams)), 60.0)
    finally:
        engine.remove_step_listener(on_step)
        for s in streams:
            await s.close()
        for c in consumers:
            c.cancel()
    # Only the steps while all streams were live: skip the first chunk's warm-in, stop at the last push.
    live = [s for t, s in steps if t0 + 2 * chunk_ms / 1000.0 <= t <= stop_at]
    lag = [s.queue_ms_max + s.step_ms for s in live]
    step_stats = stats.summarize([s.step_ms for s in live])
    lag_stats = stats.summarize(lag)
    realtime = bool(
        lag_stats["p99"] is not None and lag_stats["p99"] <= chunk_ms and backlog_end <= 2 * chunk_ms
    )
    cores = os.cpu_count() or 1
    return {
        "streams": n,
        "latency_ms": latency_ms,
        "chunk_ms": chunk_ms,
        "seconds": seconds,
        "steps": len(live),
        "batch_size": stats.summarize([s.batch_size for s in live]),
        "step_ms": step_stats,
        "queue_ms": stats.summarize([s.queue_ms_max for s in live]),
        "chunk_lag_ms": lag_stats,
        "update_lag_ms": stats.summarize(update_lags),
        "backlog_end_ms": backlog_end,
        "feeder_late_max_ms": pace.late_max_ms,
        "cpu_util": meter.cpu_s / max(meter.wall_s, 1e-9) / cores,
        "busy_fraction": sum(s.step_ms for s in live) / 1000.0 / max(seconds - 2 * chunk_ms / 1000.0, 1e-9),
        "rss_delta_per_stream_bytes": (rss1 - rss0) / n,
        "gpu_delta_per_stream_bytes": None if gpu0 is None or gpu1 is None else (gpu1 - gpu0) / n,
        "load_avg_1m": common.load_avg(),
        "realtime": realtime,
    }


def limit_reason(row: dict[str, Any], cores: int) -> str:
    """Why a run was not real time, in words."""
    busy = row["busy_fraction"]
    cores_used = row["cpu_util"] * cores
    if busy > 0.3 and cores_used < 0.6 * busy:
        return (
            f"CPU starved by other load: the model thread was busy {busy:.0%} of the time but the process got only "
            f"{cores_used:.2f} cores (1-min load average {row['load_avg_1m']}); steps p99 "
            f"{row['step_ms']['p99']:.0f} ms vs p50 {row['step_ms']['p50']:.0f} ms"
        )
    if busy >= 0.9:
        return (
            f"compute: the model thread was busy {busy:.0%} of the time (batches of {row['batch_size']['mean']:.0f} "
            f"chunks on average, mean step {row['step_ms']['mean']:.0f} ms, {row['streams']} chunks due every "
            f"{row['chunk_ms']:.0f} ms; the process used {row['cpu_util'] * cores:.2f} of {cores} cores)"
        )
    if row["feeder_late_max_ms"] > row["chunk_ms"]:
        return f"host: feeders ran up to {row['feeder_late_max_ms']:.0f} ms late (event loop starved)"
    return (
        f"tail latency: p99 chunk lag {row['chunk_lag_ms']['p99']:.0f} ms > {row['chunk_ms']:.0f} ms with the "
        f"model busy {busy:.0%} (scheduling/jitter, or other load on the machine)"
    )


def plot(result: dict[str, Any]) -> Any:
    """Lag and step time against N, and the batched step cost per mode."""
    fig, axes = output.new_figure(1, 3, (14.0, 4.2))
    rt = result["realtime"]
    n = [r["streams"] for r in rt]
    chunk = rt[0]["chunk_ms"] if rt else 0.0
    ax = axes[0][0]
    ax.plot(n, [r["chunk_lag_ms"]["p50"] for r in rt], "o-", label="chunk lag p50")
    ax.plot(n, [r["chunk_lag_ms"]["p99"] for r in rt], "s-", label="chunk lag p99")
    ax.axhline(chunk, color="r", ls="--", lw=1, label=f"chunk {chunk:.0f} ms")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("real-time streams N")
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.set_title(f"Chunk lag, {result['latency_ms']} ms mode")
    ax.legend(fontsize=8)
    ax = axes[0][1]
    ax.plot(n, [r["step_ms"]["p50"] for r in rt], "o-", label="step p50")
    ax.plot(n, [r["step_ms"]["p99"] for r in rt], "s-", label="step p99")
    ax.plot(n, [r["batch_size"]["mean"] for r in rt], "^:", label="mean batch size")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("real-time streams N")
    ax.set_yscale("log")
    ax.set_title("Step time (ms) and batch size")
    ax.legend(fontsize=8)
    ax = axes[0][2]
    bs = result["batched_steps"]
    modes = sorted({r["latency_ms"] for r in bs})
    ks = sorted({r["batch"] for r in bs})
    width = 0.8 / max(1, len(ks))
    for j, k in enumerate(ks):
        vals = [
            next((r["step_ms_p50"] for r in bs if r["latency_ms"] == m and r["batch"] == k), None) or 0
            for m in modes
        ]
        ax.bar(np.arange(len(modes)) + j * width, vals, width, label=f"{k} stream(s)")
    ax.set_xticks(np.arange(len(modes)) + width * (len(ks) - 1) / 2, [f"{m} ms" for m in modes])
    ax.set_ylabel("median step ms")
    ax.set_title("Batched step cost per mode")
    ax.legend(fontsize=8)
    return fig


def summary_tables(result: dict[str, Any]) -> str:
    """Markdown tables: real-time runs and batched steps."""
    rt_rows = [
        [
            r["streams"],
            r["batch_size"]["mean"],
            r["step_ms"]["p50"],
            r["step_ms"]["p99"],
            r["queue_ms"]["p99"],
            r["chunk_lag_ms"]["p50"],
            r["chunk_lag_ms"]["p99"],
            r["busy_fraction"],
            r["step_ratio_vs_1"],
            "yes" if r["realtime"] else "no",
        ]
        for r in result["realtime"]
    ]
    t1 = output.format_table(
        [
            "N",
            "mean batch",
            "step p50 ms",
            "step p99 ms",
            "queue p99 ms",
            "lag p50 ms",
            "lag p99 ms",
            "model busy",
            "step N/1",
            "real time",
        ],
        rt_rows,
    )
    by_mode: dict[int, dict[int, float | None]] = {}
    for r in result["batched_steps"]:
        by_mode.setdefault(r["latency_ms"], {})[r["batch"]] = r["step_ms_p50"]
    ks = sorted({r["batch"] for r in result["batched_steps"]})
    rows2 = []
    for m, d in sorted(by_mode.items()):
        last = stats.ratio(d.get(ks[-1]), d.get(ks[0])) if ks else None
        rows2.append([f"{m} ms", *[d.get(k) for k in ks], last])
    t2 = output.format_table(
        ["mode", *[f"{k} stream(s) ms" for k in ks], f"{ks[-1] if ks else '-'}/{ks[0] if ks else '-'}"], rows2
    )
    s = result["summary"]
    lines = [
        t1,
        "",
        t2,
        "",
        f"largest real-time N: {s['largest_realtime_n']} ({result['latency_ms']} ms mode); limit: {s['limit']}",
        f"memory per stream: computed cache {s['cache_bytes_per_stream'] / 1e6:.3f} MB (preallocated slot pool "
        f"{s['slot_pool_bytes'] / 1e6:.1f} MB for {s['max_streams']} slots); measured RSS growth "
        f"{(s['rss_delta_per_stream_bytes'] or 0) / 1e6:.3f} MB/stream at N={s['memory_n']}",
    ]
    return "\n".join(lines)


async def realtime_runs(
    engine: Any, clips: Sequence[Clip], ns: Sequence[int], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Part 2 for each N in turn, stopping after the first N that is not real time (unless ``--keep-going``)."""
    realtime: list[dict[str, Any]] = []
    for n in ns:
        row = await run_realtime(engine, clips, n, args.latency, args.seconds)
        realtime.append(row)
        print(
            f"[bench] N={n}: step p50 {row['step_ms']['p50'] or 0:.1f} ms, lag p99 "
            f"{row['chunk_lag_ms']['p99'] or 0:.0f} ms (chunk {row['chunk_ms']:.0f}), mean batch "
            f"{row['batch_size']['mean'] or 0:.1f}, busy {row['busy_fraction']:.0%} -> "
            f"{'real time' if row['realtime'] else 'NOT real time'}",
            flush=True,
        )
        if not row["realtime"] and not args.keep_going:
            break
    base = realtime[0]["step_ms"]["p50"] if realtime else None
    for r in realtime:
        r["step_ratio_vs_1"] = stats.ratio(r["step_ms"]["p50"], base) if realtime[0]["streams"] == 1 else None
    return realtime


def summarize_runs(
    info: Any,
    batched: Sequence[dict[str, Any]],
    realtime: Sequence[dict[str, Any]],
    ns: Sequence[int],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The verdict: largest real-time N and what limited it, batched step ratio, memory per stream."""
    ok = [r["streams"] for r in realtime if r["realtime"]]
    failing = next((r for r in realtime if not r["realtime"]), None)
    cores = os.cpu_count() or 1
    mem_row = max((r for r in realtime if r["realtime"]), key=lambda r: r["streams"], default=None) or (
        realtime[-1] if realtime else None
    )
    step_ratio_16 = next(
        (
            r["ratio_vs_1"]
            for r in batched
            if r["latency_ms"] == args.latency and r["batch"] == max(args.step_batches or [1])
        ),
        None,
    )
    return {
        "largest_realtime_n": max(ok) if ok else 0,
        "first_failing_n": failing["streams"] if failing else None,
        "limit": limit_reason(failing, cores)
        if failing
        else f"not reached: every N tried (up to {ns[-1]}) stayed real time",
        "step_ratio_max_batch_vs_1": step_ratio_16,
        "cache_bytes_per_stream": info.cache_bytes_per_stream,
        "slot_pool_bytes": info.cache_bytes_per_stream * info.max_streams,
        "max_streams": info.max_streams,
        "memory_n": mem_row["streams"] if mem_row else None,
        "rss_delta_per_stream_bytes": mem_row["rss_delta_per_stream_bytes"] if mem_row else None,
        "gpu_delta_per_stream_bytes": mem_row["gpu_delta_per_stream_bytes"] if mem_row else None,
    }


async def bench(spec: common.ModelSpec, args: argparse.Namespace, device: str) -> dict[str, Any]:
    """Both parts on one engine."""
    clips, source = load_clips(args.manifest)
    ns = args.streams or [2**i for i in range(0, 32) if 2**i <= args.max_n]
    max_streams = max([*ns, *(args.step_batches or [1])])
    async with common.bench_engine(spec.path, device, max_streams, "soft") as engine:
        info = engine.info
        modes = [m for m in (args.step_modes or []) if m in info.latency_modes]
        step_audio = loop_audio(clips, args.step_seconds)
        batched = await measure_batched_steps(engine, step_audio, modes, args.step_batches or [])
        realtime = await realtime_runs(engine, clips, ns, args)
    return {
        "model": spec.as_dict(),
        "audio_source": source,
        "latency_ms": args.latency,
        "engine": {
            "device": info.device,
            "dtype": info.dtype,
            "max_streams": info.max_streams,
            "cache_bytes_per_stream": info.cache_bytes_per_stream,
            "load_seconds": info.load_seconds,
        },
        "batched_steps": batched,
        "realtime": realtime,
        "summary": summarize_runs(info, batched, realtime, ns, args),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark; write JSON and PNG under ``args.out``; return the result."""
    device = resolve_device(args.device)
    result = output.result_header(NAME, args)
    spec = common.resolve_model(args.model, args.models_dir)
    with common.bench_context(args):
        t = time.perf_counter()
        result.update(asyncio.run(bench(spec, args, device)))
        result["bench_seconds"] = round(time.perf_counter() - t, 1)
    output.finish(args.out, NAME, result, plot(result), summary_tables(result))
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point: ``python -m pipecat_nemotron.bench concurrency [options]``."""
    return common.bench_main(NAME, __doc__, add_arguments, run, argv)
