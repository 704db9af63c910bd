"""Analysis of the load test: drift fits of the lag series, the pooled summary, and its figure.

Drift is the slope of the partial lag over time, ms per minute: the median lag per ``--bin-s`` window, then the
Theil-Sen slope of those medians (least sensitive to a window disturbed by another process) with Sen's 99 %
interval, fitted over the windows after ``--warmup-s``.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from pipecat_nemotron.bench.load_client import ClientResult, frame_bytes, frame_seconds, pause_frames


def theil_sen(xs: list[float], ys: list[float], z: float = 2.576) -> tuple[float, float, float]:
    """Theil-Sen slope of ``ys`` over ``xs`` with Sen's confidence interval.

    Args:
        xs: Abscissae (distinct).
        ys: Values.
        z: Normal quantile of the interval (2.576: 99 %).

    Returns:
        ``(slope, low, high)`` in units of y per x.

    """
    slopes = sorted((ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs)))
    n, count = len(xs), len(slopes)
    half = z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18.0) / 2.0
    low = slopes[max(0, int(round(count / 2.0 - half)))]
    high = slopes[min(count - 1, int(round(count / 2.0 + half)))]
    return float(statistics.median(slopes)), float(low), float(high)


def drift_fit(
    samples: list[tuple[float, float]], start_s: float, bin_s: float, end_s: float = math.inf
) -> tuple[float, float, float] | None:
    """Drift of a lag series: Theil-Sen slope of per-window medians with its 99 % interval, ms per minute.

    The median of each full ``bin_s`` window between ``start_s`` and ``end_s`` is taken, then the Theil-Sen
    slope (median of the pairwise slopes) of those medians, so a window disturbed by another process does not
    tilt the line; Sen's interval says how well the data pin the slope down. Make ``bin_s`` the audio
    schedule's period (see :func:`cycle_s`) so every window holds the same speech.

    Args:
        samples: ``(t_s, value_ms)`` pairs.
        start_s: Ignore samples before this time (warm-up), s.
        bin_s: Window of each median, s.
        end_s: Ignore windows that end after this time (the last, partial one), s.

    Returns:
        ``(slope, low, high)`` in ms/min, or None with fewer than 3 windows holding 3 samples or more.

    """
    bins: dict[int, list[float]] = {}
    for t, v in samples:
        if t >= start_s:
            bins.setdefault(int((t - start_s) // bin_s), []).append(v)
    keys = sorted(b for b in bins if len(bins[b]) >= 3 and start_s + (b + 1) * bin_s <= end_s + 1e-9)
    if len(keys) < 3:
        return None
    xs = [(b + 0.5) * bin_s / 60.0 for b in keys]
    ys = [statistics.median(bins[b]) for b in keys]
    return theil_sen(xs, ys)


def slope_ms_per_min(
    samples: list[tuple[float, float]], start_s: float, bin_s: float, end_s: float = math.inf
) -> float | None:
    """The point estimate of :func:`drift_fit` (ms/min), or None."""
    fit = drift_fit(samples, start_s, bin_s, end_s)
    return None if fit is None else fit[0]


def cycle_s(utterances: list[bytes], frame_ms: float, pause_s: float) -> float:
    """Period of a client's audio schedule (every utterance once, each with its pause), s."""
    size, pauses = frame_bytes(frame_ms), pause_frames(pause_s, frame_ms)
    return sum((math.ceil(len(u) / size) + pauses) * frame_seconds(frame_ms) for u in utterances)


def drift_bin_s(args: argparse.Namespace, period_s: float) -> float:
    """Window of the drift fit: ``--bin-s`` if given, else the smallest multiple of the period >= 2 s."""
    if args.bin_s and args.bin_s > 0:
        return float(args.bin_s)
    return period_s * max(1, math.ceil(2.0 / period_s))


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile of ``values`` (None when empty)."""
    return float(np.percentile(values, q)) if values else None


def client_drift(r: ClientResult, start_s: float, bin_s: float) -> float | None:
    """Drift of one client's partial lag (ms/min) over its own span after ``start_s``, or None."""
    return slope_ms_per_min([(p[0], p[1]) for p in r.partials], start_s, bin_s, r.t_last)


def common_window(results: list[ClientResult], args: argparse.Namespace) -> tuple[float, float]:
    """Time span every session streamed through, after the warm-up: (start, end), s from the run start."""
    opened = [r for r in results if r.session_id and r.t_last > 0]
    if not opened:
        return 0.0, 0.0
    return max(r.t_first for r in opened) + args.warmup_s, min(r.t_last for r in opened)


