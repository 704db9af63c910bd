"""``time-to-final``: finalize latency against utterance length, for both finalize modes.

Each utterance (1, 5, 20, 60 s by default, each plus a random fraction of a chunk so that utterances end at
random points of a chunk) is streamed in faster than real time; the benchmark waits until the
engine has decoded every complete chunk (as in a live session, where the engine keeps up), then calls
``finalize()``. Time-to-final is the engine's final ``Transcript.ttf_ms``: from the ``finalize()`` call to the final
text (the last partial chunk, the flush of the right context and detokenisation). A cache-aware model re-encodes
nothing, so TTF should not depend on how long the utterance was (target: ``TTF(60 s) / TTF(1 s) <= 1.2``).

Utterances follow one another on one stream per finalize mode, like turns of a session: ``soft`` keeps encoder
caches and decoder state across them, ``hard`` resets them after each final.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.bench import common, output, stats
from pipecat_nemotron.bench.audio import Clip, load_clips, loop_audio, wait_caught_up
from pipecat_nemotron.runtime.devices import resolve_device

NAME = "time-to-final"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of this benchmark."""
    common.add_common_args(parser, latency_default=160)
    parser.add_argument(
        "--lengths",
        type=float,
        nargs="+",
        default=[1, 5, 20, 60],
        help="utterance lengths, s (default: 1 5 20 60)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="utterances per length over 5 s (default: 5)")
    parser.add_argument(
        "--short-repeats", type=int, default=20, help="utterances per length up to 5 s (default: 20)"
    )
    parser.add_argument(
        "--finalize-modes",
        nargs="+",
        default=["soft", "hard"],
        choices=["soft", "hard"],
        help="modes to test",
    )
    parser.add_argument(
        "--push-s", type=float, default=0.5, help="audio per push while streaming in, s (default: 0.5)"
    )


async def bench_mode(
    spec: common.ModelSpec, args: argparse.Namespace, device: str, mode: str, clips: Sequence[Clip]
) -> dict[str, Any]:
    """All utterances of one finalize mode on one engine and one stream."""
    plan: list[float] = []
    most = max(args.repeats, args.short_repeats)
    for rep in range(most):
        for length in args.lengths:
            if rep < (args.short_repeats if length <= 5 else args.repeats):
                plan.append(length)
    samples: dict[float, list[float]] = {length: [] for length in args.lengths}
    waits: dict[float, list[float]] = {length: [] for length in args.lengths}
    examples: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)
    push = int(args.push_s * MODEL_SAMPLE_RATE)
    async with common.bench_engine(spec.path, device, 2, mode) as engine:
        stream = engine.open_stream(latency_ms=args.latency)
        for i, length in enumerate(plan):
            # A different stretch of audio per utterance.
            start = int(rng.integers(0, len(clips)))
            # Jitter the end by up to one chunk so every length ends at a random point of a chunk.
            seconds = length + float(rng.uniform(0.0, stream.chunk_ms / 1000.0))
            audio = loop_audio([*clips[start:], *clips[:start]], seconds, gap_s=0.2)
            for j in range(0, audio.size, push):
                await stream.push(audio[j : j + push])
                await asyncio.sleep(0)
            await wait_caught_up(stream)
            await asyncio.sleep(0.02)  # the engine is idle, as after a live stream's last chunk
            t = time.perf_counter()
            final = await stream.finalize()
            waits[length].append((time.perf_counter() - t) * 1000.0)
            samples[length].append(final.ttf_ms)
            if i < len(args.lengths):
                examples.append({"seconds": length, "ttf_ms": final.ttf_ms, "text": final.text[:120]})
        await stream.close()
    rows = []
    for length in args.lengths:
        rows.append(
            {
                "seconds": length,
                "ttf_ms": stats.summarize(samples[length]),
                "caller_wait_ms": stats.summarize(waits[length]),
            }
        )
    short, long_ = rows[0]["ttf_ms"], rows[-1]["ttf_ms"]
    out = {
        "finalize_mode": mode,
        "rows": rows,
        "ratio_long_short_p50": stats.ratio(long_["p50"], short["p50"]),
        "ratio_long_short_p90": stats.ratio(long_["p90"], short["p90"]),
        "examples": examples,
    }
    print(
        f"[bench] {mode}: TTF p50 "
        + ", ".join(f"{r['seconds']:g} s {r['ttf_ms']['p50']:.1f} ms" for r in rows)
        + f"; {args.lengths[-1]:g} s / {args.lengths[0]:g} s = {out['ratio_long_short_p50']:.2f}",
        flush=True,
    )
    return out


def plot(result: dict[str, Any]) -> Any:
    """TTF percentiles against utterance length, one line set per finalize mode."""
    fig, axes = output.new_figure(1, 1, (7.5, 4.2))
    ax = axes[0][0]
    for m, marker, color in zip(result["modes"], "os", ("tab:blue", "tab:red"), strict=False):
        x = [r["seconds"] for r in m["rows"]]
        for q, ls in (("p50", "-"), ("p90", "--"), ("p99", ":")):
            ax.plot(
                x,
                [r["ttf_ms"][q] for r in m["rows"]],
                marker=marker,
                ls=ls,
                color=color,
                label=f"{m['finalize_mode']} {q}",
            )
    ax.set_xscale("log")
    ax.set_xlabel("utterance length (s)")
    ax.set_ylabel("time-to-final (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Time-to-final vs utterance length ({result['latency_ms']} ms mode)")
    ax.legend(fontsize=8, ncol=2)
    return fig


def summary_table(result: dict[str, Any]) -> str:
    """Markdown table of the results."""
    rows = []
    for m in result["modes"]:
        for r in m["rows"]:
            t = r["ttf_ms"]
            rows.append([m["finalize_mode"], r["seconds"], t["n"], t["p50"], t["p90"], t["p99"], t["max"]])
    table = output.format_table(
        ["finalize", "utterance s", "n", "p50 ms", "p90 ms", "p99 ms", "max ms"], rows
    )
    ratios = "; ".join(
        f"{m['finalize_mode']}: TTF({result['lengths'][-1]:g} s)/TTF({result['lengths'][0]:g} s) p50 "
        f"{m['ratio_long_short_p50']:.2f}, p90 {m['ratio_long_short_p90']:.2f}"
        for m in result["modes"]
    )
    return table + "\n" + ratios


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark; write JSON and PNG under ``args.out``; return the result."""
    device = resolve_device(args.device)
    result = output.result_header(NAME, args)
    spec = common.resolve_model(args.model, args.models_dir)
    clips, source = load_clips(args.manifest)
    result.update(
        {"model": spec.as_dict(), "audio_source": source, "latency_ms": args.latency, "lengths": args.lengths}
    )
    with common.bench_context(args):
        result["modes"] = [asyncio.run(bench_mode(spec, args, device, m, clips)) for m in args.finalize_modes]
    output.finish(args.out, NAME, result, plot(result), summary_table(result))
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point: ``python -m pipecat_nemotron.bench time-to-final [options]``."""
    return common.bench_main(NAME, __doc__, add_arguments, run, argv)
