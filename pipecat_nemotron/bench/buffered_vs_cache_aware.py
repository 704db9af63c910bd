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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipecat_nemotron.bench import common

NAME = "buffered-vs-cache-aware"

#: Buffered baseline geometry per latency mode: (chunk, right context) in seconds; chunk + right = latency.
BUFFERED_SPLIT: dict[int, tuple[float, float]] = {
    80: (0.08, 0.0),
    160: (0.08, 0.08),
    560: (0.24, 0.32),
    1120: (0.56, 0.56),
}
#: Left context of the buffered window, seconds (NeMo's usual 1.6 s).
BUFFERED_LEFT_S = 1.6


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
    parser.add_argument("--manifest", type=Path, default=None, help="audio manifest (default: held-out set)")
    parser.add_argument("--repeats", type=int, default=1, help="A/B runs per setting, order alternating")
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


# ---- the buffered baseline --------------------------------------------------------------------------------


def buffered_config(model_path: Path, device: str, latency_ms: int, batch_size: int) -> Any:
    """The full ``BufferedRNNTPipeline`` config (NeMo 3.0 ships no example yaml; all blocks are mandatory)."""
    from omegaconf import OmegaConf

    chunk_s, right_s = BUFFERED_SPLIT[latency_ms]
    dev, dev_id = (device.split(":") + ["0"])[:2] if device.startswith("cuda") else (device, "0")
    return OmegaConf.create(
        {
            "asr": {
                "model_name": str(model_path),
                "device": dev,
                "device_id": int(dev_id),
                "compute_dtype": "float32" if dev == "cpu" else "bfloat16",
                "use_amp": False,
                "decoding": {
                    "strategy": "greedy_batch",
                    "fused_batch_size": -1,
                    "greedy": {"max_symbols": 10, "loop_labels": True, "use_cuda_graph_decoder": False},
                },
            },
            "itn": {
                "input_case": "lower_cased",
                "whitelist": None,
                "overwrite_cache": False,
                "max_number_of_permutations_per_split": 729,
                "left_padding_size": 4,
                "batch_size": 32,
                "n_jobs": 1,
            },
            "confidence": {
                "exclude_blank": True,
                "aggregation": "min",
                "method_cfg": {
                    "name": "entropy",
                    "entropy_type": "tsallis",
                    "alpha": 0.5,
                    "entropy_norm": "exp",
                },
            },
            "endpointing": {"stop_history_eou": -1, "residue_tokens_at_end": 0},
            "streaming": {
                "sample_rate": common.SAMPLE_RATE,
                "batch_size": batch_size,
                "word_boundary_tolerance": 4,
                "stateful": True,
                "chunk_size": chunk_s,
                "left_padding_size": BUFFERED_LEFT_S,
                "right_padding_size": right_s,
                "request_type": "frame",
                "padding_mode": "right",
            },
            "matmul_precision": "highest",
            "log_level": 40,
            "pipeline_type": "buffered",
            "asr_decoding_type": "rnnt",
            "enable_itn": False,
            "enable_nmt": False,
            "asr_output_granularity": "segment",
            "cache_dir": None,
            "lang": None,
            "return_tail_result": False,
        }
    )


@contextlib.contextmanager
def nemo_normalization(keep: bool) -> Iterator[None]:
    """Switch off ``BufferedRNNTPipeline``'s per-buffer feature normalisation inside the block (unless ``keep``)."""
    from nemo.collections.asr.inference.pipelines import buffered_rnnt_pipeline as mod

    original = mod.normalize_features
    if not keep:
        mod.normalize_features = lambda features, feature_lens=None: features
    try:
        yield
    finally:
        mod.normalize_features = original


