"""The README demo: the whole voice agent over a bundled WAV, hearing, thinking and answering on this machine.

    python -m pipecat_nemotron.demo [--wav FILE] [--latency-ms 160] [--fast] [--out runs]

With no ``.env`` every part runs here, offline (:class:`~pipecat_nemotron.agent.process.AgentProcess`):

- ASR: ``nvidia/nemotron-speech-streaming-en-0.6b`` on a CUDA GPU, else the bundled tiny model on the CPU;
- LLM: llama.cpp's OpenAI-compatible server with SmolLM2-135M-Instruct (``llm-local`` extra), started as a child
  process on a free loopback port and stopped on exit;
- TTS: the real Magpie on a CUDA GPU, else the bundled tiny Magpie (trained on espeak-ng voices: it reads short
  sentences of the agent's domain, ``docs/TINY_MAGPIE.md``).

``NEMOTRON_LLM_*`` in ``.env`` replaces the LLM with your server (vLLM, NIM, hosted, your own llama.cpp),
``MAGPIE_TTS_MODEL`` or ``MAGPIE_NIM_SERVER`` the TTS, ``NEMOTRON_ASR_MODEL`` (or ``--model``) the ASR. ``.env`` is
read from the current directory (or the nearest one above it).

It prints each final transcript as it is heard and each answer as it is made; then, per turn, what the user said,
what the agent answered and the voice-to-voice latency with its legs; then the p50/p90 table. It writes the turns'
latencies (JSONL), their plot (PNG) and the whole conversation, both sides, as a WAV under ``--out``.

Exit status: 0 when every utterance was transcribed and every turn answered; 1 when something failed (the ASR
reported an error, the LLM server could not start or died, a turn got no answer, the conversation did not end
within ``--timeout-s``: each is named); 2 for bad arguments.
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
from typing import Any

import numpy as np
from loguru import logger

from pipecat_nemotron.models import DEMO_AUDIO_DIR, default_asr_model

#: Time the conversation may take after the audio's own length before the demo gives up, s. The last answer
#: is made after the audio ends; a CPU-only first run answers within seconds, so this is only met by a part that
#: stopped answering (an LLM server that accepts the request and never replies).
DEMO_END_SLACK_S = 300.0


def _default_wav() -> Path | None:
    wavs = sorted(DEMO_AUDIO_DIR.glob("*.wav"))
    turns = [w for w in wavs if "turn" in w.name]
    return (turns or wavs or [None])[0]


def _script_turns(wav: Path) -> list[str] | None:
    """The turns the WAV's script speaks (``turns.json``, else its one transcript), or None when unknown."""
    turns = wav.parent / "turns.json"
    if turns.exists() and wav.name in (spec := json.loads(turns.read_text())):
        return list(spec[wav.name]["turns"])
    manifest = wav.parent / "transcripts.json"
    text = json.loads(manifest.read_text()).get(wav.name) if manifest.exists() else None
    return [text] if text else None


async def run_demo(
    wav: Path, model: str, latency_ms: int, device: str, realtime: bool, out: Path, *, timeout_s: float | None = None
) -> int:
    """Start the agent's parts, run the conversation over ``wav``, report it; return a process exit code.

    ``timeout_s`` bounds the conversation from the pipeline's start to its end, s (None: the audio's length plus
    :data:`DEMO_END_SLACK_S`); past it the pipeline is torn down and the run reports what it got and fails.
    """
    from pipecat_nemotron.agent.process import AgentProcess
    from pipecat_nemotron.agent.settings import AgentSettings
    from pipecat_nemotron.asr.errors import ModelLoadError
    from pipecat_nemotron.llm.embedded import EmbeddedLLMError
    from pipecat_nemotron.tts.magpie.errors import MagpieEngineError

    settings = replace(
        AgentSettings.from_env(os.environ), asr_model=model, asr_device=device, asr_latency_ms=latency_ms
    )
    print("\n".join(settings.describe()))
    process = AgentProcess(settings, llm_log_path=out / "demo_llm_server.log")
    try:
        await process.start()
    except EmbeddedLLMError as e:
        print(f"\nThe embedded LLM could not start: {e}")
        return 1
    except (ModelLoadError, MagpieEngineError) as e:
        print(f"\nA model could not load: {e}")
        return 1
    try:
        print(f"Ready in {process.startup_s:.1f} s")
        if process.llm_server is not None:
            server = process.llm_server
            print(f"LLM server: llama.cpp (pid {server.pid}) at {server.base_url}, stopped when the demo ends")
        status = await _converse(process, wav, realtime, out, timeout_s)
    finally:
        await process.stop()
    return status


