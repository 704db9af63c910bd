"""The fully local voice agent on this machine's microphone and speaker.

    pip install -e ".[local,tts,llm-local]"   # PyAudio needs portaudio (apt install portaudio19-dev)
    python bots/local_bot.py

ASR and TTS run in this process (on the GPU when there is one). With no `.env` the LLM is the embedded llama.cpp
server with a small GGUF, started with the bot and stopped with it; `cp bots/.env.example .env` and set
NEMOTRON_LLM_BASE_URL to use your own OpenAI-compatible server (read from the current directory). Each turn's
latency (TTFS, ASR finalize, LLM TTFB, TTS TTFB, voice-to-voice) goes to runs/local_turns.jsonl; plot it with
`python -m pipecat_nemotron.observers.report runs/local_turns.jsonl -o latency.png`.
"""

from __future__ import annotations

import asyncio
import os
import sys

from loguru import logger
from pipecat.pipeline.runner import WorkerRunner

from pipecat_nemotron.agent.assembly import build_voice_agent
from pipecat_nemotron.agent.process import AgentProcess
from pipecat_nemotron.agent.settings import AgentSettings
from pipecat_nemotron.llm.env import load_env_file


async def main() -> None:
    load_env_file(override=True)  # the .env of the directory the bot is started from
    settings = AgentSettings.from_env(os.environ)
    logger.info("\n".join(settings.describe()))
    try:
        from pipecat.transports.local.audio import LocalAudioTransport, LocalAudioTransportParams
    except ImportError as e:
        raise SystemExit(f"Local audio needs the 'local' extra: pip install -e '.[local]' ({e})") from e

    # Before the microphone opens: the first words are not lost to a loading model or a starting LLM server.
    async with AgentProcess(settings) as process:
        settings = process.settings
        await settings.check_llm()  # a configured LLM that is unreachable is logged now, with its URL
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