class BufferedBaseline:
    """NeMo's ``BufferedRNNTPipeline`` for one model, one pipeline per latency mode over one loaded model.

    Args:
        model_path: The ``.nemo`` file (loaded again by NeMo's wrapper: it cannot take a loaded model).
        device: ``cpu`` / ``cuda`` / ``cuda:N``.
        latencies: Latency modes to prepare.
        max_batch: Most streams per step.
        att_context: Encoder ``att_context_size`` to use.
        keep_normalization: Keep the pipeline's per-buffer feature normalisation.
        flush: Follow each clip with right-context-long silence so its last words are decoded.

    """

    def __init__(
        self,
        model_path: Path,
        device: str,
        latencies: Sequence[int],
        max_batch: int,
        att_context: list[int],
        keep_normalization: bool,
        flush: bool = True,
    ) -> None:
        from nemo.collections.asr.inference.factory.pipeline_builder import PipelineBuilder
        from nemo.collections.asr.inference.pipelines.buffered_rnnt_pipeline import BufferedRNNTPipeline

        from pipecat_nemotron.engine.loading import quiet_nemo

        self.keep_normalization = keep_normalization
        self.flush = flush
        self.pipelines: dict[int, Any] = {}
        self._next_id = 1
        with quiet_nemo(), nemo_normalization(keep_normalization):
            for latency in latencies:
                cfg = buffered_config(model_path, device, latency, max_batch)
                if not self.pipelines:
                    pipeline = PipelineBuilder.build_pipeline(cfg)
                    encoder = pipeline.asr_model.asr_model.encoder
                    if hasattr(encoder, "set_default_att_context_size"):
                        encoder.set_default_att_context_size(att_context)
                    else:
                        encoder.att_context_size = att_context
                    # The zero-buffer encoding was computed with the old context: recompute it.
                    if pipeline.right_padding:
                        pipeline.zero_encoded = pipeline.init_zero_enc()
                    self.asr_model = pipeline.asr_model
                else:
                    pipeline = BufferedRNNTPipeline(cfg, self.asr_model)
                self.pipelines[latency] = pipeline
        self.device = self.asr_model.device

    def geometry(self, latency_ms: int) -> dict[str, float]:
        """Window of one latency mode, seconds."""
        p = self.pipelines[latency_ms]
        return {
            "left_s": round(p.left_padding_size, 3),
            "chunk_s": round(p.chunk_size, 3),
            "right_s": round(p.right_padding_size, 3),
            "window_s": round(p.buffer_size_in_secs, 3),
        }

    def run(
        self, clips: Sequence[common.Clip], latency_ms: int, streams: int
    ) -> tuple[list[str], float, float]:
        """Transcribe ``clips`` with ``streams`` concurrent streams (one chunk per stream per batched step).

        Returns:
            The transcripts (in clip order), the seconds spent inside ``transcribe_step`` calls, and the seconds
            of audio processed (clips plus flush silence).

        """
        import torch
        from nemo.collections.asr.inference.streaming.framing.request import Frame
        from nemo.collections.asr.inference.streaming.framing.request_options import ASRRequestOptions

        pipeline = self.pipelines[latency_ms]
        chunk = int(round(pipeline.chunk_size * common.SAMPLE_RATE))
        # Flush: silence covering the right context after each clip. NeMo's stateful buffered pipeline decodes
        # only the chunk region of the last frame too, so without it the words spoken in the last right-context
        # window are dropped (the engine's finalize flushes by itself). In a live session that silence is just the
        # audio after speech, so it counts as processed audio: cost per second stays the steady-state cost.
        flush = np.zeros(
            int(round(pipeline.right_padding_size * common.SAMPLE_RATE)) if self.flush else 0, np.float32
        )
        queues = [list(range(i, len(clips), streams)) for i in range(streams)]
        texts: list[list[str]] = [[] for _ in clips]
        # Per worker: (clip index, stream id, next sample) of the clip it is feeding.
        active: list[list[int] | None] = [None] * streams
        step_s = 0.0
        with nemo_normalization(self.keep_normalization):
            while True:
                frames, owners = [], []
                for w in range(streams):
                    if active[w] is None and queues[w]:
                        active[w] = [queues[w].pop(0), self._new_id(), 0]
                    slot = active[w]
                    if slot is None:
                        continue
                    idx, sid, pos = slot
                    audio = np.concatenate((clips[idx].audio, flush)) if flush.size else clips[idx].audio
                    piece = audio[pos : pos + chunk]
                    last = pos + chunk >= audio.size
                    samples = np.zeros(chunk, dtype=np.float32)
                    samples[: piece.size] = piece
                    frames.append(
                        Frame(
                            samples=torch.from_numpy(samples),
                            stream_id=sid,
                            is_first=pos == 0,
                            is_last=last,
                            length=piece.size if last else -1,
                            options=ASRRequestOptions() if pos == 0 else None,
                        )
                    )
                    owners.append(w)
                    slot[2] = pos + chunk
                if not frames:
                    break
                t = time.perf_counter()
                outputs = pipeline.transcribe_step(frames)
                common.sync_device()
                step_s += time.perf_counter() - t
                for w, frame, out in zip(owners, frames, outputs, strict=True):
                    slot = active[w]
                    assert slot is not None
                    if out.final_transcript:
                        texts[slot[0]].append(out.final_transcript)
                    if frame.is_last:
                        active[w] = None
        processed_s = sum(c.seconds for c in clips) + len(clips) * flush.size / common.SAMPLE_RATE
        return [" ".join("".join(t).split()) for t in texts], step_s, processed_s

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id


