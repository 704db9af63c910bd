"""Shared pieces of the benchmarks: machine/commit facts, models, audio, pacing, statistics, JSON and PNG output.

Nothing here imports NeMo or torch at import time; heavy imports happen inside the functions that need them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipecat_nemotron.engine.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.models import TINY_MODEL_PATH

if TYPE_CHECKING:
    from pipecat_nemotron.engine import ASRStream

#: The repository root (when running from a checkout).
REPO_ROOT = Path(__file__).resolve().parents[2]
#: The trained tiny model, used by default when it exists.
TRAINED_TINY_MODEL = TINY_MODEL_PATH
#: Held-out WAVs of the tiny model (``[{"audio", "text", "split"}]``, paths relative to the manifest).
HELDOUT_MANIFEST = REPO_ROOT / "tests" / "assets" / "heldout" / "manifest.json"
#: Default output folder (git-ignored).
DEFAULT_OUT = Path("bench_out")
#: Where random-weight models are built once and cached (the 600M one is ~2.5 GB: keep it out of --out).
DEFAULT_MODELS_DIR = DEFAULT_OUT / "models"
#: Model sample rate, Hz.
SAMPLE_RATE = MODEL_SAMPLE_RATE
#: Blank-logit bias of random models used for timing (a random joint otherwise emits ~10 tokens per frame).
TIMING_BLANK_BIAS = 6.0
#: Printed wherever a random-weight model produces a WER.
RANDOM_WEIGHTS_NOTE = "random weights: WER not meaningful"


# ---- machine, commit, arguments ---------------------------------------------------------------------------


def cpu_model() -> str:
    """CPU model name (``/proc/cpuinfo`` on Linux, else :func:`platform.processor`)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def load_avg() -> float | None:
    """1-minute load average of the machine (other work competing for the CPU), or None where unknown."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def machine_info() -> dict[str, Any]:
    """Facts about this machine that change benchmark results.

    Returns:
        ``cpu_model``, ``cpu_cores`` (logical), ``torch_threads``, ``load_avg_1m`` (other work on the machine
        when the benchmark started), ``ram_gb``, ``python``, ``platform``, ``torch``, ``nemo``, ``cuda`` and
        ``gpu`` (name, or None).

    """
    import torch

    info: dict[str, Any] = {
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_avg_1m": load_avg(),
        "ram_gb": None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "nemo": None,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["ram_gb"] = round(int(line.split()[1]) / 1024**2, 1)
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        info["nemo"] = version("nemo_toolkit")
    return info


def git_commit() -> dict[str, Any]:
    """``{"commit": <HEAD sha or None>, "dirty": <uncommitted or untracked package code, or None>}``."""
    out: dict[str, Any] = {"commit": None, "dirty": None}
    try:
        out["commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        # Untracked files count too: the code that ran may not be committed yet.
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", "pipecat_nemotron", "scripts", "pyproject.toml"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        out["dirty"] = bool(status.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def add_common_args(parser: argparse.ArgumentParser, *, model_default: str | None = "tiny") -> None:
    """Add ``--out``, ``--device``, ``--threads``, ``--verbose`` (and ``--model`` unless ``model_default`` is None)."""
    if model_default is not None:
        parser.add_argument(
            "--model",
            default=model_default,
            help="'tiny' (the trained tiny model if present, else a random tiny one), 'tiny-random', '600m' "
            "(the real 600M architecture, random weights, cached in --models-dir) or a .nemo path "
            "(default: %(default)s)",
        )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    parser.add_argument(
        "--models-dir",
        type=Path,
        default=DEFAULT_MODELS_DIR,
        help="cache of built random-weight models (default: %(default)s)",
    )
    parser.add_argument("--device", default="auto", help="'auto', 'cpu', 'cuda' or 'cuda:N' (default: auto)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's own choice)"
    )
    parser.add_argument("--verbose", action="store_true", help="keep the engine's INFO logs")


def args_dict(args: argparse.Namespace) -> dict[str, Any]:
    """Arguments as JSON-friendly values (paths as strings)."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` if available, else ``cpu``."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Use ``threads`` torch CPU threads inside the block (if given), then restore the previous count."""
    import torch

    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if threads:
            torch.set_num_threads(previous)


@contextlib.contextmanager
def bench_context(args: argparse.Namespace) -> Iterator[None]:
    """Thread count and log level of a benchmark run (both restored afterwards)."""
    with torch_threads(args.threads), engine_logs(args.verbose):
        yield


@contextlib.contextmanager
def engine_logs(verbose: bool) -> Iterator[None]:
    """Silence the engine's INFO logs (loguru) during a benchmark unless ``verbose``."""
    from loguru import logger

    if verbose:
        yield
        return
    logger.disable("pipecat_nemotron.engine")
    try:
        yield
    finally:
        logger.enable("pipecat_nemotron.engine")


