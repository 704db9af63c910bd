#!/usr/bin/env python
"""Train the tiny Magpie TTS bundled with pipecat_nemotron: a codec and a ``decoder_ce`` Magpie that speak.

Both models are NeMo's own classes (``AudioCodecModel``, ``MagpieTTSModel``) built from the configs of
``pipecat_nemotron/tts/magpie/tiny.py`` (widened where noted), trained on CPU on speech that espeak-ng makes here at
22,050 Hz (its native rate). The five baked speakers are five espeak-ng voices; their context embeddings are learnt
as parameters (the released checkpoint's baked speakers stand in for its context encoder the same way).

Stages (each can be run alone; ``all`` runs them in order)::

    data        synthesise train/test utterances (22,050 Hz mono int16 wav + manifests) under --work/data/
    codec       train the codec (mel + multi-resolution STFT + time-domain losses, no discriminator); resumable;
                ``--decoder-only`` then fine-tunes its decoder alone (same codes: a Magpie trained on them stays
                valid), with ``--gan`` against a light discriminator
    codec-export  write the codec ``.nemo`` (--work/tiny_codec.nemo) from the codec run's checkpoint
    codec-eval  tiny ASR on codec-resynthesised held-out speech vs on the originals (16 kHz), per speaker
    codec-onset  the same with each utterance's start and rest taken from the original and the codec in turn
    codes       encode every training utterance with the exported codec (codes.pt)
    tts         train the Magpie (NeMo's ``process_batch`` losses: codebook CE, local transformer, alignment);
                resumable
    tts-probe   the Magpie's codebook CE with its own text (with and without the training prior) and another's
    tts-export  write the Magpie ``.nemo`` (--work/tiny_magpie.nemo) from the TTS run's checkpoint
    tts-eval    synthesise held-out sentences (fast step via MagpieEngine, and NeMo's generate_speech), transcribe
                with the tiny ASR, WER per speaker
    bundle      copy both ``.nemo`` files into pipecat_nemotron/assets/
    park        keep the training runs between machines: each run's last checkpoint without its optimizer
                (weights, progress, random states) under scripts/tiny_magpie_runs/, to commit
    unpark      put the parked runs back as --work/<run>/last.pt, so that ``--resume`` continues them (the
                optimizer starts afresh and warms up again over --warmup-steps)
    cost        first audio and per-frame time of the exported Magpie vs today's random tiny model (fast step)

Every training stage checkpoints every ``--ckpt-minutes`` and stops after ``--max-minutes``; the same command with
``--resume`` continues from the last checkpoint (its learning-rate schedule continues in steps and minutes).
Run training niced on one thread (the default: ``--threads 1``)::

    nice -n 15 .venv/bin/python scripts/make_tiny_magpie.py codec --max-minutes 60 --resume

Held-out sentences are chosen by an MD5 hash of their lower-case words (``make_tiny_model.heldout_bucket``): no
test sentence is in training. Same seed, same audio (espeak-ng is deterministic).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import wave
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_model import heldout_bucket, punctuate, sample_sentence  # noqa: E402

from pipecat_nemotron.bench.common import REPO_ROOT  # noqa: E402
from pipecat_nemotron.models import TINY_MODEL_PATH  # noqa: E402
from pipecat_nemotron.tts.magpie.options import VOICES  # noqa: E402

SAMPLE_RATE = 22050
"""espeak-ng's native rate and the codec's."""

WORK_DIR = Path(os.environ.get("TINY_MAGPIE_WORK", REPO_ROOT / "runs" / "tiny_magpie"))

#: The five baked speakers (the released model's john, sofia, aria, jason, leo): espeak-ng voice, words per minute,
#: pitch (0-99). Each voice is one the tiny ASR was trained on.
SPEAKERS: tuple[tuple[str, int, int], ...] = (
    ("en-us+m3", 160, 45),
    ("en-us+f2", 160, 55),
    ("en-gb+f3", 160, 60),
    ("en-gb+m1", 160, 40),
    ("en-us+m7", 160, 50),
)
SPEAKER_NAMES = tuple(VOICES)  # baked speaker index -> voice name

# --------------------------------------------------------------------------------------------------------------
# Text: the tiny ASR's voice-agent sentences (cased, punctuated) and, beyond its vocabulary, reply-like sentences.
# --------------------------------------------------------------------------------------------------------------
_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen"
).split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_words(n: int) -> str:
    """English words of ``0 <= n < 100``."""
    if n < 20:
        return _ONES[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens] + (f"-{_ONES[ones]}" if ones else "")


_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_WEATHER = ("sunny", "cloudy", "rainy", "windy", "cold", "warm", "mild", "clear", "foggy", "snowy")
_OPS = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b}


def reply_sentence(rng: random.Random) -> str:
    """A reply an assistant might give (words beyond the tiny ASR's vocabulary; training only)."""
    k = rng.random()
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    if k < 0.25:
        op = rng.choice(tuple(_OPS))
        value = _OPS[op](a, b)
        answer = number_words(value) if value >= 0 else "minus " + number_words(-value)
        return (
            rng.choice(("", "Sure. ", "Okay. "))
            + f"{number_words(a).capitalize()} {op} {number_words(b)} is {answer}."
        )
    if k < 0.4:
        n = rng.choice((1, 2, 3, 5, 10, 12, 15, 20, 25, 30, 40, 45, 60, 90))
        unit = "minute" if n == 1 else "minutes"
        return rng.choice(("Done. ", "Okay, ", "")) + f"I set a timer for {number_words(n)} {unit}."
    if k < 0.55:
        day = rng.choice(("today", "tomorrow", f"on {rng.choice(_DAYS)}"))
        w = rng.choice(_WEATHER)
        t = rng.randint(0, 35)
        return f"The weather {day} is {w}, with a high of {number_words(t)} degrees."
    if k < 0.65:
        h, m = rng.randint(1, 12), rng.choice((0, 5, 10, 15, 20, 30, 40, 45, 50))
        when = f"{number_words(h)} o'clock" if m == 0 else f"{number_words(h)} {number_words(m)}"
        return f"It is {when}" + rng.choice((".", " in the morning.", " in the evening.", " now."))
    if k < 0.75:
        return f"I will remind you on {rng.choice(_DAYS)}" + rng.choice(
            (".", f" at {number_words(rng.randint(1, 12))}.", " morning.", " evening.")
        )
    return rng.choice(
        (
            "Hello! How can I help you today?",
            "Hi there. What can I do for you?",
            "You're welcome.",
            "Sorry, I did not catch that. Could you say it again?",
            "The timer is cancelled.",
            "Your timer has finished.",
            "Goodbye, and have a nice day.",
            "I can tell you the time, the weather, or set a timer.",
            "Sure, here is the answer.",
            "That is a good question.",
            "I am a small voice assistant running on your computer.",
            "Let me check that for you.",
            "Of course. Anything else?",
            "Yes, that is right.",
            "No, that is not right.",
            "Today is a good day for a walk.",
            "Please wait a moment.",
            "Thank you for asking.",
        )
    )


def agent_sentence(rng: random.Random) -> str:
    """One of the tiny ASR's voice-agent sentences, cased and punctuated as an LLM writes it."""
    return punctuate(sample_sentence(rng))


def words_of(text: str) -> str:
    """Lower-case words of a written sentence (the held-out hash's input)."""
    from pipecat_nemotron.bench.wer import normalize_text

    return normalize_text(text)


def training_texts(rng: random.Random, n_agent: int, n_reply: int) -> list[str]:
    """Training sentences: ``n_agent`` draws of the agent grammar and ``n_reply`` replies, none held out."""
    out: list[str] = []
    while len(out) < n_agent:
        raw = sample_sentence(rng)
        if heldout_bucket(raw) == "train":
            out.append(punctuate(raw))
    while len(out) < n_agent + n_reply:
        text = reply_sentence(rng)
        if heldout_bucket(words_of(text)) == "train":
            out.append(text)
    return out


#: Two digit words in a row (a phone number, a code), over a sentence's lower-case words.
_DIGIT = "(?:zero|one|two|three|four|five|six|seven|eight|nine)"
DIGIT_RUN = re.compile(rf"\b{_DIGIT} {_DIGIT}\b")


def digit_texts(rng: random.Random, n: int) -> list[str]:
    """``n`` more training sentences of the agent grammar with a digit string, none held out.

    Digit strings are a twelfth of the grammar's draws but a fifth of the held-out sentences, and where the Magpie
    errs most (a repeated digit said once, "My number is" said "Nine").
    """
    out: list[str] = []
    while len(out) < n:
        raw = sample_sentence(rng)
        if DIGIT_RUN.search(raw) and heldout_bucket(raw) == "train":
            out.append(punctuate(raw))
    return out


def test_texts(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct held-out sentences of the agent grammar (the tiny ASR's vocabulary), 3+ words each."""
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        raw = sample_sentence(rng)
        if heldout_bucket(raw) == "test" and raw not in seen:
            seen.add(raw)
            out.append(punctuate(raw))
    return out


# --------------------------------------------------------------------------------------------------------------
# Audio
# --------------------------------------------------------------------------------------------------------------
def espeak(text: str, speaker: int) -> np.ndarray:
    """espeak-ng speech of ``text`` by baked speaker ``speaker``: 22,050 Hz int16, trimmed and padded, -3 dBFS peak.

    Each utterance gets 0.1 s of silence before and 0.15 s after the voice, so every clip starts and ends alike.
    """
    voice, wpm, pitch = SPEAKERS[speaker]
    wav = subprocess.run(
        ["espeak-ng", "-v", voice, "-s", str(wpm), "-p", str(pitch), "--stdout", text],
        check=True,
        capture_output=True,
    ).stdout
    data = wav[wav.index(b"data") + 8 :]  # espeak-ng writes a streaming header (no valid length)
    x = np.frombuffer(data[: len(data) // 2 * 2], dtype="<i2").astype(np.float64)
    idx = np.flatnonzero(np.abs(x) > 100)
    if idx.size:
        x = x[idx[0] : idx[-1] + 1]
    x = np.concatenate([np.zeros(int(0.1 * SAMPLE_RATE)), x, np.zeros(int(0.15 * SAMPLE_RATE))])
    x *= 0.708 * 32767 / (np.max(np.abs(x)) + 1e-9)
    return np.round(x).astype(np.int16)


def write_wav(path: Path, samples: np.ndarray, rate: int = SAMPLE_RATE) -> None:
    """Mono int16 wav."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.astype("<i2").tobytes())


def read_wav(path: Path) -> np.ndarray:
    """Samples of a mono int16 wav."""
    with wave.open(str(path), "rb") as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


def to_16k(x: np.ndarray) -> np.ndarray:
    """22,050 Hz float samples resampled to the tiny ASR's 16 kHz (polyphase, 320/441)."""
    from scipy.signal import resample_poly

    return resample_poly(x, 320, 441)


def _render(job: tuple[str, int, str]) -> dict[str, Any]:
    text, speaker, path = job
    x = espeak(text, speaker)
    write_wav(Path(path), x)
    return {"audio": path, "text": text, "speaker": speaker, "samples": int(x.size)}


def read_manifest(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines manifest."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_manifest(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Write a JSON-lines manifest."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def stage_data(args: argparse.Namespace) -> None:
    """Training utterances (each sentence by one random speaker) and held-out sentences by every speaker."""
    rng = random.Random(args.seed)
    data = args.work / "data"
    for split in ("train", "test"):
        (data / split).mkdir(parents=True, exist_ok=True)
    texts = training_texts(rng, args.n_agent, args.n_reply)
    jobs = [
        (t, rng.randrange(len(SPEAKERS)), str(data / "train" / f"{i:05d}.wav")) for i, t in enumerate(texts)
    ]
    # Their own random stream: the sentences above stay the same whatever --n-digit-strings is.
    digit_rng = random.Random(args.seed + 2)
    for t in digit_texts(digit_rng, args.n_digit_strings):
        jobs.append((t, digit_rng.randrange(len(SPEAKERS)), str(data / "train" / f"{len(jobs):05d}.wav")))
    texts = [t for t, _, _ in jobs]
    tests = test_texts(random.Random(args.seed + 1), args.n_test)
    train_words = {words_of(t) for t in texts}
    overlap = [t for t in tests if words_of(t) in train_words]
    if overlap:
        raise SystemExit(f"held-out sentences in training: {overlap[:3]}")
    test_jobs = [
        (t, s, str(data / "test" / f"{i:03d}_{s}.wav"))
        for i, t in enumerate(tests)
        for s in range(len(SPEAKERS))
    ]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        train_rows = list(pool.map(_render, jobs, chunksize=64))
        test_rows = list(pool.map(_render, test_jobs, chunksize=16))
    write_manifest(data / "train.jsonl", train_rows)
    write_manifest(data / "test.jsonl", test_rows)
    hours = sum(r["samples"] for r in train_rows) / SAMPLE_RATE / 3600
    print(
        f"[data] {len(train_rows)} training utterances ({len({r['text'] for r in train_rows})} distinct sentences, "
        f"{hours:.2f} h), {len(test_rows)} held-out ({len(tests)} sentences x {len(SPEAKERS)} speakers) "
        f"in {time.perf_counter() - started:.0f} s",
        flush=True,
    )


# --------------------------------------------------------------------------------------------------------------
# Training loop shared by the codec and the TTS
# --------------------------------------------------------------------------------------------------------------
def set_threads(n: int) -> None:
    """Torch intra-op threads (training runs on one, niced, beside other work)."""
    import torch

    torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # settable once per process (a second stage keeps the first's)
        torch.set_num_interop_threads(1)


def lr_factor(step: int, elapsed_min: float, args: argparse.Namespace, rewarm_from: int | None = None) -> float:
    """Linear warm-up, then cosine decay to 1% over ``max(step / max_steps, minutes / max_minutes)``.

    ``rewarm_from``: the step at which a fresh optimizer took over a run (an unparked one): the rate ramps up again
    over ``warmup_steps`` from there, as Adam's first moments are empty.
    """
    # A new cycle (--cycle-from) warms up and decays again from its first step to --max-steps.
    step, rewarm_from = step - args.cycle_from, None if rewarm_from is None else rewarm_from - args.cycle_from
    if step < args.warmup_steps:
        return (step + 1) / args.warmup_steps
    progress = min(1.0, max(step / (args.max_steps - args.cycle_from), elapsed_min / args.schedule_minutes))
    factor = 0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * progress))
    if rewarm_from is not None and step - rewarm_from < args.warmup_steps:
        factor *= (step - rewarm_from + 1) / args.warmup_steps
    return factor


class Checkpointer:
    """Saves model + optimizer + progress to ``run_dir/last.pt`` every few minutes and at the end."""

    def __init__(self, run_dir: Path, every_min: float, keep_weights: bool = False) -> None:
        """Checkpoint into ``run_dir`` every ``every_min`` minutes; with ``keep_weights`` also keep each save's
        weights as ``run_dir/weights/step_NNNNNN.pt`` (what ``tts-export --average`` averages).
        """
        self.path = run_dir / "last.pt"
        self.keep_weights = keep_weights
        self.every_s = every_min * 60
        self.last = time.perf_counter()
        run_dir.mkdir(parents=True, exist_ok=True)

    def load(self, model: Any, opt: Any) -> dict[str, Any]:
        """Restore model (unless None: the caller restored it) and optimizer; return the saved progress."""
        import torch

        state = torch.load(self.path, map_location="cpu", weights_only=False)
        if model is not None:
            model.load_state_dict(state["model"], strict=True)
        progress = state["progress"]
        if "opt" in state:
            opt.load_state_dict(state["opt"])
        else:  # a parked run: the optimizer starts afresh here and warms up again
            progress["rewarm_from"] = progress["step"]
            print(f"[train] no optimizer state (a parked run): re-warming from step {progress['step']}", flush=True)
        random.setstate(state["py_rng"])
        torch.set_rng_state(state["torch_rng"])
        return progress

    def save(self, model: Any, opt: Any, progress: dict[str, Any], force: bool = False) -> bool:
        """Save if due (or ``force``); return whether it saved."""
        import torch

        if not force and time.perf_counter() - self.last < self.every_s:
            return False
        tmp = self.path.with_suffix(".tmp")
        torch.save(
            {
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "progress": progress,
                "py_rng": random.getstate(),
                "torch_rng": torch.get_rng_state(),
            },
            tmp,
        )
        tmp.replace(self.path)
        if self.keep_weights:
            kept = kept_weights_path(self.path.parent, progress["step"])
            kept.parent.mkdir(exist_ok=True)
            torch.save({"model": model.state_dict(), "progress": progress}, kept)
        self.last = time.perf_counter()
        return True


def kept_weights_dir(run_dir: Path) -> Path:
    """Where ``--keep-weights`` keeps a run's weights, one file per checkpoint."""
    return run_dir / "weights"


def kept_weights_path(run_dir: Path, step: int) -> Path:
    """Where ``--keep-weights`` keeps the weights saved at ``step``."""
    return kept_weights_dir(run_dir) / f"step_{step:06d}.pt"


def averaged_weights(run_dir: Path, count: int) -> dict[str, Any]:
    """The run's last checkpoint with its model weights averaged over it and the ``count - 1`` latest weights kept
    before it (``--keep-weights``): the mean of points along the end of the schedule, steadier than any one.
    """
    import torch

    last = torch.load(run_dir / "last.pt", map_location="cpu", weights_only=False)
    step = last["progress"]["step"]
    kept = sorted(p for p in kept_weights_dir(run_dir).glob("step_*.pt") if int(p.stem.split("_")[1]) < step)
    kept = kept[len(kept) - (count - 1) :] if count > 1 else []
    if len(kept) != count - 1:
        raise SystemExit(f"--average {count}: {len(kept)} kept weights before step {step} in {kept_weights_dir(run_dir)}")
    states = [torch.load(p, map_location="cpu", weights_only=False)["model"] for p in kept] + [last["model"]]
    model = {
        name: sum(s[name] for s in states) / len(states) if value.is_floating_point() else value
        for name, value in last["model"].items()
    }
    print(f"[average] step {step} with {[p.stem for p in kept]}", flush=True)
    return {**last, "model": model}


def train_loop(
    args: argparse.Namespace,
    model: Any,
    params: Sequence[Any],
    batch_fn: Callable[[random.Random], dict[str, Any]],
    loss_fn: Callable[[dict[str, Any], int], tuple[Any, dict[str, float]]],
    run_dir: Path,
    load_weights: bool = True,
) -> None:
    """AdamW with the schedule of :func:`lr_factor`, gradient clipping 1.0, resumable checkpoints, a log line
    every ``--log-every`` steps (means since the last line) into stdout and ``run_dir/log.jsonl``.
    """
    import torch

    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.8, 0.99), weight_decay=args.weight_decay)
    ckpt = Checkpointer(run_dir, args.ckpt_minutes, args.keep_weights)
    progress: dict[str, Any] = {"step": 0, "minutes": 0.0, "cpu_s": 0.0, "runs": []}
    if args.resume and ckpt.path.exists():
        progress = ckpt.load(model if load_weights else None, opt)
        print(f"[train] resumed at step {progress['step']} ({progress['minutes']:.1f} min)", flush=True)
    elif not args.resume and ckpt.path.exists():
        raise SystemExit(f"{ckpt.path} exists: pass --resume to continue it, or choose another --run-dir")
    rng = random.Random(args.seed + progress["step"])
    started, cpu0 = time.perf_counter(), time.process_time()
    base_min, base_cpu = progress["minutes"], progress["cpu_s"]
    run = {"start_step": progress["step"], "argv": sys.argv[1:]}
    sums: dict[str, float] = {}
    count = 0
    log = (run_dir / "log.jsonl").open("a")
    stop: list[int] = []
    # SIGTERM (kill PID) ends the run after the current step with a checkpoint, like the end of --max-minutes.
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    model.train()
    while True:
        elapsed = (time.perf_counter() - started) / 60
        step = progress["step"]
        if elapsed >= args.max_minutes or step >= args.max_steps or stop:
            break
        for group in opt.param_groups:
            group["lr"] = args.lr * lr_factor(step, base_min + elapsed, args, progress.get("rewarm_from"))
        batch = batch_fn(rng)
        loss, metrics = loss_fn(batch, step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        progress["step"] = step + 1
        metrics["grad_norm"] = float(grad)
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + v
        count += 1
        progress["minutes"] = base_min + (time.perf_counter() - started) / 60
        progress["cpu_s"] = base_cpu + time.process_time() - cpu0
        if progress["step"] % args.log_every == 0:
            row = {
                "step": progress["step"],
                "minutes": round(progress["minutes"], 2),
                "lr": opt.param_groups[0]["lr"],
                **{k: round(v / count, 4) for k, v in sums.items()},
            }
            print("[train] " + json.dumps(row), flush=True)
            log.write(json.dumps(row) + "\n")
            log.flush()
            sums, count = {}, 0
        if ckpt.save(model, opt, progress):
            print(f"[train] checkpoint at step {progress['step']}", flush=True)
    run.update(
        end_step=progress["step"],
        wall_min=round((time.perf_counter() - started) / 60, 2),
        cpu_min=round((time.process_time() - cpu0) / 60, 2),
    )
    progress["runs"].append(run)
    ckpt.save(model, opt, progress, force=True)
    log.close()
    print(f"[train] run done: {json.dumps(run)}", flush=True)


# --------------------------------------------------------------------------------------------------------------
# Codec
# --------------------------------------------------------------------------------------------------------------
CODEC_ENCODER_CHANNELS = 16
CODEC_DECODER_CHANNELS = 128


def codec_config() -> dict[str, Any]:
    """The tiny codec's config (tiny.py's), with a wider encoder and decoder and the training losses set."""
    from pipecat_nemotron.tts.magpie import tiny

    cfg = tiny.codec_config()
    cfg["audio_encoder"]["base_channels"] = CODEC_ENCODER_CHANNELS
    cfg["audio_decoder"]["base_channels"] = CODEC_DECODER_CHANNELS
    cfg["loss_resolutions"] = [[256, 64, 256], [512, 128, 512], [1024, 256, 1024], [2048, 512, 2048]]
    cfg["mel_loss_dims"] = [40, 80, 128, 160]
    cfg["stft_loss_scale"] = 1.0
    cfg["time_domain_loss_scale"] = 0.1
    return cfg


def new_codec() -> Any:
    """A random ``AudioCodecModel`` of :func:`codec_config`."""
    from omegaconf import OmegaConf

    from pipecat_nemotron.runtime.nemo_logs import quiet_nemo

    with quiet_nemo(40):
        from nemo.collections.tts.models import AudioCodecModel

        return AudioCodecModel(cfg=OmegaConf.create(codec_config()))


@contextlib.contextmanager
def fsq_rounding(model: Any, enabled: bool) -> Any:
    """Within the block, FSQ rounds its compressed inputs (``enabled``) or passes them on unrounded.

    The codec's first steps run unrounded: at the start the decoder cannot use the encoder's small variations and
    pushes them towards zero, which rounding then erases for good (the codec collapsed to one code everywhere at lr
    5e-4 and 2e-3 within 100 steps). Unrounded, the variations survive until the decoder learns to use them.
    """
    fsqs = list(model.vector_quantizer.fsqs)
    if not enabled:
        for fsq in fsqs:
            fsq.round = lambda inputs, input_len: (
                inputs
            )  # shadows FiniteScalarQuantizer.round (a staticmethod)
    try:
        yield
    finally:
        for fsq in fsqs:
            fsq.__dict__.pop("round", None)


#: The light discriminator's STFT resolutions (n_fft, hop, window) and bands (fractions of the bins), and the
#: filters of each band's ``DiscriminatorSTFT``: NeMo's default 32 would cost ~8x the decoder's step on one CPU
#: thread; 8 filters at both resolutions cost ~1.1 s per step of 8 one-second crops (forward and backward, twice).
DISC_RESOLUTIONS = [[512, 128, 512], [1024, 256, 1024]]
DISC_BANDS = [[0.0, 0.1], [0.1, 0.25], [0.25, 0.5], [0.5, 1.0]]
DISC_FILTERS = 8
#: Weights of the adversarial terms beside the spectral losses (mel L1 + mel L2 + STFT + 0.1 time ~ 0.5 here).
GAN_GEN_SCALE = 0.5
GAN_FEATURE_SCALE = 1.0


def light_discriminator() -> Any:
    """NeMo's multi-resolution, multi-band STFT discriminator (DAC's), with :data:`DISC_FILTERS` per band."""
    import torch
    from nemo.collections.tts.modules.audio_codec_modules import (
        Discriminator,
        DiscriminatorSTFT,
        MultiResolutionDiscriminatorSTFT,
    )

    mrd = MultiResolutionDiscriminatorSTFT(resolutions=DISC_RESOLUTIONS, stft_bands=DISC_BANDS)
    for band_set in mrd.discriminators:
        band_set.discriminators = torch.nn.ModuleList(
            [DiscriminatorSTFT(filters=DISC_FILTERS) for _ in band_set.discriminators]
        )
    return Discriminator(discriminators=[mrd])


def stage_codec(args: argparse.Namespace) -> None:
    """Train the codec on random ``--crop-s`` crops of the training utterances.

    With ``--decoder-only --gan`` the decoder also learns against a light discriminator (NeMo's hinge losses and
    relative feature matching, as ``AudioCodecModel.training_step`` uses them): spectral losses alone render
    espeak-ng's aspiration noise as something the tiny ASR hears as a fricative or a digit.
    """
    import torch

    set_threads(args.threads)
    rows = read_manifest(args.work / "data" / "train.jsonl")
    clips = [read_wav(Path(r["audio"])) for r in rows]
    crop = int(round(args.crop_s * SAMPLE_RATE / 1024)) * 1024
    model = new_codec()
    gan = args.gan and args.decoder_only
    if args.gan and not args.decoder_only:
        raise SystemExit("--gan trains the decoder only: pass --decoder-only with it")

    def batch_fn(rng: random.Random) -> dict[str, Any]:
        out = np.zeros((args.batch_size, crop), dtype=np.float32)
        for i in range(args.batch_size):
            x = clips[rng.randrange(len(clips))]
            # A share of crops begins at the utterance's start, where the first sounds (often an aspirated "h")
            # come out of silence; random starts include it in ~8% of crops.
            start = 0 if rng.random() < args.onset_crops else rng.randrange(max(1, x.size - crop))
            piece = x[start : start + crop].astype(np.float32) / 32768
            out[i, : piece.size] = piece
        audio = torch.from_numpy(out)
        return {"audio": audio, "audio_lens": torch.full((args.batch_size,), crop)}

    def loss_fn(batch: dict[str, Any], step: int) -> tuple[Any, dict[str, float]]:
        audio, audio_len = batch["audio"], batch["audio_lens"]  # whole frames already
        # NeMo's codec step (AudioCodecModel._process_batch), with the encoder output kept for the penalty below.
        encoded, encoded_len = model.encode_audio(audio=audio, audio_len=audio_len)
        with fsq_rounding(model, enabled=step >= args.unrounded_steps):
            quantized, _ = model.vector_quantizer(inputs=encoded, input_len=encoded_len)
        audio_gen, _ = model.audio_decoder(inputs=quantized, input_len=encoded_len)
        mel_l1, mel_l2 = model.mel_loss_fn(audio_real=audio, audio_gen=audio_gen, audio_len=audio_len)
        stft = model.stft_loss_fn(audio_real=audio, audio_gen=audio_gen, audio_len=audio_len)
        td = model.time_domain_loss_fn(audio_real=audio, audio_gen=audio_gen, audio_len=audio_len)
        # FSQ squashes the encoder output with tanh: beyond |2| its gradient vanishes and the codes stop moving
        # (without this term the encoder drifted there within 100 steps and the codec collapsed to one code).
        saturation = torch.relu(encoded.abs() - 2.0).pow(2).mean()
        loss = mel_l1 + mel_l2 + model.stft_loss_scale * stft + model.time_domain_loss_scale * td + saturation
        extra: dict[str, float] = {}
        if gan:
            # Discriminator step on the detached output, then the generator's adversarial and feature terms.
            real_scores, gen_scores, _, _ = disc(audio_real=audio, audio_gen=audio_gen.detach())
            d_loss = disc_loss_fn(disc_scores_real=real_scores, disc_scores_gen=gen_scores)
            disc_opt.zero_grad(set_to_none=True)
            d_loss.backward()
            torch.nn.utils.clip_grad_norm_(disc_params, 1.0)
            for group in disc_opt.param_groups:
                group["lr"] = args.lr * lr_factor(step, 0.0, args)
            disc_opt.step()
            _, gen_scores, real_maps, gen_maps = disc(audio_real=audio, audio_gen=audio_gen)
            g_adv = gen_loss_fn(disc_scores_gen=gen_scores)
            g_feat = feature_loss_fn(fmaps_real=real_maps, fmaps_gen=gen_maps)
            loss = loss + GAN_GEN_SCALE * g_adv + GAN_FEATURE_SCALE * g_feat
            disc_opt.zero_grad(set_to_none=True)  # the generator's backward must not reach the next d step
            extra = {"d_loss": d_loss.item(), "g_adv": g_adv.item(), "g_feat": g_feat.item()}
        encoded = quantized
        return loss, {
            "loss": loss.item(),
            "mel_l1": mel_l1.item(),
            "mel_l2": mel_l2.item(),
            "stft": stft.item(),
            "saturation": saturation.item(),
            **extra,
            # Distinct first-codebook codes in the batch: 1 means the encoder has collapsed (FSQ saturated).
            "codes_used": float(torch.unique(encoded[:, :4].permute(0, 2, 1).reshape(-1, 4), dim=0).shape[0]),
        }

    run_dir = codec_run_dir(args)
    if args.decoder_only:
        # The encoder (and so every code the Magpie is trained on) stays as the first codec run left it; only
        # the decoder learns to render the same codes better.
        if not (args.resume and (run_dir / "last.pt").exists()):
            state = torch.load(args.work / "codec" / "last.pt", map_location="cpu", weights_only=False)
            model.load_state_dict(state["model"])
        model.audio_encoder.requires_grad_(False)
        args.unrounded_steps = 0
    params = [p for p in model.parameters() if p.requires_grad]
    if gan:
        from nemo.collections.tts.losses.audio_codec_loss import (
            DiscriminatorHingedLoss,
            GeneratorHingedLoss,
            RelativeFeatureMatchingLoss,
        )

        # Held as the codec's own ``discriminator`` (NeMo's attribute), so its weights go into the checkpoint;
        # codec-export leaves them out of the .nemo. Its optimizer starts afresh at each resume.
        disc = light_discriminator()
        model.discriminator = disc
        disc_params = list(disc.parameters())
        disc_opt = torch.optim.AdamW(disc_params, lr=args.lr, betas=(0.8, 0.99), weight_decay=args.weight_decay)
        disc_loss_fn, gen_loss_fn = DiscriminatorHingedLoss(), GeneratorHingedLoss()
        feature_loss_fn = RelativeFeatureMatchingLoss()
        print(f"[codec] discriminator: {sum(p.numel() for p in disc_params):,} parameters", flush=True)
    print(
        f"[codec] {sum(p.numel() for p in params):,} trainable parameters, {len(clips)} clips, crops of {crop} "
        f"samples{', decoder only' if args.decoder_only else ''}",
        flush=True,
    )
    train_loop(args, model, params, batch_fn, loss_fn, run_dir)


def codec_run_dir(args: argparse.Namespace) -> Path:
    """The codec run's folder: ``codec/``, or ``codec_decoder/`` for the decoder-only fine-tune."""
    return args.work / ("codec_decoder" if args.decoder_only else "codec")


def stage_codec_export(args: argparse.Namespace) -> None:
    """Write the codec ``.nemo`` from the codec run's last checkpoint (``--decoder-only``: the fine-tune's)."""
    import torch

    from pipecat_nemotron.runtime.nemo_logs import quiet_nemo

    model = new_codec()
    state = torch.load(codec_run_dir(args) / "last.pt", map_location="cpu", weights_only=False)
    # A --gan run's discriminator trains the decoder and is no part of the codec.
    model.load_state_dict({k: v for k, v in state["model"].items() if not k.startswith("discriminator.")})
    with quiet_nemo(40):
        model.eval().save_to(str(args.work / "tiny_codec.nemo"))
    print(f"[codec-export] step {state['progress']['step']} -> {args.work / 'tiny_codec.nemo'}", flush=True)


def load_codec(path: Path) -> Any:
    """Restore a codec ``.nemo`` on CPU, eval mode."""
    from pipecat_nemotron.runtime.nemo_logs import quiet_nemo

    with quiet_nemo(40):
        from nemo.collections.tts.models import AudioCodecModel

        return AudioCodecModel.restore_from(str(path), map_location="cpu").eval()


# --------------------------------------------------------------------------------------------------------------
# Judging by ear: the bundled tiny ASR
# --------------------------------------------------------------------------------------------------------------
def load_asr() -> Any:
    """The bundled tiny ASR (NeMo, CPU, eval, 160 ms context)."""
    from nemo.collections.asr.models import ASRModel

    from pipecat_nemotron.asr.config import LATENCY_MODES, LEFT_CONTEXT_FRAMES
    from pipecat_nemotron.runtime.nemo_logs import quiet_nemo

    with quiet_nemo(40):
        model = ASRModel.restore_from(str(TINY_MODEL_PATH), map_location="cpu")
    model.encoder.set_default_att_context_size([LEFT_CONTEXT_FRAMES, LATENCY_MODES[160]])
    return model.eval()


def transcribe(asr: Any, clips: Sequence[np.ndarray], scratch: Path) -> list[str]:
    """Transcripts of 22,050 Hz float clips (resampled to 16 kHz, written under ``scratch``)."""
    from pipecat_nemotron.runtime.nemo_logs import quiet_nemo

    scratch.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, x in enumerate(clips):
        y = np.clip(to_16k(np.asarray(x, dtype=np.float64)), -1, 1)
        path = scratch / f"{i:04d}.wav"
        write_wav(path, np.round(y * 32767).astype(np.int16), 16000)
        paths.append(str(path))
    with quiet_nemo(40):
        out = asr.transcribe(paths, batch_size=16, verbose=False)
    asr.eval()
    if isinstance(out, tuple):
        out = out[0]
    return [h.text if hasattr(h, "text") else str(h) for h in out]


def wer_report(name: str, rows: Sequence[dict[str, Any]], hyps: Sequence[str]) -> dict[str, Any]:
    """WER overall and per speaker, with a few wrong examples; printed and returned."""
    from pipecat_nemotron.bench.wer import WordErrorCount, normalize_text

    total = WordErrorCount()
    per: dict[int, WordErrorCount] = {}
    wrong: list[dict[str, Any]] = []
    for r, h in zip(rows, hyps, strict=True):
        total.add(r["text"], h)
        if per.setdefault(r["speaker"], WordErrorCount()).add(r["text"], h):
            wrong.append({"speaker": SPEAKER_NAMES[r["speaker"]], "ref": normalize_text(r["text"]), "hyp": h})
    report = {
        "name": name,
        "utterances": len(rows),
        "words": total.words,
        "wer": round(total.percent, 2),
        "per_speaker": {SPEAKER_NAMES[s]: round(c.percent, 2) for s, c in sorted(per.items())},
        "wrong": wrong[:12],
    }
    print(
        f"[{name}] WER {report['wer']}% over {total.words} words; per speaker {report['per_speaker']}",
        flush=True,
    )
    for w in wrong[:6]:
        print(f"    {w['speaker']}: {w['ref']!r} -> {w['hyp']!r}", flush=True)
    return report


def held_out_through_codec(
    args: argparse.Namespace,
) -> tuple[list[dict[str, Any]], list[np.ndarray], list[np.ndarray]]:
    """The held-out rows, their float audio, and the same encoded and decoded by the exported codec (whole frames:
    up to 1,023 samples longer)."""
    import torch

    rows = read_manifest(args.work / "data" / "test.jsonl")[: args.eval_limit]
    codec = load_codec(args.work / "tiny_codec.nemo")
    originals = [read_wav(Path(r["audio"])).astype(np.float32) / 32768 for r in rows]
    resynth = []
    with torch.no_grad():
        for x in originals:
            codes, codes_len = codec.encode(audio=torch.from_numpy(x)[None], audio_len=torch.tensor([x.size]))
            y, y_len = codec.decode(tokens=codes, tokens_len=codes_len)
            resynth.append(y[0, : int(y_len[0])].numpy())
    return rows, originals, resynth


def stage_codec_eval(args: argparse.Namespace) -> None:
    """Tiny-ASR WER on held-out espeak-ng speech, as is and through the exported codec."""

    set_threads(args.threads)
    rows, originals, resynth = held_out_through_codec(args)
    asr = load_asr()
    reports = [
        wer_report("codec-eval original", rows, transcribe(asr, originals, args.work / "eval" / "orig")),
        wer_report("codec-eval resynthesised", rows, transcribe(asr, resynth, args.work / "eval" / "codec")),
    ]
    (args.work / "codec_eval.json").write_text(json.dumps(reports, indent=1))


#: How much of each utterance's start ``codec-onset`` swaps between the original and the codec's rendering, s.
ONSET_S = 0.35


def stage_codec_onset(args: argparse.Namespace) -> None:
    """Where the codec's errors are: WER with the first :data:`ONSET_S` of each held-out utterance taken from the
    original and the rest from the codec, and the other way round.
    """
    set_threads(args.threads)
    rows, originals, whole_frames = held_out_through_codec(args)
    resynth = [y[: x.size] for x, y in zip(originals, whole_frames, strict=True)]
    n = int(ONSET_S * SAMPLE_RATE)

    def spliced(head: np.ndarray, tail: np.ndarray) -> np.ndarray:
        out = tail.copy()
        out[:n] = head[:n]
        return out

    asr = load_asr()
    scratch = args.work / "eval" / "onset"
    for name, clips in (
        ("codec", resynth),
        ("original start + codec rest", [spliced(o, r) for o, r in zip(originals, resynth, strict=True)]),
        ("codec start + original rest", [spliced(r, o[: r.size]) for o, r in zip(originals, resynth, strict=True)]),
    ):
        wer_report(f"codec-onset {name}", rows, transcribe(asr, clips, scratch))


# --------------------------------------------------------------------------------------------------------------
# Magpie
# --------------------------------------------------------------------------------------------------------------
def magpie_shape() -> Any:
    """The trained Magpie's sizes: tiny.py's test shape, wider, with a second encoder layer (no causal encoder)."""
    from pipecat_nemotron.tts.magpie.tiny import MagpieShape

    return MagpieShape(
        width=64,
        encoder_layers=2,
        decoder_layers=2,
        heads=2,
        xa_head_dim=None,
        decoder_pos_emb=True,
        lt_width=64,
        baked_context_frames=10,
        max_len=512,
    )


#: Training steps over which the beta-binomial attention prior is applied in full, then faded out (NeMo's
#: ``prior_scaledown_start_step`` / ``prior_end_step``; this loop applies them, having no Lightning trainer).
PRIOR_FULL_STEPS = 4000
PRIOR_END_STEP = 7000

#: Share of decoder-input frames replaced by random codes in half the batches (NeMo's ``decoder_input_dropout_prob``):
#: without it the tiny decoder learnt to continue the audio it was fed and ignored the text (tts 2 at 2,050 steps
#: babbled the domain's phrases whatever it was asked to say).
DECODER_INPUT_DROPOUT = 0.2

#: Weight of the alignment (forward-sum) loss; see :func:`magpie_config`.
ALIGNMENT_LOSS_SCALE = 0.1


def magpie_config(codec_path: Path) -> dict[str, Any]:
    """tiny.py's ``decoder_ce`` config of :func:`magpie_shape`, with the training losses of the released recipe."""
    from pipecat_nemotron.tts.magpie import tiny

    cfg = tiny.magpie_config(str(codec_path), magpie_shape())
    cfg.update(
        {
            "prior_scaling_factor": 0.5,
            "prior_scaledown_start_step": PRIOR_FULL_STEPS,
            "prior_end_step": PRIOR_END_STEP,
            # NeMo's forward-sum loss on the raw (pre-prior) cross-attention scores. At 0.01 (tts 2 to step 4,150)
            # the attention stayed unaligned without the training prior: codebook CE 1.45 with it, 2.2 without.
            "alignment_loss_scale": ALIGNMENT_LOSS_SCALE,
            "cfg_unconditional_prob": 0.1,
            "decoder_input_dropout_prob": DECODER_INPUT_DROPOUT,
            "optim": {"_target_": "torch.optim.AdamW", "lr": 1e-3},
        }
    )
    return cfg


def new_magpie(codec_path: Path, seed: int) -> Any:
    """A random ``MagpieTTSModel`` with five learnable baked speakers (CPU)."""
    import torch
    from omegaconf import OmegaConf

    from pipecat_nemotron.runtime.nemo_logs import quiet_nemo
    from pipecat_nemotron.tts.magpie._nemo_private import set_baked_speakers
    from pipecat_nemotron.tts.magpie.tiny import TINY_NUM_SPEAKERS

    shape = magpie_shape()
    with quiet_nemo(40):
        from nemo.collections.tts.models import MagpieTTSModel

        torch.manual_seed(seed)
        model = MagpieTTSModel(cfg=OmegaConf.create(magpie_config(codec_path)))
    set_baked_speakers(model, torch.randn(TINY_NUM_SPEAKERS, shape.baked_context_frames, shape.width))
    model.baked_context_embedding.weight.requires_grad_(True)
    # The baked speakers replace the context encoder (NeMo leaves it out of the saved weights): nothing to train.
    model.context_encoder.requires_grad_(False)
    return model


def text_tokens(model: Any, text: str) -> list[int]:
    """Token ids of ``text`` as NeMo's inference chunks it (one English chunk, end-of-text id included)."""
    from pipecat_nemotron.tts.magpie.tiny import english_tokens

    return [int(t) for t in english_tokens(model, text)]


def stage_codes(args: argparse.Namespace) -> None:
    """Codec codes of every training utterance (``codes.pt``: codes, texts, speakers)."""
    import torch

    set_threads(args.threads)
    rows = read_manifest(args.work / "data" / "train.jsonl")
    codec = load_codec(args.work / "tiny_codec.nemo")
    codes = []
    started = time.perf_counter()
    with torch.no_grad():
        for r in rows:
            x = torch.from_numpy(read_wav(Path(r["audio"])).astype(np.float32) / 32768)[None]
            c, c_len = codec.encode(audio=x, audio_len=torch.tensor([x.shape[1]]))
            codes.append(c[0, :, : int(c_len[0])].to(torch.int16).clone())
    torch.save(
        {"codes": codes, "texts": [r["text"] for r in rows], "speakers": [r["speaker"] for r in rows]},
        args.work / "codes.pt",
    )
    frames = sum(c.shape[1] for c in codes)
    print(
        f"[codes] {len(codes)} utterances, {frames} frames in {time.perf_counter() - started:.0f} s",
        flush=True,
    )


def scaled_prior(prior: np.ndarray, step: int) -> np.ndarray | None:
    """NeMo's ``scale_prior`` at ``step``: the prior in full, then interpolated towards ones, then none."""
    if step < PRIOR_FULL_STEPS:
        return prior
    if step >= PRIOR_END_STEP:
        return None
    return prior + (1.0 - prior) * (step - PRIOR_FULL_STEPS) / (PRIOR_END_STEP - PRIOR_FULL_STEPS)


def copy_weights(model: Any, state: dict[str, Any]) -> None:
    """Copy a saved ``state_dict`` into the model's own tensors (the optimizer keeps pointing at them)."""
    import torch

    own = dict(model.named_parameters()) | dict(model.named_buffers())
    missing = [n for n, p in model.named_parameters() if p.requires_grad and n not in state]
    if missing:
        raise SystemExit(f"checkpoint lacks {missing[:5]}")
    with torch.no_grad():
        for name, value in state.items():
            if name in own and own[name] is not None:
                own[name].copy_(value)


def magpie_batch(tokens: Sequence[list[int]], codes: Sequence[Any], speakers: Sequence[int]) -> dict[str, Any]:
    """``process_batch``'s inputs for utterances of ``tokens`` (text ids), ``codes`` (int16 ``(codebooks, frames)``)
    and ``speakers``, zero-padded, with the beta-binomial attention prior (scaling 0.5) of each as a numpy array
    under ``"prior"`` (the caller scales it and passes it on as ``align_prior_matrix``, or leaves it out).
    """
    import torch
    from nemo.collections.tts.parts.utils.tts_dataset_utils import beta_binomial_prior_distribution

    n_text, n_audio = max(len(t) for t in tokens), max(c.shape[1] for c in codes)
    text = torch.zeros(len(tokens), n_text, dtype=torch.long)
    audio = torch.zeros(len(tokens), codes[0].shape[0], n_audio, dtype=torch.long)
    prior = np.ones((len(tokens), n_audio + 1, n_text), dtype=np.float32)
    for row, (t, c) in enumerate(zip(tokens, codes, strict=True)):
        text[row, : len(t)] = torch.tensor(t)
        audio[row, :, : c.shape[1]] = c.long()
        p = beta_binomial_prior_distribution(len(t), c.shape[1] + 1, 0.5)
        prior[row, : p.shape[0], : p.shape[1]] = p
    return {
        "text": text,
        "text_lens": torch.tensor([len(t) for t in tokens]),
        "audio_codes": audio,
        "audio_codes_lens": torch.tensor([c.shape[1] for c in codes]),
        "speaker_indices": torch.tensor(list(speakers)),
        "prior": prior,
    }


def stage_tts(args: argparse.Namespace) -> None:
    """Train the Magpie on the precomputed codes with NeMo's ``process_batch`` (its losses, its special tokens)."""
    import torch

    set_threads(args.threads)
    data = torch.load(args.work / "codes.pt", weights_only=False)
    model = new_magpie(args.work / "tiny_codec.nemo", args.seed)
    tokens = [text_tokens(model, t) for t in data["texts"]]
    codes, speakers = data["codes"], data["speakers"]
    order = sorted(range(len(codes)), key=lambda i: codes[i].shape[1])
    print(
        f"[tts] {sum(p.numel() for p in model.parameters() if p.requires_grad):,} trainable parameters, "
        f"{len(codes)} utterances",
        flush=True,
    )

    def batch_fn(rng: random.Random) -> dict[str, Any]:
        start = rng.randrange(max(1, len(order) - args.batch_size))
        idx = order[start : start + args.batch_size]
        return magpie_batch([tokens[i] for i in idx], [codes[i] for i in idx], [speakers[i] for i in idx])

    def loss_fn(batch: dict[str, Any], step: int) -> tuple[Any, dict[str, float]]:
        prior = scaled_prior(batch.pop("prior"), step)
        if prior is not None:
            batch["align_prior_matrix"] = torch.from_numpy(prior)
        out = model.process_batch(batch)
        metrics = {"loss": out["loss"].item(), "codebook": out["codebook_loss"].item()}
        if out["local_transformer_loss"] is not None:
            metrics["local_transformer"] = out["local_transformer_loss"].item()
        if out["alignment_loss"] is not None:
            metrics["alignment"] = out["alignment_loss"].item()
        return out["loss"], metrics

    params = [p for p in model.parameters() if p.requires_grad]
    run_dir = args.work / "tts"
    ckpt = run_dir / "last.pt"
    if args.resume and ckpt.exists():
        copy_weights(model, torch.load(ckpt, map_location="cpu", weights_only=False)["model"])
    train_loop(args, model, params, batch_fn, loss_fn, run_dir, load_weights=False)


def stage_tts_probe(args: argparse.Namespace) -> None:
    """How the Magpie of the last checkpoint uses the text: its codebook cross-entropy on 16 training utterances
    with their own text and the training prior, without the prior (its own attention must align), and with another
    utterance's text. Text ignored: all three equal; attention aligned by itself: the first two close.
    """
    import torch

    set_threads(args.threads)
    data = torch.load(args.work / "codes.pt", weights_only=False)
    model = new_magpie(args.work / "tiny_codec.nemo", args.seed)
    state = averaged_weights(args.work / "tts", args.average)
    copy_weights(model, state["model"])
    model.eval()
    idx = random.Random(args.seed + 1).sample(range(len(data["codes"])), 16)
    codes = [data["codes"][i] for i in idx]

    def batch(text_of: Sequence[int], prior: bool) -> dict[str, Any]:
        tokens = [text_tokens(model, data["texts"][i]) for i in text_of]
        out = magpie_batch(tokens, codes, [data["speakers"][i] for i in idx])
        priors = out.pop("prior")
        if prior:
            out["align_prior_matrix"] = torch.from_numpy(priors)
        return out

    shuffled = idx[1:] + idx[:1]
    with torch.no_grad():
        for name, text_of, prior in (
            ("own text, training prior", idx, True),
            ("own text, no prior", idx, False),
            ("another's text, no prior", shuffled, False),
        ):
            loss = model.process_batch(batch(text_of, prior))["codebook_loss"].item()
            print(f"[tts-probe] step {state['progress']['step']}: {name}: codebook CE {loss:.3f}", flush=True)


def stage_tts_export(args: argparse.Namespace) -> None:
    """Write the Magpie ``.nemo`` (baked speakers frozen, as in the released checkpoint) from the last checkpoint."""
    from omegaconf import open_dict

    from pipecat_nemotron.runtime.nemo_logs import quiet_nemo

    model = new_magpie(args.work / "tiny_codec.nemo", args.seed)
    state = averaged_weights(args.work / "tts", args.average)
    copy_weights(model, state["model"])
    model.baked_context_embedding.weight.requires_grad_(False)
    # The checkpoint's own decoding settings (NeMo's ``inference_parameters``), read by every loader of it.
    decoding = {
        "temperature": args.temperature,
        "topk": args.topk,
        "cfg_scale": args.cfg_scale,
        "attention_prior_lookahead_window": args.lookahead,
        "attention_prior_epsilon": args.prior_epsilon,
        "ignore_finished_sentence_tracking": not args.track_sentence_end,
    }
    with open_dict(model.cfg):
        model.cfg.inference_parameters = decoding
    with quiet_nemo(40):
        model.eval().save_to(str(args.work / "tiny_magpie.nemo"))
    print(f"[tts-export] step {state['progress']['step']} {decoding} -> {args.work / 'tiny_magpie.nemo'}", flush=True)


def number_texts(rng: random.Random, n: int, exclude: set[str]) -> list[str]:
    """``n`` digit strings (4-6 digits, as "My number is ...") whose words are in no training sentence."""
    from make_tiny_model import DIGITS

    out: list[str] = []
    while len(out) < n:
        digits = " ".join(rng.choice(DIGITS) for _ in range(rng.randint(4, 6)))
        text = punctuate(f"my number is {digits}")
        if words_of(text) not in exclude and text not in out:
            out.append(text)
    return out


def synthesise(args: argparse.Namespace, step: str, jobs: Sequence[tuple[str, int]]) -> list[np.ndarray]:
    """Speech of each ``(text, speaker)`` through ``MagpieEngine`` on ``step`` (``"fast"`` or ``"nemo"``)."""
    from pipecat_nemotron.tts.magpie import MagpieEngine, MagpieSynthesisOptions

    engine = MagpieEngine(
        str(args.work / "tiny_magpie.nemo"),
        device="cpu",
        codec_model_path=str(args.work / "tiny_codec.nemo"),
        step=step,
        max_batch=8,
    )
    engine.wait_until_ready(timeout=600)
    try:
        streams = [
            engine.submit(
                text,
                voice=SPEAKER_NAMES[speaker],
                options=MagpieSynthesisOptions(max_duration_s=args.max_duration_s, use_cfg=args.cfg, seed=i),
            )
            for i, (text, speaker) in enumerate(jobs)
        ]
        clips = []
        for stream in streams:
            chunks = [chunk.audio for chunk in stream]
            if stream.error is not None:
                raise stream.error
            clips.append(
                np.concatenate(chunks).astype(np.float32) / 32768 if chunks else np.zeros(1, np.float32)
            )
    finally:
        engine.close()
    return clips


def stage_tts_eval(args: argparse.Namespace) -> None:
    """Held-out sentences by every speaker, plus digit strings, synthesised and transcribed by the tiny ASR."""
    set_threads(args.threads)
    rows = read_manifest(args.work / "data" / "test.jsonl")[: args.eval_limit]
    train_words = {words_of(r["text"]) for r in read_manifest(args.work / "data" / "train.jsonl")}
    numbers = number_texts(random.Random(args.seed + 2), args.n_numbers, train_words)
    rows += [{"text": t, "speaker": i % len(SPEAKERS)} for i, t in enumerate(numbers)]
    jobs = [(r["text"], r["speaker"]) for r in rows]
    asr = load_asr()
    reports = []
    cfg = {True: "cfg", False: "no-cfg", None: "checkpoint-cfg"}[args.cfg]
    for step in args.steps:
        started = time.perf_counter()
        clips = synthesise(args, step, jobs)
        seconds = time.perf_counter() - started
        hyps = transcribe(asr, clips, args.work / "eval" / f"tts_{step}")
        n = len(rows) - len(numbers)
        report = wer_report(f"tts-eval {step} {cfg} held-out", rows[:n], hyps[:n])
        report["numbers"] = wer_report(f"tts-eval {step} {cfg} numbers", rows[n:], hyps[n:])
        report["synthesis_s"] = round(seconds, 1)
        report["audio_s"] = round(sum(c.size for c in clips) / SAMPLE_RATE, 1)
        reports.append(report)
        out = args.work / "eval" / f"tts_{step}_{cfg}_wav"
        out.mkdir(parents=True, exist_ok=True)
        for i, clip in enumerate(clips[: args.keep_wavs]):
            write_wav(
                out / f"{i:03d}_{SPEAKER_NAMES[rows[i]['speaker']]}.wav",
                np.round(clip * 32767).astype(np.int16),
            )
    (args.work / f"tts_eval_{cfg}.json").write_text(json.dumps(reports, indent=1))


def stage_cost(args: argparse.Namespace) -> None:
    """First audio and per-frame time on the fast step (MagpieEngine, CPU): today's random tiny model against the
    exported trained Magpie (``tts-export``) over the exported codec, both with end of speech biased off (43 frames
    per request), requests alternated, ``--cost-repeats`` each; medians and minima.

    Each model runs with its own decoding settings (as the agent runs it: today's with guidance, the trained one as
    its checkpoint says); the trained one runs a second time with guidance forced on (the same work as today's).
    """
    import statistics
    import tempfile

    from nemo.collections.tts.models import MagpieTTSModel

    from pipecat_nemotron.runtime.nemo_logs import quiet_nemo
    from pipecat_nemotron.tts.magpie import MagpieEngine, MagpieSynthesisOptions, tiny

    set_threads(args.threads)
    frames = 43
    with tempfile.TemporaryDirectory() as tmp:
        old_magpie, old_codec = tiny.build_tiny_magpie(Path(tmp) / "today", end_of_speech_bias=-30.0)
        codec = args.work / "tiny_codec.nemo"
        with quiet_nemo(40):
            model = MagpieTTSModel.restore_from(str(args.work / "tiny_magpie.nemo"), map_location="cpu")
            tiny.set_end_of_speech_bias(model, -30.0)
            model.save_to(str(Path(tmp) / "trained.nemo"))
        paths = {"today": (old_magpie, old_codec), "trained": (Path(tmp) / "trained.nemo", codec)}
        engines = {
            name: MagpieEngine(str(m), device="cpu", codec_model_path=str(c), step="fast", max_batch=8)
            for name, (m, c) in paths.items()
        }
        options = MagpieSynthesisOptions(max_duration_s=(frames - 0.5) * 1024 / SAMPLE_RATE)
        runs = {
            "today's random tiny (its settings: CFG)": (engines["today"], options),
            "trained (its settings)": (engines["trained"], options),
            "trained, CFG forced on": (engines["trained"], dataclasses.replace(options, use_cfg=True)),
        }
        try:
            for engine in engines.values():
                engine.wait_until_ready(timeout=600)
            first: dict[str, list[float]] = {name: [] for name in runs}
            per_frame: dict[str, list[float]] = {name: [] for name in runs}
            for _ in range(args.cost_repeats):
                for name, (engine, opts) in runs.items():
                    started = time.perf_counter()
                    stream = engine.submit("Set a timer for twenty minutes, thanks.", options=opts)
                    made = sum(chunk.num_frames for chunk in stream)
                    per_frame[name].append((time.perf_counter() - started) / made * 1000)
                    first[name].append(stream.stats.time_to_first_audio_s * 1000)
        finally:
            for engine in engines.values():
                engine.close()
    base = next(iter(runs))
    for name in runs:
        ratio = (
            f"; x{statistics.median(first[name]) / statistics.median(first[base]):.2f} first audio, "
            f"x{statistics.median(per_frame[name]) / statistics.median(per_frame[base]):.2f} per frame (medians)"
        )
        print(
            f"[cost] {name}: first audio median {statistics.median(first[name]):.1f} ms "
            f"(min {min(first[name]):.1f}), per frame median {statistics.median(per_frame[name]):.2f} ms "
            f"(min {min(per_frame[name]):.2f}){ratio if name != base else ''}",
            flush=True,
        )


def stage_bundle(args: argparse.Namespace) -> None:
    """Copy the exported Magpie and codec into the package's assets, the Magpie naming its codec by file name."""
    from pipecat_nemotron.models import TINY_MAGPIE_CODEC_PATH, TINY_MAGPIE_PATH
    from pipecat_nemotron.tts.magpie.loading import save_with_codec_beside

    magpie, codec = save_with_codec_beside(
        args.work / "tiny_magpie.nemo", args.work / "tiny_codec.nemo", TINY_MAGPIE_PATH, TINY_MAGPIE_CODEC_PATH.name
    )
    total = 0
    for path in (magpie, codec):
        total += path.stat().st_size
        print(f"[bundle] {path} ({path.stat().st_size:,} bytes)", flush=True)
    print(f"[bundle] {total / 1e6:.1f} MB in all (budget 25 MB)", flush=True)


# --------------------------------------------------------------------------------------------------------------
# Runs kept between machines
# --------------------------------------------------------------------------------------------------------------
#: Where ``park`` keeps the training runs, in the repository: a machine's work folder does not outlive it, and the
#: 8 h budget is spent over several machines. Weights and progress only (the optimizer's moments would triple it).
PARKED_DIR = Path(__file__).resolve().parent / "tiny_magpie_runs"

#: The training runs' folders under --work.
RUN_DIRS = ("codec", "codec_decoder", "tts")


def stage_park(args: argparse.Namespace) -> None:
    """Copy each run's ``last.pt`` without its optimizer, and its ``log.jsonl``, to :data:`PARKED_DIR`."""
    import torch

    PARKED_DIR.mkdir(exist_ok=True)
    for run in RUN_DIRS:
        ckpt = args.work / run / "last.pt"
        if not ckpt.exists():
            continue
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        state.pop("opt", None)
        torch.save(state, PARKED_DIR / f"{run}.pt")
        shutil.copyfile(args.work / run / "log.jsonl", PARKED_DIR / f"{run}.log.jsonl")
        size = (PARKED_DIR / f"{run}.pt").stat().st_size
        print(f"[park] {run}: step {state['progress']['step']} -> {PARKED_DIR / run}.pt ({size:,} bytes)", flush=True)


def stage_unpark(args: argparse.Namespace) -> None:
    """Put the parked runs back as ``--work/<run>/last.pt`` (refuses to overwrite a checkpoint there)."""
    for run in RUN_DIRS:
        parked = PARKED_DIR / f"{run}.pt"
        if not parked.exists():
            continue
        target = args.work / run / "last.pt"
        if target.exists():
            raise SystemExit(f"{target} exists: unpark puts parked runs into a fresh --work only")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(parked, target)
        shutil.copyfile(PARKED_DIR / f"{run}.log.jsonl", args.work / run / "log.jsonl")
        print(f"[unpark] {run} -> {target}", flush=True)


# --------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------
STAGES: dict[str, Callable[[argparse.Namespace], None]] = {
    "data": stage_data,
    "codec": stage_codec,
    "codec-export": stage_codec_export,
    "codec-eval": stage_codec_eval,
    "codec-onset": stage_codec_onset,
    "codes": stage_codes,
    "tts": stage_tts,
    "tts-probe": stage_tts_probe,
    "tts-export": stage_tts_export,
    "tts-eval": stage_tts_eval,
    "bundle": stage_bundle,
    "cost": stage_cost,
    "park": stage_park,
    "unpark": stage_unpark,
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Stages and options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stages", nargs="+", choices=[*STAGES, "all"])
    p.add_argument(
        "--work", type=Path, default=WORK_DIR, help="data, checkpoints and logs (default: %(default)s)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2, help="synthesis processes")
    p.add_argument("--n-agent", type=int, default=5000, help="training utterances of the agent grammar")
    p.add_argument("--n-reply", type=int, default=2000, help="training utterances of reply sentences")
    p.add_argument(
        "--n-digit-strings",
        type=int,
        default=0,
        help="data: more training utterances of the agent grammar with a digit string (tts 3's last steps: 1500)",
    )
    p.add_argument("--n-test", type=int, default=40, help="held-out sentences (each by every speaker)")
    p.add_argument(
        "--eval-limit", type=int, default=None, help="evaluate only the first N held-out utterances"
    )
    p.add_argument("--n-numbers", type=int, default=10, help="extra digit strings synthesised by tts-eval")
    p.add_argument("--steps", nargs="+", default=["fast", "nemo"], help="tts-eval: MagpieEngine steps")
    p.add_argument(
        "--cfg",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="tts-eval: use CFG (default: the checkpoint's choice, off where its --cfg-scale is 1)",
    )
    p.add_argument("--max-duration-s", type=float, default=8.0, help="tts-eval: cap per utterance, s")
    p.add_argument("--temperature", type=float, default=0.7, help="tts-export: the Magpie's sampling temperature")
    p.add_argument("--topk", type=int, default=80, help="tts-export: the Magpie's top-k")
    p.add_argument(
        "--cfg-scale", type=float, default=2.5, help="tts-export: the Magpie's CFG scale (1: no guidance by default)"
    )
    p.add_argument(
        "--lookahead", type=int, default=5, help="tts-export: text tokens the inference prior may move ahead per frame"
    )
    p.add_argument(
        "--prior-epsilon", type=float, default=0.1, help="tts-export: the inference prior off its window (0-1)"
    )
    p.add_argument(
        "--track-sentence-end",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="tts-export: no end of speech before the prior has reached the text's last tokens (NeMo's "
        "ignore_finished_sentence_tracking=False)",
    )
    p.add_argument(
        "--average",
        type=int,
        default=1,
        help="tts-export, tts-probe: the last checkpoint's weights averaged with the N-1 latest kept ones "
        "(--keep-weights)",
    )
    p.add_argument("--cost-repeats", type=int, default=10, help="cost: requests per model")
    p.add_argument("--keep-wavs", type=int, default=20, help="tts-eval: synthesised clips kept under eval/")
    t = p.add_argument_group("training")
    t.add_argument("--resume", action="store_true", help="continue the stage's last checkpoint")
    t.add_argument(
        "--keep-weights", action="store_true", help="keep every checkpoint's weights under <run>/weights/"
    )
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--max-minutes", type=float, default=60.0, help="stop this run after N minutes")
    t.add_argument("--schedule-minutes", type=float, default=120.0, help="minutes over which the lr decays")
    t.add_argument("--max-steps", type=int, default=100_000)
    t.add_argument("--ckpt-minutes", type=float, default=5.0)
    t.add_argument("--log-every", type=int, default=50)
    t.add_argument("--lr", type=float, default=None, help="peak learning rate (codec 5e-4, tts 1e-3)")
    t.add_argument("--warmup-steps", type=int, default=200)
    t.add_argument(
        "--cycle-from",
        type=int,
        default=0,
        help="the step at which the schedule's warm-up and cosine begin (a new cycle of a resumed run)",
    )
    t.add_argument("--weight-decay", type=float, default=1e-4)
    t.add_argument("--batch-size", type=int, default=None, help="codec 8 crops, tts 16 utterances")
    t.add_argument("--crop-s", type=float, default=1.0, help="codec training crop, s")
    t.add_argument(
        "--unrounded-steps", type=int, default=500, help="codec: first steps with FSQ rounding off"
    )
    t.add_argument("--gan", action="store_true", help="codec --decoder-only: add the light discriminator")
    t.add_argument(
        "--onset-crops", type=float, default=0.0, help="codec: share of crops that begin at an utterance's start"
    )
    t.add_argument(
        "--decoder-only",
        action="store_true",
        help="codec, codec-export: fine-tune only the decoder of the codec run (codes unchanged) in codec_decoder/",
    )
    args = p.parse_args(argv)
    args.work = args.work.resolve()
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Run the stages in order."""
    args = parse_args(argv)
    stages = [n for n in STAGES if n not in ("park", "unpark")] if "all" in args.stages else args.stages
    for name in stages:
        for key, codec_value, tts_value in (("lr", 5e-4, 1e-3), ("batch_size", 8, 16)):
            if getattr(args, f"_{key}_given", None) is None:
                setattr(args, f"_{key}_given", getattr(args, key) is not None)
            if not getattr(args, f"_{key}_given"):
                setattr(args, key, tts_value if name.startswith("tts") else codec_value)
        print(f"[stage] {name}", flush=True)
        STAGES[name](args)


if __name__ == "__main__":
    main()
