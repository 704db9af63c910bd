#!/usr/bin/env python
"""The multilingual path through the streaming engine: per-language WER with the right, the wrong and the ``auto``
language prompt, and how often ``auto`` finals name the right locale, per latency mode.

Runs the bundled tiny bilingual model (or ``--model``) on its held-out clips (``tests/assets/heldout_multilingual``:
sentences and voices never trained on) through :class:`~pipecat_nemotron.asr.NemotronEngine`, every clip a
stream of its own, all streams of a pass batched together, hard finalize (each clip decoded as a clip of its own).

Example::

    .venv/bin/python scripts/eval_multilingual.py --modes 160 320 560 --json runs/multilingual.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from pipecat_nemotron.agent.wav_input import read_pcm16
from pipecat_nemotron.asr import EngineConfig, NemotronEngine
from pipecat_nemotron.bench.wer import wer_percent
from pipecat_nemotron.models import TINY_MULTILINGUAL_MODEL_PATH

HELDOUT = Path(__file__).resolve().parent.parent / "tests" / "assets" / "heldout_multilingual"


def _wer(pairs: list[tuple[str, str]]) -> float:
    """Corpus word error rate of ``(reference, hypothesis)`` pairs, as a fraction."""
    return (wer_percent([ref for ref, _ in pairs], [hyp for _, hyp in pairs]) or 0.0) / 100.0


def _wrong(language: str, languages: tuple[str, ...]) -> str:
    """Another of the model's locales (the next one)."""
    return languages[(languages.index(language) + 1) % len(languages)]


async def _evaluate(args: argparse.Namespace) -> dict[str, Any]:
    transcripts = json.loads((HELDOUT / "transcripts.json").read_text())
    clips = [(read_pcm16(HELDOUT / n), t["text"], t["language"]) for n, t in sorted(transcripts.items())]
    config = EngineConfig(
        model=args.model, device=args.device, max_streams=len(clips), max_batch_size=16, finalize_mode="hard"
    )
    rows: list[dict[str, Any]] = []
    async with NemotronEngine(config) as engine:
        locales = tuple(k for k in engine.info.languages if k != "auto")
        prompts = {
            "right": lambda lang: lang,
            "wrong": lambda lang: _wrong(lang, locales),
            "auto": lambda _: "auto",
        }
        for mode in args.modes:
            for name, prompt in prompts.items():
                finals = await asyncio.gather(
                    *(
                        engine.transcribe(pcm, latency_ms=mode, language=prompt(lang))
                        for pcm, _, lang in clips
                    )
                )
                for language in locales:
                    idx = [i for i, (_, _, lang) in enumerate(clips) if lang == language]
                    row = {
                        "mode_ms": mode,
                        "prompt": name,
                        "language": language,
                        "clips": len(idx),
                        "wer": _wer([(clips[i][1], finals[i].text) for i in idx]),
                    }
                    if name == "auto":
                        row["detected_right"] = sum(
                            finals[i].detected_language == language for i in idx
                        ) / len(idx)
                    rows.append(row)
                    print(
                        f"{mode:5d} ms  {name:5s}  {language}  WER {row['wer']:.3f}"
                        + (f"  detected right {row['detected_right']:.2f}" if "detected_right" in row else "")
                    )
    return {"model": args.model, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=str(TINY_MULTILINGUAL_MODEL_PATH), help="a multilingual .nemo")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--modes", type=int, nargs="+", default=[160, 320, 560], help="latency modes, ms")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args()
    result = asyncio.run(_evaluate(args))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
