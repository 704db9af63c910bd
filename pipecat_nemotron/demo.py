"""The README demo: the real agent pipeline over a bundled WAV, on whatever this machine has.

    python -m pipecat_nemotron.demo [--wav FILE] [--latency-ms 160] [--fast]

ASR: ``nvidia/nemotron-speech-streaming-en-0.6b`` on a CUDA GPU, else the bundled tiny model on the CPU (override
with ``NEMOTRON_ASR_MODEL`` in ``.env`` or ``--model``; ``NEMOTRON_CPU_THREADS`` sets its torch threads on CPU).
LLM and TTS: whatever ``.env`` configures (``NEMOTRON_LLM_BASE_URL`` ...; ``MAGPIE_TTS_MODEL`` or
``MAGPIE_NIM_SERVER``); without them the demo says so and runs the stages it can, still printing transcripts and
the latency report. ``.env`` is read from the current directory (or the nearest one above it).

Exit status: 0 when every utterance was transcribed; 1 when none was, or the ASR reported an error (a final lost
at the end of the session names the seconds of audio it covered); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from loguru import logger

from pipecat_nemotron.models import DEMO_AUDIO_DIR, default_asr_model


def _default_wav() -> Path | None:
    wavs = sorted(DEMO_AUDIO_DIR.glob("*.wav"))
    turns = [w for w in wavs if "turn" in w.name]
    return (turns or wavs or [None])[0]


def _expected_text(wav: Path) -> str | None:
    turns = wav.parent / "turns.json"
    if turns.exists() and wav.name in (spec := json.loads(turns.read_text())):
        return " | ".join(spec[wav.name]["turns"])
    manifest = wav.parent / "transcripts.json"
    return json.loads(manifest.read_text()).get(wav.name) if manifest.exists() else None


async def run_demo(
    wav: Path, model: str, latency_ms: int, device: str, realtime: bool, turns_jsonl: Path
) -> int:
    """Run the pipeline over ``wav``; return a process exit code."""
    from pipecat_nemotron.agent.assembly import AgentSettings, build_voice_agent
    from pipecat_nemotron.agent.wav_input import run_worker_on_wav
    from pipecat_nemotron.observers.transcripts import TranscriptCollector, print_latency_summary

    settings = replace(
        AgentSettings.from_env(os.environ), asr_model=model, asr_device=device, asr_latency_ms=latency_ms
    )
    print("\n".join(settings.describe()))
    started = time.perf_counter()
    await settings.preload()
    print(f"Models loaded in {time.perf_counter() - started:.1f} s")
    if await settings.check_llm() is not None:
        print("LLM: not reachable (see the error above); the turns will get no answer")
    llm = settings.create_llm()
    tts = settings.create_tts() if llm is not None else None
    stt = settings.create_stt()
    collector = TranscriptCollector(stt.name, out=sys.stdout)
    agent = build_voice_agent(stt=stt, llm=llm, tts=tts, observers=[collector], turns_jsonl=turns_jsonl)
    print(f"\nStreaming {wav.name} {'in real time' if realtime else 'as fast as possible'}...\n")
    await run_worker_on_wav(agent.worker, stt, wav, realtime=realtime, trailing_silence_s=4.0 if llm else 1.5)

    print("\nPer utterance (speech end → final transcript; finalize call → final text), ms:")
    print_latency_summary(collector.utterances)
    expected = _expected_text(wav)
    if expected is not None:
        print(f"\nexpected: {expected}\ngot:      {' | '.join(u.text for u in collector.utterances)}")
    if agent.observer.turns:
        print(
            f"\nVoice-to-voice per turn written to {turns_jsonl}; plot: python -m pipecat_nemotron.observers.report {turns_jsonl}"
        )
        from pipecat_nemotron.observers.metrics import format_summary

        print(format_summary(agent.observer.summary(log=False)))
    if collector.errors:
        print(f"\nThe ASR reported {len(collector.errors)} error(s); see [error] above.")
        return 1
    return 0 if collector.utterances else 1


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--wav", type=Path, default=None, help="16-bit WAV to stream (default: bundled demo)")
    parser.add_argument("--model", default=None, help="ASR model id or .nemo path")
    parser.add_argument("--latency-ms", type=int, default=160, choices=(80, 160, 560, 1120))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--fast", action="store_true", help="feed audio faster than real time")
    parser.add_argument(
        "--turns", type=Path, default=Path("runs/demo_turns.jsonl"), help="per-turn latency JSONL"
    )
    parser.add_argument("--verbose", action="store_true", help="DEBUG logs")
    args = parser.parse_args(argv)

    from pipecat_nemotron.llm.env import load_env_file

    load_env_file()
    logger.remove()
    logger.add(sys.stderr, level="DEBUG" if args.verbose else "WARNING")
    wav = args.wav or _default_wav()
    if wav is None or not Path(wav).exists():
        print(f"No WAV to stream: pass --wav FILE (bundled demo audio missing under {DEMO_AUDIO_DIR})")
        return 2
    model = args.model or os.environ.get("NEMOTRON_ASR_MODEL") or default_asr_model(args.device)
    return asyncio.run(run_demo(Path(wav), model, args.latency_ms, args.device, not args.fast, args.turns))


if __name__ == "__main__":
    sys.exit(main())
