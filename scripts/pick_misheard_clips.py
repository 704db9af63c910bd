"""Find the held-out clips whose one misheard word a phrase boost fixes: the clips of ``tests/test_boosting.py``.

The bundled tiny model is run over every clip of ``tests/assets/heldout`` (sentences never trained on). Where its
final, normalised, differs from the reference by exactly one substituted word, that word is boosted alone, written
as the model writes it (cased: "Tuesday"), and the clip decoded again. Kept are the clips where the boost gives the
reference's words and changes nothing else. Run it again whenever the bundled model changes::

    .venv/bin/python scripts/pick_misheard_clips.py --alpha 2.0 --threads 2
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from make_tiny_model import DAYS  # scripts/ is on sys.path when this runs as a script

from pipecat_nemotron.asr import EngineConfig, NemotronEngine
from pipecat_nemotron.asr.errors import BoostPhraseError
from pipecat_nemotron.bench.wer import normalize_text
from pipecat_nemotron.models import TINY_MODEL_PATH

HELDOUT = Path(__file__).resolve().parents[1] / "tests" / "assets" / "heldout"


async def decode(engine: NemotronEngine, audio: np.ndarray, phrases: list[str], alpha: float) -> str:
    """The final text of ``audio`` pushed whole to a new stream boosted with ``phrases``."""
    stream = engine.open_stream(boost_phrases=phrases, boost_alpha=alpha)
    try:
        await stream.push(audio)
        return (await stream.finalize()).text
    finally:
        await stream.close()


def written_forms(word: str, text: str) -> list[str]:
    """Ways the model may write ``word``, best first: as it writes it in ``text``, else a day capitalised (as the
    cased training labels write days), then as given (a lower-case model refuses the capital)."""
    for token in text.split():
        if normalize_text(token) == word:
            return [token.strip(".,?!;:")]
    return [word.capitalize(), word] if word in DAYS else [word]


def single_substitution(ref: str, hyp: str) -> tuple[str, str] | None:
    """``(right word, written word)`` when ``hyp`` differs from ``ref`` by one substituted word only."""
    r, h = ref.split(), hyp.split()
    ops = [op for op in difflib.SequenceMatcher(a=r, b=h, autojunk=False).get_opcodes() if op[0] != "equal"]
    if len(ops) != 1 or ops[0][0] != "replace" or ops[0][2] - ops[0][1] != 1 or ops[0][4] - ops[0][3] != 1:
        return None
    return r[ops[0][1]], h[ops[0][3]]


async def main() -> None:
    """Print every fixable clip as a ``MISHEARD`` row."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=str(TINY_MODEL_PATH))
    parser.add_argument("--alpha", type=float, default=2.0, help="boost weight")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    manifest = json.loads((HELDOUT / "manifest.json").read_text())
    config = EngineConfig(model=args.model, device="cpu", max_streams=2, cpu_threads=args.threads)
    engine = NemotronEngine(config)
    await engine.start()
    try:
        for row in manifest:
            audio = sf.read(HELDOUT / row["audio"], dtype="float32")[0]
            plain = await decode(engine, audio, [], args.alpha)
            swap = single_substitution(row["text"], normalize_text(plain))
            if swap is None:
                continue
            for phrase in written_forms(swap[0], plain):
                try:
                    boosted = await decode(engine, audio, [phrase], args.alpha)
                    break
                except BoostPhraseError:  # a character the model cannot write: try the next form
                    continue
            else:
                continue  # no form the model can write
            fixed = normalize_text(boosted) == row["text"]
            print(json.dumps({"clip": row["audio"], "voice": row["voice"], "phrase": phrase, "heard": swap[1],
                              "plain": plain, "boosted": boosted, "fixed": fixed}), flush=True)  # fmt: skip
    finally:
        await engine.stop()


if __name__ == "__main__":
    asyncio.run(main())
