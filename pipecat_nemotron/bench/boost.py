"""Per-stream phrase boosting (issue 24): what it costs in a step, and what it fixes and breaks on the tiny model.

``cost`` (``--model``, default the 600M architecture with random weights): one steady-state 160 ms step of B
streams (our encoder step over full 70-frame caches, then the one batched greedy RNNT decode), its decode timed
under four decoders: ``off`` (built without per-stream biasing), ``none`` (with it, no stream boosted), and every
stream boosted with a list of its own of 10 or 1,000 phrases (random letter words, ~2 per phrase). Decodes of the
four alternate within each repetition; the encoder is timed once per batch (boosting does not touch it). The
share is the extra decode time over the ``off`` step (encoder + decode). The trees' build time is reported apart
(once per distinct list, in the step that first uses it).

``recall`` (the bundled tiny model, all 200 held-out clips): for each target word, the clips that contain it are
decoded without and with the word boosted (recall of its occurrences), and 30 clips that do not contain it are
decoded with it boosted (false insertions: occurrences of the word the boost added; WER of those clips). Every
stream of a batch carries its own list.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import string
import time
from collections.abc import Sequence
from typing import Any

from pipecat_nemotron.bench import common, output

NAME = "boost"

#: Words the tiny model mishears on held-out clips (``tests/test_boosting.py``), then frequent ones.
#: Written as the model writes them (boosting matches case); counted in normalised text.
DEFAULT_WORDS = ["Tuesday", "today", "two", "five", "Hey", "day"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of this benchmark."""
    common.add_common_args(parser, model_default="600m", manifest=False)
    parser.add_argument("--parts", nargs="+", choices=["cost", "recall"], default=["cost", "recall"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16], help="streams per step")
    parser.add_argument("--phrases", type=int, nargs="+", default=[10, 1000], help="phrases per stream's list")
    parser.add_argument("--repeats", type=int, default=15, help="timed decodes per cell (default: %(default)s)")
    parser.add_argument("--encoder-repeats", type=int, default=3, help="timed encoder steps per batch (default: 3)")
    parser.add_argument("--words", nargs="+", default=DEFAULT_WORDS, help="recall: words to boost")
    parser.add_argument("--alphas", type=float, nargs="+", default=[1.0, 2.0, 4.0], help="recall: boost weights")
    parser.add_argument("--others", type=int, default=30, help="recall: clips without the word, per word")
    parser.add_argument("--clips", type=int, default=None, help="recall: the first N held-out clips (default: all)")


def random_phrases(count: int, seed: int, alphabet: str = string.ascii_lowercase) -> list[str]:
    """``count`` distinct phrases of 1-3 random words of 4-9 letters (names the model never heard)."""
    rng = random.Random(seed)
    out: dict[str, None] = {}
    while len(out) < count:
        words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(4, 9))) for _ in range(rng.randint(1, 3))]
        out[" ".join(words)] = None
    return list(out)


# ---- cost -------------------------------------------------------------------------------------------------


class _Rows:
    """B streams' decoder states and lists, decoded repeatedly over one encoder output (as steps would)."""

    def __init__(self, model: Any, boost: Any, lists: list[Any]) -> None:
        self.model, self.boost, self.lists = model, boost, lists
        self.states: list[Any] = [None] * len(lists)

    def decode(self, encoded: Any, lengths: Any) -> float:
        """One batched decode continuing every row; returns its wall time, ms."""
        from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis

        start = time.perf_counter()
        previous = []
        for i, boost in enumerate(self.lists):
            cfg = None
            if self.boost is not None:
                cfg, self.states[i] = self.boost.prepare(i, boost, self.states[i])
            previous.append(
                None
                if cfg is None and self.states[i] is None
                else Hypothesis(score=0.0, y_sequence=None, dec_state=self.states[i], timestamp=None, biasing_cfg=cfg)
            )
        hyps = self.model.decoding.rnnt_decoder_predictions_tensor(
            encoder_output=encoded, encoded_lengths=lengths, return_hypotheses=True, partial_hypotheses=previous
        )
        self.states = [h.dec_state for h in hyps]
        return (time.perf_counter() - start) * 1000.0


