"""Shared set-up of the benchmarks: machine/commit facts, options, device and threads, models and engines.

The other shared pieces live next to it: :mod:`~pipecat_nemotron.bench.audio` (clips, pacing),
:mod:`~pipecat_nemotron.bench.stats` (statistics, resource meters), :mod:`~pipecat_nemotron.bench.wer` (scoring)
and :mod:`~pipecat_nemotron.bench.output` (JSON, tables, figures). Nothing here imports NeMo or torch at import
time; heavy imports happen inside the functions that need them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipecat_nemotron.models import TINY_MODEL_PATH

if TYPE_CHECKING:
    from pipecat_nemotron.asr import NemotronEngine
    from pipecat_nemotron.asr.config import EncoderStep, FinalizeMode

#: The repository root (when running from a checkout).
REPO_ROOT = Path(__file__).resolve().parents[2]
#: The trained tiny model, used by default when it exists.
TRAINED_TINY_MODEL = TINY_MODEL_PATH
#: Default output folder (git-ignored).
DEFAULT_OUT = Path("bench_out")
#: Where random-weight models are built once and cached (the 600M one is ~2.5 GB: keep it out of --out).
DEFAULT_MODELS_DIR = DEFAULT_OUT / "models"
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


def add_common_args(
    parser: argparse.ArgumentParser,
    *,
    model_default: str | None = "tiny",
    latency_default: int | None = None,
    manifest: bool = True,
) -> None:
    """Add the options every benchmark shares.

    Args:
        parser: The benchmark's parser.
        model_default: Default of ``--model`` (None: no ``--model``; the benchmark adds its own).
        latency_default: Default of ``--latency``, ms (None: no ``--latency``).
        manifest: Add ``--manifest`` (the benchmark reads clips with :func:`~pipecat_nemotron.bench.audio.load_clips`).

    """
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
    if latency_default is not None:
        parser.add_argument(
            "--latency", type=int, default=latency_default, help="latency mode, ms (default: %(default)s)"
        )
    if manifest:
        parser.add_argument(
            "--manifest", type=Path, default=None, help="audio manifest (default: held-out set)"
        )


def bench_main(
    name: str,
    description: str | None,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], dict[str, Any]],
    argv: Sequence[str] | None,
) -> dict[str, Any]:
    """Command-line entry point of one benchmark: ``python -m pipecat_nemotron.bench <name> [options]``.

    Args:
        name: The benchmark's name.
        description: Its ``--help`` text (the module docstring).
        add_arguments: Adds its options to the parser.
        run: Runs it with the parsed options and returns the result.
        argv: The options (default: ``sys.argv[1:]``).

    Returns:
        What ``run`` returned.

    """
    parser = argparse.ArgumentParser(prog=f"python -m pipecat_nemotron.bench {name}", description=description)
    add_arguments(parser)
    return run(parser.parse_args(argv))


def args_dict(args: argparse.Namespace) -> dict[str, Any]:
    """Arguments as JSON-friendly values (paths as strings)."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}


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
    logger.disable("pipecat_nemotron.asr")
    try:
        yield
    finally:
        logger.enable("pipecat_nemotron.asr")


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
            from pipecat_nemotron.asr.architectures import build_random_model

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


def load_bench_model(spec: ModelSpec, device: str) -> tuple[Any, Any, Any]:
    """Load a model as the engine would (its device and default dtype), for benchmarks that time its parts.

    Args:
        spec: The model.
        device: ``cpu``, ``cuda`` or ``cuda:N`` (``auto`` picks CUDA when present).

    Returns:
        ``(model, torch device, torch dtype)``.

    """
    from pipecat_nemotron.asr import EngineConfig
    from pipecat_nemotron.asr.loading import load_asr_model, resolve_dtype, resolve_torch_device

    torch_device = resolve_torch_device(device)
    dtype = resolve_dtype("auto", torch_device)
    model = load_asr_model(EngineConfig(model=str(spec.path), device=str(torch_device)), torch_device, dtype)
    return model, torch_device, dtype


def bench_engine(
    model: str | Path,
    device: str,
    streams: int,
    finalize_mode: FinalizeMode = "soft",
    encoder_step: EncoderStep = "fast",
) -> NemotronEngine:
    """An engine for a benchmark: ``streams`` slots, all of them batched in one step, warmed up when it starts.

    Use it as ``async with bench_engine(...) as engine:`` (starts and stops it).

    Args:
        model: The ``.nemo`` file.
        device: ``cpu``, ``cuda`` or ``cuda:N``.
        streams: Stream slots (and the largest batch).
        finalize_mode: ``soft`` or ``hard``.
        encoder_step: ``fast`` (ours) or ``nemo`` (NeMo's ``cache_aware_stream_step``).

    """
    from pipecat_nemotron.asr import EngineConfig, NemotronEngine

    return NemotronEngine(
        EngineConfig(
            model=str(model),
            device=device,
            max_streams=streams,
            max_batch_size=streams,
            finalize_mode=finalize_mode,
            warmup=True,
            encoder_step=encoder_step,
        )
    )
