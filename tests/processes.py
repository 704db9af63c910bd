"""Starting and stopping the programs tests run as a user would (bots, drivers): ports and process ends."""

from __future__ import annotations

import os
import signal
import socket
import subprocess


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """Ctrl-C ``proc`` (as a person stops a bot), and kill it if it has not exited within ``timeout`` seconds."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def clean_env(**settings: str) -> dict[str, str]:
    """This process's environment without the project's settings, plus ``settings``, for a bot or demo.

    Drops ``NEMOTRON_*``/``MAGPIE_*`` and disables ``.env`` files (``load_dotenv`` searches upward from the
    script, so a developer's repository ``.env`` would otherwise override what the test sets).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEMOTRON_", "MAGPIE_"))}
    env["PYTHON_DOTENV_DISABLED"] = "1"
    env.update(settings)
    return env