def _cost_cell(model: Any, batch: int, args: argparse.Namespace, dtype: Any) -> dict[str, Any]:
    """Encoder and decode times of one batch size under every decoder; the trees' build time."""
    import torch

    from pipecat_nemotron.asr.boost_models import BoostModels
    from pipecat_nemotron.asr.boosting import BoostList, model_alphabet
    from pipecat_nemotron.asr.config import LATENCY_MODES, LEFT_CONTEXT_FRAMES
    from pipecat_nemotron.asr.fast_step import FastEncoderStep
    from pipecat_nemotron.asr.loading import _configure_decoding
    from pipecat_nemotron.bench.encoder_step import _Cell

    right = LATENCY_MODES[160]
    model.encoder.set_default_att_context_size([LEFT_CONTEXT_FRAMES, right])
    cell = _Cell(model, FastEncoderStep(model.encoder), right, batch, dtype)
    repeats, phrase_counts = args.repeats, args.phrases
    enc_ms, encoded = [], None
    for i in range(args.encoder_repeats + 1):
        start = time.perf_counter()
        encoded = cell.fast(cell.signal, cell.lengths, *cell.fast_caches, drop_extra_pre_encoded=cell.drop,
                            right_context=right)  # fmt: skip
        if i:
            enc_ms.append((time.perf_counter() - start) * 1000.0)
    assert encoded is not None
    # "off": the decoder as it was before boosting existed; the others share one decoder with per-stream biasing.
    with torch.inference_mode(False):  # the multi-model's buffers must not be inference tensors
        _configure_decoding(model, per_stream_biasing=False)
    off = _Rows(model, None, [None] * batch)
    off_ms = [off.decode(encoded[0], encoded[1]) for _ in range(repeats + 1)][1:]
    with torch.inference_mode(False):
        _configure_decoding(model, per_stream_biasing=True)
    boost = BoostModels(model)
    writable = model_alphabet(list(model.tokenizer.vocab))
    alphabet = "".join(c for c in string.ascii_lowercase if writable is None or c in writable)
    variants = {"none": _Rows(model, boost, [None] * batch)}
    build_ms: dict[str, float] = {}
    for n in phrase_counts:
        lists = [BoostList(tuple(random_phrases(n, seed=1000 * n + i, alphabet=alphabet)), 1.0) for i in range(batch)]
        rows = _Rows(model, _Offset(boost, len(variants) * batch), lists)  # each variant's rows: streams of their own
        start = time.perf_counter()
        rows.decode(encoded[0], encoded[1])  # builds and adds the B trees
        build_ms[str(n)] = (time.perf_counter() - start) * 1000.0
        variants[str(n)] = rows
    times: dict[str, list[float]] = {k: [] for k in variants}
    for i in range(repeats + 1):
        order = list(variants) if i % 2 == 0 else list(reversed(variants))
        for key in order:
            ms = variants[key].decode(encoded[0], encoded[1])
            if i:
                times[key].append(ms)
    enc, dec_off = statistics.median(enc_ms), statistics.median(off_ms)
    row: dict[str, Any] = {"batch": batch, "encoder_ms": enc, "decode_off_ms": dec_off, "step_off_ms": enc + dec_off}
    for key, values in times.items():
        dec = statistics.median(values)
        row[f"decode_{key}_ms"] = dec
        row[f"share_{key}"] = (dec - dec_off) / (enc + dec_off)
    row["build_ms"] = build_ms
    row["trees"] = boost.active
    return row


class _Offset:
    """A :class:`BoostModels` view whose stream ids start at ``offset`` (variants share one multi-model)."""

    def __init__(self, boost: Any, offset: int) -> None:
        self.boost, self.offset = boost, offset

    def prepare(self, stream_id: int, boost: Any, dec_state: Any) -> tuple[Any, Any]:
        return self.boost.prepare(self.offset + stream_id, boost, dec_state)


def run_cost(args: argparse.Namespace, result: dict[str, Any]) -> str:
    """The step-cost table (and its rows in ``result``)."""
    import torch

    spec = common.resolve_model(args.model, args.models_dir)
    result["cost_model"] = spec.as_dict()
    with torch.inference_mode():
        model, _, dtype = common.load_bench_model(spec, args.device)
        rows = []
        for batch in args.batches:
            row = _cost_cell(model, batch, args, dtype)
            rows.append(row)
            print(f"[bench] cost, batch {batch}: {json.dumps({k: v for k, v in row.items() if k != 'build_ms'})}",
                  flush=True)  # fmt: skip
    result["cost"] = rows
    columns: list[tuple[str, Any]] = [
        ("batch", "batch"),
        ("encoder ms", "encoder_ms"),
        ("decode ms, off", "decode_off_ms"),
        ("decode ms, on, none boosted", "decode_none_ms"),
    ]
    for n in args.phrases:
        columns.append((f"decode ms, {n} phrases each", f"decode_{n}_ms"))
    columns.append(("share of the step: on, none", lambda r: f"{100 * r['share_none']:+.1f}%"))
    for n in args.phrases:
        columns.append((f"share: {n} phrases", lambda r, n=n: f"{100 * r[f'share_{n}']:+.1f}%"))
    columns.append(("tree build ms (all B lists)", lambda r: " / ".join(f"{v:.0f}" for v in r["build_ms"].values())))
    return output.format_rows(rows, columns)


# ---- recall -----------------------------------------------------------------------------------------------


async def _decode_all(engine: Any, jobs: list[tuple[Any, list[str], float | None]]) -> list[str]:
    """Final text of each ``(audio, phrases, alpha)``, up to ``max_streams`` at a time (each its own stream)."""
    out: list[str] = [""] * len(jobs)
    width = engine.config.max_streams

    async def one(i: int) -> None:
        audio, phrases, alpha = jobs[i]
        stream = engine.open_stream(boost_phrases=phrases, boost_alpha=alpha)
        try:
            await stream.push(audio)
            out[i] = (await stream.finalize()).text
        finally:
            await stream.close()

    for start in range(0, len(jobs), width):
        await asyncio.gather(*(one(i) for i in range(start, min(start + width, len(jobs)))))
    return out


