"""What an honest client of the ASR server gets beside a peek flood, and after sending audio far ahead of real time.

Starts ``pipecat-nemotron serve`` (CPU, one torch thread) in a subprocess on loopback and measures from the client
side, the way a user sees it:

- ``peek``: the time-to-final (finalize sent -> final received) of an honest client streaming the demo utterances
  at real time: alone, beside ``--flooders`` sessions streaming audio at real time, or beside as many that also
  send ``--peek-rate`` peeks per second (within the server's default control budget of 20/s); one condition
  (``--flood``) per run, each on a fresh server;
- ``ahead``: a client sends ``--ahead-s`` of audio at once, then goes on streaming utterances at real time; the
  delay of each final after its finalize.

Usage::

    python scripts/bench_server_pacing.py peek --flood none         # the honest client alone
    python scripts/bench_server_pacing.py peek --flood streams      # beside 30 real-time streams, no peeks
    python scripts/bench_server_pacing.py peek --flood peeks        # beside 30 streams sending 19 peeks/s
    python scripts/bench_server_pacing.py ahead --ahead-s 29
    # the server of another checkout (e.g. before a change): PYTHONPATH=/path/to/checkout python scripts/...

Prints one JSON object (machine, commit, figures).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import websockets

from pipecat_nemotron.agent.wav_input import read_pcm16
from pipecat_nemotron.models import DEMO_AUDIO_DIR, TINY_MODEL_PATH
from pipecat_nemotron.server.protocol import PROTOCOL_VERSION, ConfigMessage

FRAME_S = 0.02
FRAME_BYTES = 640  # 20 ms of 16 kHz int16
CLIPS = ("demo_math.wav", "demo_timer.wav", "demo_weather.wav")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, args: argparse.Namespace) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "pipecat_nemotron.cli", "serve", "--model", str(args.model), "--device", "cpu",
        "--insecure", "--port", str(port), "--cpu-threads", "1", "--max-sessions", str(args.flooders + 4),
        "--log-level", "WARNING",
    ]  # fmt: skip
    if args.max_speed is not None:
        cmd += ["--max-speed", str(args.max_speed)]
    # Not from the checkout: ``python -m`` puts the working directory first on sys.path, and PYTHONPATH must win.
    proc = subprocess.Popen(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=tempfile.gettempdir())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return proc
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not become ready within 120 s")


async def session(url: str, interim: bool = False):
    ws = await websockets.connect(url, subprotocols=[PROTOCOL_VERSION], ping_interval=None, max_size=None)
    await ws.send(ConfigMessage(interim_results=interim).to_json())
    ready = json.loads(await ws.recv())
    if ready["type"] != "ready":
        raise RuntimeError(f"session refused: {ready}")
    return ws


async def stream_realtime(ws, pcm: bytes) -> None:
    """Send ``pcm`` in 20 ms frames against a monotonic deadline (real time)."""
    start = time.monotonic()
    for n, i in enumerate(range(0, len(pcm), FRAME_BYTES)):
        await ws.send(pcm[i : i + FRAME_BYTES])
        delay = start + (n + 1) * FRAME_S - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


async def next_final(ws) -> dict:
    while True:
        message = json.loads(await ws.recv())
        if message["type"] == "final":
            return message
        if message["type"] == "error":
            raise RuntimeError(message)


async def honest(url: str, clips: list[bytes], rounds: int) -> list[float]:
    """Time-to-final of each utterance as the client sees it (finalize sent -> final received), ms."""
    ws = await session(url)
    ttfs: list[float] = []
    for _ in range(rounds):
        for pcm in clips:
            await stream_realtime(ws, pcm)
            sent = time.monotonic()
            await ws.send('{"type": "finalize"}')
            await next_final(ws)
            ttfs.append((time.monotonic() - sent) * 1000.0)
    await ws.close()
    return ttfs


async def peek_flooder(url: str, rate: float, stop: asyncio.Event, seed: int) -> int:
    """Stream noise at real time and send ``rate`` peeks per second (0: none) until ``stop``; the answers received.

    Returns -1 if the server closed the connection first.
    """
    try:
        return await _flood(url, rate, stop, seed)
    except websockets.ConnectionClosed as e:
        print(f"flooder {seed}: connection closed: {e}", file=sys.stderr)
        return -1


async def _flood(url: str, rate: float, stop: asyncio.Event, seed: int) -> int:
    ws = await session(url)
    rng = np.random.default_rng(seed)
    noise = (rng.standard_normal(16000) * 3000).astype("<i2").tobytes()
    answered = 0

    async def read() -> None:
        nonlocal answered
        with contextlib.suppress(websockets.ConnectionClosed):
            async for raw in ws:
                answered += '"peek_result"' in raw

    reader = asyncio.create_task(read())
    start, n, next_peek = time.monotonic(), 0, time.monotonic()
    while not stop.is_set():  # 20 ms frames, as a real client sends them
        offset = (n * FRAME_BYTES) % len(noise)
        await ws.send(noise[offset : offset + FRAME_BYTES])
        n += 1
        now = time.monotonic()
        while rate > 0 and next_peek <= now:
            await ws.send('{"type": "peek"}')
            next_peek += 1.0 / rate
        delay = start + n * FRAME_S - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
    await ws.close()
    await reader
    return answered


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "n": len(values),
        "p50_ms": round(statistics.median(ordered), 1),
        "p90_ms": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 1),
        "max_ms": round(ordered[-1], 1),
    }


async def beside(url: str, args: argparse.Namespace, clips: list[bytes], peek_rate: float) -> tuple[list[float], list[int]]:
    """The honest client's time-to-final beside ``--flooders`` real-time sessions sending ``peek_rate`` peeks/s."""
    stop = asyncio.Event()
    flooders = [asyncio.create_task(peek_flooder(url, peek_rate, stop, seed)) for seed in range(args.flooders)]
    await asyncio.sleep(2.0)  # the flood is under way
    ttfs = await honest(url, clips, args.rounds)
    stop.set()
    return ttfs, list(await asyncio.gather(*flooders))