async def _converse(process: Any, wav: Path, realtime: bool, out: Path, timeout_s: float | None) -> int:
    """One conversation over ``wav`` with the started parts; prints as it goes and reports at the end."""
    from pipecat_nemotron.agent.assembly import build_voice_agent
    from pipecat_nemotron.agent.wav_input import read_pcm16, run_worker_on_wav
    from pipecat_nemotron.observers.conversation import ConversationLog, write_conversation_wav
    from pipecat_nemotron.observers.transcripts import TranscriptCollector, print_latency_summary

    settings = process.settings
    if process.llm_server is None and await settings.check_llm() is not None:
        print("LLM: not reachable (see the error above); the turns will get no answer")
    llm = settings.create_llm()
    tts = settings.create_tts() if llm is not None else None
    stt = settings.create_stt()
    collector = TranscriptCollector(stt.name, out=sys.stdout)

    def print_answer(turn: Any) -> None:
        cut = " [interrupted]" if turn.interrupted else ""
        print(f"[agent] {turn.reply_text.strip() or '(no text)'}{cut}", flush=True)

    conversation = ConversationLog(speaks=tts is not None, on_answer=print_answer)
    turns_jsonl = out / "demo_turns.jsonl"
    turns_jsonl.unlink(missing_ok=True)
    agent = build_voice_agent(
        stt=stt,
        llm=llm,
        tts=tts,
        observers=[collector, conversation],
        turns_jsonl=turns_jsonl,
        turn_end=settings.turn_end,
    )
    started: list[float] = []
    problems: list[str] = []
    if timeout_s is None:
        timeout_s = len(read_pcm16(wav, convert=True)) / 16000 + DEMO_END_SLACK_S
    print(f"\nStreaming {wav.name} {'in real time' if realtime else 'as fast as possible'}...\n")
    try:
        await run_worker_on_wav(
            agent.worker,
            stt,
            wav,
            realtime=realtime,
            trailing_silence_s=4.0 if llm else 1.5,
            timeout_s=timeout_s,
            on_start=lambda: started.append(time.time()),
        )
    except TimeoutError:
        problems.append(
            f"the conversation had not ended {timeout_s:g} s after it started, so it was stopped: a part stopped "
            "answering (run with --verbose to see which)"
        )

    print("\nPer utterance (speech end → final transcript; finalize call → final text), ms:")
    print_latency_summary(collector.utterances)
    _print_segmentation(wav, [u.text for u in collector.utterances], conversation)
    problems += [f"the ASR reported: {e}" for e in collector.errors]
    if llm is not None:
        heard = await _hear_answers(settings, conversation.turns, problems) if tts is not None else {}
        _print_turns(conversation, agent.observer.turns, heard)
        problems += conversation.unanswered()
        server = process.llm_server
        if server is not None and server.exit_code is not None:
            problems.append(f"the embedded LLM server exited with code {server.exit_code} during the run")
    if agent.observer.turns:
        _report_latency(agent.observer, turns_jsonl, out / "demo_latency.png")
    if conversation.turns and started and realtime:
        path = write_conversation_wav(
            out / "demo_conversation.wav", read_pcm16(wav, convert=True), 16000, started[0], conversation.turns
        )
        print(f"\nThe conversation, both sides: {path}")
    if not collector.utterances:
        problems.append("nothing was transcribed")
    if problems:
        print("\nProblems:\n" + "\n".join(f"  - {p}" for p in problems))
        return 1
    return 0


def _print_segmentation(wav: Path, heard: list[str], conversation: Any) -> None:
    """The script's turns beside the utterances the ASR finalized and the turns the agent answered."""
    script = _script_turns(wav)
    print(f"\nHeard {len(heard)} utterance(s): " + " | ".join(heard))
    if script is None:
        return
    print(f"Script ({len(script)} turn(s)): " + " | ".join(script))
    answered = len(conversation.turns)
    if answered and answered != len(script):
        print(
            f"The agent answered {answered} turn(s) where the script has {len(script)}: the VAD ends an utterance at "
            "each pause, and the turn detector decides which pauses end the user's turn, so a pause inside a "
            "sentence can split it and a short pause between sentences can join them."
        )
    elif len(heard) != len(script):
        print(
            f"The ASR finalized {len(heard)} utterance(s) where the script has {len(script)} turn(s): the VAD "
            "ends an utterance at each pause (a turn with a pause inside is two utterances)."
        )


#: The most the demo waits for the ASR to transcribe the agent's answers back, seconds (a few seconds of speech each).
HEAR_ANSWERS_TIMEOUT_S = 120.0


