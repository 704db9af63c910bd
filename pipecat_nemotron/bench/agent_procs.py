"""``agent-load --bots processes``: the parent's side of the bot processes, and process CPU time.

:func:`run_bots` spreads N sessions over K bot processes (:mod:`~pipecat_nemotron.bench.agent_bot`), waits until
every bot has imported what it needs, starts all sessions together, and collects the turn records each bot
appended to its JSONL file, with the CPU seconds each process spent between the start and its sessions' end
(``/proc/<pid>/stat``). A bot that dies (killed, crashed) costs only its sessions: it is reported with its exit
status and its log's tail, the turns it answered before are kept, and the other bots go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipecat_nemotron.observers.latency_stats import TurnLatency, load_turns

#: Marks the lines of a bot's protocol on its stdout (anything else a library prints there is ignored).
PREFIX = "agent-bot "

#: Clock ticks per second of ``/proc/<pid>/stat``'s times.
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a live process (its threads included, its children not), s.

    Raises:
        OSError: The process is gone (or this is not Linux).

    """
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may hold spaces: fields are counted after its closing parenthesis.
    rest = stat[stat.rindex(")") + 2 :].split()
    return (int(rest[11]) + int(rest[12])) / _TICKS  # fields 14 (utime) and 15 (stime)


def available_cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_bot_processes(sessions: int) -> int:
    """One bot process per session, up to the cores this process may use.

    A process is a GIL of its own, so up to one per core each adds parallel Python; past the cores they only
    add memory (each imports Pipecat and loads Silero) and context switches, so sessions then share processes.
    """
    return max(1, min(sessions, available_cores()))


def spread(sessions: int, processes: int) -> list[list[int]]:
    """Session indices per bot process, round robin (counts differ by at most one); no empty process."""
    processes = max(1, min(processes, sessions))
    return [list(range(b, sessions, processes)) for b in range(processes)]


@dataclass
class BotProcess:
    """One bot process and what the parent knows of it."""

    index: int
    sessions: list[int]
    proc: Any
    log: Path
    jsonl: Path
    cpu_at_go: float | None = None
    cpu_s: float | None = None
    session_errors: list[str | None] = field(default_factory=list)
    failure: str | None = None

    @property
    def pid(self) -> int:
        """The process id."""
        return int(self.proc.pid)

    async def event(self, name: str) -> dict[str, Any]:
        """The next protocol line of event ``name`` from the bot.

        Raises:
            RuntimeError: The bot's output ended first (it exited or was killed).

        """
        while line := await self.proc.stdout.readline():
            text = line.decode(errors="replace").strip()
            if text.startswith(PREFIX) and (message := json.loads(text[len(PREFIX) :]))["event"] == name:
                return message
        returncode = await self.proc.wait()
        tail = self.log.read_text(errors="replace")[-1500:] if self.log.exists() else ""
        raise RuntimeError(f"bot process {self.index} (pid {self.pid}) exited with {returncode} before {name!r}; "
                           f"its log ends:\n{tail}")  # fmt: skip

    def report(self) -> dict[str, Any]:
        """The bot as the benchmark's JSON records it."""
        return {
            "bot": self.index,
            "pid": self.pid,
            "sessions": self.sessions,
            "returncode": self.proc.returncode,
            "cpu_s": self.cpu_s,
            "session_errors": [e for e in self.session_errors if e is not None],
            "failure": self.failure,
        }


@dataclass
class BotsOutcome:
    """What the bots of one run left: their turn records, CPU seconds and failures."""

    records: list[TurnLatency]
    server_cpu_s: float | None
    bots_cpu_s: float | None
    bots: list[dict[str, Any]]

    @property
    def failed(self) -> list[dict[str, Any]]:
        """The bots that died, or whose sessions failed."""
        return [b for b in self.bots if b["failure"] or b["session_errors"]]


