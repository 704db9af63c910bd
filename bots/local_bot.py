"""The fully local voice agent on this machine's microphone and speaker.

    pip install -e ".[local,tts]"     # PyAudio needs portaudio (apt install portaudio19-dev)
    cp bots/.env.example .env         # point it at your LLM server (read from the current directory)
    python bots/local_bot.py

ASR and TTS run in this process on the GPU; the LLM runs on the OpenAI-compatible server `.env` names. Each turn's
latency (TTFS, ASR finalize, LLM TTFB, TTS TTFB, voice-to-voice) goes to runs/local_turns.jsonl; plot it with
`python -m pipecat_nemotron.observers.report runs/local_turns.jsonl -o latency.png`.
"""

from __future__ import annotations

import asyncio
import os
import sys

from loguru import logger
from pipecat.pipeline.runner import WorkerRunner

from pipecat_nemotron.agent.assembly import AgentSettings, build_voice_agent
from pipecat_nemotron.llm.env import load_env_file


async def main() -> None:
    load_env_file(override=True)  # the .env of the directory the bot is started from
    settings = AgentSettings.from_env(os.environ)
    logger.info("\n".join(settings.describe()))
    await settings.check_llm()  # an unreachable LLM is logged now, with its URL, not at the first turn
    try:
        from pipecat.transports.local.audio import LocalAudioTransport, LocalAudioTransportParams
    except ImportError as e:
        raise SystemExit(f"Local audio needs the 'local' extra: pip install -e '.[local]' ({e})") from e

    await settings.preload()  # before the microphone opens: the first words are not lost to a loading model
    transport = LocalAudioTransport(
        LocalAudioTransportParams(audio_in_enabled=True, audio_out_enabled=True, audio_in_sample_rate=16000)
    )
    agent = build_voice_agent(
        stt=settings.create_stt(),
        llm=settings.create_llm(),
        tts=settings.create_tts(),
        transport=transport,
        turns_jsonl="runs/local_turns.jsonl",
        idle_timeout_secs=None,
        turn_end=settings.turn_end,
    )
    runner = WorkerRunner()
    await runner.add_workers(agent.worker)
    await runner.run()


if __name__ == "__main__":
    logger.remove()
    logger.add(sys.stderr, level="INFO")
    asyncio.run(main())