async def _recall(args: argparse.Namespace) -> list[dict[str, Any]]:
    from pipecat_nemotron.asr import EngineConfig, NemotronEngine
    from pipecat_nemotron.bench.wer import normalize_text, wer_percent
    from pipecat_nemotron.models import TINY_MODEL_PATH

    rows_in = _heldout_rows()[: args.clips]
    engine = NemotronEngine(EngineConfig(model=str(TINY_MODEL_PATH), device="cpu", max_streams=16,
                                         max_batch_size=16, cpu_threads=args.threads or 1))  # fmt: skip
    await engine.start()
    try:
        audio = [r["audio_array"] for r in rows_in]
        plain = [normalize_text(t) for t in await _decode_all(engine, [(a, [], None) for a in audio])]
        rows = []
        for phrase in args.words:
            word = normalize_text(phrase)
            has = [i for i, r in enumerate(rows_in) if word in r["text"].split()]
            rng = random.Random(word)
            others = rng.sample([i for i in range(len(rows_in)) if i not in set(has)], args.others)
            for alpha in args.alphas:
                texts = await _decode_all(engine, [(audio[i], [phrase], alpha) for i in has + others])
                texts = [normalize_text(t) for t in texts]
                boosted = dict(zip(has + others, texts, strict=True))
                refs = [rows_in[i]["text"].split().count(word) for i in has]
                rows.append({
                    "word": phrase,
                    "alpha": alpha,
                    "occurrences": sum(refs),
                    "recall_before": _hits(word, rows_in, plain, has) / max(1, sum(refs)),
                    "recall_after": _hits(word, rows_in, boosted, has) / max(1, sum(refs)),
                    "extra_in_clips_with_it": sum(
                        max(0, boosted[i].split().count(word) - rows_in[i]["text"].split().count(word)) for i in has
                    ),
                    "wer_with_before": wer_percent([rows_in[i]["text"] for i in has], [plain[i] for i in has]),
                    "wer_with_after": wer_percent([rows_in[i]["text"] for i in has], [boosted[i] for i in has]),
                    "other_clips": len(others),
                    "false_insertions": sum(
                        max(0, boosted[i].split().count(word) - plain[i].split().count(word)) for i in others
                    ),
                    "wer_others_before": wer_percent([rows_in[i]["text"] for i in others], [plain[i] for i in others]),
                    "wer_others_after": wer_percent([rows_in[i]["text"] for i in others], [boosted[i] for i in others]),
                })  # fmt: skip
                print(f"[bench] recall: {json.dumps(rows[-1])}", flush=True)
    finally:
        await engine.stop()
    return rows


def _hits(word: str, rows: list[dict[str, Any]], texts: Any, indices: list[int]) -> int:
    """Occurrences of ``word`` in the references that the texts have (per clip, at most the reference's count)."""
    return sum(min(rows[i]["text"].split().count(word), texts[i].split().count(word)) for i in indices)


def _heldout_rows() -> list[dict[str, Any]]:
    """The held-out clips (``tests/assets/heldout``, in a source checkout) with their audio."""
    import soundfile as sf

    from pipecat_nemotron.bench.audio import HELDOUT_DIR, HELDOUT_MANIFEST

    rows = json.loads(HELDOUT_MANIFEST.read_text())
    for r in rows:
        r["audio_array"] = sf.read(HELDOUT_DIR / r["audio"], dtype="float32")[0]
    return rows


def run_recall(args: argparse.Namespace, result: dict[str, Any]) -> str:
    """The recall / false-insertion table (and its rows in ``result``)."""
    rows = asyncio.run(_recall(args))
    result["recall"] = rows
    return output.format_rows(
        rows,
        [
            ("word", "word"),
            ("alpha", "alpha"),
            ("occurrences", "occurrences"),
            ("recall unboosted", lambda r: f"{100 * r['recall_before']:.0f}%"),
            ("recall boosted", lambda r: f"{100 * r['recall_after']:.0f}%"),
            ("extra copies where it is said", "extra_in_clips_with_it"),
            ("WER of those clips", lambda r: f"{r['wer_with_before']:.1f} → {r['wer_with_after']:.1f}%"),
            ("clips without it", "other_clips"),
            ("false insertions", "false_insertions"),
            ("WER there, unboosted → boosted", lambda r: f"{r['wer_others_before']:.1f} → {r['wer_others_after']:.1f}%"),
        ],
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the parts asked for; write JSON under ``args.out``; return the result."""
    result = output.result_header(NAME, args)
    tables = []
    with common.bench_context(args):
        if "recall" in args.parts:
            tables.append(run_recall(args, result))
        if "cost" in args.parts:
            tables.append(run_cost(args, result))
    output.finish(args.out, NAME, result, None, "\n\n".join(tables))
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point: ``python -m pipecat_nemotron.bench boost [options]``."""
    return common.bench_main(NAME, __doc__, add_arguments, run, argv)
