"""One bot process of ``agent-load --bots processes``: its sessions through the whole agent, on a shared model server.

Started by :mod:`pipecat_nemotron.bench.agent_procs` as ``python -m pipecat_nemotron.bench.agent_bot SPEC.json``.
Each session is the pipeline :func:`~pipecat_nemotron.bench.agent_load.run_session` runs in the in-process mode
(Silero VAD, the STT owning turn detection, the loopback fake LLM of this process), with the ASR over the
WebSocket protocol (:class:`~pipecat_nemotron.stt.NemotronServerSTTService`) and the TTS over Riva gRPC (Pipecat's
``NvidiaTTSService``), both on one ``pipecat-nemotron serve`` process. Every answered turn is appended to the
spec's JSONL file as it is measured, so a bot killed mid-run keeps the turns it answered.

The parent talks to it in JSON lines: the bot prints ``{"event": "ready"}`` once its imports are done (its
sessions have not started), starts its sessions when ``go`` arrives on stdin (so sessions of all bots start
together), prints ``{"event": "done", "errors": [...]}`` when they end (one entry per session: None or the
error), then waits for stdin to close before it exits (the parent reads the process's CPU time in between).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipecat_nemotron.bench.agent_procs import PREFIX


def say(event: str, **fields: Any) -> None:
    """One protocol line to the parent."""
    print(PREFIX + json.dumps({"event": event, **fields}), flush=True)


async def read_stdin_line() -> str:
    """The next line from the parent ('' at end of input), read off the event loop."""
    return await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


async def run_bot(spec: dict[str, Any]) -> None:
    """Run the spec's sessions when the parent says ``go``; report how each ended."""
    from pipecat.services.nvidia.tts import NvidiaTTSService

    from pipecat_nemotron.bench.agent_load import REPLY, run_session, session_stt
    from pipecat_nemotron.llm.fake_server import FakeOpenAIServer

    async def session(wav: str, llm_url: str) -> None:
        stt = session_stt(spec["asr_url"], spec["latency_ms"], spec.get("skip_silence", True))  # server client
        tts = NvidiaTTSService(server=spec["tts_address"], use_ssl=False)
        await run_session(stt, tts, llm_url, Path(wav), jsonl=Path(spec["jsonl"]))

    async with FakeOpenAIServer(reply=REPLY, first_token_delay_s=spec["ttft_ms"] / 1000) as llm:
        say("ready")
        if (await read_stdin_line()).strip() != "go":
            return  # the parent gave up before the start
        ended = await asyncio.gather(*(session(w, llm.base_url) for w in spec["wavs"]), return_exceptions=True)
    say("done", errors=[None if e is None else f"{type(e).__name__}: {e}" for e in ended])
    while await read_stdin_line():
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pipecat_nemotron.bench.agent_bot SPEC.json``; returns the exit status."""
    from loguru import logger

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m pipecat_nemotron.bench.agent_bot SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    logger.remove()  # Pipecat logs every frame decision at DEBUG: warnings only, on stderr (the parent's log file)
    logger.add(sys.stderr, level="WARNING")
    asyncio.run(run_bot(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
