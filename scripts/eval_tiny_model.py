#!/usr/bin/env python
"""Word error rate of the tiny Nemotron-family model per latency mode, on the held-out sets, by streaming.

Held-out sets (see ``scripts/make_tiny_model.py``): sentences never seen in training, spoken by

* ``seen_voice``: espeak-ng voices used in training;
* ``unseen_voice``: voices never used in training (an unseen accent or an unseen voice variant).

Sets: ``ci`` is the small subset bundled in ``tests/assets/heldout/``; ``full`` is the few-hundred-utterance
sets under ``data/tiny_asr/`` (regenerate with ``make_tiny_model.py heldout``).

Backends:

* ``engine``: ``pipecat_nemotron.engine.NemotronEngine`` (the streaming engine of this package), all
  utterances of a mode submitted concurrently so that the engine batches them;
* ``nemo``: NeMo's model-level cache-aware streaming (``conformer_stream_step`` chunk by chunk with
  ``CacheAwareStreamingAudioBuffer``), an independent cross-check of the engine (the script itself needs the
  ``pipecat_nemotron`` package for its WER and audio helpers);
* ``auto`` (default): ``engine`` if it imports, else ``nemo``.

``--offline`` adds ``model.transcribe()`` (whole utterance, same attention context) for comparison.

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

from pipecat_nemotron.bench.common import normalize_text, read_pcm16, word_errors
from pipecat_nemotron.engine.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.engine.config import LATENCY_MODES
from pipecat_nemotron.models import TINY_MODEL_PATH

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = TINY_MODEL_PATH
CI_MANIFEST = REPO / "tests" / "assets" / "heldout" / "manifest.json"
FULL_MANIFESTS = {
    "seen_voice": REPO / "data" / "tiny_asr" / "test_seen_voice_manifest.json",
    "unseen_voice": REPO / "data" / "tiny_asr" / "test_unseen_voice_manifest.json",
}
# latency mode (ms) -> right attention context in 80 ms encoder frames; left context is 70 frames.
MODES: dict[int, int] = LATENCY_MODES
SAMPLE_RATE = MODEL_SAMPLE_RATE


# ------------------------------------------------------------------------------------------------------------
# Data and scoring
# ------------------------------------------------------------------------------------------------------------
@dataclass
class Utt:
    """One held-out utterance."""

    path: Path
    text: str
    split: str


@dataclass
class Score:
    """Accumulated word errors of one (set, split, mode, backend)."""

    errors: int = 0
    words: int = 0
    utts: int = 0
    wrong_utts: int = 0
    examples: list[tuple[str, str]] = field(default_factory=list)

    @property
    def wer(self) -> float:
        """Word error rate in percent."""
        return 100.0 * self.errors / max(1, self.words)


def load_set(name: str) -> list[Utt]:
    """Utterances of the ``ci`` or ``full`` held-out set."""
    if name == "ci":
        rows = json.loads(CI_MANIFEST.read_text())
        return [Utt(CI_MANIFEST.parent / r["audio"], r["text"], r["split"]) for r in rows]
    utts: list[Utt] = []
    for split, manifest in FULL_MANIFESTS.items():
        if not manifest.exists():
            raise SystemExit(f"{manifest} is missing: run `scripts/make_tiny_model.py heldout` first")
        for line in manifest.open():
            r = json.loads(line)
            utts.append(Utt(Path(r["audio_filepath"]), r["text"], split))
    return utts


def score(utts: Sequence[Utt], hyps: Sequence[str]) -> dict[str, Score]:
    """Per-split scores."""
    out: dict[str, Score] = {}
    for u, h in zip(utts, hyps, strict=True):
        s = out.setdefault(u.split, Score())
        ref, hyp = normalize_text(u.text), normalize_text(h)
        e = word_errors(ref, hyp)
        s.errors += e
        s.words += len(ref.split())
        s.utts += 1
        if e:
            s.wrong_utts += 1
            if len(s.examples) < 5:
                s.examples.append((ref, hyp))
    return out


# ------------------------------------------------------------------------------------------------------------
# NeMo model-level backends
# ------------------------------------------------------------------------------------------------------------
def load_model(path: Path) -> Any:
    """Restore the ``.nemo`` on CPU in eval mode."""
    from nemo.collections.asr.models import ASRModel

    from pipecat_nemotron.engine.loading import quiet_nemo

    with quiet_nemo(logging.WARNING):
        model = ASRModel.restore_from(str(path), map_location="cpu")
    model.eval()
    return model


def nemo_stream(model: Any, utts: Sequence[Utt], right: int, batch_size: int) -> list[str]:
    """Cache-aware streaming with NeMo's model-level API, ``batch_size`` utterances per forward.

    Each utterance is followed by ``(right + 2) * 80 ms`` of silence so that its last frames get their full
    right context (the flush a live stream does at end of turn) and no final partial chunk is dropped.
    """
    import torch
    from nemo.collections.asr.parts.utils.streaming_utils import CacheAwareStreamingAudioBuffer

    model.encoder.set_default_att_context_size([70, right])
    model.eval()
    pad = np.zeros(int((right + 2) * 0.08 * SAMPLE_RATE), dtype=np.float32)
    texts: list[str] = []
    for start in range(0, len(utts), batch_size):
        batch = utts[start : start + batch_size]
        buf = CacheAwareStreamingAudioBuffer(model=model, online_normalization=False)
        for u in batch:
            x = np.frombuffer(read_pcm16(u.path), dtype="<i2").astype(np.float32) / 32768.0
            buf.append_audio(np.concatenate([x, pad]), stream_id=-1)
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
        texts += [h.text if hasattr(h, "text") else str(h) for h in (hyps or [])]
    return texts


def nemo_offline(model: Any, utts: Sequence[Utt], right: int, batch_size: int) -> list[str]:
    """Whole-utterance ``model.transcribe()`` with the same attention context."""
    from pipecat_nemotron.engine.loading import quiet_nemo

    model.encoder.set_default_att_context_size([70, right])
    with quiet_nemo(logging.WARNING):
        out = model.transcribe([str(u.path) for u in utts], batch_size=batch_size, verbose=False)
    model.eval()  # transcribe() can leave submodules in train mode (dropout on)
    if isinstance(out, tuple):
        out = out[0]
    return [h.text if hasattr(h, "text") else str(h) for h in out]


# ------------------------------------------------------------------------------------------------------------
# Engine backend
# ------------------------------------------------------------------------------------------------------------
def engine_available() -> bool:
    """Whether ``pipecat_nemotron.engine`` exposes the streaming engine."""
    try:
        from pipecat_nemotron.engine import EngineConfig, NemotronEngine  # noqa: F401
    except ImportError:
        return False
    return True


async def engine_stream(
    model_path: Path, utts: Sequence[Utt], modes: Sequence[int], streams: int
) -> dict[int, list[str]]:
    """Transcribe every utterance in every mode through ``NemotronEngine`` (concurrent, so batched)."""
    from pipecat_nemotron.engine import EngineConfig, NemotronEngine

    engine = NemotronEngine(
        EngineConfig(model=str(model_path), device="cpu", max_streams=streams, max_batch_size=streams)
    )
    await engine.start()
    try:
        out: dict[int, list[str]] = {}
        sem = asyncio.Semaphore(streams)
        pcm = [read_pcm16(u.path) for u in utts]

        async def one(data: bytes, mode: int) -> str:
            async with sem:
                result = await engine.transcribe(data, latency_ms=mode)
                return str(result.text)

        for mode in modes:
            out[mode] = list(await asyncio.gather(*(one(d, mode) for d in pcm)))
        return out
    finally:
        await engine.stop()


# ------------------------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate and return a JSON-able report."""
    import torch

    torch.set_num_threads(args.threads)
    model_path = Path(args.model)
    backends: list[str] = []
    for b in args.backend:
        if b == "auto":
            b = "engine" if engine_available() else "nemo"
        if b not in backends:
            backends.append(b)
    report: dict[str, Any] = {
        "model": str(model_path.relative_to(REPO) if model_path.is_relative_to(REPO) else model_path),
        "model_bytes": model_path.stat().st_size,
        "backends": backends,
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, torch {torch.__version__}",
        "results": [],
    }
    model = load_model(model_path) if ("nemo" in backends or args.offline) else None
    for set_name in args.sets:
        utts = load_set(set_name)
        methods: list[tuple[str, dict[int, list[str]]]] = []
        for backend in backends:
            t0 = time.perf_counter()
            if backend == "engine":
                streamed = asyncio.run(engine_stream(model_path, utts, args.modes, args.batch_size))
            else:
                streamed = {m: nemo_stream(model, utts, MODES[m], args.batch_size) for m in args.modes}
            methods.append((f"stream/{backend}", streamed))
            report.setdefault("stream_seconds", {})[f"{set_name}/{backend}"] = round(
                time.perf_counter() - t0, 1
            )
        if args.offline:
            methods.append(
                ("offline", {m: nemo_offline(model, utts, MODES[m], args.batch_size) for m in args.modes})
            )
        for method, by_mode in methods:
            for mode, hyps in by_mode.items():
                for split, s in sorted(score(utts, hyps).items()):
                    report["results"].append(
                        {
                            "set": set_name,
                            "split": split,
                            "method": method,
                            "latency_ms": mode,
                            "wer": round(s.wer, 2),
                            "errors": s.errors,
                            "words": s.words,
                            "utts": s.utts,
                            "wrong_utts": s.wrong_utts,
                            "examples": s.examples,
                        }
                    )
        if args.offline:
            offline = methods[-1][1]
            for method, by_mode in methods[:-1]:
                same = {
                    m: sum(
                        normalize_text(a) == normalize_text(b)
                        for a, b in zip(by_mode[m], offline[m], strict=True)
                    )
                    for m in args.modes
                }
                report.setdefault("stream_equals_offline", {})[f"{set_name}/{method}"] = {
                    m: f"{n}/{len(utts)}" for m, n in same.items()
                }
    return report


