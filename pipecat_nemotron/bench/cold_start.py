"""``cold-start``: how long a fresh process takes to serve its first session, and what the background import saves.

Each trial runs in a fresh Python process (``sys.executable``), as a bot's first session would:

- ``cold-warm``: import the STT service module, then ``SharedEngines.preload`` (import NeMo, restore, warm up:
  the *first start*), then start a second engine of the same model in the same process (NeMo already imported:
  the *warm start*).
- ``prefetch``: construct a ``NemotronSTTService`` (which starts importing NeMo on a background thread), spend
  ``--setup-s`` seconds as a bot does before its ``StartFrame`` (pipeline, VAD, transport, the client joining),
  then load the engine; once with the background import and once without it, alternated over ``--repeats``. The
  figure of merit is the time from ``StartFrame`` to a ready engine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from pipecat_nemotron.bench import common, output, stats
from pipecat_nemotron.runtime.devices import resolve_device

NAME = "cold-start"

_COLD_WARM = """
import asyncio, json, time
t0 = time.perf_counter()
import pipecat_nemotron.stt
from pipecat_nemotron.asr import EngineConfig, NemotronEngine
from pipecat_nemotron.asr.shared import SharedEngines
import_s = time.perf_counter() - t0

async def main():
    registry = SharedEngines()
    t = time.perf_counter()
    await registry.preload(EngineConfig(model={model!r}, device={device!r}))
    first = time.perf_counter() - t
    t = time.perf_counter()
    engine = NemotronEngine(EngineConfig(model={model!r}, device={device!r}, max_streams=8))
    await engine.start()
    warm = time.perf_counter() - t
    await engine.stop()
    await registry.close_all()
    print("RESULT " + json.dumps({{"import_s": import_s, "first_start_s": first, "warm_start_s": warm}}))

asyncio.run(main())
"""

_PREFETCH = """
import asyncio, json, time
import pipecat_nemotron.stt.local as stt_module
if not {prefetch!r}:
    stt_module.prefetch_nemo_imports = lambda: None
from pipecat_nemotron.asr import EngineConfig
from pipecat_nemotron.asr.shared import SharedEngines

async def main():
    registry = SharedEngines()
    config = EngineConfig(model={model!r}, device={device!r})
    t0 = time.perf_counter()
    stt_module.NemotronSTTService(engine_config=config, registry=registry)
    await asyncio.sleep({setup_s!r})
    t1 = time.perf_counter()
    await registry.acquire(config)
    done = time.perf_counter()
    await registry.close_all()
    print("RESULT " + json.dumps({{"start_frame_to_ready_s": done - t1, "construction_to_ready_s": done - t0}}))

asyncio.run(main())
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of this benchmark."""
    common.add_common_args(parser, manifest=False)
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per trial (default: 3)")
    parser.add_argument(
        "--setup-s", type=float, default=2.0, help="bot set-up time before StartFrame, s (default: 2)"
    )
    parser.add_argument(
        "--trials", nargs="+", default=["cold-warm", "prefetch"], choices=["cold-warm", "prefetch"]
    )


def _run_fresh(code: str) -> dict[str, float]:
    """Run ``code`` in a fresh interpreter and return the JSON it printed after ``RESULT``."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"trial failed (exit {proc.returncode}): {proc.stderr[-2000:]}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the trials; write JSON under ``args.out``; return the result."""
    device = resolve_device(args.device)
    spec = common.resolve_model(args.model, args.models_dir)
    result = output.result_header(NAME, args)
    result.update({"model": spec.as_dict(), "setup_s": args.setup_s})
    rows: list[list[Any]] = []
    if "cold-warm" in args.trials:
        runs = [
            _run_fresh(_COLD_WARM.format(model=str(spec.path), device=device)) for _ in range(args.repeats)
        ]
        result["cold_warm"] = {key: stats.summarize([r[key] for r in runs]) for key in runs[0]}
        rows += [[key, "", v["p50"], v["mean"], v["max"]] for key, v in result["cold_warm"].items()]
    if "prefetch" in args.trials:
        runs_by: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        for _ in range(args.repeats):  # alternated, so machine noise hits both alike
            for prefetch in (False, True):
                code = _PREFETCH.format(
                    model=str(spec.path), device=device, prefetch=prefetch, setup_s=args.setup_s
                )
                runs_by[prefetch].append(_run_fresh(code))
        result["prefetch"] = {
            ("on" if on else "off"): {k: stats.summarize([r[k] for r in runs]) for k in runs[0]}
            for on, runs in runs_by.items()
        }
        off = result["prefetch"]["off"]["start_frame_to_ready_s"]["p50"]
        on = result["prefetch"]["on"]["start_frame_to_ready_s"]["p50"]
        result["prefetch_saves_s_p50"] = None if off is None or on is None else off - on
        for name, trial in result["prefetch"].items():
            v = trial["start_frame_to_ready_s"]
            rows.append(["StartFrame -> ready", f"background import {name}", v["p50"], v["mean"], v["max"]])
    table = output.format_table(["what", "", "p50 s", "mean s", "max s"], rows)
    output.finish(args.out, NAME, result, None, table)
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point: ``python -m pipecat_nemotron.bench cold-start [options]``."""
    return common.bench_main(NAME, __doc__, add_arguments, run, argv)
