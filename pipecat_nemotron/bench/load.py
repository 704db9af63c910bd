"""Load test of the ASR server: N concurrent WebSocket clients streaming real audio, paced in real time.

Each client opens a ``nemotron-asr.v1`` session and streams utterances (WAV files, or synthetic audio) in
``--frame-ms`` frames against a monotonic deadline (frame *k* goes out at ``t0 + k * frame``; a late frame is
sent at once and counted, never skipped), followed by a pause of silence; ``--vad-stop-s`` into each pause it
sends ``finalize`` (like a bot's VAD), and keeps streaming the silence. It measures, per client:

* **partial lag** (end to end): arrival of a ``partial`` minus the time the client sent the audio the partial
  covers (the server reports the decoded position ``audio_ms``). Includes the mode's look-ahead, network,
  queueing and the model step. The server's own ``lag_ms`` (from the chunk's audio arriving at the server)
  is kept too.
* **finalize latency**: ``final`` arrival minus the ``finalize`` send (round trip), and the server's ``ttf_ms``.
* **drift**: the slope of the partial lag over time, ms per minute (median lag per ``--bin-s`` window, least
  squares over the windows after ``--warmup-s``). A server that keeps up has ~0; one that falls behind grows
  by up to 60,000 ms/min.
* refused sessions (close code), errors, late client frames.

Writes ``load.json`` (summary + per client), ``load_samples.json`` (raw samples) and ``load.png`` under
``--out``. Examples::

    python -m pipecat_nemotron.bench.load                                  # local server, CPU-sized defaults
    python -m pipecat_nemotron.bench.load --url ws://gpu-host:8765/v1/asr --clients 127 --minutes 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time
import wave
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from loguru import logger

from pipecat_nemotron.engine.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.models import DEMO_AUDIO_DIR, TINY_MODEL_PATH
from pipecat_nemotron.server.protocol import (
    ConfigMessage,
    ErrorMessage,
    FinalizeMessage,
    FinalMessage,
    PartialMessage,
    ReadyMessage,
    close_reason,
    parse_server_message,
)

TRAINED_MODEL = TINY_MODEL_PATH
DEMO_DIR = DEMO_AUDIO_DIR
SAMPLE_RATE = MODEL_SAMPLE_RATE
BYTES_PER_MS = 2 * SAMPLE_RATE / 1000


# ---- arguments -------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the load test's options to ``parser``."""
    g = parser.add_argument_group("load")
    g.add_argument("--url", help="session URL of a running server (default: start a local one)")
    g.add_argument(
        "--token", default=os.environ.get("NEMOTRON_ASR_TOKEN"), help="bearer token (env NEMOTRON_ASR_TOKEN)"
    )
    g.add_argument("--clients", type=int, default=8, help="concurrent sessions (GPU target: 127)")
    g.add_argument(
        "--minutes", type=float, default=1.0, help="streaming time per client, minutes (GPU target: 3)"
    )
    g.add_argument(
        "--latency-ms", type=int, default=160, choices=(80, 160, 560, 1120), help="latency mode, ms"
    )
    g.add_argument("--frame-ms", type=float, default=20.0, help="audio per WebSocket message, ms")
    g.add_argument(
        "--audio",
        nargs="*",
        default=None,
        help="WAV files or folders (default: bundled demo WAVs, else synthetic)",
    )
    g.add_argument("--pause-s", type=float, default=0.8, help="silence after each utterance, s")
    g.add_argument("--vad-stop-s", type=float, default=0.2, help="finalize this far into each pause, s")
    g.add_argument("--ramp-s", type=float, default=2.0, help="spread client starts over this long, s")
    g.add_argument(
        "--warmup-s", type=float, default=5.0, help="ignore the first seconds for the drift fit, s"
    )
    g.add_argument(
        "--bin-s",
        type=float,
        default=0.0,
        help="window of the median lag in the drift fit, s (default: the audio period, at least 2 s)",
    )
    g.add_argument(
        "--max-drift",
        type=float,
        default=2.0,
        help="drift bound (99%% interval must reach it) for realtime_ok, ms/min",
    )
    g.add_argument(
        "--max-drift-hard", type=float, default=120.0, help="bound on the drift estimate itself, ms/min"
    )
    g.add_argument("--out", default="bench_out", help="output folder")
    g.add_argument("--no-plot", action="store_true", help="skip the PNG")
    s = parser.add_argument_group("local server (when --url is not given)")
    s.add_argument(
        "--model", default=None, help="model for the local server (default: bundled tiny model, else random)"
    )
    s.add_argument("--device", default="auto", help="device of the local server")
    s.add_argument(
        "--max-batch-size", type=int, default=None, help="engine max_batch_size (default: --clients)"
    )
    s.add_argument(
        "--local-server",
        choices=("subprocess", "inprocess"),
        default="subprocess",
        help="run the local server in its own process (realistic) or in this one (faster start)",
    )


