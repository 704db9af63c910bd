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
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from loguru import logger

from pipecat_nemotron.agent.wav_input import read_pcm16
from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.asr.config import LATENCY_MODES
from pipecat_nemotron.bench.load_client import ClientResult, run_client
from pipecat_nemotron.bench.load_server import fetch_metrics, start_local_server, stop_process
from pipecat_nemotron.bench.load_stats import (
    client_drift,
    common_window,
    cycle_s,
    drift_bin_s,
    fmt,
    percentile,
    plot,
    summarize,
)
from pipecat_nemotron.models import DEMO_AUDIO_DIR

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
        "--latency-ms", type=int, default=160, choices=sorted(LATENCY_MODES), help="latency mode, ms"
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
    return read_pcm16(path, convert=True).tobytes()


def synthetic_utterances(count: int = 6, seed: int = 0) -> list[bytes]:
    """Deterministic speech-like clips (noise bursts with a gated tone), 1.5 to 3 s, 16 kHz int16."""
    out = []
    for k in range(count):
        rng = np.random.default_rng(seed + k)
        n = int(MODEL_SAMPLE_RATE * (1.5 + 1.5 * ((k * 7) % 5) / 4))
        t = np.arange(n) / MODEL_SAMPLE_RATE
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
    demo = sorted(DEMO_AUDIO_DIR.glob("*.wav")) if DEMO_AUDIO_DIR.is_dir() else []
    if demo:
        return [read_wav(f) for f in demo], f"{len(demo)} bundled demo WAV(s)"
    return synthetic_utterances(), "synthetic clips (no demo WAVs found)"


# ---- run -------------------------------------------------------------------------------------------------


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


def client_report(r: ClientResult, start_s: float, bin_s: float) -> dict[str, Any]:
    """One client's line of ``load.json``."""
    return {
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
        "partial_lag_p50_ms": percentile([p[1] for p in r.partials], 50),
        "finalize_rtt_p50_ms": percentile([f[1] for f in r.finals], 50),
        "drift_ms_per_min": client_drift(r, start_s, bin_s),
    }


async def run_clients(
    url: str, utterances: list[bytes], args: argparse.Namespace
) -> tuple[list[ClientResult], float, str | None]:
    """All clients against ``url``, their starts spread over ``--ramp-s``.

    Returns:
        Every client's result, the wall time of the run (s) and the server's ``/metrics`` text (or None).

    """
    http_url = url.replace("ws://", "http://", 1).replace("wss://", "https://", 1).rsplit("/v1/", 1)[0]
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
    return results, wall_s, await fetch_metrics(http_url)


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
                url, server, proc = await start_local_server(args, Path(tmp))
            logger.info(
                f"load: {args.clients} client(s) x {args.minutes:g} min of {source} (period {period_s:.2f} s) "
                f"-> {url} ({args.latency_ms} ms mode)"
            )
            results, wall_s, metrics_text = await run_clients(url, utterances, args)
        finally:
            if server is not None:
                await server.stop(drain_timeout_s=0)
            if proc is not None:
                await stop_process(proc)
    config = {k: v for k, v in vars(args).items() if k not in ("token", "func")}
    config.update(url=url, audio_source=source, audio_period_s=round(period_s, 3))
    start_s, _ = common_window(results, args)
    report = {
        "summary": summarize(results, args, wall_s, bin_s),
        "config": config,
        "clients": [client_report(r, start_s, bin_s) for r in results],
    }
    out = Path(args.out)
    await asyncio.to_thread(_write_outputs, out, report, results, metrics_text, args, bin_s)
    s = report["summary"]
    logger.info(
        f"load: {s['sessions_opened']}/{s['clients']} sessions, refused {s['refused']}, errors {s['errors']}; "
        f"partial lag p50 {fmt(s['partial_lag_ms']['p50'])} / p99 {fmt(s['partial_lag_ms']['p99'])} ms; "
        f"finalize p50 {fmt(s['finalize_rtt_ms']['p50'])} / p99 {fmt(s['finalize_rtt_ms']['p99'])} ms; "
        f"drift {fmt(s['drift_ms_per_min'])} ms/min (server {fmt(s['server_drift_ms_per_min'])}); "
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