# ---- models -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """A model to benchmark.

    Attributes:
        path: The ``.nemo`` file.
        name: Short name for tables (``tiny-trained``, ``tiny-random``, ``600m-random``, or the file stem).
        random_weights: True for a random-weight architecture (its WER means nothing).
        size: ``tiny``, ``600m`` or ``custom``.

    """

    path: Path
    name: str
    random_weights: bool
    size: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form, with the file size in MB."""
        d = asdict(self)
        d["path"] = str(self.path)
        with contextlib.suppress(OSError):
            d["file_mb"] = round(self.path.stat().st_size / 1e6, 1)
        return d


def resolve_model(spec: str, models_dir: Path) -> ModelSpec:
    """Turn a ``--model`` value into a ``.nemo`` file, building (and caching) random architectures as needed.

    Args:
        spec: ``tiny``, ``tiny-random``, ``600m`` or a ``.nemo`` path.
        models_dir: Cache folder of the random-weight models.

    Raises:
        FileNotFoundError: A path that does not exist.

    """
    if spec == "tiny" and TRAINED_TINY_MODEL.exists():
        return ModelSpec(TRAINED_TINY_MODEL, "tiny-trained", False, "tiny")
    if spec in ("tiny", "tiny-random", "600m"):
        size = "600m" if spec == "600m" else "tiny"
        path = models_dir / f"{size}_random_blank{TIMING_BLANK_BIAS:g}.nemo"
        if not path.exists():
            from pipecat_nemotron.engine.architectures import build_random_model

            what = "the 600M architecture (~2.5 GB, about a minute)" if size == "600m" else "a tiny model"
            print(f"[bench] building {what} with random weights -> {path}", flush=True)
            tmp = path.with_suffix(".tmp.nemo")
            build_random_model(tmp, size=size, seed=0, blank_bias=TIMING_BLANK_BIAS)
            tmp.replace(path)
        return ModelSpec(path, f"{size}-random", True, size)
    path = Path(spec).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"--model {spec!r}: no such file (use 'tiny', 'tiny-random', '600m' or a path)"
        )
    return ModelSpec(path, path.stem, "random" in path.stem, "custom")


# ---- audio ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Clip:
    """One utterance of benchmark audio.

    Attributes:
        name: File name (or ``synthetic-N``).
        audio: float32 mono samples at 16 kHz, in [-1, 1].
        text: Reference transcript (None for synthetic audio).

    """

    name: str
    audio: np.ndarray
    text: str | None

    @property
    def seconds(self) -> float:
        """Duration, s."""
        return self.audio.size / SAMPLE_RATE


def read_pcm16(path: Path) -> bytes:
    """Raw little-endian int16 PCM of a 16 kHz mono WAV or FLAC file.

    Raises:
        ValueError: Another sample rate, channel count or sample format.

    """
    import soundfile

    info = soundfile.info(str(path))
    if info.channels != 1 or info.samplerate != SAMPLE_RATE or info.subtype != "PCM_16":
        raise ValueError(f"{path}: expected 16 kHz mono 16-bit PCM (WAV or FLAC), got {info}")
    data, _ = soundfile.read(str(path), dtype="int16")
    return data.astype("<i2").tobytes()


