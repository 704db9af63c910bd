"""``tts``: Magpie synthesis with our fast step (KV cache, continuous batching) against NeMo's ``generate_speech``.

Two parts, each through :class:`~pipecat_nemotron.tts.magpie.MagpieEngine` (codec decoding and streaming included):

1. **Large** (``--large``, default the released 357M shape with random weights, built once into ``--models-dir``):
   one request on NeMo's step and on ours (time to first audio, real-time factor), 8 requests submitted together
   on ours (first audio p50, audio-seconds per wall-second), and our step time at frame 400 vs frame 40.
2. **Tiny** (the 1.7M test model): 1/2/4/8/16 requests submitted together, on NeMo's step (FIFO), on ours with
   ``max_batch=1`` (FIFO) and on ours batched; plus our step time with 8 rows vs 1.

Random weights never end speech (end-of-speech logit biased off), so every request produces exactly the frames
asked for. Both models use the tiny codec (the released codec is not available offline): codec time is a smaller
share here than with the real one, the same for both steps. Ratios are measured within one run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipecat_nemotron.bench import common, output

NAME = "tts"
SENTENCE = "The quick brown fox jumps over the lazy dog, and then it runs far away into the woods."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of this benchmark."""
    common.add_common_args(parser, model_default=None, manifest=False)
    parser.add_argument(
        "--large", choices=["357m", "small", "none"], default="357m", help="large model shape (default: 357m)"
    )
    parser.add_argument("--large-frames", type=int, default=60, help="frames per large request (default: 60)")
    parser.add_argument(
        "--tiny-frames", type=int, default=43, help="frames per tiny request, ~2 s (default: 43)"
    )
    parser.add_argument(
        "--tiny-counts", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="tiny request counts"
    )
    parser.add_argument("--no-tiny", action="store_true", help="skip the tiny-model table")
    parser.add_argument("--no-cfg", action="store_true", help="disable classifier-free guidance")
    parser.add_argument(
        "--dtype", choices=["float32", "bfloat16"], default="float32", help="our step's dtype (NeMo's: float32)"
    )


def _build(shape_name: str, models_dir: Path) -> tuple[Path, Path]:
    from pipecat_nemotron.tts.magpie import tiny

    shape = {
        "357m": tiny.RELEASED_SHAPE,
        "small": tiny.SMALL_RELEASED_FAMILY_SHAPE,
        "tiny": tiny.TINY_SHAPE,
    }[shape_name]
    folder = models_dir / f"magpie_{shape_name}_random"
    magpie, codec = folder / "tiny_magpie.nemo", folder / "tiny_codec.nemo"
    if not magpie.exists():
        print(f"[bench] building a random Magpie of shape {shape_name} into {folder} ...", flush=True)
        tiny.build_tiny_magpie(folder, seed=0, end_of_speech_bias=-30.0, shape=shape)
    return magpie, codec


def _engine(paths: tuple[Path, Path], device: str, step: str, max_batch: int, dtype: str = "float32") -> Any:
    from pipecat_nemotron.tts.magpie import MagpieEngine

    engine = MagpieEngine(
        str(paths[0]),
        device=device,
        codec_model_path=str(paths[1]),
        step=step,
        max_batch=max_batch,
        dtype=dtype if step == "fast" else "float32",
    )
    engine.wait_until_ready(timeout=3600)
    return engine


def _options(engine: Any, frames: int, use_cfg: bool, seed: int = 0) -> Any:
    from pipecat_nemotron.tts.magpie import MagpieSynthesisOptions

    seconds = (frames - 0.5) * engine.samples_per_frame / engine.sample_rate
    return MagpieSynthesisOptions(max_duration_s=seconds, use_cfg=use_cfg, seed=seed)


def _together(engine: Any, count: int, frames: int, use_cfg: bool) -> dict[str, Any]:
    """Submit ``count`` requests at once; first-audio times and audio-seconds per wall-second."""
    started = time.perf_counter()
    streams = [
        engine.submit(f"{SENTENCE} Number {i}.", options=_options(engine, frames, use_cfg, seed=i))
        for i in range(count)
    ]
    audio_s = 0.0
    for stream in streams:
        audio_s += sum(chunk.duration_s for chunk in stream)
    wall = time.perf_counter() - started
    first = sorted(s.stats.time_to_first_audio_s * 1000 for s in streams)
    waits = [s.stats.queue_wait_s * 1000 for s in streams]
    return {
        "requests": count,
        "first_audio_p50_ms": round(statistics.median(first), 1),
        "first_audio_max_ms": round(first[-1], 1),
        "queue_wait_max_ms": round(max(waits), 1),
        "audio_s": round(audio_s, 2),
        "wall_s": round(wall, 3),
        "audio_s_per_wall_s": round(audio_s / wall, 3),
        "rtf": round(wall / audio_s, 3),
    }


