#!/usr/bin/env python
"""Full-size check of our encoder step on the tiny model: the whole held-out set, every latency mode.

``tests/test_fast_step.py`` runs a representative subset (every 4th clip) in the suite; this script runs all 200
clips of ``tests/assets/heldout``:

* the fast step's transcripts equal NeMo's step's, clip for clip, in every mode;
* bf16 (fast step, CPU) stays within 1 point of fp32 WER at 160 ms.

Exits non-zero when either fails. Example::

    .venv/bin/python scripts/check_fast_step.py --threads 1
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from pipecat_nemotron.agent.wav_input import read_pcm16
from pipecat_nemotron.asr import EngineConfig
from pipecat_nemotron.asr.config import LATENCY_MODES
from pipecat_nemotron.bench.audio import HELDOUT_MANIFEST, manifest_rows, transcribe_clips
from pipecat_nemotron.bench.wer import wer_percent
from pipecat_nemotron.models import TINY_MODEL_PATH

#: Largest tolerated |WER(bf16) - WER(fp32)|, points.
BF16_WER_TOLERANCE = 1.0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(TINY_MODEL_PATH))
    p.add_argument("--modes", nargs="+", type=int, default=sorted(LATENCY_MODES), choices=sorted(LATENCY_MODES))
    p.add_argument("--streams", type=int, default=32, help="clips batched at a time")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run both checks; print one line per mode and the WERs. Returns the exit status."""
    import torch

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = manifest_rows(HELDOUT_MANIFEST)
    clips = [read_pcm16(row["audio"]) for row in rows]
    refs = [row["text"] for row in rows]

    def texts(encoder_step: str, dtype: str, modes: Sequence[int]) -> dict[int, list[str]]:
        config = EngineConfig(
            model=args.model, device="cpu", max_streams=args.streams, encoder_step=encoder_step, dtype=dtype
        )
        return asyncio.run(transcribe_clips(config, clips, modes))

    nemo = texts("nemo", "float32", args.modes)
    fast = texts("fast", "float32", args.modes)
    failed = False
    for mode in args.modes:
        differing = [r["audio"] for r, a, b in zip(rows, nemo[mode], fast[mode], strict=True) if a != b]
        failed |= bool(differing)
        print(f"{mode} ms: {len(rows) - len(differing)}/{len(rows)} clips equal; differing: {differing[:5]}")
    if 160 in args.modes:
        bf16 = texts("fast", "bfloat16", [160])[160]
        fp32_wer, bf16_wer = wer_percent(refs, nemo[160]), wer_percent(refs, bf16)
        assert fp32_wer is not None and bf16_wer is not None
        failed |= abs(bf16_wer - fp32_wer) > BF16_WER_TOLERANCE
        print(f"160 ms WER over {len(rows)} clips: fp32 {fp32_wer:.2f}%, bf16 (fast step) {bf16_wer:.2f}%")
    print("FAILED" if failed else "OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