def read_audio(path: Path) -> np.ndarray:
    """A 16 kHz mono 16-bit WAV or FLAC file as float32 samples in [-1, 1)."""
    return np.frombuffer(read_pcm16(path), dtype="<i2").astype(np.float32) / 32768.0


def synthetic_clip(seconds: float, seed: int) -> np.ndarray:
    """Deterministic noise with a gated tone, float32, 16 kHz (random-weight models turn it into tokens)."""
    rng = np.random.default_rng(seed)
    n = int(SAMPLE_RATE * seconds)
    t = np.arange(n) / SAMPLE_RATE
    tone = 0.03 * np.sin(2 * np.pi * (200 + 37 * seed) * t) * (np.sin(2 * np.pi * 1.5 * t) > 0)
    return (0.02 * rng.standard_normal(n) + tone).astype(np.float32)


def load_clips(manifest: Path | None = None, max_seconds: float | None = None) -> tuple[list[Clip], str]:
    """Benchmark audio: the held-out WAVs when present, else synthetic clips.

    Args:
        manifest: A JSON list ``[{"audio", "text", ...}]`` (paths relative to it) or a NeMo JSON-lines manifest
            (``audio_filepath``, ``text``). Default: ``tests/assets/heldout/manifest.json``.
        max_seconds: Stop adding clips once this much audio is collected (None: all).

    Returns:
        The clips and a description of the source.

    """
    manifest = manifest or HELDOUT_MANIFEST
    clips: list[Clip] = []
    if manifest.exists():
        text = manifest.read_text().strip()
        rows = (
            json.loads(text)
            if text.startswith("[")
            else [json.loads(line) for line in text.splitlines() if line]
        )
        total = 0.0
        for row in rows:
            path = Path(row.get("audio") or row["audio_filepath"])
            if not path.is_absolute():
                path = manifest.parent / path
            clip = Clip(path.name, read_audio(path), row.get("text"))
            clips.append(clip)
            total += clip.seconds
            if max_seconds is not None and total >= max_seconds:
                break
        return clips, f"{manifest} ({len(clips)} clips, {total:.1f} s)"
    seconds = max_seconds or 30.0
    n = max(1, math.ceil(seconds / 3.0))
    clips = [Clip(f"synthetic-{i}", synthetic_clip(seconds / n, i), None) for i in range(n)]
    return clips, f"synthetic noise+tone ({n} clips, {seconds:.1f} s; {manifest} not found)"


def loop_audio(clips: Sequence[Clip], seconds: float, gap_s: float = 0.0) -> np.ndarray:
    """``seconds`` of audio made by concatenating ``clips`` (with ``gap_s`` of silence between) in a loop."""
    n = int(seconds * SAMPLE_RATE)
    gap = np.zeros(int(gap_s * SAMPLE_RATE), dtype=np.float32)
    parts: list[np.ndarray] = []
    have = 0
    i = 0
    while have < n:
        for piece in (clips[i % len(clips)].audio, gap):
            parts.append(piece)
            have += piece.size
        i += 1
    return np.concatenate(parts)[:n]


# ---- scoring ----------------------------------------------------------------------------------------------


def normalize_text(text: str) -> str:
    """Lower case; letters, digits, apostrophes and single spaces only."""
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


def word_errors(ref: str, hyp: str) -> int:
    """Word-level Levenshtein distance (substitutions + deletions + insertions) of normalised texts."""
    r, h = normalize_text(ref).split(), normalize_text(hyp).split()
    prev = list(range(len(h) + 1))
    for i, rw in enumerate(r, 1):
        cur = [i] + [0] * len(h)
        for j, hw in enumerate(h, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (rw != hw))
        prev = cur
    return prev[-1]