# ---- the cache-aware engine -------------------------------------------------------------------------------


async def run_engine(
    engine: Any, clips: Sequence[common.Clip], latency_ms: int, streams: int
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
        common.remove_step_listener(engine, listener)
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

    def per_audio_s(self) -> dict[str, float | None]:
        """Seconds per audio-second."""
        a = self.audio_s or float("nan")
        return {
            "wall_s_per_audio_s": self.wall_s / a,
            "cpu_s_per_audio_s": self.cpu_s / a,
            "step_s_per_audio_s": self.step_s / a,
        }


async def bench_model(
    spec: common.ModelSpec, args: argparse.Namespace, device: str, att_context: list[int]
) -> dict[str, Any]:
    """All settings of one model: both backends, each latency and stream count."""
    from pipecat_nemotron.engine import EngineConfig, NemotronEngine

    cap = args.max_audio_s_600m if spec.size == "600m" else args.max_audio_s
    clips, source = common.load_clips(args.manifest, cap)
    audio_s = sum(c.seconds for c in clips)
    refs = [c.text for c in clips]
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
    engine = NemotronEngine(
        EngineConfig(
            model=str(spec.path),
            device=device,
            max_streams=max_streams,
            max_batch_size=max_streams,
            finalize_mode="hard",
            warmup=True,
        )
    )
    await engine.start()
    rows: list[dict[str, Any]] = []
    try:
        warm = [common.Clip("warmup", common.synthetic_clip(1.0, 99), None)]
        for latency in args.latency:
            baseline.run(warm, latency, 1)  # first-call costs (allocations, decoder setup)
            for streams in args.streams:
                sides = {"cache_aware": Side(), "buffered": Side()}
                for rep in range(args.repeats):
                    order = (
                        ("cache_aware", "buffered")
                        if (rep + len(rows)) % 2 == 0
                        else ("buffered", "cache_aware")
                    )
                    for backend in order:
                        side = sides[backend]
                        with common.Meter() as m:
                            if backend == "cache_aware":
                                texts, step_s = await run_engine(engine, clips, latency, streams)
                                processed_s = audio_s
                            else:
                                texts, step_s, processed_s = baseline.run(clips, latency, streams)
                        side.wall_s += m.wall_s
                        side.cpu_s += m.cpu_s
                        side.step_s += step_s
                        side.audio_s += processed_s
                        if side.texts is None:
                            side.texts = texts
                row: dict[str, Any] = {
                    "latency_ms": latency,
                    "streams": streams,
                    "audio_s": round(audio_s, 2),
                    "buffered_processed_audio_s": round(sides["buffered"].audio_s / args.repeats, 2),
                    "buffered_geometry": baseline.geometry(latency),
                }
                for backend, side in sides.items():
                    wer = None if spec.random_weights else common.wer_percent(refs, side.texts or [])
                    row[backend] = {**side.per_audio_s(), "wer_percent": wer}
                for key in ("wall_s_per_audio_s", "cpu_s_per_audio_s", "step_s_per_audio_s"):
                    row[f"ratio_{key.split('_s_per')[0]}"] = common.ratio(
                        row["buffered"][key], row["cache_aware"][key]
                    )
                row["examples"] = [
                    {"ref": c.text, "cache_aware": a, "buffered": b}
                    for c, a, b in list(
                        zip(
                            clips,
                            sides["cache_aware"].texts or [],
                            sides["buffered"].texts or [],
                            strict=False,
                        )
                    )[:3]
                ]
                rows.append(row)
                print(
                    f"[bench] {spec.name} {latency} ms x{streams}: cache-aware "
                    f"{row['cache_aware']['cpu_s_per_audio_s']:.3f} CPU-s/audio-s, buffered "
                    f"{row['buffered']['cpu_s_per_audio_s']:.3f} -> {row['ratio_cpu']:.2f}x "
                    f"(wall {row['ratio_wall']:.2f}x)",
                    flush=True,
                )
    finally:
        await engine.stop()
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
    fig, axes = common.new_figure(1, 1, (max(6.0, 1.6 * sum(len(m["rows"]) for m in result["models"])), 4.2))
    ax = axes[0][0]
    labels, ca, bu = [], [], []
    for m in result["models"]:
        for r in m["rows"]:
            labels.append(f"{m['model']['name']}\n{r['latency_ms']} ms x{r['streams']}")
            ca.append(r["cache_aware"]["cpu_s_per_audio_s"])
            bu.append(r["buffered"]["cpu_s_per_audio_s"])
    x = np.arange(len(labels))
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
    """The Markdown table of the results."""
    rows = []
    for m in result["models"]:
        for r in m["rows"]:
            rows.append(
                [
                    m["model"]["name"],
                    r["latency_ms"],
                    r["streams"],
                    r["cache_aware"]["cpu_s_per_audio_s"],
                    r["buffered"]["cpu_s_per_audio_s"],
                    r["ratio_cpu"],
                    r["ratio_wall"],
                    r["cache_aware"]["wer_percent"],
                    r["buffered"]["wer_percent"],
                ]
            )
    return common.format_table(
        [
            "model",
            "latency ms",
            "streams",
            "cache-aware CPU-s/audio-s",
            "buffered CPU-s/audio-s",
            "ratio (CPU)",
            "ratio (wall)",
            "WER cache-aware %",
            "WER buffered %",
        ],
        rows,
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark; write JSON and PNG under ``args.out``; return the result."""
    device = common.resolve_device(args.device)
    att_context = [int(v) for v in args.buffered_att_context.split(",")]
    for latency in args.latency:
        if latency not in BUFFERED_SPLIT:
            raise SystemExit(f"--latency {latency}: expected one of {sorted(BUFFERED_SPLIT)}")
    result = common.result_header(NAME, args)
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
    result["latency_definition"] = (
        "cache-aware mode L: a step takes L ms of audio (right context included); buffered at L: chunk + right "
        "context = L. Either way a sample waits at most L ms plus compute before its text can appear."
    )
    with common.bench_context(args):
        result["models"] = [asyncio.run(bench_model(s, args, device, att_context)) for s in specs]
    fig = plot(result)
    notes = [f"{m['model']['name']}: {m['wer_note']}" for m in result["models"] if m["wer_note"]]
    common.finish(
        args.out, NAME, result, fig, summary_table(result) + ("\n" + "\n".join(notes) if notes else "")
    )
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point: ``python -m pipecat_nemotron.bench buffered-vs-cache-aware [options]``."""
    parser = argparse.ArgumentParser(prog=f"python -m pipecat_nemotron.bench {NAME}", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
