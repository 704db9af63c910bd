"""The bots as a person starts them: Pipecat's development runner, the bundled tiny model and the embedded LLM,
loopback only."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from processes import clean_env, free_port, stop_process

from pipecat_nemotron.models import TINY_MODEL_PATH as TRAINED_MODEL

BOT = Path(__file__).resolve().parents[1] / "bots" / "bot.py"


def test_runner_bot_loads_the_model_before_it_accepts_a_session(tmp_path: Path) -> None:
    port = free_port()
    env = clean_env(NEMOTRON_ASR_MODEL=str(TRAINED_MODEL), NEMOTRON_ASR_DEVICE="cpu")
    log = tmp_path / "bot.log"
    with log.open("w") as out:
        bot = subprocess.Popen(
            [sys.executable, str(BOT), "--host", "127.0.0.1", "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 240
        while "Uvicorn running" not in log.read_text():
            assert bot.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        text = log.read_text()
        # The model is loaded (and said so, with its time) before the server listens for a first session.
        assert "Models loaded at process start" in text, text[-3000:]
        assert text.index("Nemotron ASR engine ready") < text.index("Uvicorn running")
        # With no LLM configured, the embedded llama.cpp server is up before the first session, too.
        assert text.index("Embedded LLM: ready") < text.index("Uvicorn running"), text[-3000:]
        llm_pid = int(re.search(r"starting llama.cpp's server \(pid (\d+)\)", text).group(1))
        # The page a person opens: / redirects to the runner's prebuilt client, served whole.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as response:
            assert response.status == 200 and response.url == f"http://127.0.0.1:{port}/client/"
            assert "<title>Pipecat UI</title>" in response.read().decode()
    finally:
        stop_process(bot)
    # Ctrl-C stops the bot and, with it, its LLM server.
    with pytest.raises(ProcessLookupError):
        os.kill(llm_pid, 0)