async def start_bot(index: int, sessions: list[int], wavs: Sequence[Path], spec: dict[str, Any],
                    folder: Path) -> BotProcess:  # fmt: skip
    """Start bot process ``index`` for ``sessions`` (indices into ``wavs``); ``spec``: the servers and options."""
    jsonl, log = folder / f"bot{index}.jsonl", folder / f"bot{index}.log"
    spec_path = folder / f"bot{index}.json"
    spec_path.write_text(json.dumps({**spec, "wavs": [str(wavs[s]) for s in sessions], "jsonl": str(jsonl)}))
    with log.open("w") as log_file:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pipecat_nemotron.bench.agent_bot", str(spec_path),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log_file,
        )  # fmt: skip
    return BotProcess(index, sessions, proc, log, jsonl)


async def run_bots(
    wavs: Sequence[Path],
    processes: int,
    spec: dict[str, Any],
    folder: Path,
    *,
    server_pid: int | None = None,
    timeout_s: float = 900.0,
    on_go: Callable[[list[BotProcess]], None] | None = None,
) -> BotsOutcome:
    """Run ``wavs`` as sessions spread over ``processes`` bot processes, all started together.

    Args:
        wavs: One WAV per session.
        processes: Bot processes (at most one per session).
        spec: What every bot gets: ``asr_url``, ``tts_address``, ``latency_ms``, ``ttft_ms``.
        folder: Where the bots' specs, logs and JSONL files go.
        server_pid: The model server, whose CPU seconds over the run are measured too.
        timeout_s: Longest wait for a bot's sessions, s; a bot past it is killed and reported.
        on_go: Called with the bots right after ``go`` was sent (tests kill a bot there).

    Returns:
        The turn records of every bot, the CPU seconds of the server and of the bots (summed over the bots that
        finished: a dead process can no longer be read), and each bot's report.

    """
    bots = [await start_bot(i, s, wavs, spec, folder) for i, s in enumerate(spread(len(wavs), processes))]
    try:
        ready = await asyncio.gather(*(b.event("ready") for b in bots), return_exceptions=True)
        for bot, outcome in zip(bots, ready, strict=True):
            if isinstance(outcome, BaseException):
                bot.failure = str(outcome)
        live = [b for b in bots if b.failure is None]
        server_before = cpu_seconds(server_pid) if server_pid is not None else None
        for bot in live:
            bot.cpu_at_go = cpu_seconds(bot.pid)
            bot.proc.stdin.write(b"go\n")
            await bot.proc.stdin.drain()
        if on_go is not None:
            on_go(live)
        await asyncio.gather(*(_finish(b, timeout_s) for b in live))
        server_cpu = cpu_seconds(server_pid) - server_before if server_before is not None else None
    finally:
        for bot in bots:
            await _stop(bot)
    records = [t for b in bots if b.jsonl.exists() for t in load_turns(b.jsonl)]
    finished = [b.cpu_s for b in bots if b.cpu_s is not None]
    return BotsOutcome(records, server_cpu, sum(finished) if finished else None, [b.report() for b in bots])


async def _finish(bot: BotProcess, timeout_s: float) -> None:
    """Wait for the bot's ``done``; read its CPU time before it may exit. A bot that dies or hangs is recorded."""
    try:
        done = await asyncio.wait_for(bot.event("done"), timeout_s)
    except (RuntimeError, TimeoutError, asyncio.TimeoutError) as e:
        bot.failure = str(e) or f"no answer within {timeout_s:g} s"
        return
    with contextlib.suppress(OSError):
        if bot.cpu_at_go is not None:
            bot.cpu_s = cpu_seconds(bot.pid) - bot.cpu_at_go
    bot.session_errors = list(done["errors"])


async def _stop(bot: BotProcess) -> None:
    """Close the bot's stdin (it exits), killing it after 30 s."""
    if bot.proc.returncode is None:
        with contextlib.suppress(OSError, RuntimeError):
            bot.proc.stdin.close()
        try:
            await asyncio.wait_for(bot.proc.wait(), 30)
        except (TimeoutError, asyncio.TimeoutError):
            bot.proc.kill()
            await bot.proc.wait()
