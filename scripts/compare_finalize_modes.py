"""Soft vs hard finalization on multi-turn sessions: WER and time-to-final (the choice documented in ARCHITECTURE.md).

    python scripts/compare_finalize_modes.py [--manifest tests/assets/heldout/manifest.json] [--turns 5]

Each session streams several held-out utterances through ONE engine stream, with 0.4 s of silence after each and a
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

from pipecat_nemotron.bench.common import normalize_text, read_pcm16, word_errors
from pipecat_nemotron.engine import EngineConfig, NemotronEngine
from pipecat_nemotron.models import TINY_MODEL_PATH


def load(manifest: Path) -> list[tuple[np.ndarray, str]]:
    items = []
    for entry in json.loads(manifest.read_text()):
        pcm = np.frombuffer(read_pcm16(manifest.parent / entry["audio"]), dtype="<i2")
        items.append((pcm, entry["text"]))
    return items


async def run_mode(
    model: str, mode: str, sessions: list[list[tuple[np.ndarray, str]]], latency_ms: int
) -> dict:
    finalize_mode = "hard" if mode == "isolated" else mode
    config = EngineConfig(model=model, device="cpu", max_streams=4, finalize_mode=finalize_mode)
    errors = words = 0
    ttfs: list[float] = []
    gap = np.zeros(int(0.4 * 16000), dtype="<i2")
    async with NemotronEngine(config) as engine:
        for session in sessions:
            stream = engine.open_stream(latency_ms) if mode != "isolated" else None
            for pcm, text in session:
                s = stream or engine.open_stream(latency_ms)
                await s.push(np.concatenate((pcm, gap)).tobytes())
                final = await s.finalize()
                if stream is None:
                    await s.close()
                ttfs.append(final.ttf_ms)
                errors += word_errors(normalize_text(text), normalize_text(final.text))
                words += len(normalize_text(text).split())
            if stream is not None:
                await stream.close()
    return {
        "mode": mode,
        "wer_percent": 100.0 * errors / max(words, 1),
        "words": words,
        "ttf_ms_p50": statistics.median(ttfs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--manifest", type=Path, default=Path("tests/assets/heldout/manifest.json"))
    parser.add_argument("--model", default=str(TINY_MODEL_PATH))
    parser.add_argument("--turns", type=int, default=5, help="utterances per session")
    parser.add_argument("--latency-ms", type=int, default=160)
    args = parser.parse_args()
    items = load(args.manifest)
    sessions = [items[i : i + args.turns] for i in range(0, len(items), args.turns)]
    for mode in ("isolated", "hard", "soft"):
        result = asyncio.run(run_mode(args.model, mode, sessions, args.latency_ms))
        print(json.dumps(result))


if __name__ == "__main__":
    main()
