#!/usr/bin/env python
"""Word timings and confidence of the streaming engine: timing errors, confidence on right and wrong words, cost.

Three measurements on the bundled tiny model (or ``--model``), CPU by default:

* ``timings``: clips of single espeak-ng words joined by known silences (``tests/word_clips.py``: the held-out
  sentences of the tiny model, word by word, in their training voices), streamed per latency mode; the error
  of each recognised word's start and end (median and 95th percentile of |error|, share within 200 ms, median
  signed error). ``--raw`` measures without the model's timing offsets: its median signed errors are the
  offsets to use (``EngineConfig.word_timing_offsets_ms`` = minus them).
* ``confidence``: the held-out set (``tests/assets/heldout``); mean word confidence of the words the
  alignment with the reference keeps (right) and of the others (wrong), per method of NeMo's confidence config.
* ``cost``: mean model step time with NeMo's token confidence and the engine's word assembly on and off
  (``EngineConfig.word_timings``), alternated in one run over the same audio and batch, and their ratio; and,
  less noisy, the greedy decode alone on the same encoder outputs, and the word assembly per call.

Example::

    .venv/bin/python scripts/eval_word_timings.py timings confidence cost --json runs/word_timings.json
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the clip builder lives with the tests that use it

from word_clips import HELDOUT_MANIFEST, TRAINING_LIKE_GAPS_S, TimingErrors, correct_words, sentence_clips  # noqa: E402

from pipecat_nemotron.agent.wav_input import read_float32  # noqa: E402
from pipecat_nemotron.asr import EngineConfig, NemotronEngine  # noqa: E402
from pipecat_nemotron.asr.loading import TOKEN_CONFIDENCE_CFG  # noqa: E402
from pipecat_nemotron.models import TINY_MODEL_PATH  # noqa: E402

#: NeMo confidence measures compared by ``confidence`` (``confidence_cfg.method_cfg``).
METHODS: dict[str, dict[str, Any]] = {
    "entropy_tsallis_exp_a0.33": TOKEN_CONFIDENCE_CFG["method_cfg"],
    "entropy_gibbs_exp": {"name": "entropy", "entropy_type": "gibbs", "alpha": 1.0, "entropy_norm": "exp"},
    "max_prob": {"name": "max_prob", "entropy_type": "tsallis", "alpha": 1.0, "entropy_norm": "exp"},
}


async def transcribe_all(engine: NemotronEngine, clips: list[np.ndarray], latency_ms: int) -> list[Any]:
    """Finals of all clips, streamed concurrently (batched by the engine)."""
    return list(await asyncio.gather(*(engine.transcribe(c, latency_ms=latency_ms) for c in clips)))


async def measure_timings(
    engine: NemotronEngine, modes: list[int], count: int, gaps: tuple[float, float]
) -> dict[str, Any]:
    """Timing errors per latency mode on ``count`` word clips with silences drawn from ``gaps`` (s)."""
    clips = sentence_clips(count, gaps)
    out: dict[str, Any] = {}
    for mode in modes:
        finals = await transcribe_all(engine, [c.audio for c in clips], mode)
        predicted = [[(w.text, w.start_ms, w.end_ms) for w in f.words] for f in finals]
        out[str(mode)] = summary = TimingErrors.measure(clips, predicted).summary()
        print(
            f"timings {mode} ms, gaps {gaps[0]:g}-{gaps[1]:g} s: {summary['matched']}/{summary['words']} words; start "
            f"|err| median {summary['start_median_abs_ms']:.0f} p95 {summary['start_p95_abs_ms']:.0f} ms, "
            f"{summary['start_within_200ms']:.0%} within 200 ms, median {summary['start_median_ms']:+.0f}; end "
            f"|err| median {summary['end_median_abs_ms']:.0f} p95 {summary['end_p95_abs_ms']:.0f} ms, "
            f"median {summary['end_median_ms']:+.0f}",
            flush=True,
        )
    return out


def _set_confidence(engine: NemotronEngine, method: dict[str, Any] | None) -> None:
    """Decode with ``method`` (NeMo ``method_cfg``), or with no confidence at all (None). Engine idle only."""
    from omegaconf import open_dict

    model = engine.model
    cfg = copy.deepcopy(model.cfg.decoding)
    with open_dict(cfg):
        conf = copy.deepcopy(TOKEN_CONFIDENCE_CFG)
        if method is None:
            conf.update(preserve_frame_confidence=False, preserve_token_confidence=False)
        else:
            conf["method_cfg"] = method
        cfg.confidence_cfg = conf
    model.change_decoding_strategy(cfg, verbose=False)


async def measure_confidence(engine: NemotronEngine, latency_ms: int) -> dict[str, Any]:
    """Mean word confidence of right and wrong words on the held-out set, per confidence method."""
    rows = json.loads(HELDOUT_MANIFEST.read_text())
    audio = [read_float32(HELDOUT_MANIFEST.parent / r["audio"]) for r in rows]
    out: dict[str, Any] = {}
    for name, method in METHODS.items():
        _set_confidence(engine, method)
        finals = await transcribe_all(engine, audio, latency_ms)
        right: list[float] = []
        wrong: list[float] = []
        for row, final in zip(rows, finals, strict=True):
            keep = correct_words([w.text for w in final.words], row["text"].split())
            for word, ok in zip(final.words, keep, strict=True):
                (right if ok else wrong).append(word.confidence)
        pos, neg = np.array(right), np.array(wrong)
        auc = float(np.mean(pos[:, None] > neg[None, :]) + 0.5 * np.mean(pos[:, None] == neg[None, :]))
        out[name] = {"right": len(right), "right_mean": float(pos.mean()), "wrong": len(wrong)}
        out[name] |= {"wrong_mean": float(neg.mean()), "auc": auc}
        print(
            f"confidence {name} ({latency_ms} ms): right words {len(right)} mean {pos.mean():.3f}, wrong "
            f"{len(wrong)} mean {neg.mean():.3f}, AUC {auc:.3f}",
            flush=True,
        )
    _set_confidence(engine, TOKEN_CONFIDENCE_CFG["method_cfg"])
    return out


async def _timed_round(
    engine: NemotronEngine, audio: list[np.ndarray], latency_ms: int, on: bool
) -> list[float]:
    """Step times (model step + word assembly, ms) of one pass over ``audio`` with timings on or off."""
    runner = engine._require().runner  # noqa: SLF001 - a benchmark switches the engine's internals
    aligner = runner.aligner
    spent = [0.0]
    words = aligner.words

    def timed_words(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return words(*args, **kwargs)
        finally:
            spent[0] += (time.perf_counter() - t0) * 1000.0

    steps: list[float] = []
    listener = lambda stats: steps.append(stats.step_ms)  # noqa: E731
    _set_confidence(engine, TOKEN_CONFIDENCE_CFG["method_cfg"] if on else None)
    aligner.words = timed_words  # type: ignore[method-assign]
    aligner.enabled = on
    engine.add_step_listener(listener)
    try:
        await transcribe_all(engine, audio, latency_ms)
    finally:
        engine.remove_step_listener(listener)
        del aligner.words
        aligner.enabled = True
    return [s + spent[0] / len(steps) for s in steps]


async def _decode_cost(
    engine: NemotronEngine, audio: list[np.ndarray], latency_ms: int, rounds: int
) -> dict[str, float]:
    """The greedy decode alone on one pass's encoder outputs, confidence on and off; word assembly per call."""
    import torch

    from pipecat_nemotron.asr.words import TokenTrace

    chunks: list[tuple[Any, Any]] = []
    with engine.observe_encoder_output(lambda _ids, enc, lens: chunks.append((enc.clone(), lens.clone()))):
        finals = await transcribe_all(engine, audio, latency_ms)
    decoding = engine.model.decoding
    per_chunk: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for on in (False, True):
            _set_confidence(engine, TOKEN_CONFIDENCE_CFG["method_cfg"] if on else None)
            decoding = engine.model.decoding
            t0 = time.perf_counter()
            with torch.inference_mode():
                for enc, lens in chunks:
                    decoding.rnnt_decoder_predictions_tensor(
                        encoder_output=enc, encoded_lengths=lens, return_hypotheses=True
                    )
            per_chunk[on].append((time.perf_counter() - t0) * 1000.0 / len(chunks))
    aligner = engine._require().runner.aligner  # noqa: SLF001
    calls, t0 = 0, time.perf_counter()
    for final in finals:  # as on every partial: the words of each growing prefix
        tokens = list(final.tokens)
        for k in range(1, len(tokens) + 1):
            aligner.words(tokens[:k], TokenTrace(list(range(k)), [0.5] * k), 0.0)
            calls += 1
    words_us = (time.perf_counter() - t0) * 1e6 / max(calls, 1)
    off, on = float(np.median(per_chunk[False])), float(np.median(per_chunk[True]))
    _print_on_off(
        engine, f"decode alone ({len(chunks)} chunks)", off, on, f"; word assembly {words_us:.1f} us per call"
    )
    return {"decode_off_ms": off, "decode_on_ms": on, "words_us_per_call": words_us}