# ---- audio -----------------------------------------------------------------------------------------------


def read_wav(path: Path) -> bytes:
    """A WAV file as 16 kHz mono int16 PCM bytes (resampled / downmixed if needed)."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: only 16-bit PCM WAV is supported")
        rate, channels = w.getframerate(), w.getnchannels()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    x = pcm.astype(np.float32) / 32768.0
    if channels > 1:
        x = x.reshape(-1, channels).mean(axis=1)
    if rate != SAMPLE_RATE:
        import soxr

        x = soxr.resample(x, rate, SAMPLE_RATE)
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


def synthetic_utterances(count: int = 6, seed: int = 0) -> list[bytes]:
    """Deterministic speech-like clips (noise bursts with a gated tone), 1.5 to 3 s, 16 kHz int16."""
    out = []
    for k in range(count):
        rng = np.random.default_rng(seed + k)
        n = int(SAMPLE_RATE * (1.5 + 1.5 * ((k * 7) % 5) / 4))
        t = np.arange(n) / SAMPLE_RATE
        tone = 0.3 * np.sin(2 * np.pi * (200 + 300 * k) * t) * (np.sin(2 * np.pi * 1.5 * t) > 0)
        x = 0.1 * rng.standard_normal(n) + 0.1 * tone
        out.append((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
    return out


def load_utterances(paths: list[str] | None) -> tuple[list[bytes], str]:
    """The utterances to stream and a description of where they came from."""
    if paths:
        files: list[Path] = []
        for p in map(Path, paths):
            files.extend(sorted(p.glob("*.wav")) if p.is_dir() else [p])
        if not files:
            raise ValueError(f"no WAV files in {paths}")
        return [read_wav(f) for f in files], f"{len(files)} WAV file(s)"
    demo = sorted(DEMO_DIR.glob("*.wav")) if DEMO_DIR.is_dir() else []
    if demo:
        return [read_wav(f) for f in demo], f"{len(demo)} bundled demo WAV(s)"
    return synthetic_utterances(), "synthetic clips (no demo WAVs found)"


# ---- one client ------------------------------------------------------------------------------------------


@dataclass
class ClientResult:
    """What one client saw.

    Attributes:
        index: Client number.
        session_id: Server session id ('' if refused).
        refused_code: Close code of a refusal at connect (None if the session opened).
        close_code: Close code the session ended with.
        errors: Error descriptions (error messages, unexpected closes, missing finals).
        audio_s: Audio sent, s.
        late_frames: Frames sent more than 50 ms after their deadline (client overloaded).
        partials: ``(t_s, e2e_lag_ms, server_lag_ms)`` per partial (t from the run start).
        finals: ``(t_s, round_trip_ms, server_ttf_ms)`` per final.
        finalizes_sent: ``finalize`` messages sent.
        t_first: First frame sent, s from the run start.
        t_last: Last frame sent, s from the run start.

    """

    index: int
    session_id: str = ""
    refused_code: int | None = None
    close_code: int | None = None
    errors: list[str] = field(default_factory=list)
    audio_s: float = 0.0
    late_frames: int = 0
    partials: list[tuple[float, float, float]] = field(default_factory=list)
    finals: list[tuple[float, float, float]] = field(default_factory=list)
    finalizes_sent: int = 0
    t_first: float = 0.0
    t_last: float = 0.0


def _schedule(utterances: list[bytes], first: int, pause_s: float, vad_stop_s: float, frame_bytes: int):
    """Endless (frame bytes, finalize-after-this-frame) sequence: utterance, pause with a finalize, next."""
    silence = b"\x00" * frame_bytes
    pause_frames = max(1, round(pause_s * 1000 * BYTES_PER_MS / frame_bytes))
    stop_frame = min(pause_frames - 1, max(0, round(vad_stop_s * 1000 * BYTES_PER_MS / frame_bytes) - 1))
    k = first
    while True:
        pcm = utterances[k % len(utterances)]
        for i in range(0, len(pcm), frame_bytes):
            chunk = pcm[i : i + frame_bytes]
            yield chunk + silence[: frame_bytes - len(chunk)], False
        for j in range(pause_frames):
            yield silence, j == stop_frame
        k += 1


async def run_client(
    index: int,
    url: str,
    token: str | None,
    utterances: list[bytes],
    args: argparse.Namespace,
    run_t0: float,
    start_delay_s: float,
) -> ClientResult:
    """Stream to one session for ``args.minutes``; never raises (failures land in the result)."""
    import websockets
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    res = ClientResult(index)
    await asyncio.sleep(start_delay_s)
    headers = {"Authorization": f"Bearer {token}"} if token else None
    frame_bytes = int(round(args.frame_ms * BYTES_PER_MS / 2)) * 2
    frame_s = frame_bytes / BYTES_PER_MS / 1000.0
    try:
        ws = await websockets.connect(url, additional_headers=headers, open_timeout=30, max_size=2**22)
    except (OSError, InvalidStatus, asyncio.TimeoutError, TimeoutError) as e:
        res.errors.append(f"connect failed: {e!r}")
        return res
    send_times: list[float] = []  # monotonic send time of frame k
    finalize_times: list[float] = []
    try:
        await ws.send(ConfigMessage(latency_ms=args.latency_ms, client=f"bench.load/{index}").to_json())
        first = parse_server_message(await asyncio.wait_for(ws.recv(), 30))
        if isinstance(first, ErrorMessage):
            res.refused_code = first.code
            try:
                await asyncio.wait_for(ws.wait_closed(), 5)
            except (asyncio.TimeoutError, TimeoutError):
                pass
            res.close_code = ws.close_code
            return res
        assert isinstance(first, ReadyMessage), first
        res.session_id = first.session_id
    except ConnectionClosed as e:
        res.refused_code = e.rcvd.code if e.rcvd else None
        res.close_code = res.refused_code
        return res
    except Exception as e:  # noqa: BLE001 - reported, not raised
        res.errors.append(f"opening the session failed: {e!r}")
        await ws.close()
        return res

    async def receive() -> None:
        finals = 0
        try:
            async for raw in ws:
                now = time.monotonic()
                msg = parse_server_message(raw)
                if isinstance(msg, PartialMessage):
                    idx = min(len(send_times) - 1, max(0, math.ceil(msg.audio_ms / 1000.0 / frame_s) - 1))
                    if idx >= 0:
                        res.partials.append((now - run_t0, (now - send_times[idx]) * 1000.0, msg.lag_ms))
                elif isinstance(msg, FinalMessage):
                    if finals < len(finalize_times):
                        res.finals.append((now - run_t0, (now - finalize_times[finals]) * 1000.0, msg.ttf_ms))
                    finals += 1
                elif isinstance(msg, ErrorMessage):
                    res.errors.append(f"server error {msg.code} ({msg.reason}): {msg.message}")
        except ConnectionClosed:
            pass

    receiver = asyncio.get_running_loop().create_task(receive())
    t0 = time.monotonic()
    end = t0 + args.minutes * 60.0
    frames = _schedule(utterances, index, args.pause_s, args.vad_stop_s, frame_bytes)
    k = 0
    try:
        while True:
            deadline = t0 + k * frame_s
            if deadline >= end:
                break
            delay = deadline - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -0.05:
                res.late_frames += 1
            chunk, finalize = next(frames)
            await ws.send(chunk)
            send_times.append(time.monotonic())
            if k == 0:
                res.t_first = send_times[0] - run_t0
            res.t_last = send_times[-1] - run_t0
            res.audio_s += frame_s
            if finalize:
                await ws.send(FinalizeMessage().to_json())
                finalize_times.append(time.monotonic())
                res.finalizes_sent += 1
            k += 1
        await ws.send(json.dumps({"type": "close"}))
        await asyncio.wait_for(receiver, 15.0)
    except ConnectionClosed:
        pass
    except (asyncio.TimeoutError, TimeoutError):
        res.errors.append("the session did not close within 15 s of the close message")
    except Exception as e:  # noqa: BLE001
        res.errors.append(f"streaming failed: {e!r}")
    finally:
        receiver.cancel()
        await ws.close()
        res.close_code = ws.close_code
    if res.close_code not in (1000, None):
        res.errors.append(f"closed with {res.close_code} ({close_reason(res.close_code)})")
    if len(res.finals) < res.finalizes_sent:
        res.errors.append(f"{res.finalizes_sent - len(res.finals)} final(s) missing")
    return res


# ---- analysis --------------------------------------------------------------------------------------------


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
    frame_bytes = int(round(frame_ms * BYTES_PER_MS / 2)) * 2
    frame_s = frame_bytes / BYTES_PER_MS / 1000.0
    pause_frames = max(1, round(pause_s * 1000 * BYTES_PER_MS / frame_bytes))
    return sum((math.ceil(len(u) / frame_bytes) + pause_frames) * frame_s for u in utterances)


def drift_bin_s(args: argparse.Namespace, period_s: float) -> float:
    """Window of the drift fit: ``--bin-s`` if given, else the smallest multiple of the period >= 2 s."""
    if args.bin_s and args.bin_s > 0:
        return float(args.bin_s)
    return period_s * max(1, math.ceil(2.0 / period_s))


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _drifts(r: ClientResult, start_s: float, bin_s: float) -> float | None:
    return slope_ms_per_min([(p[0], p[1]) for p in r.partials], start_s, bin_s, r.t_last)


def _window(results: list[ClientResult], args: argparse.Namespace) -> tuple[float, float]:
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
    start_s, end_s = _window(results, args)
    e2e = [p[1] for r in opened for p in r.partials]
    srv = [p[2] for r in opened for p in r.partials]
    rtt = [f[1] for r in opened for f in r.finals]
    ttf = [f[2] for r in opened for f in r.finals]
    fit = drift_fit([(p[0], p[1]) for r in opened for p in r.partials], start_s, bin_s, end_s)
    drift = None if fit is None else fit[0]
    server_drift = slope_ms_per_min([(p[0], p[2]) for r in opened for p in r.partials], start_s, bin_s, end_s)
    final_drift = slope_ms_per_min([(f[0], f[1]) for r in opened for f in r.finals], start_s, bin_s, end_s)
    per_client_abs = [abs(d) for d in (_drifts(r, start_s, bin_s) for r in opened) if d is not None]
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
            "p50": _pct(e2e, 50),
            "p90": _pct(e2e, 90),
            "p99": _pct(e2e, 99),
            "max": _max(e2e),
        },
        "server_lag_ms": {"p50": _pct(srv, 50), "p99": _pct(srv, 99), "max": _max(srv)},
        "finalize_rtt_ms": {
            "p50": _pct(rtt, 50),
            "p90": _pct(rtt, 90),
            "p99": _pct(rtt, 99),
            "max": _max(rtt),
        },
        "finalize_server_ms": {"p50": _pct(ttf, 50), "p99": _pct(ttf, 99)},
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

    start_s, end_s = _window(results, args)
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
        f"partial lag; drift {_fmt(summary['drift_ms_per_min'])} ms/min (99% {_fmt(ci[0])} .. {_fmt(ci[1])})"
    )
    ax = axes[1]
    for r in results:
        if r.finals:
            t, rtt = zip(*[(f[0], f[1]) for f in r.finals], strict=True)
            ax.plot(t, rtt, ".", ms=3, alpha=0.5)
    ax.set(xlabel="time (s)", ylabel="finalize round trip (ms)")
    fin = summary["finalize_rtt_ms"]
    ax.set_title(f"finalize p50 {_fmt(fin['p50'])} / p99 {_fmt(fin['p99'])} ms")
    ax = axes[2]
    drifts = [_drifts(r, start_s, bin_s) for r in results]
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


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


# ---- local server ----------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _default_model(tmp: Path) -> str:
    if TRAINED_MODEL.exists():
        return str(TRAINED_MODEL)
    from pipecat_nemotron.engine.architectures import build_random_model

    logger.warning("no bundled tiny model; building a random-weight tiny model for the local server")
    return str(build_random_model(tmp / "tiny_random.nemo", size="tiny", seed=0))


async def _wait_ready(http_url: str, proc: Any, timeout_s: float = 300.0) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc is not None and proc.returncode is not None:
                raise RuntimeError(f"the local server exited with {proc.returncode}")
            try:
                async with http.get(f"{http_url}/readyz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.5)
    raise TimeoutError(f"the local server was not ready within {timeout_s:g} s")


async def _fetch_metrics(http_url: str) -> str | None:
    import aiohttp

    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{http_url}/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
                return await r.text() if r.status == 200 else None
    except Exception:  # noqa: BLE001 - metrics are optional
        return None


# ---- run -------------------------------------------------------------------------------------------------


async def _start_local_server(args: argparse.Namespace, tmp: Path) -> tuple[str, Any, Any]:
    """Start the local server; return its URL and the in-process server or the subprocess."""
    model = args.model or _default_model(tmp)
    batch = args.max_batch_size or args.clients
    if args.local_server == "inprocess":
        from pipecat_nemotron.engine import EngineConfig
        from pipecat_nemotron.server.app import ASRServer, ServerConfig

        server = ASRServer(
            EngineConfig(model=model, device=args.device, max_streams=args.clients, max_batch_size=batch),
            ServerConfig(insecure=True, port=0),
        )
        await server.start()
        return server.url, server, None
    port = _free_port()
    extra: list[str] = []
    if args.device == "cpu" or (args.device == "auto" and not _has_cuda()):
        # One intra-op thread: on a busy CPU, OpenMP threads spinning at barriers make steps ~10x slower.
        extra = ["--cpu-threads", "1"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pipecat_nemotron.cli", "serve", "--insecure", "--host", "127.0.0.1",
        "--port", str(port), "--model", model, "--device", args.device,
        "--max-sessions", str(args.clients), "--max-batch-size", str(batch), "--log-level", "WARNING",
        *extra,
    )  # fmt: skip
    try:
        await _wait_ready(f"http://127.0.0.1:{port}", proc)
    except BaseException:
        await _stop_process(proc)
        raise
    return f"ws://127.0.0.1:{port}/v1/asr", None, proc


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:  # pragma: no cover
        return False


async def _stop_process(proc: Any) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except (asyncio.TimeoutError, TimeoutError):
            proc.kill()
            await proc.wait()


def _write_outputs(
    out: Path,
    report: dict[str, Any],
    results: list[ClientResult],
    metrics_text: str | None,
    args: argparse.Namespace,
    bin_s: float,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "load.json").write_text(json.dumps(report, indent=2))
    (out / "load_samples.json").write_text(
        json.dumps([{"index": r.index, "partials": r.partials, "finals": r.finals} for r in results])
    )
    if metrics_text:
        (out / "load_metrics.prom").write_text(metrics_text)
    if not args.no_plot:
        plot(results, report["summary"], out / "load.png", args, bin_s)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the load test; write ``load.json``, ``load_samples.json`` and ``load.png`` under ``args.out``.

    Returns:
        The report: ``{"summary": ..., "config": ..., "clients": [...]}``.

    """
    utterances, source = load_utterances(args.audio)
    period_s = cycle_s(utterances, args.frame_ms, args.pause_s)
    bin_s = drift_bin_s(args, period_s)
    server: Any = None
    proc: Any = None
    url = args.url
    with tempfile.TemporaryDirectory(prefix="nemotron-load-") as tmp:
        try:
            if url is None:
                url, server, proc = await _start_local_server(args, Path(tmp))
            http_url = (
                url.replace("ws://", "http://", 1).replace("wss://", "https://", 1).rsplit("/v1/", 1)[0]
            )
            logger.info(
                f"load: {args.clients} client(s) x {args.minutes:g} min of {source} (period {period_s:.2f} s) "
                f"-> {url} ({args.latency_ms} ms mode)"
            )
            run_t0 = time.monotonic()
            stagger = args.ramp_s / max(1, args.clients)
            results = list(
                await asyncio.gather(
                    *(
                        run_client(i, url, args.token, utterances, args, run_t0, i * stagger)
                        for i in range(args.clients)
                    )
                )
            )
            wall_s = time.monotonic() - run_t0
            metrics_text = await _fetch_metrics(http_url)
        finally:
            if server is not None:
                await server.stop(drain_timeout_s=0)
            if proc is not None:
                await _stop_process(proc)
    summary = summarize(results, args, wall_s, bin_s)
    config = {k: v for k, v in vars(args).items() if k not in ("token", "func")}
    config.update(url=url, audio_source=source, audio_period_s=round(period_s, 3))
    start_s, _ = _window(results, args)
    report = {
        "summary": summary,
        "config": config,
        "clients": [
            {
                "index": r.index,
                "session_id": r.session_id,
                "refused_code": r.refused_code,
                "close_code": r.close_code,
                "errors": r.errors,
                "audio_s": round(r.audio_s, 2),
                "late_frames": r.late_frames,
                "partials": len(r.partials),
                "finals": len(r.finals),
                "finalizes_sent": r.finalizes_sent,
                "partial_lag_p50_ms": _pct([p[1] for p in r.partials], 50),
                "finalize_rtt_p50_ms": _pct([f[1] for f in r.finals], 50),
                "drift_ms_per_min": _drifts(r, start_s, bin_s),
            }
            for r in results
        ],
    }
    out = Path(args.out)
    await asyncio.to_thread(_write_outputs, out, report, results, metrics_text, args, bin_s)
    s = summary
    logger.info(
        f"load: {s['sessions_opened']}/{s['clients']} sessions, refused {s['refused']}, errors {s['errors']}; "
        f"partial lag p50 {_fmt(s['partial_lag_ms']['p50'])} / p99 {_fmt(s['partial_lag_ms']['p99'])} ms; "
        f"finalize p50 {_fmt(s['finalize_rtt_ms']['p50'])} / p99 {_fmt(s['finalize_rtt_ms']['p99'])} ms; "
        f"drift {_fmt(s['drift_ms_per_min'])} ms/min (server {_fmt(s['server_drift_ms_per_min'])}); "
        f"realtime_ok={s['realtime_ok']} -> {out / 'load.json'}"
    )
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m pipecat_nemotron.bench.load``: run and print the summary; exit 1 if not real time."""
    parser = argparse.ArgumentParser(
        prog="python -m pipecat_nemotron.bench.load", description=__doc__.split("\n")[0]
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    report = asyncio.run(run(args))
    print(json.dumps(report["summary"], indent=2))
    return 0 if report["summary"]["realtime_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