def summarize(
    results: list[ClientResult], args: argparse.Namespace, wall_s: float, bin_s: float
) -> dict[str, Any]:
    """Pool the clients' measurements into the report's summary.

    Args:
        results: Every client's result.
        args: The run's options.
        wall_s: Wall time of the run, s.
        bin_s: Window of the drift fit, s (see :func:`drift_bin_s`).

    """
    opened = [r for r in results if r.session_id]
    start_s, end_s = common_window(results, args)
    e2e = [p[1] for r in opened for p in r.partials]
    srv = [p[2] for r in opened for p in r.partials]
    rtt = [f[1] for r in opened for f in r.finals]
    ttf = [f[2] for r in opened for f in r.finals]
    fit = drift_fit([(p[0], p[1]) for r in opened for p in r.partials], start_s, bin_s, end_s)
    drift = None if fit is None else fit[0]
    server_drift = slope_ms_per_min([(p[0], p[2]) for r in opened for p in r.partials], start_s, bin_s, end_s)
    final_drift = slope_ms_per_min([(f[0], f[1]) for r in opened for f in r.finals], start_s, bin_s, end_s)
    per_client_abs = [abs(d) for d in (client_drift(r, start_s, bin_s) for r in opened) if d is not None]
    errors = sum(len(r.errors) for r in results)
    refused = sum(1 for r in results if r.refused_code is not None)
    summary = {
        "clients": len(results),
        "sessions_opened": len(opened),
        "refused": refused,
        "refused_codes": sorted({r.refused_code for r in results if r.refused_code is not None}),
        "errors": errors,
        "minutes": args.minutes,
        "wall_s": round(wall_s, 1),
        "audio_s": round(sum(r.audio_s for r in results), 1),
        "late_frames": sum(r.late_frames for r in results),
        "partials": len(e2e),
        "finals": len(rtt),
        "partial_lag_ms": {
            "p50": percentile(e2e, 50),
            "p90": percentile(e2e, 90),
            "p99": percentile(e2e, 99),
            "max": _max(e2e),
        },
        "server_lag_ms": {"p50": percentile(srv, 50), "p99": percentile(srv, 99), "max": _max(srv)},
        "finalize_rtt_ms": {
            "p50": percentile(rtt, 50),
            "p90": percentile(rtt, 90),
            "p99": percentile(rtt, 99),
            "max": _max(rtt),
        },
        "finalize_server_ms": {"p50": percentile(ttf, 50), "p99": percentile(ttf, 99)},
        "drift_window_s": round(bin_s, 3),
        "drift_span_s": [round(start_s, 1), round(end_s, 1)],
        "drift_ms_per_min": drift,
        "drift_ci99_ms_per_min": None if fit is None else [fit[1], fit[2]],
        "server_drift_ms_per_min": server_drift,
        "finalize_drift_ms_per_min": final_drift,
        "client_drift_ms_per_min": {
            "median_abs": statistics.median(per_client_abs) if per_client_abs else None,
            "max_abs": max(per_client_abs, default=None),
        },
    }
    # Real time: no failures, and a lag slope consistent (99 % interval) with |drift| <= --max-drift, under the
    # hard --max-drift-hard bound. A server that cannot keep up drifts by hundreds to thousands of ms/min with a
    # tight interval; other processes' CPU bursts widen the interval rather than fake a drift.
    summary["drift_consistent"] = bool(
        fit is not None
        and fit[1] <= args.max_drift
        and fit[2] >= -args.max_drift
        and abs(fit[0]) <= args.max_drift_hard
    )
    summary["realtime_ok"] = bool(errors == 0 and refused == 0 and summary["drift_consistent"])
    summary["sessions_held_realtime"] = len(opened) if summary["realtime_ok"] else 0
    return summary


def plot(
    results: list[ClientResult], summary: dict[str, Any], path: Path, args: argparse.Namespace, bin_s: float
) -> None:
    """Partial lag and finalize latency over time, and per-client drift, as one PNG (matplotlib Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start_s, end_s = common_window(results, args)
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    ax = axes[0]
    pooled: dict[int, list[float]] = {}
    for r in results:
        if r.partials:
            t, lag = zip(*[(p[0], p[1]) for p in r.partials], strict=True)
            ax.plot(t, lag, ".", ms=1.5, alpha=0.3)
        for p in r.partials:
            if start_s <= p[0] and start_s + (int((p[0] - start_s) // bin_s) + 1) * bin_s <= end_s:
                pooled.setdefault(int((p[0] - start_s) // bin_s), []).append(p[1])
    if pooled:
        keys = sorted(pooled)
        ax.plot(
            [start_s + (k + 0.5) * bin_s for k in keys],
            [statistics.median(pooled[k]) for k in keys],
            "k-o",
            ms=3,
            lw=1.2,
            label=f"median per {bin_s:.1f} s",
        )
        ax.legend(loc="upper left")
    ax.set(xlabel="time (s)", ylabel="partial lag, end to end (ms)")
    ci = summary.get("drift_ci99_ms_per_min") or [None, None]
    ax.set_title(
        f"partial lag; drift {fmt(summary['drift_ms_per_min'])} ms/min (99% {fmt(ci[0])} .. {fmt(ci[1])})"
    )
    ax = axes[1]
    for r in results:
        if r.finals:
            t, rtt = zip(*[(f[0], f[1]) for f in r.finals], strict=True)
            ax.plot(t, rtt, ".", ms=3, alpha=0.5)
    ax.set(xlabel="time (s)", ylabel="finalize round trip (ms)")
    fin = summary["finalize_rtt_ms"]
    ax.set_title(f"finalize p50 {fmt(fin['p50'])} / p99 {fmt(fin['p99'])} ms")
    ax = axes[2]
    drifts = [client_drift(r, start_s, bin_s) for r in results]
    ax.bar(range(len(drifts)), [d if d is not None else 0.0 for d in drifts])
    ax.axhline(args.max_drift, color="r", lw=0.8)
    ax.axhline(-args.max_drift, color="r", lw=0.8)
    ax.set(xlabel="client", ylabel="drift (ms/min)", title="per-client lag drift")
    fig.suptitle(
        f"{summary['sessions_opened']}/{summary['clients']} sessions x {args.minutes:g} min, "
        f"{args.latency_ms} ms mode; refused {summary['refused']}, errors {summary['errors']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _max(values: list[float]) -> float | None:
    return max(values) if values else None


def fmt(value: float | None) -> str:
    """A number for log lines and titles: one decimal, or ``n/a``."""
    return "n/a" if value is None else f"{value:.1f}"
