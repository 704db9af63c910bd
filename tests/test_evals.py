"""Pipecat's behavioural eval harness drives bots/bot.py the way a user runs it, over loopback only.

The bot runs under Pipecat's development runner with the bundled tiny ASR model, a tiny Magpie TTS model and
an LLM at a loopback OpenAI-compatible server; ``python -m pipecat.evals run tests/evals`` connects to the
runner's ``/ws`` route as an RTVI client, plays each turn's recording and checks the events the bot reports.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from openai_server import FakeOpenAIServer
from processes import clean_env, free_port, stop_process

from pipecat_nemotron.bench.wer import normalize_text
from pipecat_nemotron.models import TINY_MODEL_PATH as TRAINED_MODEL

BOT = Path(__file__).resolve().parents[1] / "bots" / "bot.py"
EVALS = Path(__file__).resolve().parent / "evals"

#: The loopback LLM's answer to a question, by a word of the question (tests/evals/*.yaml expects these).
REPLIES = {
    "weather": "It will be sunny on Monday.",
    "times": "Four times six is twenty four.",
    "timer": "The timer is cancelled.",
}

BOT_START_TIMEOUT_S = 240.0  # NeMo import and both model loads on 2 busy cores
HARNESS_TIMEOUT_S = 180.0
SESSION_ENDED = re.compile(r"Session \S+ ended")
EXPECTATION_TIMEOUT_S = 20  # the harness's budget per turn (its --timeout); a turn takes ~4 s here


def _latest_user_text(body: dict[str, Any]) -> str:
    """The content of the last user message of a chat request ("" if there is none)."""
    users = [m.get("content") for m in body.get("messages", []) if m.get("role") == "user"]
    return users[-1] if users and isinstance(users[-1], str) else ""


class TopicalOpenAIServer(FakeOpenAIServer):
    """Answers the latest user message by its topic (:data:`REPLIES`): no turn's reply passes for another's.

    ``reply`` is what it says to a question on no known topic.
    """

    @property
    def reply(self) -> str:
        words = normalize_text(_latest_user_text(self.requests[-1])).split() if self.requests else []
        return next((r for topic, r in REPLIES.items() if topic in words), self._fallback)

    @reply.setter
    def reply(self, value: str) -> None:
        self._fallback = value


def _launch(args: list[str], log: Path, *, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)


def _tail(path: Path, lines: int) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(missing)\n"
    return "\n".join(text.splitlines()[-lines:])


def _report(logs: Path) -> str:
    """The tails of the harness's output, its decision trace per scenario and the bot's log."""
    parts = [f"--- harness (tail) ---\n{_tail(logs / 'harness.log', 60)}"]
    parts += [f"--- {p.name} (tail) ---\n{_tail(p, 60)}" for p in sorted(logs.glob("*.eval.log"))]
    parts.append(f"--- bot (tail) ---\n{_tail(logs / 'bot.log', 80)}")
    return f"logs kept in {logs}\n" + "\n".join(parts)


def test_the_loopback_llm_answers_a_cased_punctuated_transcript_by_its_topic() -> None:
    """Real models write "Cancel the timer, please.": the topic word is read with its punctuation stripped."""
    llm = TopicalOpenAIServer(reply="Say that again?")
    for said, answer in [
        ("Cancel the timer, please.", REPLIES["timer"]),
        ("What is the weather on Monday?", REPLIES["weather"]),
        ("hello what is four times six", REPLIES["times"]),
        ("Good morning.", "Say that again?"),
    ]:
        llm.requests.append({"messages": [{"role": "user", "content": said}]})
        assert llm.reply == answer, said


async def _wait_for(done, what: str, proc: subprocess.Popen, timeout_s: float, logs: Path) -> None:
    """Poll ``done()`` until it holds; fail with the logs if ``proc`` exits or ``timeout_s`` passes first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not done():
        if proc.poll() is not None:
            pytest.fail(f"exited with {proc.returncode} before {what}\n{_report(logs)}")
        if loop.time() > deadline:
            pytest.fail(f"no {what} after {timeout_s:.0f} s\n{_report(logs)}")
        await asyncio.sleep(0.2)


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.timeout(420)
async def test_pipecat_eval_harness_passes_our_scenarios(bot_magpie: Path, tmp_path: Path) -> None:
    from pipecat.evals.scenario import EvalScenarioFile, is_scenario_file

    files = [p for p in sorted(EVALS.glob("*.yaml")) if is_scenario_file(p)]
    scenarios = [s for path in files for s in EvalScenarioFile.load(path)]
    assert scenarios, f"no scenarios in {EVALS}"
    spoken = [turn.user for s in scenarios for turn in s.turns if turn.user is not None]
    logs = tmp_path / "logs"
    logs.mkdir()
    port = free_port()

    async with TopicalOpenAIServer(reply="Sorry, could you say that again?") as llm:
        env = clean_env(  # neither the bot nor the harness reads a developer's .env
            NEMOTRON_ASR_MODEL=str(TRAINED_MODEL),
            NEMOTRON_ASR_DEVICE="cpu",
            NEMOTRON_LLM_BASE_URL=llm.base_url,
            MAGPIE_TTS_MODEL=str(bot_magpie),
        )
        bot_log = logs / "bot.log"
        bot = _launch(
            [sys.executable, str(BOT), "--host", "127.0.0.1", "--port", str(port)],
            bot_log,
            env=env,
            cwd=tmp_path,  # the bot writes runs/turns-<session>.jsonl here
        )
        try:
            # The bot loads its models before the runner listens.
            await _wait_for(
                lambda: "Uvicorn running" in bot_log.read_text(),
                "'Uvicorn running'",
                bot,
                BOT_START_TIMEOUT_S,
                logs,
            )
            harness_args = [sys.executable, "-m", "pipecat.evals", "run", str(EVALS)]
            harness_args += ["--bot-url", f"ws://127.0.0.1:{port}/ws", "--verbose", "--debug"]
            harness_args += ["--logs-dir", str(logs), "--timeout", str(EXPECTATION_TIMEOUT_S)]
            harness = _launch(harness_args, logs / "harness.log", env=env, cwd=tmp_path)
            try:
                returncode = await asyncio.to_thread(harness.wait, HARNESS_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                harness.kill()
                await asyncio.to_thread(harness.wait)
                pytest.fail(f"the harness ran past {HARNESS_TIMEOUT_S:.0f} s\n{_report(logs)}")
            assert returncode == 0, _report(logs)

            # What reached the LLM is each turn's transcript, in order: no turn split, merged or lost.
            heard = [normalize_text(_latest_user_text(r)) for r in llm.requests]
            assert heard == [normalize_text(t) for t in spoken], _report(logs)
            # The bot ends each session when the harness leaves it.
            await _wait_for(
                lambda: len(SESSION_ENDED.findall(bot_log.read_text())) == len(scenarios),
                f"'Session … ended' for each of the {len(scenarios)} scenario(s)",
                bot,
                30,
                logs,
            )
        finally:
            await asyncio.to_thread(stop_process, bot)  # off the loop the LLM server runs on
