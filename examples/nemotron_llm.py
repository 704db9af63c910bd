"""One question through the Nemotron LLM service (Pipecat's OpenAI-compatible LLM, voice defaults), streamed.

    python examples/nemotron_llm.py "What is two plus two?"

With ``NEMOTRON_LLM_BASE_URL`` (or ``NEMOTRON_LLM_BACKEND``) in ``.env`` it asks your server (vLLM, NIM, hosted,
llama.cpp; docs/LLM.md). Without, it starts the embedded llama.cpp server with the bundled small GGUF (the
``llm-local`` extra) for the question and stops it after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from pipecat.frames.frames import EndFrame, Frame, LLMContextFrame, LLMFullResponseEndFrame, LLMTextFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import WorkerRunner
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from pipecat_nemotron import NemotronLLMSettings, create_nemotron_llm
from pipecat_nemotron.llm.embedded import EmbeddedLLMServer, EmbeddedLLMSettings
from pipecat_nemotron.llm.env import ENV_BACKEND, ENV_BASE_URL, load_env_file


class PrintAnswer(FrameProcessor):
    """Prints the answer as it streams."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMTextFrame):
            print(frame.text, end="", flush=True)
        elif isinstance(frame, LLMFullResponseEndFrame):
            print()
        await self.push_frame(frame, direction)


async def ask(settings: NemotronLLMSettings, question: str) -> None:
    worker = PipelineWorker(Pipeline([create_nemotron_llm(settings), PrintAnswer()]), params=PipelineParams())
    # The LLM answers the context before it passes the EndFrame on: the pipeline ends after the answer.
    await worker.queue_frames(
        [LLMContextFrame(LLMContext(messages=[{"role": "user", "content": question}])), EndFrame()]
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()


async def main(question: str) -> None:
    load_env_file()
    if os.environ.get(ENV_BASE_URL) or os.environ.get(ENV_BACKEND):
        await ask(NemotronLLMSettings.from_env(os.environ), question)
        return
    async with EmbeddedLLMServer(EmbeddedLLMSettings()) as server:
        await ask(NemotronLLMSettings(base_url=server.base_url, model=server.model, api_key="none"), question)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("question", nargs="?", default="What is two plus two?")
    args = parser.parse_args()
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    asyncio.run(main(args.question))