def _print_on_off(engine: NemotronEngine, what: str, off_ms: float, on_ms: float, extra: str = "") -> None:
    """Print an off/on timing pair and its ratio; leave the engine's confidence as configured by default."""
    print(
        f"{what}: {off_ms:.3f} ms without, {on_ms:.3f} ms with word timings/confidence (ratio {on_ms / off_ms:.3f}){extra}"
    )
    _set_confidence(engine, TOKEN_CONFIDENCE_CFG["method_cfg"])


async def measure_cost(engine: NemotronEngine, latency_ms: int, streams: int, rounds: int) -> dict[str, Any]:
    """Mean step time with word timings and confidence on and off, alternated over the same audio."""
    rows = json.loads(HELDOUT_MANIFEST.read_text())[:streams]
    audio = [read_float32(HELDOUT_MANIFEST.parent / r["audio"]) for r in rows]
    times: dict[bool, list[float]] = {True: [], False: []}
    await _timed_round(engine, audio, latency_ms, True)  # warm-up
    for _ in range(rounds):
        for on in (False, True):
            times[on].extend(await _timed_round(engine, audio, latency_ms, on))
    on_ms, off_ms = float(np.mean(times[True])), float(np.mean(times[False]))
    _print_on_off(engine, f"cost ({latency_ms} ms, {streams} streams, {rounds} rounds): step", off_ms, on_ms)
    decode = await _decode_cost(engine, audio, latency_ms, rounds)
    return {
        "latency_ms": latency_ms,
        "streams": streams,
        "rounds": rounds,
        "off_ms": off_ms,
        "on_ms": on_ms,
    } | decode


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the requested measurements on one engine."""
    config = EngineConfig(
        model=args.model,
        device=args.device,
        max_streams=256,
        max_batch_size=args.batch,
        warmup=False,
        word_timing_offsets_ms=(0.0, 0.0) if args.raw else None,
    )
    results: dict[str, Any] = {"model": args.model, "raw": args.raw, "cpu_threads": os.cpu_count()}
    async with NemotronEngine(config) as engine:
        if "timings" in args.what:
            results["timings"] = await measure_timings(engine, args.modes, args.clips, tuple(args.gaps))
        if "confidence" in args.what:
            results["confidence"] = await measure_confidence(engine, args.modes[0])
        if "cost" in args.what:
            results["cost"] = await measure_cost(engine, args.modes[0], args.batch, args.rounds)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", nargs="+", choices=("timings", "confidence", "cost"))
    parser.add_argument("--model", default=str(TINY_MODEL_PATH))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--modes", type=int, nargs="+", default=[160, 560], help="latency modes, ms")
    parser.add_argument("--clips", type=int, default=100, help="word clips for timings (at most 100)")
    parser.add_argument(
        "--gaps", type=float, nargs=2, default=TRAINING_LIKE_GAPS_S, help="silences between words, s"
    )
    parser.add_argument("--raw", action="store_true", help="no timing offsets (to measure a model's)")
    parser.add_argument("--batch", type=int, default=16, help="streams per step (cost), max batch size")
    parser.add_argument("--rounds", type=int, default=3, help="on/off rounds (cost)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    results = asyncio.run(run(args))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