def wer_percent(refs: Sequence[str | None], hyps: Sequence[str]) -> float | None:
    """Corpus WER in percent over the clips that have a reference (None if none has)."""
    errors = words = 0
    for ref, hyp in zip(refs, hyps, strict=True):
        if ref is None:
            continue
        errors += word_errors(ref, hyp)
        words += len(normalize_text(ref).split())
    return 100.0 * errors / words if words else None


# ---- statistics -------------------------------------------------------------------------------------------


def summarize(values: Sequence[float]) -> dict[str, float | int | None]:
    """``n``, ``mean``, ``p50``, ``p90``, ``p99``, ``max`` of ``values`` (None entries when empty)."""
    if len(values) == 0:
        return {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    a = np.asarray(values, dtype=float)
    return {
        "n": int(a.size),
        "mean": float(a.mean()),
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
    }


def linear_slope(t: Sequence[float], y: Sequence[float]) -> float | None:
    """Least-squares slope of ``y`` over ``t`` (units of y per unit of t), or None with fewer than 3 points."""
    if len(t) < 3:
        return None
    tt = np.asarray(t, dtype=float)
    if float(tt.max() - tt.min()) <= 0:
        return None
    return float(np.polyfit(tt, np.asarray(y, dtype=float), 1)[0])


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` or None when either is missing or ``b`` is 0."""
    if a is None or b is None or b == 0:
        return None
    return a / b


# ---- resources --------------------------------------------------------------------------------------------


def rss_bytes() -> int:
    """Resident set size of this process, bytes (``/proc/self/statm``; peak RSS where that is missing)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def gpu_bytes() -> int | None:
    """GPU memory allocated by torch on the current device, bytes (None without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.memory_allocated())


def sync_device() -> None:
    """Wait for queued GPU work (no-op on CPU)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


@dataclass
class Meter:
    """Wall and process-CPU seconds of a block (``with Meter() as m: ...``), GPU work synchronised at both ends.

    Attributes:
        wall_s: Wall-clock seconds.
        cpu_s: CPU seconds of this process (all threads).

    """

    wall_s: float = 0.0
    cpu_s: float = 0.0
    _t: tuple[float, float] = field(default=(0.0, 0.0), repr=False)

    def __enter__(self) -> Meter:
        sync_device()
        self._t = (time.perf_counter(), time.process_time())
        return self

    def __exit__(self, *exc: object) -> None:
        sync_device()
        self.wall_s = time.perf_counter() - self._t[0]
        self.cpu_s = time.process_time() - self._t[1]


# ---- pacing -----------------------------------------------------------------------------------------------


@dataclass
class PaceStats:
    """How well a real-time feeder kept to its schedule.

    Attributes:
        frames: Frames pushed.
        late_max_ms: Worst lateness of a push against its deadline, ms (event-loop stalls show up here).

    """

    frames: int = 0
    late_max_ms: float = 0.0


async def feed_realtime(
    stream: ASRStream,
    audio: np.ndarray,
    t0: float,
    frame_ms: float = 20.0,
    stop_at: float | None = None,
    stats: PaceStats | None = None,
) -> PaceStats:
    """Push ``audio`` in ``frame_ms`` frames, frame ``i`` at ``t0 + (i + 1) * frame_ms`` (loop monotonic time).

    Deadlines come from ``t0`` and the frame index, never from summed sleeps, so pacing does not drift; a
    frame whose deadline has passed is pushed at once (and counted as late).

    Args:
        stream: Engine stream to feed.
        audio: float32 samples at 16 kHz.
        t0: Loop time (``loop.time()``) at which the audio starts "being spoken".
        frame_ms: Frame length, ms.
        stop_at: Loop time after which no more frames are pushed.
        stats: Accumulate into this object (else a new one).

    Returns:
        The pacing statistics.

    """
    loop = asyncio.get_running_loop()
    stats = stats or PaceStats()
    step = int(SAMPLE_RATE * frame_ms / 1000)
    for i, start in enumerate(range(0, audio.size, step)):
        deadline = t0 + (i + 1) * frame_ms / 1000.0
        if stop_at is not None and deadline > stop_at:
            break
        delay = deadline - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        stats.late_max_ms = max(stats.late_max_ms, (loop.time() - deadline) * 1000.0)
        await stream.push(audio[start : start + step])
        stats.frames += 1
    return stats


async def wait_caught_up(stream: ASRStream, timeout_s: float = 300.0) -> None:
    """Wait until the engine has taken every complete chunk the stream has received.

    Raises:
        TimeoutError: Still behind after ``timeout_s``.

    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while stream.backlog_ms >= stream.chunk_ms + 16 or stream.in_flight:
        if loop.time() > deadline:
            raise TimeoutError(f"stream still {stream.backlog_ms:.0f} ms behind after {timeout_s} s")
        await asyncio.sleep(0.005)


def remove_step_listener(engine: Any, listener: Any) -> None:
    """Undo ``engine.add_step_listener(listener)`` (the engine has no public remover)."""
    with contextlib.suppress(ValueError, Exception):
        engine._require().step_listeners.remove(listener)


# ---- output -----------------------------------------------------------------------------------------------


def result_header(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The fields every result JSON starts with: benchmark, time, machine, commit, args."""
    machine = machine_info()
    if getattr(args, "threads", None):
        machine["torch_threads"] = args.threads
    return {
        "_t0": time.perf_counter(),
        "benchmark": name,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine,
        **git_commit(),
        "args": args_dict(args),
    }


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def write_json(out_dir: Path, name: str, result: dict[str, Any]) -> Path:
    """Write ``out_dir/<name>.json`` (pretty, NaN-free) and return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(result, indent=1, default=_json_default, allow_nan=False) + "\n")
    return path


def new_figure(rows: int = 1, cols: int = 1, size: tuple[float, float] = (10.0, 4.0)) -> tuple[Any, Any]:
    """A matplotlib figure on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt.subplots(rows, cols, figsize=size, squeeze=False)


def save_figure(fig: Any, out_dir: Path, name: str, subtitle: str = "") -> Path:
    """Save ``fig`` as ``out_dir/<name>.png`` (small: 90 dpi) and close it."""
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    if subtitle:
        fig.text(0.01, 0.005, subtitle, fontsize=7, color="0.4", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.03 if subtitle else 0, 1, 1))
    path = out_dir / f"{name}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_subtitle(result: dict[str, Any]) -> str:
    """A one-line footer for plots: machine, model, commit."""
    m = result["machine"]
    where = m.get("gpu") or f"{m['cpu_model']} x{m['cpu_cores']}"
    commit = (result.get("commit") or "no-git")[:8] + ("+dirty" if result.get("dirty") else "")
    names = [m["model"]["name"] for m in result.get("models", [])]
    if "model" in result:
        names.append(result["model"]["name"])
    models = ", ".join(dict.fromkeys(names))
    return f"{where} | torch {m['torch']} | {models} | {commit}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (numbers formatted compactly, None as '-')."""

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            if v == 0:
                return "0"
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def finish(out_dir: Path, name: str, result: dict[str, Any], fig: Any | None, summary: str) -> None:
    """Write JSON (+ PNG), store the wall time of the whole benchmark, and print the summary."""
    started = result.get("_t0")
    if started is not None:
        result["duration_s"] = round(time.perf_counter() - started, 1)
        del result["_t0"]
    json_path = write_json(out_dir, name, result)
    png = save_figure(fig, out_dir, name, plot_subtitle(result)) if fig is not None else None
    print(summary)
    print(f"[bench] wrote {json_path}" + (f" and {png}" if png else ""), flush=True)
