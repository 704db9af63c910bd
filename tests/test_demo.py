"""`make demo` as a user runs it: the README's demo command over the bundled two-turn WAV, in real time, with the
embedded agent (no configuration) and with the parts `.env` configures."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import wave
from pathlib import Path

from openai_server import openai_server  # noqa: F401  (fixture)
from processes import clean_env

from pipecat_nemotron.bench.wer import normalize_text
from pipecat_nemotron.models import DEMO_AUDIO_DIR, TINY_MAGPIE_PATH

_FINAL = re.compile(r"^\[final\] (.*?)(?:\x1b\[K)?$")
# Pipecat reports no TTFS ("n/a") for a final later than its STT TTFB timeout (2 s), as on an overloaded machine.
_NUMBERS = re.compile(r"^\s+TTFS (\d+ ms|n/a) · ASR finalize ([\d.]+) ms$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_make_demo_hears_thinks_and_answers_offline_with_no_configuration(tmp_path: Path) -> None:
    """`make demo` on a fresh clone: no .env, so the embedded agent runs (tiny ASR, llama.cpp's server with the
    bundled GGUF, tiny Magpie). Every final prints in order with its own numbers; every turn gets a spoken answer with
    its voice-to-voice legs; the conversation WAV, turns JSONL and plot are written; the LLM server is gone after."""
    env = clean_env()
    wav = DEMO_AUDIO_DIR / "two_turns.wav"
    run = subprocess.run(
        [sys.executable, "-m", "pipecat_nemotron.demo", "--wav", str(wav), "--out", str(tmp_path / "runs")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "LLM: embedded llama.cpp server with SmolLM2-135M-Instruct.Q4_1.gguf" in run.stdout, run.stdout
    # The console as a person reads it: interims overwrite one line ("\r  … text"), finals get their own.
    events = [e for line in run.stdout.splitlines() for e in line.split("\r") if e.strip()]
    finals: list[tuple[str, float]] = []
    interims_since_final: list[str] = []
    for i, event in enumerate(events):
        if event.startswith("  … "):
            interims_since_final.append(event[4:].removesuffix("\x1b[K"))
        elif m := _FINAL.match(event):
            text = m.group(1)
            # Printed in order: every interim shown since the previous final belongs to this utterance.
            assert all(text.startswith(p) for p in interims_since_final), (text, interims_since_final)
            interims_since_final = []
            numbers = _NUMBERS.match(events[i + 1])
            assert numbers, f"final {text!r} is not followed by its own TTFS and finalize time: {events[i + 1]!r}"
            finals.append((text, float(numbers.group(2))))
    spoken = " ".join(json.loads((DEMO_AUDIO_DIR / "turns.json").read_text())["two_turns.wav"]["turns"])
    assert normalize_text(" ".join(t for t, _ in finals)) == normalize_text(spoken), run.stdout
    assert len(finals) >= 2 and all(ms > 0 for _, ms in finals)
    # One finalize time per final in the summary too (none attributed twice, none missing).
    assert re.search(rf"finalize_ms\s+n=\s*{len(finals)}\s", run.stdout), run.stdout

    # Every turn: what the user said, a real answer, and voice-to-voice with its legs.
    conversation = run.stdout[run.stdout.index("Conversation:") :]
    heard = re.findall(r"^    you:   (.+)$", conversation, re.M)
    answers = re.findall(r"^    agent: (.+)$", conversation, re.M)
    v2v = re.findall(r"^    voice-to-voice (\d+) ms = (.+)$", conversation, re.M)
    assert heard and len(answers) == len(heard) == len(v2v), conversation
    assert all(a.strip() and a != "(no answer)" for a in answers), conversation
    # Each spoken answer, as the tiny ASR hears it (what its words are depends on SmolLM2's free text).
    assert len(re.findall(r"^    heard: ", conversation, re.M)) == len(answers), conversation
    assert all(int(ms) > 0 and "llm_inference" in legs for ms, legs in v2v), conversation
    assert normalize_text(" ".join(heard)) == normalize_text(spoken), conversation
    # The segmentation is explained, not left as a mismatch.
    assert "Script (2 turn(s))" in run.stdout
    if len(answers) != 2:
        assert f"The agent answered {len(answers)} turn(s) where the script has 2" in run.stdout, run.stdout
    assert "Problems:" not in run.stdout

    # Both sides in one WAV a user can play: the user's audio, then the agent's answers after it.
    runs = tmp_path / "runs"
    with wave.open(str(runs / "demo_conversation.wav")) as conversation_wav:
        assert conversation_wav.getframerate() == 16000 and conversation_wav.getnchannels() == 1
        mixed = conversation_wav.readframes(conversation_wav.getnframes())
    with wave.open(str(wav)) as user_wav:
        user_s = user_wav.getnframes() / user_wav.getframerate()
    assert len(mixed) / 2 / 16000 > user_s  # the last answer plays after the user's last words
    assert (runs / "demo_latency.png").stat().st_size > 0
    assert len((runs / "demo_turns.jsonl").read_text().splitlines()) == len(v2v)
    pid = int(re.search(r"LLM server: llama.cpp \(pid (\d+)\)", run.stdout).group(1))
    assert not _pid_alive(pid), "the embedded LLM server outlived the demo"


def test_demo_ctrl_c_stops_the_llm_server(tmp_path: Path) -> None:
    """Ctrl-C while the conversation streams: the demo ends at once and takes the LLM server with it."""
    env = clean_env()
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "pipecat_nemotron.demo", "--out", str(tmp_path / "runs")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines: list[str] = []
        pid = None
        assert proc.stdout is not None
        for line in proc.stdout:  # ends when the demo exits: a demo that exits early fails below, no hang
            lines.append(line)
            if m := re.search(r"LLM server: llama.cpp \(pid (\d+)\)", line):
                pid = int(m.group(1))
            if line.startswith("Streaming "):
                proc.send_signal(signal.SIGINT)
                break
        assert pid is not None and _pid_alive(pid), "".join(lines)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, "".join(lines) + rest
    assert "the LLM server was stopped" in rest
    assert not _pid_alive(pid)


def test_demo_names_the_fix_for_a_missing_gguf(tmp_path: Path) -> None:
    env = clean_env(NEMOTRON_LLM_EMBEDDED_GGUF=str(tmp_path / "nope.gguf"))
    run = subprocess.run(
        [sys.executable, "-m", "pipecat_nemotron.demo", "--fast", "--out", str(tmp_path / "runs")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stdout[-3000:]
    assert f"NEMOTRON_LLM_EMBEDDED_GGUF={str(tmp_path / 'nope.gguf')!r}: no such file" in run.stdout, run.stdout


async def test_demo_runs_the_whole_agent_configured_in_env(openai_server, tmp_path: Path) -> None:  # noqa: F811
    """The README demo with an LLM and in-process Magpie in the environment (as `.env` sets them): the models
    load before the pipeline starts, so no StartFrame times out, and every turn is answered, measured and heard:
    the ASR reads the bundled tiny Magpie's speech of every answer back as its text."""
    import asyncio

    # A sentence the tiny Magpie says right for every seed (tests/test_agent_speaks.py).
    openai_server.reply = "What is five times eight?"
    env = clean_env(
        NEMOTRON_LLM_BASE_URL=openai_server.base_url,
        NEMOTRON_LLM_API_KEY="none",
        MAGPIE_TTS_MODEL=str(TINY_MAGPIE_PATH),
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pipecat_nemotron.demo", "--wav", str(DEMO_AUDIO_DIR / "two_turns.wav"),
        "--out", str(tmp_path), "--verbose",
        cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=300)
    out, err = stdout.decode(), stderr.decode()
    assert proc.returncode == 0, err[-4000:]
    assert "timeout waiting for StartFrame" not in err
    # Both models are loaded before the pipeline starts.
    assert err.index("Magpie TTS model") < err.index("StartFrame#0") and "Ready in" in out, err[-4000:]
    turns = [json.loads(line) for line in (tmp_path / "demo_turns.jsonl").read_text().splitlines()]
    # (Pipecat's Smart Turn may join the two utterances, 1.2 s apart, into one turn.)
    assert turns and all(t["v2v_ms"] > 0 and t["tts_ttfb_ms"] > 0 for t in turns), turns
    asked = " ".join(m["content"] for r in openai_server.requests for m in r["messages"] if m["role"] == "user")
    asked = normalize_text(asked)
    assert "what is two plus two" in asked and "what time is it please" in asked
    conversation = out[out.index("Conversation:") :]
    answers = re.findall(r"^    agent: (.+)$", conversation, re.M)
    heard = re.findall(r"^    heard: (.+?)  \(the agent's speech", conversation, re.M)
    assert len(heard) == len(answers) == len(turns), conversation
    complete = [h for a, h in zip(answers, heard, strict=True) if not a.endswith("[interrupted]")]
    assert complete and all(normalize_text(h) == "what is five times eight" for h in complete), conversation


