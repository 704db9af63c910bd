"""Text → Magpie TTS (in process, batched) → a WAV file, through Pipecat's TTS service interface.

    python examples/magpie_tts.py "Hello. The weather on Friday is sunny." --out hello.wav [--model nvidia/magpie_tts_multilingual_357m]

The default model is the real Magpie on a CUDA GPU (downloaded on first use; needs the ``tts`` extra); on a CPU it is
the bundled tiny Magpie (trained on espeak-ng voices: it reads short sentences of a voice agent's domain,
``docs/TINY_MAGPIE.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import wave
from pathlib import Path

from pipecat.frames.frames import EndFrame, Frame, TTSAudioRawFrame, TTSSpeakFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import WorkerRunner
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from pipecat_nemotron import MagpieTTSService
from pipecat_nemotron.agent.process import REAL_MAGPIE_MODEL
from pipecat_nemotron.models import TINY_MAGPIE_PATH
from pipecat_nemotron.runtime.devices import resolve_device
from pipecat_nemotron.tts.magpie import MagpieSynthesisOptions


class CollectAudio(FrameProcessor):
    """Keeps the TTS audio that reaches the end of the pipeline."""

    def __init__(self) -> None:
        super().__init__()
        self.pcm = bytearray()
        self.sample_rate = 0

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.pcm += frame.audio
            self.sample_rate = frame.sample_rate
        await self.push_frame(frame, direction)


async def speak(text: str, model: str, out: Path, voice: str) -> None:
    tts = MagpieTTSService(
        model=model, settings=MagpieTTSService.Settings(voice=voice), options=MagpieSynthesisOptions(max_duration_s=6.0)
    )
    audio = CollectAudio()
    worker = PipelineWorker(Pipeline([tts, audio]), params=PipelineParams())
    # The service speaks the text before it passes the EndFrame on.
    await worker.queue_frames([TTSSpeakFrame(text), EndFrame()])
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()
    with wave.open(str(out), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(audio.sample_rate)
        wav.writeframes(bytes(audio.pcm))
    print(f"{len(audio.pcm) / 2 / audio.sample_rate:.2f} s of speech at {audio.sample_rate} Hz: {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("text", nargs="?", default="Hello. The weather on Friday is sunny.")
    parser.add_argument("--out", type=Path, default=Path("magpie.wav"))
    parser.add_argument("--model", default=None, help="Magpie .nemo path or hub id (default: see above)")
    parser.add_argument("--voice", default="aria", help="john, sofia, aria, jason or leo")
    args = parser.parse_args()
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    model = args.model or (REAL_MAGPIE_MODEL if resolve_device("auto").startswith("cuda") else str(TINY_MAGPIE_PATH))
    asyncio.run(speak(args.text, model, args.out, args.voice))


if __name__ == "__main__":
    main()
