"""The load test's local ASR server (when ``--url`` is not given): a subprocess, or a server in this process.

The subprocess is ``pipecat-nemotron serve`` (realistic: its own interpreter and event loop); ``inprocess`` starts
faster. Either way the load test waits for ``/readyz`` before the clients connect.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import time
from pathlib import Path
from typing import Any

from loguru import logger

from pipecat_nemotron.models import TINY_MODEL_PATH
from pipecat_nemotron.runtime.devices import resolve_device


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def default_model(tmp: Path) -> str:
    """The bundled tiny model, else a random-weight tiny model built in ``tmp``."""
    if TINY_MODEL_PATH.exists():
        return str(TINY_MODEL_PATH)
    from pipecat_nemotron.asr.architectures import build_random_model

    logger.warning("no bundled tiny model; building a random-weight tiny model for the local server")
    return str(build_random_model(tmp / "tiny_random.nemo", size="tiny", seed=0))


async def wait_ready(http_url: str, proc: Any, timeout_s: float = 300.0) -> None:
    """Poll ``/readyz`` until it answers 200.

    Raises:
        RuntimeError: The server process ``proc`` (if any) exited.
        TimeoutError: Not ready within ``timeout_s``.

    """
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


async def fetch_metrics(http_url: str) -> str | None:
    """The server's ``/metrics`` text, or None where it cannot be read (metrics are optional)."""
    import aiohttp

    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{http_url}/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
                return await r.text() if r.status == 200 else None
    except Exception:  # noqa: BLE001 - metrics are optional
        return None


async def start_local_server(args: argparse.Namespace, tmp: Path) -> tuple[str, Any, Any]:
    """Start the local server; return its URL and the in-process server or the subprocess."""
    model = args.model or default_model(tmp)
    batch = args.max_batch_size or args.clients
    if args.local_server == "inprocess":
        from pipecat_nemotron.asr import EngineConfig
        from pipecat_nemotron.server.app import ASRServer, ServerConfig

        server = ASRServer(
            EngineConfig(model=model, device=args.device, max_streams=args.clients, max_batch_size=batch),
            ServerConfig(insecure=True, port=0),
        )
        await server.start()
        return server.url, server, None
    port = free_port()
    extra: list[str] = []
    if resolve_device(args.device) == "cpu":
        # One intra-op thread: on a busy CPU, OpenMP threads spinning at barriers make steps ~10x slower.
        extra = ["--cpu-threads", "1"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pipecat_nemotron.cli", "serve", "--insecure", "--host", "127.0.0.1",
        "--port", str(port), "--model", model, "--device", args.device,
        "--max-sessions", str(args.clients), "--max-batch-size", str(batch), "--log-level", "WARNING",
        *extra,
    )  # fmt: skip
    try:
        await wait_ready(f"http://127.0.0.1:{port}", proc)
    except BaseException:
        await stop_process(proc)
        raise
    return f"ws://127.0.0.1:{port}/v1/asr", None, proc


async def stop_process(proc: Any) -> None:
    """Terminate the server process, killing it after 30 s."""
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except (asyncio.TimeoutError, TimeoutError):
            proc.kill()
            await proc.wait()