def test_demo_names_a_model_that_cannot_load(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pipecat_nemotron.demo", "--fast", "--model", str(tmp_path / "nope.nemo"),
         "--out", str(tmp_path / "runs")],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert "A model could not load" in run.stdout and "nope.nemo" in run.stdout, run.stdout[-3000:]


async def test_demo_stops_and_names_an_llm_that_never_answers(
    openai_server, bot_magpie: Path, tmp_path: Path  # noqa: F811
) -> None:
    """An LLM server that takes the request and never replies cannot hang the demo: past ``--timeout-s`` the
    conversation is torn down, the demo says so and exits 1. Pipecat runs a ``CancelFrame`` only after an
    ``EndFrame`` queued before it, and that waits for the LLM: the LLM's stall timeout (30 s here) ends the
    request, then the cancel goes through. Only the bounds can end this run: the server never answers, and every
    VAD stop ends a turn (``NEMOTRON_TURN_END=vad``), so the last words always wait for an answer."""
    import asyncio

    openai_server.first_token_delay_s = 3600.0
    env = clean_env(
        NEMOTRON_LLM_BASE_URL=openai_server.base_url,
        NEMOTRON_LLM_API_KEY="none",
        NEMOTRON_LLM_STALL_TIMEOUT_S="30",
        NEMOTRON_TURN_END="vad",
        MAGPIE_TTS_MODEL=str(bot_magpie),
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pipecat_nemotron.demo", "--wav", str(DEMO_AUDIO_DIR / "two_turns.wav"),
        "--out", str(tmp_path), "--fast", "--timeout-s", "10",
        cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=300)
    out = stdout.decode()
    assert proc.returncode == 1, out[-3000:] + stderr.decode()[-3000:]
    assert "the conversation had not ended 10 s after it started" in out, out[-3000:]
    assert openai_server.requests, "the LLM was never asked, so the bound was not what ended the run"


