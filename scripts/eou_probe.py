"""Where a model's ``<EOU>`` falls relative to a VAD stop's final, measured without the agent (docs/BENCHMARKS.md §14).

Two parts, both on the tiny EOU model (or ``--eou-model``), 160 ms mode, one torch thread:

- ``flush``: held-out sentences (training voices) with a 600 ms pause inserted at the middle word gap. Per
  sentence, the final is requested 200 ms into the pause (a VAD stop there), and separately the whole audio is
  streamed through the pause. Prints whether each carries an ``<EOU>`` inside the sentence.
- ``sessions``: the sessions of ``bench turns`` (same seed and arguments), each streamed whole with no final
  until its end (``bench.eou.eou_times``): for each utterance, the ``<EOU>`` times relative to its last sound.
- ``agent``: one ``bench turns`` session (``--session``) through the whole agent in ``turn_end="eou"``, eager end
  of turn off, with the STT's and the turn commit's DEBUG log: each ``<EOU>``, wait, final and decision.

Usage::

    python scripts/eou_probe.py flush --sentences 12
    python scripts/eou_probe.py sessions --sessions 3
    python scripts/eou_probe.py agent --sessions 3 --session 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from pipecat_nemotron.agent.wav_input import read_pcm16
from pipecat_nemotron.asr import EngineConfig, NemotronEngine
from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.bench import turns
from pipecat_nemotron.bench.audio import HELDOUT_DIR
from pipecat_nemotron.bench.eager import word_gap
from pipecat_nemotron.bench.eou import eou_times
from pipecat_nemotron.models import TINY_EOU_MODEL_PATH

#: The pause inserted at the word gap, and where in it the VAD stops, s.
PAUSE_S, VAD_STOP_S = 0.6, 0.2


async def _events(engine: NemotronEngine, audio: np.ndarray, final_at: int | None) -> list[tuple]:
    """``("eou", ms, text)`` and ``("final", text)`` of one stream: finalized at sample ``final_at``, or at the end."""
    stream = engine.open_stream(latency_ms=160, eou=True)
    events: list[tuple] = []
    try:
        await stream.push(audio[:final_at] if final_at is not None else audio)
        stream.request_final()
        async for update in stream.updates():
            if update.kind == "eou":
                events.append(("eou", round(update.eou_ms or 0.0), update.text))
            elif update.is_final:
                events.append(("final", update.text))
                break
    finally:
        await stream.close()
    return events


async def flush(engine: NemotronEngine, sentences: int) -> None:
    """Final at a VAD stop inside a pause, against the same audio streamed through: who says ``<EOU>`` inside."""
    rows = [r for r in json.loads((HELDOUT_DIR / "manifest.json").read_text()) if r["split"] == "seen_voice"]
    at_final = through = 0
    for row in rows[:sentences]:
        clip = read_pcm16(HELDOUT_DIR / row["audio"], convert=True)
        at, _ = word_gap(clip)
        audio = np.concatenate([clip[:at], np.zeros(int(PAUSE_S * MODEL_SAMPLE_RATE), clip.dtype), clip[at:]])
        stop = at + int(VAD_STOP_S * MODEL_SAMPLE_RATE)
        finalized = await _events(engine, audio, stop)
        streamed = await _events(engine, audio, None)
        pause_end_ms = (at + PAUSE_S * MODEL_SAMPLE_RATE) * 1000 / MODEL_SAMPLE_RATE
        inside_final = any(e[0] == "eou" for e in finalized)
        inside_streamed = any(e[0] == "eou" and e[1] < pause_end_ms for e in streamed)
        at_final += inside_final
        through += inside_streamed
        print(f"{row['text']!r}: final at the VAD stop {finalized}; streamed through, <EOU> inside: {inside_streamed}")
    print(f"<EOU> inside the sentence: {at_final} of {sentences} finalized at the VAD stop, {through} streamed through")


async def sessions(engine: NemotronEngine, args: argparse.Namespace) -> None:
    """Each ``bench turns`` session streamed whole: ``<EOU>`` times against each utterance's last sound."""
    with tempfile.TemporaryDirectory() as tmp:
        made, _ = turns.make_sessions(args, Path(tmp))
        timely = late = missing = inside = 0
        for i, (wav, utterances) in enumerate(made):
            times = await eou_times(engine, read_pcm16(wav, convert=True))
            for u in utterances:
                rel = [round(t - u.end_s * 1000) for t in times if u.start_s * 1000 < t < u.end_s * 1000 + 4000]
                after = [r for r in rel if r >= -100]
                inside += any(r < -100 for r in rel)
                missing += not after
                timely += bool(after) and after[0] <= 400
                late += bool(after) and after[0] > 400
                print(f"session {i} {'paused ' if u.paused else ''}{u.text!r}: <EOU> - last sound, ms: {rel}")
    print(f"after the last sound: {timely} within 400 ms, {late} later, {missing} none; {inside} with one inside")


async def agent(engine: NemotronEngine, args: argparse.Namespace) -> None:
    """One ``bench turns`` session through the agent (``eou``, eager off), logging the STT's end-of-turn events."""
    import sys

    from loguru import logger

    from pipecat_nemotron.llm.fake_server import FakeOpenAIServer
    from pipecat_nemotron.tts.magpie import MagpieEngine
    from pipecat_nemotron.tts.magpie.tiny import build_tiny_magpie

    logger.remove()
    kept = ("pipecat_nemotron.stt", "pipecat_nemotron.agent.turn_end")
    logger.add(sys.stdout, level="DEBUG", filter=lambda r: r["name"].startswith(kept), format="{time:ss.SSS} {message}")
    with tempfile.TemporaryDirectory() as tmp:
        made, _ = turns.make_sessions(args, Path(tmp))
        wav, utterances = made[args.session]
        for u in utterances:
            print(f"utterance {u.start_s:.2f}-{u.end_s:.2f} s{' paused' if u.paused else ''}: {u.text!r}")
        magpie_path, _ = build_tiny_magpie(Path(tmp) / "magpie", end_of_speech_bias=30.0)
        magpie = MagpieEngine(str(magpie_path), device="cpu")
        try:
            magpie.wait_until_ready(timeout=600)
            async with FakeOpenAIServer(reply="Sure, here it is.", first_token_delay_s=args.ttft_ms / 1000) as llm:
                await turns.run_session(engine, magpie, llm.base_url, wav, turns.Config("eou", False), 160)
        finally:
            magpie.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("part", choices=("flush", "sessions", "agent"))
    parser.add_argument("--sentences", type=int, default=12, help="flush: held-out sentences (default 12)")
    parser.add_argument("--session", type=int, default=0, help="agent: which session (default 0)")
    # The same sessions as bench turns (--sessions, --turns, --seed, ...), and its --eou-model.
    turns.add_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)

    async def run() -> None:
        model = str(args.eou_model or TINY_EOU_MODEL_PATH)
        config = EngineConfig(model=model, device="cpu", max_streams=2, max_batch_size=2)
        async with NemotronEngine(config) as engine:
            if args.part == "flush":
                await flush(engine, args.sentences)
            elif args.part == "sessions":
                await sessions(engine, args)
            else:
                await agent(engine, args)

    asyncio.run(run())


if __name__ == "__main__":
    main()
