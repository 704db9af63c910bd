"""``python -m pipecat_nemotron.bench <name> [options]``: run one benchmark (``--help`` lists them)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: Benchmark name -> module (under ``pipecat_nemotron.bench``).
BENCHMARKS: dict[str, str] = {
    "buffered-vs-cache-aware": "buffered_vs_cache_aware",
    "concurrency": "concurrency",
    "time-to-final": "time_to_final",
    "soak": "soak",
    "cold-start": "cold_start",
    "encoder-step": "encoder_step",
    "eager": "eager",
    "agent-load": "agent_load",
    "turns": "turns",
    "multilingual": "multilingual",
    "tts": "tts",
    "boost": "boost",
    "embedded-llm": "embedded_llm",
    # Side by side with sherpa-onnx running the same weights (needs the bench extra).
    "peer": "peer",
    # The WebSocket server's load test (its own module and options).
    "load": "load",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to a benchmark's ``main``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m pipecat_nemotron.bench",
        description="Benchmarks of the Nemotron streaming ASR engine (JSON + PNG under --out).",
    )
    parser.add_argument("name", choices=sorted(BENCHMARKS), help="benchmark to run")
    parser.add_argument(
        "options", nargs=argparse.REMAINDER, help="options of the benchmark (see NAME --help)"
    )
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    ns = parser.parse_args(argv[:1])
    module = importlib.import_module(f"pipecat_nemotron.bench.{BENCHMARKS[ns.name]}")
    status = module.main(argv[1:])
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    sys.exit(main())
