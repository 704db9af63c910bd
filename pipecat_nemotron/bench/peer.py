"""``peer``: this engine side by side with sherpa-onnx (C++ on ONNX Runtime) running the same weights.

The model is exported per latency mode with :mod:`~pipecat_nemotron.bench.sherpa_export` (fp32 and int8) and
streamed by sherpa-onnx's own ``OnlineRecognizer`` with its batched ``decode_streams``; our engine runs its
fast step (fp32, bf16, and int8: ``EngineConfig(dtype="int8")``). Both get the same clips in the same rounds: ``N``
streams start an utterance each, all its audio at once (faster than real time, so every step batches all
streams still speaking), then all ``N`` finalize together. Per (engine, mode, N):

* **CPU-s per audio-s**: process CPU time of all rounds over the audio seconds (``--threads`` threads each:
  torch's intra-op threads for ours, ONNX Runtime's for sherpa-onnx);
* **real-time streams on one core**: its inverse (with ``--threads 1``);
* **WER** on the clips' references (meaningless with random weights);
* **time-to-final**: from the finalize of a round (every complete chunk already decoded) to the last of its
  ``N`` final texts: our flush of the remainder as one partial chunk, sherpa-onnx's tail padding
  (:func:`~pipecat_nemotron.bench.sherpa_run.tail_padding`) decoded to the end.

``--agreement`` instead compares transcripts (sherpa-onnx fp32 vs our fp32, hard finalize) on every clip in
each mode (with the WER of our int8 beside them), as they are and with 0.3 s of silence before and after each clip: a difference that disappears
with the silence comes from how the two engines treat a stream's first and last audio.

Skips with a message (exit 0) when sherpa-onnx is not installed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pipecat_nemotron.bench import common, output, stats
from pipecat_nemotron.bench.audio import Clip, load_clips, transcribe_clips, wait_caught_up
from pipecat_nemotron.bench.sherpa_export import SherpaModelFiles
from pipecat_nemotron.bench.wer import WordErrorCount

NAME = "peer"
#: The compared engines: ours per dtype, sherpa-onnx per precision.
VARIANTS = ("ours-fp32", "ours-bf16", "ours-int8", "sherpa-fp32", "sherpa-int8")
#: Silence around each clip in the agreement check's second pass, s.
EDGE_SILENCE_S = 0.3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of this benchmark."""
    common.add_common_args(parser)
    parser.set_defaults(threads=1)
    parser.add_argument(
        "--latency", type=int, nargs="+", default=[160, 560], help="modes, ms (default: 160 560)"
    )
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 16], help="N (default: 1 4 16)")
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="audio per stream and N, s (whole clips; default: 20)"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=list(VARIANTS),
        choices=VARIANTS,
        help="engines to run (default: all)",
    )
    parser.add_argument("--agreement", action="store_true", help="compare transcripts on every clip instead")
    parser.add_argument("--reexport", action="store_true", help="export again even if the files exist")


# ---- the two engines, one round at a time -----------------------------------------------------------------


@dataclasses.dataclass
class RoundResult:
    """One round: ``N`` utterances streamed together, then finalized together.

    Attributes:
        texts: Final text per utterance.
        ttf_ms: From the finalize to the last final text, ms.

    """

    texts: list[str]
    ttf_ms: float


async def ours_round(engine: Any, latency_ms: int, clips: Sequence[Clip]) -> RoundResult:
    """All clips pushed at once on fresh streams, decoded up to their last complete chunk, then finalized."""
    streams = [engine.open_stream(latency_ms=latency_ms) for _ in clips]
    try:
        for stream, clip in zip(streams, clips, strict=True):
            await stream.push(clip.audio)
        for stream in streams:
            await wait_caught_up(stream)
        t0 = time.perf_counter()
        finals = await asyncio.gather(*(s.finalize() for s in streams))
        ttf = (time.perf_counter() - t0) * 1000.0
    finally:
        for stream in streams:
            await stream.close()
    return RoundResult([f.text for f in finals], ttf)


