"""``buffered-vs-cache-aware``: our cache-aware engine against NeMo's buffered RNNT pipeline at matched latency.

Compute per audio-second and WER, on the same model and the same audio.

Baseline: NeMo's own ``BufferedRNNTPipeline`` (``nemo.collections.asr.inference``, built with
``PipelineBuilder.build_pipeline(cfg)``, stateful RNNT decoding, ``request_type=frame``). Every step it re-encodes
a window of ``left 1.6 s + chunk + right context`` and decodes the chunk's frames. Three adjustments, all
recorded in the JSON:

* Its per-buffer feature normalisation is switched off (``--keep-nemo-normalization`` keeps it): these models
  are trained on un-normalised log-mel (``normalize: NA``), and per-buffer normalisation would hand the baseline
  a WER it does not deserve.
* Each clip is followed by right-context-long silence (``--no-buffered-flush`` drops it): NeMo's stateful buffered
  pipeline decodes only the chunk region of a stream's last frame, so the words in the last right-context window
  would be lost; the engine's ``finalize()`` flushes by itself. In a live session that silence is simply the audio
  after speech, so the baseline's cost is divided by the audio it processed (clip + silence): the steady-state
  cost per second of stream, not a per-clip penalty.
* Its encoder uses ``att_context_size`` ``--buffered-att-context`` (default ``70,13``: the widest context the
  multi-lookahead checkpoint was trained with; ``-1,-1`` is full offline attention).

Matched latency: the cache-aware mode ``L`` ms emits a chunk of ``L`` ms of audio per step (right context
included); the buffered baseline at ``L`` uses ``chunk + right context = L`` (160 ms: 0.08 + 0.08 s;
560 ms: 0.24 + 0.32 s). Either way a sample waits at most ``L`` ms (plus compute) before its text can appear.

Cost is measured per second of audio: wall seconds, process CPU seconds (all threads), and the time inside
model steps (GPU-synchronised on CUDA, so an upper bound of GPU busy time). Runs alternate A/B order between
repeats so that background load on a shared machine hits both sides alike.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipecat_nemotron.bench import common, output, stats
from pipecat_nemotron.bench.audio import Clip, load_clips, synthetic_clip
from pipecat_nemotron.bench.buffered_baseline import BUFFERED_LEFT_S, BUFFERED_SPLIT, BufferedBaseline
from pipecat_nemotron.bench.wer import wer_percent
from pipecat_nemotron.runtime.devices import resolve_device

NAME = "buffered-vs-cache-aware"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of this benchmark."""
    common.add_common_args(parser, model_default=None)
    parser.add_argument(
        "--model",
        nargs="+",
        default=["tiny", "600m"],
        help="models to compare: 'tiny' (trained if present), 'tiny-random', '600m' (random-weight 600M "
        "architecture, built once and cached in --models-dir) or .nemo paths (default: tiny 600m)",
    )
    parser.add_argument(
        "--latency", type=int, nargs="+", default=[160, 560], help="latency modes, ms (default: 160 560)"
    )
    parser.add_argument(
        "--streams",
        type=int,
        nargs="+",
        default=[1, 4],
        help="concurrent streams (batched in both backends) (default: 1 4)",
    )
    parser.add_argument(
        "--max-audio-s",
        type=float,
        default=90.0,
        help="audio per run for tiny/custom models, s (default: 90; the bundled held-out subset has ~510 s)",
    )
    parser.add_argument(
        "--max-audio-s-600m", type=float, default=6.0, help="audio per run for the 600M model, s (default: 6)"
    )
    parser.add_argument("--repeats", type=int, default=1, help="A/B runs per setting, order alternating")
    parser.add_argument(
        "--encoder-steps",
        nargs="+",
        choices=["fast", "nemo"],
        default=["fast", "nemo"],
        help="cache-aware engines to run: our encoder step and/or NeMo's (default: fast nemo; the first is "
        "the 'cache-aware' column, a second one gets its own column)",
    )
    parser.add_argument(
        "--buffered-att-context",
        default="70,13",
        help="encoder att_context_size of the buffered baseline (default: 70,13; '-1,-1' = offline)",
    )
    parser.add_argument(
        "--no-buffered-flush",
        action="store_true",
        help="do not follow each clip with right-context-long silence in the buffered baseline (it then drops "
        "the last words)",
    )
    parser.add_argument(
        "--keep-nemo-normalization",
        action="store_true",
        help="keep the buffered pipeline's per-buffer feature normalisation (wrong for normalize=NA models)",
    )


