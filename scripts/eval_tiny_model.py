#!/usr/bin/env python
"""Word error rate of the tiny Nemotron-family model per latency mode, on the held-out sets, by streaming.

Held-out sets (see ``scripts/make_tiny_model.py``): sentences never seen in training, spoken by

* ``seen_voice``: espeak-ng voices used in training;
* ``unseen_voice``: voices never used in training (an unseen accent or an unseen voice variant).

Sets: ``ci`` is the small subset bundled in ``tests/assets/heldout/``; ``full`` is the few-hundred-utterance
sets under ``data/tiny_asr/`` (regenerate with ``make_tiny_model.py heldout``).

Backends:

* ``engine``: ``pipecat_nemotron.asr.NemotronEngine`` (the streaming engine of this package), all
  utterances of a mode submitted concurrently so that the engine batches them;
* ``nemo``: NeMo's model-level cache-aware streaming (``conformer_stream_step`` chunk by chunk with
  ``CacheAwareStreamingAudioBuffer``), an independent cross-check of the engine;
* ``auto`` (default): ``engine``.

``--offline`` adds ``model.transcribe()`` (whole utterance, same attention context) for comparison.

Scores: word error rate on normalised text (lower case, no punctuation: a cased, punctuated model is scored on
its words), and terminal-punctuation accuracy: the share of utterances whose transcript ends with the same mark
(``?``, ``.`` or none) as the reference written the way the training labels are (``make_tiny_model.punctuate``).
A model that writes no punctuation scores 0 there.

``--lead-silence 0 1.5 3`` adds the leading-silence table: the same utterances (``--lead-utts`` of the CI set,
spread over both splits) streamed through the engine at 160 ms after that much digital silence; an utterance is
right when its normalised transcript equals the reference.

Example::

    .venv/bin/python scripts/eval_tiny_model.py --sets ci full --offline --json runs/eval_tiny.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipecat_nemotron.agent.wav_input import read_float32, read_pcm16
from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.asr.config import LATENCY_MODES, LEFT_CONTEXT_FRAMES
from pipecat_nemotron.bench.audio import HELDOUT_MANIFEST, manifest_rows
from pipecat_nemotron.bench.common import REPO_ROOT, bench_engine
from pipecat_nemotron.bench.wer import WordErrorCount, normalize_text
from pipecat_nemotron.models import TINY_MODEL_PATH

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_model import punctuate  # noqa: E402  (the training labels' rules, next to this script)

FULL_MANIFESTS = {
    "seen_voice": REPO_ROOT / "data" / "tiny_asr" / "test_seen_voice_manifest.json",
    "unseen_voice": REPO_ROOT / "data" / "tiny_asr" / "test_unseen_voice_manifest.json",
}
#: Encoder frame (8x subsampled 10 ms features), s.
ENCODER_FRAME_S = 0.08


# ------------------------------------------------------------------------------------------------------------
# Data and scoring
# ------------------------------------------------------------------------------------------------------------
@dataclass
class Utt:
    """One held-out utterance."""

    path: Path
    text: str
    split: str

    @property
    def written(self) -> str:
        """The reference as a cased, punctuated model writes it (the training labels' rules)."""
        return punctuate(normalize_text(self.text))


def end_mark(text: str) -> str:
    """The terminal punctuation of a transcript: ``?``, ``.``, ``!`` or ``""`` (none)."""
    text = text.rstrip()
    return text[-1] if text and text[-1] in "?.!" else ""


@dataclass
class Score(WordErrorCount):
    """Word errors of one (set, split, mode, backend), with the utterances that had some."""

    utts: int = 0
    wrong_utts: int = 0
    mark_right: int = 0
    exact: int = 0
    examples: list[tuple[str, str]] = field(default_factory=list)


def load_set(name: str) -> list[Utt]:
    """Utterances of the ``ci`` or ``full`` held-out set."""
    if name == "ci":
        return [Utt(Path(r["audio"]), r["text"], r["split"]) for r in manifest_rows(HELDOUT_MANIFEST)]
    utts: list[Utt] = []
    for split, manifest in FULL_MANIFESTS.items():
        if not manifest.exists():
            raise SystemExit(f"{manifest} is missing: run `scripts/make_tiny_model.py heldout` first")
        utts += [Utt(Path(r["audio"]), r["text"], split) for r in manifest_rows(manifest)]
    return utts


def score(utts: Sequence[Utt], hyps: Sequence[str]) -> dict[str, Score]:
    """Per-split scores."""
    out: dict[str, Score] = {}
    for u, h in zip(utts, hyps, strict=True):
        s = out.setdefault(u.split, Score())
        s.utts += 1
        s.mark_right += end_mark(h) == end_mark(u.written)
        s.exact += h.strip() == u.written
        if s.add(u.text, h):
            s.wrong_utts += 1
            if len(s.examples) < 5:
                s.examples.append((normalize_text(u.text), normalize_text(h)))
    return out


# ------------------------------------------------------------------------------------------------------------
# NeMo model-level backends
# ------------------------------------------------------------------------------------------------------------
def load_model(path: Path) -> Any:
    """Restore the ``.nemo`` on CPU in eval mode."""
    from nemo.collections.asr.models import ASRModel

    from pipecat_nemotron.asr.loading import quiet_nemo

    with quiet_nemo(logging.WARNING):
        model = ASRModel.restore_from(str(path), map_location="cpu")
    model.eval()
    return model


def _texts(hyps: Any) -> list[str]:
    """Transcripts of NeMo's hypotheses (objects with ``.text``, or plain strings)."""
    return [h.text if hasattr(h, "text") else str(h) for h in hyps]


def nemo_stream(model: Any, utts: Sequence[Utt], right: int, batch_size: int) -> list[str]:
    """Cache-aware streaming with NeMo's model-level API, ``batch_size`` utterances per forward.

    Each utterance is followed by ``(right + 2) * 80 ms`` of silence so that its last frames get their full
    right context (the flush a live stream does at end of turn) and no final partial chunk is dropped.
    """
    import torch
    from nemo.collections.asr.parts.utils.streaming_utils import CacheAwareStreamingAudioBuffer

    model.encoder.set_default_att_context_size([LEFT_CONTEXT_FRAMES, right])
    model.eval()
    pad = np.zeros(int((right + 2) * ENCODER_FRAME_S * MODEL_SAMPLE_RATE), dtype=np.float32)
    texts: list[str] = []
    for start in range(0, len(utts), batch_size):
        batch = utts[start : start + batch_size]
        buf = CacheAwareStreamingAudioBuffer(model=model, online_normalization=False)
        for u in batch:
            buf.append_audio(np.concatenate([read_float32(u.path), pad]), stream_id=-1)
        cache_ch, cache_t, cache_len = model.encoder.get_initial_cache_state(batch_size=len(batch))
        prev_hyps = None
        pred_out = None
        hyps: Any = None
        for step, (chunk, chunk_len) in enumerate(iter(buf)):
            with torch.inference_mode():
                (pred_out, hyps, cache_ch, cache_t, cache_len, prev_hyps) = model.conformer_stream_step(
                    processed_signal=chunk,
                    processed_signal_length=chunk_len,
                    cache_last_channel=cache_ch,
                    cache_last_time=cache_t,
                    cache_last_channel_len=cache_len,
                    keep_all_outputs=buf.is_buffer_empty(),
                    previous_hypotheses=prev_hyps,
                    previous_pred_out=pred_out,
                    drop_extra_pre_encoded=model.encoder.streaming_cfg.drop_extra_pre_encoded if step else 0,
                    return_transcription=True,
                )
        texts += _texts(hyps or [])
    return texts


def nemo_offline(model: Any, utts: Sequence[Utt], right: int, batch_size: int) -> list[str]:
    """Whole-utterance ``model.transcribe()`` with the same attention context."""
    from pipecat_nemotron.asr.loading import quiet_nemo

    model.encoder.set_default_att_context_size([LEFT_CONTEXT_FRAMES, right])
    with quiet_nemo(logging.WARNING):
        out = model.transcribe([str(u.path) for u in utts], batch_size=batch_size, verbose=False)
    model.eval()  # transcribe() can leave submodules in train mode (dropout on)
    if isinstance(out, tuple):
        out = out[0]
    return _texts(out)


# ------------------------------------------------------------------------------------------------------------
# Engine backend
# ------------------------------------------------------------------------------------------------------------
async def engine_stream(
    model_path: Path, utts: Sequence[Utt], modes: Sequence[int], streams: int
) -> dict[int, list[str]]:
    """Transcribe every utterance in every mode through ``NemotronEngine`` (concurrent, so batched)."""
    async with bench_engine(model_path, "cpu", streams) as engine:
        out: dict[int, list[str]] = {}
        sem = asyncio.Semaphore(streams)
        pcm = [read_pcm16(u.path) for u in utts]

        async def one(data: np.ndarray, mode: int) -> str:
            async with sem:
                result = await engine.transcribe(data, latency_ms=mode)
                return str(result.text)

        for mode in modes:
            out[mode] = list(await asyncio.gather(*(one(d, mode) for d in pcm)))
        return out


# ------------------------------------------------------------------------------------------------------------
# Evaluation
# ------------------------------------------------------------------------------------------------------------
def stream_all(
    backend: str, model: Any, model_path: Path, utts: Sequence[Utt], args: argparse.Namespace
) -> dict[int, list[str]]:
    """Transcripts of every utterance in every mode of ``args.modes``, streamed by ``backend``."""
    if backend == "engine":
        return asyncio.run(engine_stream(model_path, utts, args.modes, args.batch_size))
    return {m: nemo_stream(model, utts, LATENCY_MODES[m], args.batch_size) for m in args.modes}


def result_rows(set_name: str, method: str, by_mode: dict[int, list[str]], utts: Sequence[Utt]) -> list[dict]:
    """One report row per (split, mode) of a method's transcripts."""
    rows = []
    for mode, hyps in by_mode.items():
        for split, s in sorted(score(utts, hyps).items()):
            rows.append(
                {
                    "set": set_name,
                    "split": split,
                    "method": method,
                    "latency_ms": mode,
                    "wer": round(s.percent, 2),
                    "errors": s.errors,
                    "words": s.words,
                    "utts": s.utts,
                    "wrong_utts": s.wrong_utts,
                    "end_mark_accuracy": round(100.0 * s.mark_right / max(1, s.utts), 1),
                    "exact_written": s.exact,
                    "examples": s.examples,
                }
            )
    return rows


def equal_counts(
    by_mode: dict[int, list[str]], offline: dict[int, list[str]], modes: Sequence[int], total: int
) -> dict[int, str]:
    """Per mode, how many of the ``total`` streamed transcripts equal the offline ones (normalised text)."""
    same = {
        m: sum(normalize_text(a) == normalize_text(b) for a, b in zip(by_mode[m], offline[m], strict=True))
        for m in modes
    }
    return {m: f"{n}/{total}" for m, n in same.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate and return a JSON-able report."""
    import torch

    torch.set_num_threads(args.threads)
    model_path = Path(args.model)
    # ``auto`` is the engine: this script imports the package, so the engine is always there.
    backends = list(dict.fromkeys("engine" if b == "auto" else b for b in args.backend))
    report: dict[str, Any] = {
        "model": str(
            model_path.relative_to(REPO_ROOT) if model_path.is_relative_to(REPO_ROOT) else model_path
        ),
        "model_bytes": model_path.stat().st_size,
        "backends": backends,
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, torch {torch.__version__}",
        "results": [],
    }
    model = load_model(model_path) if ("nemo" in backends or args.offline) else None
    if args.lead_silence:
        ci = load_set("ci")
        picked = [ci[i * len(ci) // args.lead_utts] for i in range(args.lead_utts)]
        report["lead_silence"] = lead_silence_rows(model_path, picked, args.lead_silence, args.batch_size)
    for set_name in args.sets:
        utts = load_set(set_name)
        methods: list[tuple[str, dict[int, list[str]]]] = []
        for backend in backends:
            t0 = time.perf_counter()
            methods.append((f"stream/{backend}", stream_all(backend, model, model_path, utts, args)))
            seconds = round(time.perf_counter() - t0, 1)
            report.setdefault("stream_seconds", {})[f"{set_name}/{backend}"] = seconds
        if args.offline:
            offline = {m: nemo_offline(model, utts, LATENCY_MODES[m], args.batch_size) for m in args.modes}
            methods.append(("offline", offline))
        for method, by_mode in methods:
            report["results"] += result_rows(set_name, method, by_mode, utts)
        if args.offline:
            for method, by_mode in methods[:-1]:
                report.setdefault("stream_equals_offline", {})[f"{set_name}/{method}"] = equal_counts(
                    by_mode, offline, args.modes, len(utts)
                )
    return report


def print_table(report: dict[str, Any], metric: str = "wer") -> None:
    """Markdown table of ``metric`` (``wer`` or ``end_mark_accuracy``, %): one row per (set, split, method), one
    column per latency mode."""
    rows: dict[tuple[str, str, str], dict[int, dict[str, Any]]] = {}
    modes: list[int] = []
    for r in report["results"]:
        rows.setdefault((r["set"], r["split"], r["method"]), {})[r["latency_ms"]] = r
        if r["latency_ms"] not in modes:
            modes.append(r["latency_ms"])
    print(
        f"model {report['model']} ({report['model_bytes'] / 1e6:.2f} MB), backends {report['backends']}, {metric}"
    )
    print("| set | split | method | utts/words | " + " | ".join(f"{m} ms" for m in modes) + " |")
    print("|---|---|---|---|" + "---|" * len(modes))
    for (set_name, split, method), by_mode in rows.items():
        first = next(iter(by_mode.values()))
        cells = " | ".join(f"{by_mode[m][metric]:.2f}%" if m in by_mode else "" for m in modes)
        print(f"| {set_name} | {split} | {method} | {first['utts']}/{first['words']} | {cells} |")
    if "stream_equals_offline" in report and metric == "wer":
        print("streamed text == offline text:", json.dumps(report["stream_equals_offline"]))


def lead_silence_rows(
    model_path: Path, utts: Sequence[Utt], leads_s: Sequence[float], streams: int
) -> list[dict[str, Any]]:
    """Utterances transcribed exactly (normalised text) at 160 ms after each leading silence, through the engine."""
    pcm = [read_pcm16(u.path) for u in utts]

    async def go() -> list[dict[str, Any]]:
        rows = []
        async with bench_engine(model_path, "cpu", streams) as engine:
            sem = asyncio.Semaphore(streams)

            async def one(data: np.ndarray) -> str:
                async with sem:
                    return str((await engine.transcribe(data, latency_ms=160)).text)

            for lead in leads_s:
                pad = np.zeros(int(lead * MODEL_SAMPLE_RATE), np.int16)
                hyps = await asyncio.gather(*(one(np.concatenate([pad, d])) for d in pcm))
                right = sum(
                    normalize_text(h) == normalize_text(u.text) for u, h in zip(utts, hyps, strict=True)
                )
                rows.append({"lead_silence_s": lead, "right": right, "utts": len(utts)})
        return rows

    return asyncio.run(go())


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(TINY_MODEL_PATH))
    p.add_argument("--sets", nargs="*", choices=["ci", "full"], default=["ci"])
    p.add_argument(
        "--modes", nargs="+", type=int, choices=sorted(LATENCY_MODES), default=sorted(LATENCY_MODES)
    )
    p.add_argument(
        "--backend",
        nargs="+",
        choices=["auto", "engine", "nemo"],
        default=["auto"],
        help="streaming backend(s); several are scored side by side",
    )
    p.add_argument("--offline", action="store_true", help="also score model.transcribe() (whole utterance)")
    p.add_argument(
        "--batch-size", type=int, default=16, help="streams per forward (engine: concurrent streams)"
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--lead-silence",
        nargs="*",
        type=float,
        default=[],
        help="leading-silence table: seconds of silence before speech (e.g. 0 1.5 3)",
    )
    p.add_argument("--lead-utts", type=int, default=60, help="CI utterances of the leading-silence table")
    p.add_argument("--json", default=None, help="write the full report here")
    p.add_argument("--show-errors", action="store_true", help="print up to 5 wrong transcripts per row")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args = parse_args(argv)
    report = run(args)
    print_table(report)
    print_table(report, "end_mark_accuracy")
    for row in report.get("lead_silence", []):
        print(f"leading silence {row['lead_silence_s']:.1f} s: {row['right']}/{row['utts']} right")
    if args.show_errors:
        for r in report["results"]:
            for ref, hyp in r["examples"]:
                print(
                    f"  [{r['set']}/{r['split']}/{r['method']}/{r['latency_ms']}] ref: {ref!r} hyp: {hyp!r}"
                )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