def sherpa_round(recognizer: Any, padding: np.ndarray, clips: Sequence[Clip]) -> RoundResult:
    """All clips accepted at once, decoded while whole windows remain, then tail-padded and decoded to the end."""
    from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
    from pipecat_nemotron.bench import sherpa_run

    streams = []
    for clip in clips:
        s = recognizer.create_stream()
        s.accept_waveform(MODEL_SAMPLE_RATE, clip.audio)
        streams.append(s)
    sherpa_run.decode_ready(recognizer, streams)
    t0 = time.perf_counter()
    for s in streams:
        s.accept_waveform(MODEL_SAMPLE_RATE, padding)
        s.input_finished()
    sherpa_run.decode_ready(recognizer, streams)
    texts = [recognizer.get_result(s).strip() for s in streams]
    return RoundResult(texts, (time.perf_counter() - t0) * 1000.0)


def rounds_for(clips: Sequence[Clip], n: int, seconds: float) -> list[list[Clip]]:
    """Rounds of ``n`` clips (clips reused in order) until each stream has about ``seconds`` of audio."""
    mean_s = float(np.mean([c.seconds for c in clips]))
    count = max(1, math.ceil(seconds / mean_s))
    return [[clips[(r * n + i) % len(clips)] for i in range(n)] for r in range(count)]


def warmup_round(rounds: Sequence[list[Clip]]) -> list[Clip]:
    """A short unmeasured round first (N streams, 1 s each): allocator, ONNX Runtime's first runs, batch shapes."""
    from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE

    return [dataclasses.replace(c, audio=c.audio[:MODEL_SAMPLE_RATE]) for c in rounds[0]]


def score(
    variant: str, rounds: Sequence[list[Clip]], results: Sequence[RoundResult], meter: stats.Meter
) -> dict[str, Any]:
    """One table row from the rounds of a variant."""
    audio_s = sum(c.seconds for r in rounds for c in r)
    wer = WordErrorCount()
    for clips, result in zip(rounds, results, strict=True):
        for clip, text in zip(clips, result.texts, strict=True):
            if clip.text is not None:
                wer.add(clip.text, text)
    cpu_per_s = meter.cpu_s / audio_s
    ttf = stats.summarize([r.ttf_ms for r in results])
    return {
        "variant": variant,
        "audio_s": round(audio_s, 2),
        "cpu_s_per_audio_s": cpu_per_s,
        "wall_s_per_audio_s": meter.wall_s / audio_s,
        "rt_streams_one_core": 1.0 / cpu_per_s if cpu_per_s > 0 else None,
        "wer": wer.percent if wer.words else None,
        "ttf_ms_p50": ttf["p50"],
        "ttf_ms_max": ttf["max"],
        "texts": [t for r in results for t in r.texts],
    }


# ---- runs -------------------------------------------------------------------------------------------------


def export_mode(args: argparse.Namespace, spec: common.ModelSpec, latency_ms: int) -> SherpaModelFiles:
    """The sherpa-onnx files of a mode (exported once under ``--out/sherpa``)."""
    from pipecat_nemotron.bench.sherpa_export import export_sherpa_onnx

    files = SherpaModelFiles(args.out / "sherpa" / spec.name / str(latency_ms), latency_ms)
    int8 = dataclasses.replace(files, int8=True)
    if args.reexport or not (files.exists() and int8.exists()):
        print(f"[bench] exporting {spec.name} ({latency_ms} ms) to {files.directory}", flush=True)
        export_sherpa_onnx(spec.path, files.directory, latency_ms, int8=True)
    return files


def ours_config(spec: common.ModelSpec, dtype: str, streams: int, threads: int) -> Any:
    """Our engine for a variant: fast step, hard finalize (each utterance decodes as a clip of its own)."""
    from pipecat_nemotron.asr import EngineConfig

    return EngineConfig(
        model=str(spec.path),
        device="cpu",
        dtype=dtype,
        max_streams=streams,
        max_batch_size=streams,
        finalize_mode="hard",
        cpu_threads=threads,
        warmup=True,
        word_timings=False,
    )