async def _hear_answers(settings: Any, turns: Any, problems: list[str]) -> dict[int, str]:
    """Each spoken answer as the process's own ASR hears it (turn index -> text): the TTS checked by the ears.

    A failure (or no result within :data:`HEAR_ANSWERS_TIMEOUT_S`) adds to ``problems`` and returns what was heard:
    the conversation ran; only this check of its speech is lost.
    """
    from pipecat_nemotron.asr.shared import shared_engines

    heard: dict[int, str] = {}
    spoken = [turn for turn in turns if turn.audio]
    if not spoken:
        return heard

    async def transcribe_all() -> None:
        engine = await shared_engines.acquire(settings.asr_engine_config())
        try:
            for turn in spoken:
                rates = {piece.sample_rate for piece in turn.audio}
                if len(rates) != 1:  # One TTS speaks at one rate; no piece is left out unsaid.
                    raise ValueError(f"answer {turn.index}'s speech mixes sample rates {sorted(rates)}")
                rate = rates.pop()
                pcm = np.concatenate([piece.audio for piece in turn.audio])
                heard[turn.index] = (await engine.transcribe(pcm, sample_rate=rate)).text
        finally:
            await shared_engines.release(engine)

    try:
        await asyncio.wait_for(transcribe_all(), HEAR_ANSWERS_TIMEOUT_S)
    except Exception as e:
        problems.append(f"the agent's speech could not be transcribed back: {e!r}")
    return heard


def _print_turns(conversation: Any, latencies: list[Any], heard: dict[int, str]) -> None:
    """Per answered turn: the user's words, the answer (and what the ASR heard of its speech), voice-to-voice."""
    print("\nConversation:")
    for turn in conversation.turns:
        print(f"  turn {turn.index}")
        print(f"    you:   {turn.user_text or '(nothing heard)'}")
        print(f"    agent: {turn.reply_text.strip() or '(no answer)'}{' [interrupted]' if turn.interrupted else ''}")
        if turn.index in heard:
            print(f"    heard: {heard[turn.index] or '(nothing)'}  (the agent's speech, transcribed by the ASR)")
        latency = _latency_for(turn, latencies)
        if latency is not None and latency.v2v_ms is not None:
            legs = " · ".join(f"{k} {v:.0f}" for k, v in latency.breakdown_ms.items())
            print(f"    voice-to-voice {latency.v2v_ms:.0f} ms" + (f" = {legs}" if legs else ""))
            stages = [
                f"{name} {value:.0f}"
                for name, value in (
                    ("TTFS", latency.ttfs_ms),
                    ("ASR finalize", latency.asr_finalize_ms),
                    ("LLM TTFB", latency.llm_ttfb_ms),
                    ("TTS TTFB", latency.tts_ttfb_ms),
                )
                if value is not None
            ]
            print(f"    stages (ms): {' · '.join(stages)}; spoke {turn.spoken_s:.1f} s")


def _latency_for(turn: Any, latencies: list[Any]) -> Any:
    """The latency record of the turn whose bot speech began with this answer's first audio (nearest, ≤ 1 s)."""
    if not turn.audio:
        return None
    first = turn.audio[0].wall_s
    timed = [t for t in latencies if t.bot_started_ts is not None and abs(t.bot_started_ts - first) <= 1.0]
    return min(timed, key=lambda t: abs(t.bot_started_ts - first), default=None)


def _report_latency(observer: Any, turns_jsonl: Path, png: Path) -> None:
    from pipecat_nemotron.observers.metrics import format_summary

    print("\n" + format_summary(observer.summary(log=False)))
    print(f"Per-turn latency: {turns_jsonl}")
    try:
        from pipecat_nemotron.observers.report import plot_turns

        print(f"Plot: {plot_turns(observer.turns, png)}")
    except ImportError as e:
        print(f"(no plot: matplotlib is missing, pip install 'pipecat-nemotron[plot]': {e})")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--wav", type=Path, default=None, help="16-bit WAV to stream (default: bundled demo)")
    parser.add_argument("--model", default=None, help="ASR model id or .nemo path")
    parser.add_argument("--latency-ms", type=int, default=160, choices=(80, 160, 560, 1120))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--fast", action="store_true", help="feed audio faster than real time (no conversation WAV)")
    parser.add_argument(
        "--out", type=Path, default=Path("runs"), help="folder for the turns JSONL, plot, WAV and LLM server log"
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=None,
        help=f"stop and fail when the conversation has not ended this long after it started, s (default: the "
        f"audio's length + {DEMO_END_SLACK_S:g})",
    )
    parser.add_argument("--verbose", action="store_true", help="DEBUG logs")
    args = parser.parse_args(argv)

    from pipecat_nemotron.llm.env import load_env_file

    load_env_file()
    logger.remove()
    logger.add(sys.stderr, level="DEBUG" if args.verbose else "WARNING", diagnose=False)
    wav = args.wav or _default_wav()
    if wav is None or not Path(wav).exists():
        print(f"No WAV to stream: pass --wav FILE (bundled demo audio missing under {DEMO_AUDIO_DIR})")
        return 2
    model = args.model or os.environ.get("NEMOTRON_ASR_MODEL") or default_asr_model(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        return asyncio.run(
            run_demo(Path(wav), model, args.latency_ms, args.device, not args.fast, args.out, timeout_s=args.timeout_s)
        )
    except KeyboardInterrupt:
        print("\nStopped (Ctrl-C); the LLM server was stopped with the demo.")
        return 130


if __name__ == "__main__":
    sys.exit(main())
