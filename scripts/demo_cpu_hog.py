"""The demo's ASR finalize times on a CPU that another process keeps busy, per torch thread count (issue 22).

    python scripts/demo_cpu_hog.py --runs 3 --hogs 1 --config new:default --config new:2 [--config old:default]

Each run streams one WAV of the bundled demo sentences (12 utterances, 1 s of silence after each) in real time
through ``python -m pipecat_nemotron.demo`` (tiny model, CPU, no LLM) while ``--hogs`` busy-looping processes run
beside it, and collects the ``ASR finalize`` time the demo prints for each final. A config is ``CODE:THREADS``:
CODE ``new`` is this checkout, any other value a directory holding another checkout (e.g. one extracted with
``git archive <commit> | tar -x -C DIR``, to measure the code before a change); THREADS is ``default`` (the code's
own choice) or a number set through ``NEMOTRON_CPU_THREADS``. Runs alternate between configs, so a machine whose
load drifts affects each alike. Prints one JSON line per config: finals delivered of those spoken, finalize p50 and
p99 (ms), the demo's exit codes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipecat_nemotron.models import DEMO_AUDIO_DIR  # noqa: E402
from pipecat_nemotron.observers.latency_stats import percentile  # noqa: E402

_FINALIZE = re.compile(r"ASR finalize ([\d.]+) ms")
_FINAL = re.compile(r"\[final\] ")
_CLIPS = ("demo_math.wav", "demo_timer.wav", "demo_weather.wav")


def build_wav(path: Path, repeats: int = 4, gap_s: float = 1.0) -> int:
    """The demo sentences ``repeats`` times each, ``gap_s`` of silence after each; returns the utterance count."""
    pieces = []
    for _ in range(repeats):
        for name in _CLIPS:
            with wave.open(str(DEMO_AUDIO_DIR / name), "rb") as w:
                pieces.append(np.frombuffer(w.readframes(w.getnframes()), dtype="<i2"))
            pieces.append(np.zeros(int(16000 * gap_s), dtype="<i2"))
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(np.concatenate(pieces).tobytes())
    return repeats * len(_CLIPS)


def run_demo(code: Path, threads: str, wav: Path, hogs: int, workdir: Path) -> subprocess.CompletedProcess[str]:
    """One demo run beside ``hogs`` busy processes (its output has the finals and their finalize times)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEMOTRON_", "MAGPIE_", "OMP_"))}
    env.update(PYTHONPATH=str(code), PYTHON_DOTENV_DISABLED="1")
    if threads != "default":
        env["NEMOTRON_CPU_THREADS"] = threads
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pipecat_nemotron.demo", "--wav", str(wav), "--device", "cpu",
             "--turns", str(workdir / "turns.jsonl")],
            cwd=workdir, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    finally:
        for p in busy:
            p.kill()
            p.wait()
    return done


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", default=[], help="CODE:THREADS (repeatable)")
    parser.add_argument("--runs", type=int, default=3, help="demo runs per config")
    parser.add_argument("--hogs", type=int, default=1, help="busy-looping processes beside the demo")
    parser.add_argument("--keep", type=Path, default=None, help="folder to keep each run's output in")
    args = parser.parse_args()
    configs = args.config or ["new:default"]
    results: dict[str, dict] = {c: {"finalize_ms": [], "exit_codes": [], "finals": 0} for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        wav = work / "turns.wav"
        spoken = build_wav(wav)
        for run in range(args.runs):
            for config in configs:
                code, threads = config.rsplit(":", 1)
                done = run_demo(ROOT if code == "new" else Path(code), threads, wav, args.hogs, work)
                ms = [float(m) for m in _FINALIZE.findall(done.stdout)]
                finals = len(_FINAL.findall(done.stdout))
                results[config]["finalize_ms"] += ms
                results[config]["finals"] += finals
                results[config]["exit_codes"].append(done.returncode)
                if args.keep is not None:
                    args.keep.mkdir(parents=True, exist_ok=True)
                    name = f"run{run + 1}-{config.replace('/', '_').replace(':', '-')}"
                    (args.keep / f"{name}.out").write_text(done.stdout)
                    (args.keep / f"{name}.err").write_text(done.stderr)
                print(
                    f"run {run + 1} {config}: {finals}/{spoken} finals ({len(ms)} with a finalize time), "
                    f"exit {done.returncode}",
                    file=sys.stderr,
                )
    for config, r in results.items():
        ms = r["finalize_ms"]
        summary = {
            "config": config,
            "hogs": args.hogs,
            "finals": f"{r['finals']}/{spoken * args.runs}",
            "finalize_times": len(ms),
            "finalize_p50_ms": round(percentile(ms, 50), 1) if ms else None,
            "finalize_p99_ms": round(percentile(ms, 99), 1) if ms else None,
            "exit_codes": r["exit_codes"],
        }
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