async def test_the_demo_says_when_it_cannot_hear_its_answers(tmp_path: Path) -> None:
    """The check of the agent's speech fails alone: the answers heard so far come back, the failure is a problem."""
    import numpy as np

    from pipecat_nemotron.agent.settings import AgentSettings
    from pipecat_nemotron.demo import _hear_answers
    from pipecat_nemotron.observers.conversation import BotAudio, ConversationTurn

    turn = ConversationTurn(index=1, user_text="hi", reply_text="Hello.")
    turn.audio.append(BotAudio(wall_s=0.0, audio=np.zeros(2205, dtype=np.int16), sample_rate=22050))
    problems: list[str] = []
    settings = AgentSettings(asr_model=str(tmp_path / "nope.nemo"), asr_device="cpu")
    assert await _hear_answers(settings, [turn], problems) == {}
    assert len(problems) == 1 and "could not be transcribed back" in problems[0] and "nope.nemo" in problems[0]


async def test_the_demo_names_an_answer_whose_speech_it_cannot_hear_whole() -> None:
    """Speech pieces at two sample rates are not silently thinned out: the answer is named as a problem."""
    import numpy as np

    from pipecat_nemotron.agent.settings import AgentSettings
    from pipecat_nemotron.demo import _hear_answers
    from pipecat_nemotron.observers.conversation import BotAudio, ConversationTurn

    turn = ConversationTurn(index=2, user_text="hi", reply_text="Hello.")
    for rate in (22050, 16000):
        turn.audio.append(BotAudio(wall_s=0.0, audio=np.zeros(rate // 10, dtype=np.int16), sample_rate=rate))
    problems: list[str] = []
    assert await _hear_answers(AgentSettings(asr_device="cpu"), [turn], problems) == {}
    assert len(problems) == 1 and "answer 2's speech mixes sample rates [16000, 22050]" in problems[0], problems