# ---- the cache-aware engine -------------------------------------------------------------------------------


async def run_engine(
    engine: Any, clips: Sequence[Clip], latency_ms: int, streams: int
) -> tuple[list[str], float]:
    """Transcribe ``clips`` through the engine, ``streams`` at a time (each clip its own stream, pushed whole).

    Returns:
        The transcripts (in clip order) and the seconds spent inside model steps.

    """
    texts = [""] * len(clips)
    step_ms: list[float] = []
    listener = lambda s: step_ms.append(s.step_ms)  # noqa: E731
    engine.add_step_listener(listener)
    queues = [list(range(i, len(clips), streams)) for i in range(streams)]

    async def worker(queue: list[int]) -> None:
        for idx in queue:
            final = await engine.transcribe(clips[idx].audio, latency_ms=latency_ms)
            texts[idx] = final.text

    try:
        await asyncio.gather(*(worker(q) for q in queues))
    finally:
        engine.remove_step_listener(listener)
    return texts, sum(step_ms) / 1000.0


# ---- orchestration ----------------------------------------------------------------------------------------


@dataclass
class Side:
    """Accumulated cost of one backend in one setting."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    step_s: float = 0.0
    audio_s: float = 0.0
    texts: list[str] | None = None

    def add(self, meter: stats.Meter, step_s: float, audio_s: float, texts: list[str]) -> None:
        """Count one run: its meter, seconds inside model steps, audio processed; keep the first transcripts."""
        self.wall_s += meter.wall_s
        self.cpu_s += meter.cpu_s
        self.step_s += step_s
        self.audio_s += audio_s
        if self.texts is None:
            self.texts = texts

    def per_audio_s(self) -> dict[str, float | None]:
        """Seconds per audio-second."""
        a = self.audio_s or float("nan")
        return {
            "wall_s_per_audio_s": self.wall_s / a,
            "cpu_s_per_audio_s": self.cpu_s / a,
            "step_s_per_audio_s": self.step_s / a,
        }


def engine_backends(encoder_steps: Sequence[str]) -> dict[str, str]:
    """Result key of the engine running each requested encoder step.

    The first step (``fast`` when both are asked for) is ``cache_aware``; NeMo's step next to it is
    ``cache_aware_nemo_step``.
    """
    steps = ["fast", "nemo"] if set(encoder_steps) == {"fast", "nemo"} else list(dict.fromkeys(encoder_steps))
    return {step: "cache_aware" if i == 0 else "cache_aware_nemo_step" for i, step in enumerate(steps)}


async def measure_setting(
    engines: dict[str, Any],
    baseline: BufferedBaseline,
    clips: Sequence[Clip],
    latency_ms: int,
    streams: int,
    repeats: int,
    order_offset: int,
) -> dict[str, Side]:
    """Every backend on the same clips, ``repeats`` times, rotating which runs first.

    Args:
        engines: The started cache-aware engines by result key (:func:`engine_backends`).
        baseline: The buffered baseline of the same model.
        clips: The audio.
        latency_ms: Latency mode, ms.
        streams: Concurrent streams.
        repeats: A/B runs.
        order_offset: Shifts the alternation (the settings measured before), so that consecutive settings do
            not all start with the same backend.

    Returns:
        A :class:`Side` per backend: the engines' keys and ``"buffered"``.

    """
    audio_s = sum(c.seconds for c in clips)
    backends = [*engines, "buffered"]
    sides = {backend: Side() for backend in backends}
    for rep in range(repeats):
        shift = (rep + order_offset) % len(backends)
        for backend in backends[shift:] + backends[:shift]:
            with stats.Meter() as m:
                if backend in engines:
                    texts, step_s = await run_engine(engines[backend], clips, latency_ms, streams)
                    processed_s = audio_s
                else:
                    texts, step_s, processed_s = baseline.run(clips, latency_ms, streams)
            sides[backend].add(m, step_s, processed_s, texts)
    return sides


def setting_row(
    spec: common.ModelSpec,
    clips: Sequence[Clip],
    latency_ms: int,
    streams: int,
    sides: dict[str, Side],
    baseline: BufferedBaseline,
    repeats: int,
) -> dict[str, Any]:
    """The result row of one setting: cost per audio-second and WER of each backend, their ratios, examples."""
    refs = [c.text for c in clips]
    row: dict[str, Any] = {
        "latency_ms": latency_ms,
        "streams": streams,
        "audio_s": round(sum(c.seconds for c in clips), 2),
        "buffered_processed_audio_s": round(sides["buffered"].audio_s / repeats, 2),
        "buffered_geometry": baseline.geometry(latency_ms),
    }
    for backend, side in sides.items():
        wer = None if spec.random_weights else wer_percent(refs, side.texts or [])
        row[backend] = {**side.per_audio_s(), "wer_percent": wer}
    for key in ("wall_s_per_audio_s", "cpu_s_per_audio_s", "step_s_per_audio_s"):
        for backend in sides:
            if backend != "buffered":
                suffix = "" if backend == "cache_aware" else backend.removeprefix("cache_aware")
                row[f"ratio_{key.split('_s_per')[0]}{suffix}"] = stats.ratio(
                    row["buffered"][key], row[backend][key]
                )
    pairs = zip(clips, sides["cache_aware"].texts or [], sides["buffered"].texts or [], strict=False)
    row["examples"] = [{"ref": c.text, "cache_aware": a, "buffered": b} for c, a, b in list(pairs)[:3]]
    print(
        f"[bench] {spec.name} {latency_ms} ms x{streams}: cache-aware "
        f"{row['cache_aware']['cpu_s_per_audio_s']:.3f} CPU-s/audio-s, buffered "
        f"{row['buffered']['cpu_s_per_audio_s']:.3f} -> {row['ratio_cpu']:.2f}x "
        f"(wall {row['ratio_wall']:.2f}x)"
        + (f"; with NeMo's step {row['ratio_cpu_nemo_step']:.2f}x" if "ratio_cpu_nemo_step" in row else ""),
        flush=True,
    )
    return row


async def bench_model(
    spec: common.ModelSpec, args: argparse.Namespace, device: str, att_context: list[int]
) -> dict[str, Any]:
    """All settings of one model: both backends, each latency and stream count."""
    cap = args.max_audio_s_600m if spec.size == "600m" else args.max_audio_s
    clips, source = load_clips(args.manifest, cap)
    print(f"[bench] {spec.name}: {source}", flush=True)
    if spec.random_weights:
        print(f"[bench] {spec.name}: {common.RANDOM_WEIGHTS_NOTE}", flush=True)

    max_streams = max(args.streams)
    t = time.perf_counter()
    baseline = BufferedBaseline(
        spec.path,
        device,
        args.latency,
        max_streams,
        att_context,
        args.keep_nemo_normalization,
        flush=not args.no_buffered_flush,
    )
    build_s = time.perf_counter() - t
    rows: list[dict[str, Any]] = []
    async with contextlib.AsyncExitStack() as stack:
        engines = {
            key: await stack.enter_async_context(
                common.bench_engine(spec.path, device, max_streams, "hard", encoder_step=step)
            )
            for step, key in engine_backends(args.encoder_steps).items()
        }
        warm = [Clip("warmup", synthetic_clip(1.0, 99), None)]
        for latency in args.latency:
            baseline.run(warm, latency, 1)  # first-call costs (allocations, decoder setup)
            for streams in args.streams:
                sides = await measure_setting(
                    engines, baseline, clips, latency, streams, args.repeats, len(rows)
                )
                rows.append(setting_row(spec, clips, latency, streams, sides, baseline, args.repeats))
        engine = next(iter(engines.values()))
    return {
        "model": spec.as_dict(),
        "audio_source": source,
        "wer_note": common.RANDOM_WEIGHTS_NOTE if spec.random_weights else None,
        "baseline_build_s": round(build_s, 1),
        "engine_load_s": round(engine.info.load_seconds, 1),
        "rows": rows,
    }


def plot(result: dict[str, Any]) -> Any:
    """Bar chart: CPU seconds per audio-second of both backends, per model/latency/streams."""
    fig, axes = output.new_figure(1, 1, (max(6.0, 1.6 * sum(len(m["rows"]) for m in result["models"])), 4.2))
    ax = axes[0][0]
    labels, ca, bu = [], [], []
    for m in result["models"]:
        for r in m["rows"]:
            labels.append(f"{m['model']['name']}\n{r['latency_ms']} ms x{r['streams']}")
            ca.append(r["cache_aware"]["cpu_s_per_audio_s"])
            bu.append(r["buffered"]["cpu_s_per_audio_s"])
    x = np.arange(len(labels))
    nemo = [
        r.get("cache_aware_nemo_step", {}).get("cpu_s_per_audio_s")
        for m in result["models"]
        for r in m["rows"]
    ]
    if all(v is not None for v in nemo):
        ax.bar(x - 0.3, ca, 0.3, label="cache-aware engine, our encoder step")
        ax.bar(x, nemo, 0.3, label="cache-aware engine, NeMo's encoder step")
        ax.bar(x + 0.3, bu, 0.3, label="NeMo BufferedRNNTPipeline")
    else:
        ax.bar(x - 0.2, ca, 0.4, label="cache-aware engine")
        ax.bar(x + 0.2, bu, 0.4, label="NeMo BufferedRNNTPipeline")
    for i, (a, b) in enumerate(zip(ca, bu, strict=True)):
        if a:
            ax.text(i, max(a, b) * 1.02, f"{b / a:.1f}x", ha="center", fontsize=8)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("CPU seconds per audio second")
    ax.set_yscale("log")
    ax.set_title("Compute per audio-second at matched latency (lower is better)")
    ax.legend(fontsize=8)
    return fig


def summary_table(result: dict[str, Any]) -> str:
    """The Markdown table of the results (with NeMo-step columns when that engine ran too)."""
    nemo_step = any("cache_aware_nemo_step" in r for m in result["models"] for r in m["rows"])
    headers = ["model", "latency ms", "streams", "cache-aware CPU-s/audio-s"]
    headers += ["cache-aware NeMo step CPU-s/audio-s"] if nemo_step else []
    headers += ["buffered CPU-s/audio-s", "ratio (CPU)", "ratio (wall)"]
    headers += ["ratio NeMo step (CPU)", "NeMo step / fast step (CPU)"] if nemo_step else []
    headers += ["WER cache-aware %", "WER buffered %"]
    rows = []
    for m in result["models"]:
        for r in m["rows"]:
            ca, bu = r["cache_aware"], r["buffered"]
            row = [m["model"]["name"], r["latency_ms"], r["streams"], ca["cpu_s_per_audio_s"]]
            if nemo_step:
                row.append(r["cache_aware_nemo_step"]["cpu_s_per_audio_s"])
            row += [bu["cpu_s_per_audio_s"], r["ratio_cpu"], r["ratio_wall"]]
            if nemo_step:
                nemo_cpu = r["cache_aware_nemo_step"]["cpu_s_per_audio_s"]
                row += [r["ratio_cpu_nemo_step"], stats.ratio(nemo_cpu, ca["cpu_s_per_audio_s"])]
            row += [ca["wer_percent"], bu["wer_percent"]]
            rows.append(row)
    return output.format_table(headers, rows)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark; write JSON and PNG under ``args.out``; return the result."""
    device = resolve_device(args.device)
    att_context = [int(v) for v in args.buffered_att_context.split(",")]
    for latency in args.latency:
        if latency not in BUFFERED_SPLIT:
            raise SystemExit(f"--latency {latency}: expected one of {sorted(BUFFERED_SPLIT)}")
    result = output.result_header(NAME, args)
    specs = [common.resolve_model(m, args.models_dir) for m in args.model]
    result["baseline"] = {
        "implementation": "nemo.collections.asr.inference BufferedRNNTPipeline via PipelineBuilder.build_pipeline",
        "stateful": True,
        "left_s": BUFFERED_LEFT_S,
        "split_s": {str(k): v for k, v in BUFFERED_SPLIT.items() if k in args.latency},
        "att_context_size": att_context,
        "per_buffer_normalization": bool(args.keep_nemo_normalization),
        "flush_silence_after_clip_s": None if args.no_buffered_flush else "right context",
    }
    result["cache_aware_encoder_step"] = next(iter(engine_backends(args.encoder_steps)))
    result["latency_definition"] = (
        "cache-aware mode L: a step takes L ms of audio (right context included); buffered at L: chunk + right "
        "context = L. Either way a sample waits at most L ms plus compute before its text can appear."
    )
    with common.bench_context(args):
        result["models"] = [asyncio.run(bench_model(s, args, device, att_context)) for s in specs]
    fig = plot(result)
    notes = [f"{m['model']['name']}: {m['wer_note']}" for m in result["models"] if m["wer_note"]]
    output.finish(
        args.out, NAME, result, fig, summary_table(result) + ("\n" + "\n".join(notes) if notes else "")
    )
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point: ``python -m pipecat_nemotron.bench buffered-vs-cache-aware [options]``."""
    return common.bench_main(NAME, __doc__, add_arguments, run, argv)
