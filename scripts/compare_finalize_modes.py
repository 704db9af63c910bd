"""Soft vs hard finalization on multi-turn sessions: WER and time-to-final (the choice documented in ARCHITECTURE.md).

    python scripts/compare_finalize_modes.py [--manifest tests/assets/heldout/manifest.json] [--turns 5]

Each session streams several held-out utterances through ONE engine stream, with 0.4 s (``--gap-s``) of silence after each and a
finalize at every utterance end, as a voice agent does at each end of turn. ``soft`` keeps encoder caches and decoder
state across turns; ``hard`` resets them after every final. ``isolated`` decodes each utterance in its own stream.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path

import numpy as np

from pipecat_nemotron.agent.wav_input import read_pcm16
from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.bench.audio import HELDOUT_MANIFEST, manifest_rows
from pipecat_nemotron.bench.common import bench_engine
from pipecat_nemotron.bench.wer import WordErrorCount
from pipecat_nemotron.models import TINY_MODEL_PATH


def load(manifest: Path) -> list[tuple[np.ndarray, str]]:
    return [(read_pcm16(row["audio"]), row["text"]) for row in manifest_rows(manifest)]


async def run_mode(
    model: str, mode: str, sessions: list[list[tuple[np.ndarray, str]]], latency_ms: int, gap_s: float = 0.4
) -> dict:
    finalize_mode = "hard" if mode == "isolated" else mode
    count = WordErrorCount()
    ttfs: list[float] = []
    gap = np.zeros(int(gap_s * MODEL_SAMPLE_RATE), dtype="<i2")
    async with bench_engine(model, "cpu", 4, finalize_mode) as engine:
        for session in sessions:
            stream = engine.open_stream(latency_ms) if mode != "isolated" else None
            for pcm, text in session:
                s = stream or engine.open_stream(latency_ms)
                await s.push(np.concatenate((pcm, gap)).tobytes())
                final = await s.finalize()
                if stream is None:
                    await s.close()
                ttfs.append(final.ttf_ms)
                count.add(text, final.text)
            if stream is not None:
                await stream.close()
    return {
        "mode": mode,
        "wer_percent": count.percent,
        "words": count.words,
        "ttf_ms_p50": statistics.median(ttfs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--manifest", type=Path, default=HELDOUT_MANIFEST)
    parser.add_argument("--model", default=str(TINY_MODEL_PATH))
    parser.add_argument("--turns", type=int, default=5, help="utterances per session")
    parser.add_argument("--latency-ms", type=int, default=160)
    parser.add_argument("--gap-s", type=float, default=0.4, help="silence after each utterance, s (a live turn: 2-4)")
    parser.add_argument("--modes", nargs="+", choices=["isolated", "hard", "soft"], default=["isolated", "hard", "soft"])
    args = parser.parse_args()
    items = load(args.manifest)
    sessions = [items[i : i + args.turns] for i in range(0, len(items), args.turns)]
    for mode in args.modes:
        result = asyncio.run(run_mode(args.model, mode, sessions, args.latency_ms, args.gap_s))
        print(json.dumps({**result, "gap_s": args.gap_s}))


if __name__ == "__main__":
    main()
