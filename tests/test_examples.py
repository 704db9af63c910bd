"""The minimal example of each service runs as the README shows it: the LLM against the embedded llama.cpp server,
Magpie to a WAV file (the STT examples run in test_user_paths.py)."""

from __future__ import annotations

import subprocess
import sys
import wave
from pathlib import Path

from processes import clean_env

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_llm_example_answers_with_the_embedded_server(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "nemotron_llm.py"), "What is the capital of France?"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip(), "the LLM example printed no answer"


def test_tts_example_writes_the_speech_to_a_wav(tmp_path: Path) -> None:
    out = tmp_path / "hello.wav"
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "magpie_tts.py"), "Hello there.", "--out", str(out)],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    with wave.open(str(out)) as wav:
        assert wav.getnchannels() == 1 and wav.getsampwidth() == 2 and wav.getnframes() > 0
        seconds = wav.getnframes() / wav.getframerate()
    assert f"{seconds:.2f} s of speech" in run.stdout, run.stdout
