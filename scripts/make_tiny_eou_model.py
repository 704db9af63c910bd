#!/usr/bin/env python
"""Fine-tune the bundled tiny ASR to say where an utterance ends: ``tiny_nemotron_asr_eou.nemo``.

NVIDIA's realtime EOU models (``nvidia/parakeet_realtime_eou_120m-v1``) have an ``<EOU>`` piece in their vocabulary
and are trained with plain RNNT loss on each utterance's text followed by it (NeMo's ``examples/asr/asr_eou``). This
script does the same to the bundled cased model (``pipecat_nemotron/assets/tiny_nemotron_asr.nemo``) on speech this
machine makes (espeak-ng, training sentences and voices only), with the silences a live session has: long lead
silences, pauses inside a sentence (no ``<EOU>`` there) and multi-turn clips whose turns each end in ``<EOU>``.

Stages (each alone or in order; ``all`` = tokenizer data train export)::

    tokenizer  the bundled model's 256-piece tokenizer with <EOU> appended (id 256; the blank moves to 257)
    data       synthesise training utterances and build the EOU clips and their manifests under --work-dir
    train      fine-tune from the bundled model (make_tiny_model.py's train stage; resumable with --resume)
    export     write the best checkpoint as a .nemo (default pipecat_nemotron/assets/tiny_nemotron_asr_eou.nemo)
    heldout    write tests/assets/heldout_eou/: held-out sentences in a voice and at a speed training never had
    eval       EOU placement on held-out multi-utterance sessions (pipecat_nemotron.bench.eou), JSON in --work-dir

The clips (labels are the cased sentences of :func:`make_tiny_model.punctuate`, each turn followed by ``<EOU>``)::

    single    one utterance after 0-3 s of silence: "What time is it?<EOU>"
    paused    one utterance of 3+ words with one or two 0.3-1.2 s pauses at word gaps (the bench's 300-900 ms
              and more), label unchanged: no <EOU> at a pause inside a sentence
    turns     2-3 utterances, a third of them paused, 0.4-2.5 s of silence between them: one <EOU> per turn

Each clip ends 0-0.15 s after its last utterance (60%, :data:`SHORT_TAIL_SHARE`) or 0.2-1.5 s after it (each
utterance has 0.1-0.4 s of its own tail too).

Silences are digital zeros or white noise at the level of the utterance's lead-in (half each). Reproduce
docs/TINY_MODEL.md, *End of utterance*::

    nice -n 15 .venv/bin/python scripts/make_tiny_eou_model.py tokenizer data --work-dir /work/eou_work
    nice -n 15 .venv/bin/python scripts/make_tiny_eou_model.py train --work-dir /work/eou_work --resume
    .venv/bin/python scripts/make_tiny_eou_model.py export --work-dir /work/eou_work
    .venv/bin/python scripts/make_tiny_eou_model.py eval --work-dir /work/eou_work

Same seed, same audio and labels (``sox -D``: no dither).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import struct
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import make_tiny_model as mtm  # noqa: E402

from pipecat_nemotron.agent.wav_input import read_pcm16  # noqa: E402
from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE  # noqa: E402
from pipecat_nemotron.asr.eou import EOU_PIECE  # noqa: E402
from pipecat_nemotron.bench.common import REPO_ROOT  # noqa: E402
from pipecat_nemotron.models import ASSETS_DIR, TINY_MODEL_PATH  # noqa: E402

#: The fine-tuned model, beside the bundled one.
EOU_MODEL_PATH = ASSETS_DIR / "tiny_nemotron_asr_eou.nemo"
DEFAULT_WORK_DIR = REPO_ROOT / "data" / "tiny_asr_eou"


def eou_label(spoken: str) -> str:
    """The label of one finished utterance: its cased sentence(s), then ``<EOU>``."""
    return mtm.punctuate(spoken) + EOU_PIECE


# ---- tokenizer ------------------------------------------------------------------------------------------------


def _user_defined_piece(piece: str) -> bytes:
    """A serialised ``ModelProto.pieces`` entry (field 1) of a USER_DEFINED piece with score 0.

    Written by hand: the installed protobuf runtime is older than sentencepiece's generated ``_pb2`` module.
    A repeated field may be appended after the others; parsers keep the order, so the piece gets the next id.
    """
    text = piece.encode()
    sub = b"\x0a" + bytes([len(text)]) + text + b"\x15" + struct.pack("<f", 0.0) + b"\x18\x04"  # 4: USER_DEFINED
    return b"\x0a" + bytes([len(sub)]) + sub


def stage_tokenizer(args: argparse.Namespace) -> None:
    """The bundled model's tokenizer with ``<EOU>`` appended, in NeMo's layout (tokenizer.model, .vocab, vocab.txt).

    Every old piece keeps its id, so every weight row but the blank's keeps its meaning.
    """
    import sentencepiece as spm

    out = Path(args.work_dir) / "tokenizer_eou"
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(args.base_model) as tar:
        members = {Path(m.name).name: m for m in tar.getmembers()}
        model_name = next(n for n in members if n.endswith("tokenizer.model"))
        raw = tar.extractfile(members[model_name]).read()  # type: ignore[union-attr]
    (out / "tokenizer.model").write_bytes(raw + _user_defined_piece(EOU_PIECE))
    sp = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    if pieces[-1] != EOU_PIECE or sp.encode("Hi." + EOU_PIECE, out_type=str)[-1] != EOU_PIECE:
        raise SystemExit(f"{out / 'tokenizer.model'}: {EOU_PIECE} did not become the last, whole piece")
    (out / "tokenizer.vocab").write_text("".join(f"{p}\t{sp.get_score(i)}\n" for i, p in enumerate(pieces)))
    tokens = []
    for p in pieces:
        if p in ("<s>", "</s>", "<pad>", "<unk>"):
            continue
        t = p[1:] if p.startswith(mtm.WORD_MARK) else (p if p == EOU_PIECE else f"##{p}")
        tokens.append(t if t else p[0])
    (out / "vocab.txt").write_text("\n".join(tokens) + "\n")
    print(f"[tokenizer] {len(pieces)} pieces ({EOU_PIECE} = {len(pieces) - 1}) -> {out}", flush=True)


# ---- data -----------------------------------------------------------------------------------------------------


def _silence(rng: random.Random, seconds: float, like: np.ndarray) -> np.ndarray:
    """``seconds`` of digital zeros or (half the time) white noise at the level of ``like``'s first 40 ms."""
    n = int(seconds * MODEL_SAMPLE_RATE)
    if rng.random() < 0.5:
        return np.zeros(n, np.int16)
    rms = float(np.sqrt(np.mean(like[:640].astype(np.float64) ** 2)))
    noise = np.random.default_rng(rng.randrange(2**31)).standard_normal(n) * rms
    return np.clip(np.round(noise), -32768, 32767).astype(np.int16)


