"""A bot in a process of its own, on a ``pipecat-nemotron serve`` process, barged in on by its user.

The model server hosts the tiny ASR and the tiny random Magpie (one synthesis slot; a reply is 600 s of audio,
since that Magpie never ends a sentence on its own, so a reply cannot end before the barge-in). The bot
(``tests/barge_in_bot.py``) runs the agent pipeline of ``agent-load``'s bot processes with
``NemotronServerSTTService`` and Pipecat's ``NvidiaTTSService`` on the server, and this test's loopback LLM. The
user asks something, the bot starts its reply, the user speaks again while it talks: the reply must be
interrupted and its synthesis cancelled on the server (the slot freed: the reply to the second turn needs it),
the second turn's final must arrive and get a reply of its own, and nothing may be reported lost.

Every wait is on an event (a bot protocol line, the server's metrics), each bounded by a generous timeout that
names what never came.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from processes import clean_env

from pipecat_nemotron.llm.fake_server import FakeOpenAIServer
from pipecat_nemotron.models import TINY_MODEL_PATH

pytestmark = [pytest.mark.serial]

ROOT = Path(__file__).resolve().parent.parent
BOT = Path(__file__).resolve().parent / "barge_in_bot.py"
PREFIX = "barge-in-bot "
#: The longest any one event may take (the bot process imports Pipecat and loads Silero; beside CPU hogs, minutes).
HANG_S = 300.0
REPLY = "Sure, the meeting is at ten tomorrow morning in room four."


class BotProcess:
    """The bot's protocol lines as they arrive, and commands to it."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log
        self.events: list[dict[str, Any]] = []
        self._arrived = asyncio.Condition()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace")
            if line.startswith(PREFIX):
                await self._arrive(json.loads(line[len(PREFIX) :]))
        await self._arrive({"event": "exit", "code": await self.proc.wait()})

    async def _arrive(self, event: dict[str, Any]) -> None:
        async with self._arrived:
            self.events.append(event)
            self._arrived.notify_all()

    async def next(self, name: str, after: int = 0) -> tuple[int, dict[str, Any]]:
        """The first ``name`` event at index ``after`` or later (waiting for it): ``(index, event)``."""

        def found() -> tuple[int, dict[str, Any]] | None:
            for i in range(after, len(self.events)):
                if self.events[i]["event"] == name:
                    return i, self.events[i]
            if any(e["event"] == "exit" for e in self.events):
                raise AssertionError(f"the bot exited before {name!r}; its log ends:\n{self.log.read_text()[-3000:]}")
            return None

        async def wait() -> tuple[int, dict[str, Any]]:
            async with self._arrived:
                while (hit := found()) is None:
                    await self._arrived.wait()
                return hit

        return await bounded(wait(), f"the bot's {name!r} (events so far: {self.events})")

    async def send(self, **command: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(command) + "\n").encode())
        await self.proc.stdin.drain()


async def bounded(awaitable: Any, what: str) -> Any:
    """``awaitable``'s result; ``TimeoutError`` naming ``what`` after :data:`HANG_S`."""
    try:
        return await asyncio.wait_for(awaitable, HANG_S)
    except TimeoutError:
        raise TimeoutError(f"timed out after {HANG_S:g} s waiting for {what}") from None


def tts_metrics(metrics_url: str) -> dict[str, float]:
    """The server's TTS gauges and request outcomes: ``active``, and one entry per ``outcome``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(metrics_url, timeout=30) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "nemotron_tts_active_streams":
                values["active"] = sample.value
            elif sample.name == "nemotron_tts_requests_total":
                values[sample.labels["outcome"]] = sample.value
    return values


async def metrics_until(metrics_url: str, holds: Callable[[dict[str, float]], bool], what: str) -> dict[str, float]:
    """Poll the server's metrics until ``holds``; return them."""

    async def poll() -> dict[str, float]:
        while not holds(values := await asyncio.to_thread(tts_metrics, metrics_url)):  # noqa: ASYNC110 - polled
            await asyncio.sleep(0.1)
        return values

    return await bounded(poll(), what)


@pytest.mark.timeout(1200)
async def test_a_bot_process_barged_in_on_cancels_its_reply_on_the_server_and_answers_the_new_turn(
    tmp_path: Path, tiny_magpie: tuple[Path, Path]
) -> None:
    from pipecat_nemotron.bench.agent_load import model_server

    args = argparse.Namespace(device="cpu", sessions=[1], reply_s=600.0, threads=1)
    async with FakeOpenAIServer(reply=REPLY) as llm, model_server(TINY_MODEL_PATH, args, magpie=tiny_magpie) as server:
        metrics_url = server.asr_url.replace("ws://", "http://").replace("/v1/asr", "/metrics")
        spec = tmp_path / "spec.json"
        spec.write_text(json.dumps({"asr_url": server.asr_url, "tts_address": server.tts_address, "llm_url": llm.base_url}))
        log = tmp_path / "bot.log"
        with log.open("w") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(BOT), str(spec),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err,
                cwd=ROOT, env=clean_env(PYTHONPATH=str(ROOT)),
            )  # fmt: skip
        bot = BotProcess(proc, log)
        try:
            await bot.next("ready")
            # 1. The user asks; the bot answers, and its reply is being synthesised on the server.
            await bot.send(say="demo_weather.wav")
            asked, first = await bot.next("final")
            speaking, _ = await bot.next("bot_started", asked)
            await metrics_until(metrics_url, lambda m: m.get("active") == 1, "the reply's synthesis on the server")
            # 2. The user barges in while the bot talks.
            await bot.send(say="demo_timer.wav")
            interrupted, _ = await bot.next("interrupted", speaking)
            cancelled = await metrics_until(
                metrics_url, lambda m: m.get("cancelled", 0) >= 1, "the server to cancel the interrupted reply"
            )
            barged, second = await bot.next("final", asked + 1)
            await bot.next("bot_started", max(barged, interrupted))
            # 3. The user hangs up; the bot's pipeline ends with an EndFrame.
            await bot.send(end=True)
            _, done = await bot.next("done")
            _, exited = await bot.next("exit")
            after = await metrics_until(metrics_url, lambda m: m.get("active") == 0, "the server's TTS to be idle")
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            print(json.dumps({"bot": bot.events, "llm_user_texts": [r["messages"][-1] for r in llm.requests]}, indent=1))
    assert first["text"] and second["text"] and second["text"] != first["text"], (first, second)
    # Reply 1 could only have ended by a cancel: 600 s of audio take minutes to synthesise here.
    assert cancelled.get("truncated", 0) == 0 and cancelled.get("completed", 0) == 0, cancelled
    assert len(llm.requests) == 2, llm.requests  # one LLM request per finished turn
    assert second["text"] in llm.last_user_text()
    assert done["errors"] == [], done["errors"]  # no TTS error, no lost final, no refused synthesis
    assert exited["code"] == 0
    assert after.get("failed", 0) == 0 and after.get("cancelled", 0) >= 1, after