def print_table(report: dict[str, Any]) -> None:
    """Markdown table: one row per (set, split, method), one column per latency mode."""
    rows: dict[tuple[str, str, str], dict[int, dict[str, Any]]] = {}
    modes: list[int] = []
    for r in report["results"]:
        rows.setdefault((r["set"], r["split"], r["method"]), {})[r["latency_ms"]] = r
        if r["latency_ms"] not in modes:
            modes.append(r["latency_ms"])
    print(f"model {report['model']} ({report['model_bytes'] / 1e6:.2f} MB), backends {report['backends']}")
    print("| set | split | method | utts/words | " + " | ".join(f"{m} ms" for m in modes) + " |")
    print("|---|---|---|---|" + "---|" * len(modes))
    for (set_name, split, method), by_mode in rows.items():
        first = next(iter(by_mode.values()))
        cells = " | ".join(f"{by_mode[m]['wer']:.2f}%" if m in by_mode else "" for m in modes)
        print(f"| {set_name} | {split} | {method} | {first['utts']}/{first['words']} | {cells} |")
    if "stream_equals_offline" in report:
        print("streamed text == offline text:", json.dumps(report["stream_equals_offline"]))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--sets", nargs="+", choices=["ci", "full"], default=["ci"])
    p.add_argument("--modes", nargs="+", type=int, choices=sorted(MODES), default=sorted(MODES))
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
    p.add_argument("--json", default=None, help="write the full report here")
    p.add_argument("--show-errors", action="store_true", help="print up to 5 wrong transcripts per row")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args = parse_args(argv)
    report = run(args)
    print_table(report)
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