def _paused(rng: random.Random, x: np.ndarray, pauses: int) -> np.ndarray | None:
    """``x`` with ``pauses`` silences of 0.3-1.2 s at distinct word gaps (None: too few gaps)."""
    gaps = mtm.word_gaps(x)
    if len(gaps) < pauses:
        return None
    cuts = sorted(rng.sample(gaps, pauses))
    pieces, at = [], 0
    for cut in cuts:
        pieces += [x[at:cut], _silence(rng, rng.uniform(0.3, 1.2), x)]
        at = cut
    return np.concatenate([*pieces, x[at:]])


#: Share of clips that end 0-0.15 s after their last utterance (plus its own 0.1-0.4 s tail): RNNT emits a label
#: anywhere before the clip ends, so without short tails the model learns to say <EOU> late (~0.8 s after the
#: speech in the first run); with them it must say it within ~0.1-0.55 s.
SHORT_TAIL_SHARE = 0.6


def stage_data(args: argparse.Namespace) -> None:
    """Training utterances (training sentences, voices and augmentation; a fifth accent-mixed), the three clip
    kinds of the module docstring, and a small validation set (validation sentences, same clip kinds)."""
    work = Path(args.work_dir)
    rng = random.Random(args.seed + 40)
    n_accent = args.n_utterances // 5
    specs = mtm.make_specs(
        rng, args.n_utterances - n_accent, "train", "eutt", mtm.TRAIN_BASES, mtm.TRAIN_VARIANTS, "train"
    )
    accents = mtm.make_accent_specs(rng, n_accent, "eacc")
    val = mtm.make_specs(rng, args.n_val, "val", "eval", mtm.TRAIN_BASES, mtm.TRAIN_VARIANTS, "light")
    sets = (("utt", specs), ("utt_accent", accents), ("utt_val", val))
    rendered: dict[str, list[dict[str, Any]]] = {}
    for name, set_specs in sets:
        manifest = work / f"{name}_manifest.json"
        if manifest.exists() and sum(1 for _ in manifest.open()) == len(set_specs):  # same seed: same audio
            rendered[name] = [json.loads(line) for line in manifest.open()]
        else:
            rendered[name] = mtm.render_set(set_specs, work / name, manifest, args.workers)
    rows, val_rows = rendered["utt"] + rendered["utt_accent"], rendered["utt_val"]
    _clips(rng, rows, args.n_clips, work / "clips", work / "train_eou_manifest.json")
    _clips(rng, val_rows, args.n_val, work / "clips_val", work / "val_eou_manifest.json")


