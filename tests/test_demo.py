"""`make demo` as a user runs it: the README's demo command over the bundled two-turn WAV, in real time."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from pipecat_nemotron.models import DEMO_AUDIO_DIR

_FINAL = re.compile(r"^\[final\] (.*?)(?:\x1b\[K)?$")
_NUMBERS = re.compile(r"^\s+TTFS (\d+) ms · ASR finalize ([\d.]+) ms$")


def test_demo_prints_each_final_in_order_with_its_own_finalize_time(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEMOTRON_", "MAGPIE_"))}
    wav = DEMO_AUDIO_DIR / "two_turns.wav"
    run = subprocess.run(
        [sys.executable, "-m", "pipecat_nemotron.demo", "--wav", str(wav), "--turns", str(tmp_path / "t.jsonl")],
        cwd=tmp_path,  # no .env here
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
    assert " ".join(t for t, _ in finals) == spoken, run.stdout
    assert len(finals) >= 2 and all(ms > 0 for _, ms in finals)
    # One finalize time per final in the summary too (none attributed twice, none missing).
    assert re.search(rf"finalize_ms\s+n=\s*{len(finals)}\s", run.stdout), run.stdout
