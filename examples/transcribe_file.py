"""Stream a WAV file in real time through a Pipecat pipeline and print transcripts with TTFS per utterance.

    python examples/transcribe_file.py pipecat_nemotron/assets/demo/two_turns.wav
    python examples/transcribe_file.py my.wav --model nvidia/nemotron-speech-streaming-en-0.6b --latency-ms 160
    python examples/transcribe_file.py pipecat_nemotron/assets/demo/two_turns.wav --words
    python examples/transcribe_file.py call.wav --model nvidia/nemotron-speech-streaming-en-0.6b --boost "Dr. Okafor" "Nemotron"

Pipeline: WAV (20 ms frames, paced like a microphone) -> Silero VAD (stop_secs 0.2) -> NemotronSTTService
(TranscriptCollector observing it). Each utterance ends when the VAD hears 0.2 s of silence; the STT then finalizes it.
``--words`` also prints each final's words with their start and end times and confidence (``TranscriptionFrame.result``).
``--cpu-threads N`` sets torch's threads for the model on CPU (default: half the cores).
``--boost PHRASE ...`` favours these phrases in the decode (names, product words; ``--boost-alpha`` weighs them,
default 1.0). Write them as the model writes text: cased and punctuated for the Nemotron models, lower case for the
bundled tiny model; a phrase with characters the model cannot write is refused at start with the reason.

Exit status: 0 when every final was delivered; 1 when the model could not start (a missing file, ``--device cuda``
without a GPU, a language the model lacks: the error says which, within seconds) or the ASR reported an error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from loguru import logger
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.audio.vad.vad_analyzer import VADParams
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.audio.vad_processor import VADProcessor

from pipecat_nemotron import NemotronSTTService, default_asr_model
from pipecat_nemotron.agent.wav_input import run_worker_on_wav
from pipecat_nemotron.asr import EngineConfig
from pipecat_nemotron.asr.boosting import DEFAULT_BOOST_ALPHA
from pipecat_nemotron.observers.transcripts import TranscriptCollector, print_latency_summary
from pipecat_nemotron.stt.base import NemotronSTTUnavailableError


async def transcribe(
    path: str,
    model: str,
    latency_ms: int,
    device: str,
    realtime: bool,
    words: bool = False,
    language: str | None = None,
    cpu_threads: int | None = None,
    boost: list[str] | None = None,
    boost_alpha: float | None = None,
) -> dict:
    # Boost phrases as the engine's defaults: every stream the service opens decodes with them.
    engine_config = EngineConfig(
        model=model,
        device=device,
        cpu_threads=cpu_threads,
        default_boost_phrases=tuple(boost or ()),
        default_boost_alpha=DEFAULT_BOOST_ALPHA if boost_alpha is None else boost_alpha,
    )
    stt = NemotronSTTService(
        latency_ms=latency_ms, language=language, engine_config=engine_config, cpu_threads=cpu_threads
    )
    collector = TranscriptCollector(stt.name, out=sys.stdout, show_words=words)
    vad = VADProcessor(vad_analyzer=SileroVADAnalyzer(params=VADParams(stop_secs=0.2)))
    worker = PipelineWorker(
        Pipeline([vad, stt]),
        params=PipelineParams(enable_metrics=True),
        observers=[collector],
        cancel_on_idle_timeout=False,
    )
    # The audio starts once the model is loaded (first use), as a user would wait for the bot to join; a model
    # that cannot start raises NemotronSTTUnavailableError here, after the pipeline is torn down.
    await run_worker_on_wav(worker, stt, path, realtime=realtime)
    print()
    summary = print_latency_summary(collector.utterances)
    utterances = [
        {"text": u.text, "ttfs_ms": u.ttfs_ms, "finalize_ms": u.finalize_ms}
        | ({"language": u.result.language} if u.result and u.result.language else {})
        | ({"words": u.result.to_dict()["words"], "confidence": u.result.confidence} if u.result else {})
        for u in collector.utterances
    ]
    return {"utterances": utterances, "summary": summary, "errors": collector.errors}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("wav", help="16-bit PCM WAV file (any common rate, mono or stereo)")
    parser.add_argument(
        "--model", default=None, help="model id or .nemo path (default: GPU model, else tiny CPU model)"
    )
    parser.add_argument(
        "--latency-ms",
        type=int,
        default=160,
        help="latency mode: 80, 160, 560, 1120 (multilingual: also 320)",
    )
    parser.add_argument(
        "--language", default=None, help="multilingual model: es-ES, es, auto ... (default: the model's auto)"
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--cpu-threads", type=int, default=None, help="torch threads of the model on CPU (default: half the cores)"
    )
    parser.add_argument(
        "--fast", action="store_true", help="feed audio as fast as possible instead of real time"
    )
    parser.add_argument(
        "--words", action="store_true", help="print word timings and confidence of each final"
    )
    parser.add_argument(
        "--boost",
        nargs="+",
        default=None,
        metavar="PHRASE",
        help="phrases to favour (names, product words), cased as the model writes them",
    )
    parser.add_argument(
        "--boost-alpha", type=float, default=None, help=f"weight of --boost (default {DEFAULT_BOOST_ALPHA:g})"
    )
    parser.add_argument(
        "--json", help="write utterances (with word timings) and the latency summary to this file"
    )
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="INFO")
    try:
        result = asyncio.run(
            transcribe(
                args.wav,
                args.model or default_asr_model(args.device),
                args.latency_ms,
                args.device,
                not args.fast,
                args.words,
                args.language,
                args.cpu_threads,
                args.boost,
                args.boost_alpha,
            )
        )
    except NemotronSTTUnavailableError as e:
        print(f"error: {e.__cause__ or e}", file=sys.stderr)
        return 1
    except ValueError as e:  # a --boost phrase over the limits, or a bad --boost-alpha
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