async def run_peek(url: str, args: argparse.Namespace, clips: list[bytes]) -> dict:
    """One condition of the peek scenario (``--flood``): the honest client's time-to-final."""
    await honest(url, clips[:1], 1)  # warm-up
    if args.flood == "none":
        return {"honest_ttf": summary(await honest(url, clips, args.rounds))}
    ttfs, answered = await beside(url, args, clips, args.peek_rate if args.flood == "peeks" else 0.0)
    return {
        "honest_ttf": summary(ttfs),
        "peek_results_received": sum(a for a in answered if a > 0),
        "flooders_disconnected": sum(a < 0 for a in answered),
    }


async def run_ahead(url: str, args: argparse.Namespace, clips: list[bytes]) -> dict:
    """``--ahead-s`` of audio at once and a finalize, then utterances at real time, each with its finalize, sent
    without waiting for the finals (a live client): each final's delay after its finalize, ms."""
    ws = await session(url)
    long = b"".join(clips * 20)[: int(args.ahead_s * 32000)]
    sent: list[float] = []
    finals: list[tuple[float, float]] = []  # (arrival, server ttf_ms)
    expected = 1 + args.rounds * len(clips)

    async def read() -> None:
        while len(finals) < expected:
            final = await next_final(ws)
            finals.append((time.monotonic(), final["ttf_ms"]))

    reader = asyncio.create_task(read())
    for i in range(0, len(long), FRAME_BYTES):
        await ws.send(long[i : i + FRAME_BYTES])
    sent.append(time.monotonic())
    await ws.send('{"type": "finalize"}')
    for _ in range(args.rounds):
        for pcm in clips:
            await stream_realtime(ws, pcm)
            sent.append(time.monotonic())
            await ws.send('{"type": "finalize"}')
    await asyncio.wait_for(reader, 120)
    await ws.close()
    delays = [(arrival - at) * 1000.0 for at, (arrival, _) in zip(sent, finals, strict=True)]
    return {
        "final_delay_after_finalize_ms": [round(d) for d in delays],
        "server_ttf_ms": [round(t, 1) for _, t in finals],
        "later_finals": summary(delays[1:]),
        "last_final_delay_ms": round(delays[-1]),
    }


def commit() -> str:
    with contextlib.suppress(Exception):
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()  # fmt: skip
    return "?"


async def amain(args: argparse.Namespace) -> dict:
    clips = [read_pcm16(DEMO_AUDIO_DIR / name, convert=True).tobytes() for name in CLIPS]
    port = free_port()
    proc = start_server(port, args)
    url = f"ws://127.0.0.1:{port}/v1/asr"
    try:
        figures = await (run_peek if args.scenario == "peek" else run_ahead)(url, args, clips)
    finally:
        proc.terminate()
        try:
            proc.wait(60)  # SIGTERM drains the sessions first
        except subprocess.TimeoutExpired:
            proc.kill()
    return {
        "scenario": args.scenario,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "commit": commit(),
        "model": Path(args.model).name,
        "max_speed": args.max_speed,
        **({"flood": args.flood, "flooders": args.flooders, "peek_rate": args.peek_rate} if args.scenario == "peek" else {}),
        **({"ahead_s": args.ahead_s} if args.scenario == "ahead" else {}),
        **figures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=("peek", "ahead"))
    parser.add_argument("--model", type=Path, default=TINY_MODEL_PATH)
    parser.add_argument("--flooders", type=int, default=30)
    parser.add_argument(
        "--flood",
        choices=("none", "streams", "peeks"),
        default="peeks",
        help="peek scenario: the honest client alone, beside real-time streams, or beside streams that peek",
    )
    parser.add_argument("--peek-rate", type=float, default=19.0, help="peeks per second per flooder")
    parser.add_argument("--rounds", type=int, default=2, help="passes over the three demo utterances")
    parser.add_argument("--ahead-s", type=float, default=29.0)
    parser.add_argument("--max-speed", type=float, default=None, help="serve --max-speed (default: the server's)")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(amain(args)), indent=1))


if __name__ == "__main__":
    main()
