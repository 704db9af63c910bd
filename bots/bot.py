"""The voice agent for Pipecat's development runner: the browser page, Daily rooms, Pipecat's eval harness.

    pip install -e ".[daily,webrtc,tts,llm-local]"
    python bots/bot.py -t webrtc       # open http://localhost:7860/nemotron (offline page) or /client (Pipecat's)
    python bots/bot.py -t daily        # needs DAILY_API_KEY
    python bots/bot.py                 # eval harness: python -m pipecat.evals run SCENARIO --bot-url ws://localhost:7860/ws

Every session runs in this process and shares one ASR engine and one Magpie model, loaded at process start
(before the runner accepts a connection) and batched together on the GPU. With no `.env` the whole agent runs here
(the embedded defaults of `AgentProcess`: the tiny ASR on CPU, llama.cpp's server with a small GGUF as the LLM, the
tiny Magpie); `cp bots/.env.example .env` and edit it to use your own LLM server or Magpie. With
NEMOTRON_LLM_EMBEDDED=0 and no LLM configured the bot only transcribes: the client still gets bot-ready and live
interim and final transcripts. Each final transcript is logged at INFO with its session and TTFS; a session ends
when its client leaves.
"""

from __future__ import annotations

import os
import uuid

from loguru import logger
from pipecat.pipeline.runner import WorkerRunner
from pipecat.runner.types import RunnerArguments
from pipecat.runner.utils import create_transport
from pipecat.transports.base_transport import TransportParams

from pipecat_nemotron.agent.assembly import build_voice_agent
from pipecat_nemotron.agent.process import AgentProcess
from pipecat_nemotron.agent.runner import (
    offer_loopback_ice_candidates,
    preload_when_runner_starts,
    serve_nemotron_page,
)
from pipecat_nemotron.agent.settings import AgentSettings
from pipecat_nemotron.llm.env import load_env_file
from pipecat_nemotron.observers.transcripts import TranscriptCollector, UtteranceRecord

load_env_file(override=True)  # the .env of the directory the bot is started from
PROCESS = AgentProcess(AgentSettings.from_env(os.environ))


def _daily_params():
    from pipecat.transports.daily.transport import DailyParams

    return DailyParams(audio_in_enabled=True, audio_out_enabled=True)


def _eval_params():
    from pipecat.evals.transport import EvalTransportParams

    return EvalTransportParams(audio_in_enabled=True, audio_out_enabled=True)


TRANSPORT_PARAMS = {
    "daily": _daily_params,
    "webrtc": lambda: TransportParams(audio_in_enabled=True, audio_out_enabled=True),
    "eval": _eval_params,
}


async def bot(runner_args: RunnerArguments) -> None:
    """Run one session (called by the runner for every connection)."""
    session = runner_args.session_id or uuid.uuid4().hex[:8]
    transport = await create_transport(runner_args, TRANSPORT_PARAMS)
    settings = PROCESS.settings  # started: the embedded LLM's URL and Magpie filled in
    stt = settings.create_stt()
    await settings.check_llm()  # an unreachable LLM is logged now, with its URL, not at the first turn

    def log_final(record: UtteranceRecord) -> None:
        ttfs = f"{record.ttfs_ms:.0f} ms" if record.ttfs_ms is not None else "n/a"
        logger.info(f"Session {session} heard: {record.text!r} (TTFS {ttfs})")

    agent = build_voice_agent(
        stt=stt,
        llm=settings.create_llm(),
        tts=settings.create_tts(),
        transport=transport,
        observers=[TranscriptCollector(stt.name, on_final=log_final)],
        turns_jsonl=f"runs/turns-{session}.jsonl",
        idle_timeout_secs=runner_args.pipeline_idle_timeout_secs,
        turn_end=settings.turn_end,
    )

    @transport.event_handler("on_client_disconnected")
    async def _client_left(_transport, _client) -> None:
        logger.info(f"Session {session}: the client left; ending the session")
        await agent.worker.cancel()

    logger.info(f"Session {session} started: " + "; ".join(settings.describe()))
    runner = WorkerRunner(handle_sigint=runner_args.handle_sigint)
    await runner.add_workers(agent.worker)
    await runner.run()
    logger.info(f"Session {session} ended")


if __name__ == "__main__":
    from pipecat.runner.run import main

    preload_when_runner_starts(PROCESS)
    serve_nemotron_page()
    if os.environ.get("NEMOTRON_WEBRTC_LOOPBACK", "").strip() in ("1", "true", "yes"):
        offer_loopback_ice_candidates()  # a browser on this machine with no other network (CI, offline box)
    main()
