"""The voice agent for Pipecat's development runner: Daily rooms or the SmallWebRTC browser page.

    pip install -e ".[daily,webrtc,tts]"
    cp bots/.env.example .env
    python bots/bot.py -t webrtc       # open http://localhost:7860/client
    python bots/bot.py -t daily        # needs DAILY_API_KEY

Every session runs in this process and shares one ASR engine and one Magpie model, loaded at process start
(before the runner accepts a connection) and batched together on the GPU.
"""

from __future__ import annotations

import os

from dotenv import load_dotenv
from loguru import logger
from pipecat.pipeline.runner import WorkerRunner
from pipecat.runner.types import RunnerArguments
from pipecat.runner.utils import create_transport
from pipecat.transports.base_transport import TransportParams

from pipecat_nemotron.agent import AgentSettings, build_voice_agent, preload_when_runner_starts

load_dotenv(override=True)
SETTINGS = AgentSettings.from_env(os.environ)


def _daily_params():
    from pipecat.transports.daily.transport import DailyParams

    return DailyParams(audio_in_enabled=True, audio_out_enabled=True)


TRANSPORT_PARAMS = {
    "daily": _daily_params,
    "webrtc": lambda: TransportParams(audio_in_enabled=True, audio_out_enabled=True),
}


async def bot(runner_args: RunnerArguments) -> None:
    """Run one session (called by the runner for every connection)."""
    transport = await create_transport(runner_args, TRANSPORT_PARAMS)
    agent = build_voice_agent(
        stt=SETTINGS.create_stt(),
        llm=SETTINGS.create_llm(),
        tts=SETTINGS.create_tts(),
        transport=transport,
        turns_jsonl=f"runs/turns-{runner_args.session_id or 'session'}.jsonl",
        idle_timeout_secs=runner_args.pipeline_idle_timeout_secs,
    )
    logger.info("Session started: " + "; ".join(SETTINGS.describe()))
    runner = WorkerRunner(handle_sigint=runner_args.handle_sigint)
    await runner.add_workers(agent.worker)
    await runner.run()


if __name__ == "__main__":
    from pipecat.runner.run import main

    preload_when_runner_starts(SETTINGS)
    main()
