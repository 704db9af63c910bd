"""`make demo` as a user runs it: the README's demo command over the bundled two-turn WAV, in real time."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from openai_server import openai_server  # noqa: F401  (fixture)
from processes import clean_env

from pipecat_nemotron.bench.wer import normalize_text
from pipecat_nemotron.models import DEMO_AUDIO_DIR

_FINAL = re.compile(r"^\[final\] (.*?)(?:\x1b\[K)?$")
# Pipecat reports no TTFS ("n/a") for a final later than its STT TTFB timeout (2 s), as on an overloaded machine.
_NUMBERS = re.compile(r"^\s+TTFS (\d+ ms|n/a) · ASR finalize ([\d.]+) ms$")


def test_demo_prints_each_final_in_order_with_its_own_finalize_time(tmp_path: Path) -> None:
    env = clean_env()
    wav = DEMO_AUDIO_DIR / "two_turns.wav"
    run = subprocess.run(
        [sys.executable, "-m", "pipecat_nemotron.demo", "--wav", str(wav), "--turns", str(tmp_path / "t.jsonl")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
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


async def test_demo_runs_the_whole_agent_configured_in_env(
    openai_server, bot_magpie: Path, tmp_path: Path  # noqa: F811
) -> None:
    """The README demo with an LLM and in-process Magpie in the environment (as `.env` sets them): the models
    load before the pipeline starts, so no StartFrame times out, and every turn is answered and measured."""
    import asyncio

    openai_server.reply = "Four."
    env = clean_env(
        NEMOTRON_LLM_BASE_URL=openai_server.base_url, NEMOTRON_LLM_API_KEY="none", MAGPIE_TTS_MODEL=str(bot_magpie)
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pipecat_nemotron.demo", "--wav", str(DEMO_AUDIO_DIR / "two_turns.wav"),
        "--turns", str(tmp_path / "turns.jsonl"), "--verbose",
        cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=300)
    out, err = stdout.decode(), stderr.decode()
    assert proc.returncode == 0, err[-4000:]
    assert "timeout waiting for StartFrame" not in err
    # Both models are loaded before the pipeline starts.
    assert err.index("Magpie TTS model") < err.index("StartFrame#0") and "Models loaded in" in out, err[-4000:]
    turns = [json.loads(line) for line in (tmp_path / "turns.jsonl").read_text().splitlines()]
    # (Pipecat's Smart Turn may join the two utterances, 1.2 s apart, into one turn.)
    assert turns and all(t["v2v_ms"] > 0 and t["tts_ttfb_ms"] > 0 for t in turns), turns
    asked = " ".join(m["content"] for r in openai_server.requests for m in r["messages"] if m["role"] == "user")
    asked = normalize_text(asked)
    assert "what is two plus two" in asked and "what time is it please" in asked