def _tail_s(rng: random.Random, last: bool) -> float:
    """Silence after an utterance of a clip, s: a live pause between turns, or the clip's end."""
    if not last:  # between turns: the next one starts after a live pause
        return rng.uniform(0.4, 2.5)
    if rng.random() < SHORT_TAIL_SHARE:  # the clip ends soon after the speech: <EOU> must come by then
        return rng.uniform(0.0, 0.15)
    return rng.uniform(0.2, 1.5)


def _clips(rng: random.Random, rows: Sequence[dict[str, Any]], n: int, out_dir: Path, manifest: Path) -> None:
    """``n`` clips of the three kinds (single 30%, paused 30%, turns 40%) from the utterances ``rows``."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    short = [r for r in rows if r["duration"] <= 3.0]
    wordy = [r for r in rows if r["duration"] <= 4.0 and len(r["text"].split()) >= 3]
    kinds: dict[str, int] = {"single": 0, "paused": 0, "turns": 0}
    seconds = 0.0
    with manifest.open("w") as f:
        i = 0
        while i < n:
            k = rng.random()
            if k < 0.3:
                kind, parts = "single", [rng.choice(rows)]
            elif k < 0.6:
                kind, parts = "paused", [rng.choice(wordy)]
            else:
                kind, parts = "turns", rng.sample(short, rng.choice((2, 2, 3)))
            audio = [read_pcm16(Path(r["audio_filepath"])) for r in parts]
            if kind == "paused":
                x = _paused(rng, audio[0], rng.choice((1, 1, 2)))
                if x is None:
                    continue
                audio = [x]
            elif kind == "turns":
                for j, r in enumerate(parts):
                    if len(r["text"].split()) >= 3 and rng.random() < 0.33:
                        x = _paused(rng, audio[j], 1)
                        audio[j] = audio[j] if x is None else x
            lead = rng.uniform(0.0, 3.0) if kind == "single" else rng.uniform(0.0, 1.5)
            pieces = [_silence(rng, lead, audio[0])]
            for j, a in enumerate(audio):
                pieces += [a, _silence(rng, _tail_s(rng, last=j + 1 == len(audio)), a)]
            x = np.concatenate(pieces)
            path = out_dir / f"{kind}_{i:06d}.wav"
            mtm.write_wav(path, x)
            spoken = [r["text"] for r in parts]
            row = {
                "audio_filepath": str(path),
                "duration": round(x.size / MODEL_SAMPLE_RATE, 4),
                "text": " ".join(eou_label(s) for s in spoken),
                "spoken": " ".join(spoken),
                "parts": spoken,
                "kind": kind,
            }
            f.write(json.dumps(row) + "\n")
            kinds[kind] += 1
            seconds += x.size / MODEL_SAMPLE_RATE
            i += 1
    print(f"[data] {manifest.name}: {n} clips, {seconds / 3600:.2f} h, {kinds}", flush=True)


# ---- training and export --------------------------------------------------------------------------------------


def _mtm_args(args: argparse.Namespace, stage: str) -> argparse.Namespace:
    """make_tiny_model.py's options for ``stage`` (train or export) of this fine-tune."""
    work = Path(args.work_dir)
    argv = [
        stage,
        "--labels", "plain",  # the manifests' labels are used as written (cased, with <EOU>)
        "--tokenizer-dir", str(work / "tokenizer_eou"),
        "--run-dir", str(work / "runs" / args.run_name),
        "--seed", str(args.seed),
        "--train-manifest", str(work / "train_eou_manifest.json"),
        "--val-manifest", str(work / "val_eou_manifest.json"),
    ]  # fmt: skip
    if stage == "train":
        argv += [
            "--init-from-nemo", str(args.base_model),
            "--no-spec-augment",
            "--lr", str(args.lr), "--warmup-steps", "20", "--batch-size", "8", "--max-steps", "20000",
            "--max-minutes", str(args.max_minutes), "--val-every", "100000", "--threads", str(args.threads),
            "--checkpoint-minutes", "8", "--print-every", "25",
        ]  # fmt: skip
        if args.resume:
            argv.append("--resume")
    else:
        argv += ["--out", str(args.out)] + (["--checkpoint", args.checkpoint] if args.checkpoint else [])
    return mtm.parse_args(argv)


