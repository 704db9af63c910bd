#!/usr/bin/env python
"""Full-size check of our Magpie step: greedy codes equal NeMo's ``generate_speech`` at the released 357M shape.

``tests/test_magpie_fast_step.py`` runs one short sentence for 6 frames at this shape (and the tiny and small
family models in full); this script runs several sentences for ``--frames`` frames each:

* top-k 1 codes equal NeMo's ``generate_speech`` in its KV-cache mode (attention prior on), sentence by sentence;
* with the attention prior off, they also equal NeMo's cache-less loop (its default);
* admitted together (one batched prefill), the sentences give the codes each gives alone.

The model is built in memory with random weights (the end-of-speech bias left at 0, so speech ends when it ends), or
loaded from ``--model``. Prints the time of each part. Exits non-zero when any check fails. Example::

    .venv/bin/python scripts/check_magpie_step.py --threads 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from pipecat_nemotron.tts.magpie.tiny import english_tokens, inference_parameters

SENTENCES = [
    "Hello there.",
    "The quick brown fox jumps over the lazy dog.",
    "Short one.",
]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a Magpie .nemo (default: a random model of the 357M shape)")
    p.add_argument("--codec", default=None, help="its codec .nemo (with --model)")
    p.add_argument(
        "--shape", choices=["357m", "small"], default="357m", help="random model's shape (default: 357m)"
    )
    p.add_argument("--frames", type=int, default=30, help="max decoder steps per sentence (default: 30)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    return p.parse_args(argv)


def nemo_codes(model: Any, text: Any, *, kv_cache: bool) -> Any:
    """NeMo's ``generate_speech`` codes ``(C, T)`` for one sentence (CFG on, speaker 2)."""
    import torch

    with torch.inference_mode():
        model.decoder.reset_cache(use_cache=kv_cache)
        try:
            out = model.generate_speech(
                {"text": text[None], "text_lens": torch.tensor([text.shape[0]]), "speaker_indices": 2},
                chunk_state=model.create_chunk_state(1),
                end_of_text=[True],
                beginning_of_text=True,
                use_cfg=True,
                use_local_transformer_for_inference=True,
            )
        finally:
            model.decoder.reset_cache(use_cache=False)
    return out.predicted_codes[0, :, : int(out.predicted_codes_lens[0])]


def fast_codes(model: Any, texts: list[Any]) -> list[Any]:
    """Our step's greedy codes for ``texts`` admitted together (one batched prefill)."""
    import torch

    from pipecat_nemotron.tts.magpie.fast_step import FastMagpieStep, RowSampling

    step = FastMagpieStep(model)
    with torch.inference_mode():
        rows = step.add_rows([(t, 2, RowSampling(0.7, 1, True)) for t in texts])
        while not all(r.done for r in rows):
            step.advance(step.forward())
    empty = torch.zeros(model.num_audio_codebooks, 0, dtype=torch.long)
    return [torch.stack(r.codes, -1) if r.codes else empty for r in rows]


def load(args: argparse.Namespace, tmp: str) -> Any:
    """The model to check."""
    if args.model:
        from pipecat_nemotron.tts.magpie.loading import load_magpie_model

        return load_magpie_model(args.model, "cpu", args.codec)
    from pipecat_nemotron.tts.magpie import tiny

    shape = tiny.RELEASED_SHAPE if args.shape == "357m" else tiny.SMALL_RELEASED_FAMILY_SHAPE
    return tiny.random_magpie(tiny.build_tiny_codec(tmp), seed=7, end_of_speech_bias=0.0, shape=shape)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks; print one line per sentence and part. Returns the exit status."""
    import torch

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        model = load(args, tmp)
        print(f"model ready in {time.perf_counter() - t0:.1f} s", flush=True)
    texts = [english_tokens(model, s) for s in SENTENCES]
    for prior, kv_cache in ((True, True), (False, False)):
        with inference_parameters(model, topk=1, max_decoder_steps=args.frames, apply_attention_prior=prior):
            t0 = time.perf_counter()
            refs = [nemo_codes(model, t, kv_cache=kv_cache) for t in texts]
            t1 = time.perf_counter()
            alone = [fast_codes(model, [t])[0] for t in texts]
            t2 = time.perf_counter()
            together = fast_codes(model, texts)
            t3 = time.perf_counter()
        label = f"prior {'on' if prior else 'off'}, NeMo {'KV-cache mode' if kv_cache else 'cache-less loop'}"
        for sentence, ref, a, b in zip(SENTENCES, refs, alone, together, strict=True):
            ok = torch.equal(a, ref) and torch.equal(b, ref)
            failed |= not ok
            print(f"{label}: {sentence!r}: {ref.shape[1]} frames, {'equal' if ok else 'DIFFERENT'}")
        print(f"{label}: NeMo {t1 - t0:.1f} s, ours alone {t2 - t1:.1f} s, ours together {t3 - t2:.1f} s", flush=True)
    print("FAILED" if failed else "OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