async def run_ours(
    args: argparse.Namespace, spec: common.ModelSpec, dtype: str, latency_ms: int, plan: dict[int, list]
) -> dict[int, tuple[list[RoundResult], stats.Meter]]:
    """Our engine over every N's rounds (one engine, loaded once: a round of N streams batches N)."""
    from pipecat_nemotron.asr import NemotronEngine

    out: dict[int, tuple[list[RoundResult], stats.Meter]] = {}
    async with NemotronEngine(ours_config(spec, dtype, max(plan), args.threads)) as engine:
        for n, rounds in plan.items():
            await ours_round(engine, latency_ms, warmup_round(rounds))
            with stats.Meter() as meter:
                results = [await ours_round(engine, latency_ms, r) for r in rounds]
            out[n] = (results, meter)
    return out


def run_sherpa(
    args: argparse.Namespace, files: SherpaModelFiles, plan: dict[int, list]
) -> dict[int, tuple[list[RoundResult], stats.Meter]]:
    """sherpa-onnx over every N's rounds (one recognizer; ``decode_streams`` batches the ready streams)."""
    from pipecat_nemotron.bench import sherpa_run

    recognizer = sherpa_run.make_recognizer(files, threads=args.threads)
    padding = sherpa_run.tail_padding(files)
    out: dict[int, tuple[list[RoundResult], stats.Meter]] = {}
    for n, rounds in plan.items():
        sherpa_round(recognizer, padding, warmup_round(rounds))
        with stats.Meter() as meter:
            results = [sherpa_round(recognizer, padding, r) for r in rounds]
        out[n] = (results, meter)
    return out


def run_mode(
    args: argparse.Namespace, spec: common.ModelSpec, clips: Sequence[Clip], latency_ms: int
) -> list[dict[str, Any]]:
    """Every variant at every N in one latency mode; rows carry ratios against ``ours-fp32`` at the same N."""
    files = export_mode(args, spec, latency_ms)
    plan = {n: rounds_for(clips, n, args.seconds) for n in args.streams}
    runners: dict[str, Callable[[], dict[int, tuple[list[RoundResult], stats.Meter]]]] = {
        "ours-fp32": lambda: asyncio.run(run_ours(args, spec, "float32", latency_ms, plan)),
        "ours-bf16": lambda: asyncio.run(run_ours(args, spec, "bfloat16", latency_ms, plan)),
        "ours-int8": lambda: asyncio.run(run_ours(args, spec, "int8", latency_ms, plan)),
        "sherpa-fp32": lambda: run_sherpa(args, files, plan),
        "sherpa-int8": lambda: run_sherpa(args, dataclasses.replace(files, int8=True), plan),
    }
    rows: list[dict[str, Any]] = []
    for variant in args.variants:
        print(f"[bench] {variant} {latency_ms} ms, N={list(plan)}", flush=True)
        for n, (results, meter) in runners[variant]().items():
            rows.append({"latency_ms": latency_ms, "streams": n, **score(variant, plan[n], results, meter)})
    for row in rows:
        ref = next((r for r in rows if r["variant"] == "ours-fp32" and r["streams"] == row["streams"]), None)
        row["cpu_vs_ours_fp32"] = stats.ratio(
            row["cpu_s_per_audio_s"], ref["cpu_s_per_audio_s"] if ref else None
        )
        row["same_text_as_ours_fp32"] = (
            sum(a == b for a, b in zip(row["texts"], ref["texts"], strict=True)) if ref else None
        )
    return rows