def _step_times(
    engine: Any, rows: int, at: Sequence[int], use_cfg: bool, repeats: int = 8
) -> dict[int, float]:
    """Our step's median time (ms) with ``rows`` rows around each frame index in ``at`` (run on this thread).

    On CUDA the step is the CUDA-graphed one the engine uses, and each timing waits for the GPU.
    """
    import torch

    from pipecat_nemotron.tts.magpie.fast_step import FastMagpieStep, RowSampling
    from pipecat_nemotron.tts.magpie.graphs import GraphedMagpieStep
    from pipecat_nemotron.tts.magpie.runner import text_chunks

    model = engine.model
    tokens = text_chunks(model, SENTENCE, "en")[0]
    cuda = next(model.decoder.parameters()).is_cuda
    step = (GraphedMagpieStep if cuda else FastMagpieStep)(model, max_slots=2 * rows)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for i in range(rows):
        step.add_row(tokens, 2, RowSampling(0.7, 80, use_cfg, torch.Generator().manual_seed(i)))
    times: dict[int, float] = {}
    frame = 0
    for target in sorted(at):
        while frame < target:
            step.advance(step.forward())
            frame += 1
        samples = []
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            step.advance(step.forward())
            sync()
            samples.append((time.perf_counter() - t0) * 1000)
            frame += 1
        times[target] = round(statistics.median(samples), 2)
    return times


def run_large(args: argparse.Namespace) -> dict[str, Any]:
    """The 357M-shape measurements: NeMo's step vs ours, one request; ours with 8; step time vs length."""
    paths = _build(args.large, args.models_dir)
    use_cfg = not args.no_cfg
    frames = args.large_frames
    result: dict[str, Any] = {"shape": args.large, "frames": frames}
    nemo = _engine(paths, args.device, "nemo", 1)
    try:
        result["nemo_single"] = _together(nemo, 1, frames, use_cfg)
    finally:
        nemo.close()
    fast = _engine(paths, args.device, "fast", 8, args.dtype)
    try:
        result["fast_single"] = _together(fast, 1, frames, use_cfg)
        result["fast_8"] = _together(fast, 8, frames, use_cfg)
        result["fast_graphs"] = fast.graphs  # CUDA graphs captured (empty on CPU)
        result["fast_step_ms"] = _step_times(fast, 1, [40, 400], use_cfg)
    finally:
        fast.close()
    ns, fs, f8 = result["nemo_single"], result["fast_single"], result["fast_8"]
    result["ratios"] = {
        "first_audio_fast_over_nemo": round(fs["first_audio_p50_ms"] / ns["first_audio_p50_ms"], 3),
        "rtf_nemo_over_fast": round(ns["rtf"] / fs["rtf"], 2),
        "first_audio_p50_8_over_1": round(f8["first_audio_p50_ms"] / fs["first_audio_p50_ms"], 2),
        "throughput_8_over_1": round(f8["audio_s_per_wall_s"] / fs["audio_s_per_wall_s"], 2),
        "step_400_over_40": round(result["fast_step_ms"][400] / result["fast_step_ms"][40], 3),
    }
    return result


def run_tiny(args: argparse.Namespace) -> dict[str, Any]:
    """The tiny-model table: NeMo's step (FIFO), ours FIFO (max_batch=1) and ours batched, per request count."""
    paths = _build("tiny", args.models_dir)
    use_cfg = not args.no_cfg
    top = max(args.tiny_counts)
    rows = []
    for label, step, max_batch in (
        ("nemo FIFO", "nemo", 1),
        ("fast FIFO", "fast", 1),
        ("fast batched", "fast", top),
    ):
        engine = _engine(paths, args.device, step, max_batch, args.dtype)
        try:
            for count in args.tiny_counts:
                rows.append({"engine": label, **_together(engine, count, args.tiny_frames, use_cfg)})
            if label == "fast batched":
                one = _step_times(engine, 1, [40], use_cfg)[40]
                eight = _step_times(engine, 8, [40], use_cfg)[40]
        finally:
            engine.close()
    return {"frames": args.tiny_frames, "rows": rows, "step_ms_1_row": one, "step_ms_8_rows": eight}


def summary(result: dict[str, Any]) -> str:
    """Markdown tables of a result."""
    parts = []
    large = result.get("large")
    if large:
        cells = [
            (name, large[key])
            for name, key in (
                ("NeMo, 1 request", "nemo_single"),
                ("fast, 1", "fast_single"),
                ("fast, 8", "fast_8"),
            )
        ]
        parts.append(
            output.format_table(
                ["run", "first audio p50 ms", "max ms", "audio s / wall s", "RTF"],
                [
                    [n, c["first_audio_p50_ms"], c["first_audio_max_ms"], c["audio_s_per_wall_s"], c["rtf"]]
                    for n, c in cells
                ],
            )
        )
        parts.append("fast step ms at frame 40 / 400: " + str(large["fast_step_ms"]))
        parts.append("ratios: " + str(large["ratios"]))
    tiny_part = result.get("tiny")
    if tiny_part:
        parts.append(
            output.format_rows(
                tiny_part["rows"],
                [
                    ("engine", "engine"),
                    ("requests", "requests"),
                    ("first audio p50 ms", "first_audio_p50_ms"),
                    ("max ms", "first_audio_max_ms"),
                    ("audio s / wall s", "audio_s_per_wall_s"),
                ],
            )
        )
        parts.append(
            f"tiny fast step: 1 row {tiny_part['step_ms_1_row']} ms, 8 rows {tiny_part['step_ms_8_rows']} ms"
        )
    return "\n\n".join(parts)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark and write its JSON."""
    from loguru import logger

    result = output.result_header(NAME, args)
    logger.disable("pipecat_nemotron.tts.magpie")
    try:
        with common.bench_context(args):
            if args.large != "none":
                result["large"] = run_large(args)
            if not args.no_tiny:
                result["tiny"] = run_tiny(args)
    finally:
        logger.enable("pipecat_nemotron.tts.magpie")
    output.finish(args.out, NAME, result, None, summary(result))
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point."""
    return common.bench_main(NAME, __doc__, add_arguments, run, argv)