def stage_train(args: argparse.Namespace) -> None:
    """Fine-tune from ``--base-model``: every weight copied, ``<EOU>``'s rows from the full stop's
    (:data:`make_tiny_model.MARKER_ROWS`); last.ckpt every 8 minutes; ``--resume`` continues a killed run."""
    mtm.stage_train(_mtm_args(args, "train"))


def stage_export(args: argparse.Namespace) -> None:
    """Write the run's best checkpoint as a self-contained ``.nemo`` (at most 10 MB)."""
    mtm.stage_export(_mtm_args(args, "export"))


# ---- held-out speech and evaluation -------------------------------------------------------------------------

#: Held-out clips in voices and at speeds training never had: the unseen accent and unseen variants, faster than
#: the 125-250 words per minute of every training set.
UNSEEN_FAST_SPEEDS = (265, 300)


def stage_heldout(args: argparse.Namespace) -> None:
    """``tests/assets/heldout_eou/``: ``--n-heldout`` held-out (test-bucket) sentences of 3+ words spoken by unseen
    voices at 265-300 words per minute, clean (no noise: small FLAC files), with a manifest ``bench`` reads."""
    import soundfile

    out = REPO_ROOT / "tests" / "assets" / "heldout_eou"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    rng = random.Random(args.seed + 41)
    specs = []
    seen: set[str] = set()
    while len(specs) < args.n_heldout:
        text = mtm.sample_sentence(rng)
        if mtm.heldout_bucket(text) != "test" or not 3 <= len(text.split()) <= 9 or text in seen:
            continue
        seen.add(text)
        base = rng.choice(mtm.UNSEEN_BASES + mtm.TRAIN_BASES)
        var = rng.choice(mtm.UNSEEN_VARIANTS)
        specs.append(
            mtm.UttSpec(
                name=f"unseen_fast_{len(specs):03d}",
                text=text,
                voice=f"{base}+{var}",
                speed=rng.randint(*UNSEEN_FAST_SPEEDS),
                pitch=rng.randint(15, 85),
                gap=0,
                seed=rng.randrange(2**31),
                aug="none",
            )
        )
    rows = []
    for spec in specs:
        x = mtm.render(spec)
        soundfile.write(str(out / f"{spec.name}.flac"), x, MODEL_SAMPLE_RATE)
        rows.append({"audio": f"{spec.name}.flac", "text": spec.text, "split": "unseen_fast", "voice": spec.voice,
                     "speed": spec.speed})
    (out / "manifest.json").write_text(json.dumps(rows, indent=1) + "\n")
    total = sum(f.stat().st_size for f in out.iterdir())
    print(f"[heldout] {out}: {len(rows)} clips, {total / 1e3:.0f} kB", flush=True)


