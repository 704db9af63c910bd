"""Microphone → Nemotron ASR (local, in process) → transcripts printed on the console.

    pip install -e ".[local]"        # PyAudio needs portaudio (apt install portaudio19-dev)
    python examples/stt_only_bot.py --latency-ms 160

Speak; each pause of 0.2 s ends an utterance and prints its final transcript with TTFS and finalize time.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from loguru import logger
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.audio.vad.vad_analyzer import VADParams
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import WorkerRunner
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.audio.vad_processor import VADProcessor

from pipecat_nemotron import NemotronSTTService, default_asr_model
from pipecat_nemotron.observers.transcripts import TranscriptCollector, print_latency_summary


async def run(model: str, latency_ms: int, device: str, cpu_threads: int | None = None) -> None:
    try:
        from pipecat.transports.local.audio import LocalAudioTransport, LocalAudioTransportParams
    except ImportError as e:
        raise SystemExit(f"Local audio needs the 'local' extra: pip install -e '.[local]' ({e})") from e

    transport = LocalAudioTransport(
        LocalAudioTransportParams(audio_in_enabled=True, audio_in_sample_rate=16000)
    )
    stt = NemotronSTTService(model=model, latency_ms=latency_ms, device=device, cpu_threads=cpu_threads)
    collector = TranscriptCollector(stt.name, out=sys.stdout)
    vad = VADProcessor(vad_analyzer=SileroVADAnalyzer(params=VADParams(stop_secs=0.2)))
    worker = PipelineWorker(
        Pipeline([transport.input(), vad, stt]),
        params=PipelineParams(enable_metrics=True),
        observers=[collector],
    )
    try:
        runner = WorkerRunner()
        await runner.add_workers(worker)
        await runner.run()
    finally:
        print_latency_summary(collector.utterances)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default=None, help="model id or .nemo path (default: GPU model, else tiny model)"
    )
    parser.add_argument("--latency-ms", type=int, default=160, choices=(80, 160, 560, 1120))
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--cpu-threads", type=int, default=None, help="torch threads of the model on CPU (default: half the cores)"
    )
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="INFO")
    asyncio.run(run(args.model or default_asr_model(args.device), args.latency_ms, args.device, args.cpu_threads))


if __name__ == "__main__":
    main()