def run_agreement(args: argparse.Namespace, spec: common.ModelSpec, clips: Sequence[Clip]) -> dict[str, Any]:
    """Transcripts of sherpa-onnx fp32 vs ours fp32 on every clip, per mode, plain and with edge silence."""
    from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
    from pipecat_nemotron.bench import sherpa_run

    silence = np.zeros(int(EDGE_SILENCE_S * MODEL_SAMPLE_RATE), dtype=np.float32)
    passes = {
        "plain": [c.audio for c in clips],
        "edge-silence": [np.concatenate([silence, c.audio, silence]) for c in clips],
    }
    modes: list[dict[str, Any]] = []
    for latency_ms in args.latency:
        files = export_mode(args, spec, latency_ms)
        recognizer = sherpa_run.make_recognizer(files, threads=args.threads)
        for name, audio in passes.items():
            ours, int8 = (
                asyncio.run(transcribe_clips(ours_config(spec, dtype, 16, args.threads), audio, [latency_ms]))
                for dtype in ("float32", "int8")
            )
            theirs = sherpa_run.transcribe(recognizer, files, audio)
            wer_ours, wer_theirs, wer_int8 = WordErrorCount(), WordErrorCount(), WordErrorCount()
            diffs = []
            for clip, a, b, q in zip(clips, ours[latency_ms], theirs, int8[latency_ms], strict=True):
                if clip.text is not None:
                    wer_ours.add(clip.text, a)
                    wer_theirs.add(clip.text, b)
                    wer_int8.add(clip.text, q)
                if a != b:
                    diffs.append({"clip": clip.name, "ref": clip.text, "ours": a, "sherpa": b})
            modes.append(
                {
                    "latency_ms": latency_ms,
                    "pass": name,
                    "clips": len(clips),
                    "same": len(clips) - len(diffs),
                    "wer_ours": wer_ours.percent if wer_ours.words else None,
                    "wer_sherpa": wer_theirs.percent if wer_theirs.words else None,
                    "wer_ours_int8": wer_int8.percent if wer_int8.words else None,
                    "differences": diffs,
                }
            )
            print(
                f"[bench] agreement {latency_ms} ms {name}: {len(clips) - len(diffs)}/{len(clips)}",
                flush=True,
            )
    return {"agreement": modes}


def summary(result: dict[str, Any]) -> str:
    """Markdown table(s) of the result."""
    if "agreement" in result:
        return output.format_rows(
            result["agreement"],
            [
                ("mode ms", "latency_ms"),
                ("audio", "pass"),
                ("same text", lambda r: f"{r['same']}/{r['clips']}"),
                ("WER ours %", "wer_ours"),
                ("WER sherpa-onnx %", "wer_sherpa"),
                ("WER ours int8 %", "wer_ours_int8"),
            ],
        )
    return output.format_rows(
        result["rows"],
        [
            ("mode ms", "latency_ms"),
            ("N", "streams"),
            ("engine", "variant"),
            ("CPU-s / audio-s", "cpu_s_per_audio_s"),
            ("x ours fp32", "cpu_vs_ours_fp32"),
            ("RT streams / core", "rt_streams_one_core"),
            ("WER %", "wer"),
            ("same text as ours fp32", "same_text_as_ours_fp32"),
            ("TTF p50 ms", "ttf_ms_p50"),
            ("TTF max ms", "ttf_ms_max"),
        ],
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark (or the agreement check) and write ``peer.json``."""
    from pipecat_nemotron.bench.sherpa_run import sherpa_missing

    missing = sherpa_missing()
    if missing is not None:
        print(f"[bench] peer: skipped: {missing}", flush=True)
        return {"skipped": missing}
    result = output.result_header(NAME, args)
    spec = common.resolve_model(args.model, args.models_dir)
    clips, source = load_clips(args.manifest)
    result.update(model=spec.as_dict(), audio=source)
    if spec.random_weights:
        result["note"] = common.RANDOM_WEIGHTS_NOTE
    with common.bench_context(args):
        if args.agreement:
            result.update(run_agreement(args, spec, clips))
        else:
            result["rows"] = [row for ms in args.latency for row in run_mode(args, spec, clips, ms)]
    name = NAME + ("-agreement" if args.agreement else "") + f"-{spec.name}"
    output.finish(args.out, name, result, None, summary(result))
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """``python -m pipecat_nemotron.bench peer [options]``."""
    return common.bench_main(NAME, __doc__, add_arguments, run, argv)