def stage_eval(args: argparse.Namespace) -> None:
    """EOU placement of ``--out`` on sessions of 5 held-out utterances (half with a 300-900 ms pause inside, 2 s
    after each): per split, utterances ended, missed, cut inside, and the delay after the speech end."""
    import asyncio

    from pipecat_nemotron.asr import EngineConfig, NemotronEngine
    from pipecat_nemotron.bench.audio import HELDOUT_DIR
    from pipecat_nemotron.bench.eou import build_session, eou_times, place, summarize

    sets: dict[str, list[tuple[np.ndarray, str]]] = {}
    for manifest in (HELDOUT_DIR / "manifest.json", REPO_ROOT / "tests" / "assets" / "heldout_eou" / "manifest.json"):
        if not manifest.exists():
            continue
        for row in json.loads(manifest.read_text()):
            x, _ = _read_audio(manifest.parent / row["audio"])
            sets.setdefault(row["split"], []).append((x, row["text"]))

    async def run() -> dict[str, Any]:
        config = EngineConfig(model=str(args.out), device="cpu", cpu_threads=args.threads, max_streams=8)
        report: dict[str, Any] = {}
        async with NemotronEngine(config) as engine:
            for split, clips in sets.items():
                rng = random.Random(args.seed)
                sessions = [build_session(clips[i : i + 5], rng) for i in range(0, len(clips), 5)]
                slots = asyncio.Semaphore(config.max_streams)

                async def one(audio: np.ndarray, slots: asyncio.Semaphore = slots) -> list[float]:
                    async with slots:
                        return await eou_times(engine, audio, args.latency_ms)

                times = await asyncio.gather(*(one(audio) for audio, _ in sessions))
                placements = [p for (_, spans), t in zip(sessions, times, strict=True) for p in place(spans, t)]
                report[split] = summarize(placements)
                print(f"[eval] {split}: {report[split]}", flush=True)
                report[split]["cut_inside"] = [
                    {"text": p.span.text, "paused": p.span.paused, "at_ms": [round(t - p.span.start_ms) for t in p.inside]}
                    for p in placements
                    if p.inside
                ]
                report[split]["missed_texts"] = [p.span.text for p in placements if p.delay_ms is None]
        return report

    report = asyncio.run(run())
    path = Path(args.work_dir) / f"eval_{Path(args.out).stem}.json"
    path.write_text(json.dumps({"model": str(args.out), "latency_ms": args.latency_ms, **report}, indent=1))
    print(f"[eval] -> {path}", flush=True)


def _read_audio(path: Path) -> tuple[np.ndarray, int]:
    """An audio file as int16 samples and its rate."""
    import soundfile

    x, rate = soundfile.read(str(path), dtype="int16")
    return x, rate


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stages", nargs="+", choices=["all", "tokenizer", "data", "train", "export", "heldout", "eval"])
    p.add_argument("--work-dir", default=str(DEFAULT_WORK_DIR), help="data, tokenizer and runs (not in git)")
    p.add_argument("--base-model", type=Path, default=TINY_MODEL_PATH, help="the model fine-tuned")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--workers", type=int, default=2, help="processes for synthesis")
    p.add_argument("--n-utterances", type=int, default=3600, help="synthesised training utterances")
    p.add_argument("--n-clips", type=int, default=5000, help="training clips built from them")
    p.add_argument("--n-val", type=int, default=60, help="validation utterances and clips")
    p.add_argument("--run-name", default="eou1", help="run folder under <work-dir>/runs/")
    p.add_argument("--lr", type=float, default=2e-4, help="peak learning rate")
    p.add_argument("--max-minutes", type=float, default=60.0, help="training budget (clock-driven schedule)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--resume", action="store_true", help="continue <run>/checkpoints/last.ckpt if there is one")
    p.add_argument("--out", type=Path, default=EOU_MODEL_PATH, help="export: the .nemo written; eval: the model")
    p.add_argument("--checkpoint", default=None, help="export this checkpoint instead of the run's best")
    p.add_argument("--n-heldout", type=int, default=16, help="heldout: clips written")
    p.add_argument("--latency-ms", type=int, default=160, help="eval: latency mode")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the requested stages."""
    stages = {
        "tokenizer": stage_tokenizer,
        "data": stage_data,
        "train": stage_train,
        "export": stage_export,
        "heldout": stage_heldout,
        "eval": stage_eval,
    }
    mtm.run_stages(parse_args(argv), stages, ["tokenizer", "data", "train", "export"])


if __name__ == "__main__":
    main()
