"""What languages cost: the per-row language prompt of every step, and ``auto`` detection at each final.

On one loaded model of the multilingual prompt class (``EncDecRNNTBPEModelWithPrompt``), in the 160 ms mode:

* **Prompt cost per step.** For a batch of B streams, one steady-state step (full 70-frame context, real log-mel
  chunks of the bundled demo speech, as ``encoder-step`` feeds it) of our fast encoder, then the language prompt
  the engine applies to its output (``ModelRunner.apply_prompts`` itself, on a runner built around the model:
  one-hot joined to every frame, ``prompt_kernel``), then the greedy decode of the prompted output. The three are
  timed back to back inside every repetition; the table gives medians and prompt / encoder.
* **Detection cost per utterance.** :func:`~pipecat_nemotron.asr.language_id.alignment_scores` over a
  ``--utterance-s`` utterance (real encoder output of the demo speech, looped, kept 2 frames per step as the
  engine keeps it; ~4 tokens per second at increasing frames) for each ``--detect-locales`` count of candidate
  locales, against the encoder time of the same audio (batch-1 encoder step time x steps of that audio).

Every cell runs once per repetition, in an order reversed every other repetition, so machine noise hits them alike.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipecat_nemotron.bench import common, output

NAME = "multilingual"

#: 40 plausible locales (the real multilingual model has 40 and ``auto``).
LOCALES_40: list[str] = [
    "en-US", "en-GB", "es-ES", "es-US", "fr-FR", "fr-CA", "de-DE", "it-IT", "pt-BR", "pt-PT",
    "nl-NL", "pl-PL", "ru-RU", "uk-UA", "cs-CZ", "sk-SK", "sl-SI", "hr-HR", "bg-BG", "ro-RO",
    "hu-HU", "el-GR", "sv-SE", "da-DK", "nb-NO", "fi-FI", "et-EE", "lv-LV", "lt-LT", "mt-MT",
    "tr-TR", "ar-SA", "hi-IN", "ja-JP", "ko-KR", "zh-CN", "vi-VN", "th-TH", "id-ID", "he-IL",
]  # fmt: skip
#: Locales of the random tiny prompt model (``--model tiny``).
TINY_LOCALES: list[str] = ["en-US", "es-ES", "de-DE"]
#: The 160 ms mode: 70 frames of left context, 1 of right context.
ATT_CONTEXT = [70, 1]
#: Tokens per second of speech in the synthetic detection utterance.
TOKENS_PER_S = 4.0
#: Encoder frames per second (80 ms frames).
FRAMES_PER_S = 12.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of this benchmark."""
    common.add_common_args(parser, model_default=None, manifest=False)
    parser.add_argument(
        "--model",
        default="600m",
        help="'600m' (the 600M architecture of the prompt class, random weights, --locales locales, cached in "
        "--models-dir), 'tiny' (a random tiny prompt model, 3 locales) or a .nemo path of a prompt-class model "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--locales", type=int, default=40, help="locales of the built 600m model (default: %(default)s)"
    )
    parser.add_argument(
        "--batches", type=int, nargs="+", default=[1, 4], help="streams per step (default: %(default)s)"
    )
    parser.add_argument(
        "--detect-locales",
        type=int,
        nargs="+",
        default=[40, 2],
        help="candidate locales scored by detection, capped at the model's (default: %(default)s)",
    )
    parser.add_argument(
        "--utterance-s", type=float, default=10.0, help="detected utterance, seconds (default: %(default)s)"
    )
    parser.add_argument(
        "--repeats", type=int, default=15, help="measured repetitions of every cell (default: %(default)s)"
    )


def resolve_prompt_model(spec: str, locales: int, models_dir: Path) -> common.ModelSpec:
    """A ``.nemo`` of the prompt class: a built (and cached) random one for ``600m``/``tiny``, else the path."""
    if spec in ("600m", "tiny"):
        languages = LOCALES_40[:locales] if spec == "600m" else TINY_LOCALES
        if spec == "600m" and not 1 <= locales <= len(LOCALES_40):
            raise ValueError(f"--locales must be 1..{len(LOCALES_40)}")
        path = models_dir / f"{spec}_prompt{len(languages)}_random_blank{common.TIMING_BLANK_BIAS:g}.nemo"
        if not path.exists():
            from pipecat_nemotron.asr.architectures import build_random_model

            what = "the 600M prompt-class architecture (~2.5 GB)" if spec == "600m" else "a tiny prompt model"
            print(f"[bench] building {what} with {len(languages)} locales -> {path}", flush=True)
            tmp = path.with_suffix(".tmp.nemo")
            build_random_model(
                tmp, size=spec, seed=0, blank_bias=common.TIMING_BLANK_BIAS, languages=languages
            )
            tmp.replace(path)
        return common.ModelSpec(path, f"{spec}-prompt{len(languages)}-random", True, spec)
    path = Path(spec).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"--model {spec!r}: no such file (use '600m', 'tiny' or a path)")
    return common.ModelSpec(path, path.stem, "random" in path.stem, "custom")


class _StepCell:
    """One batch size: the same chunks and full caches on every repetition; a language per row."""

    def __init__(self, runner: Any, batch: int, num_languages: int) -> None:
        import torch

        from pipecat_nemotron.bench.encoder_step import _demo_features

        model, fast = runner.model, runner.fast_step
        encoder = model.encoder
        cfg = encoder.streaming_cfg
        self.runner, self.model, self.fast = runner, model, fast
        frames = int(cfg.chunk_size[1]) + int(cfg.pre_encode_cache_size[1])
        feats = _demo_features(model, frames * batch)
        self.signal = feats.view(1, feats.size(1), batch, frames).permute(2, 0, 1, 3)[:, 0].to(runner.dtype)
        self.lengths = torch.full((batch,), frames, device=feats.device)
        self.drop = int(cfg.drop_extra_pre_encoded)
        channel, time_cache, cached = encoder.get_initial_cache_state(
            batch, dtype=runner.dtype, device=feats.device
        )
        channel.normal_(std=0.5)
        cached.fill_(int(cfg.last_channel_cache_size))
        self.caches = (fast.project_layer_inputs(channel), time_cache, cached)
        self.indices = [row % num_languages for row in range(batch)]  # a different language per row
        self.frames_out = 0

    def run(self) -> tuple[float, float, float]:
        """One step: encoder, prompt, decode; returns their wall times (ms)."""
        sync = _sync(self.signal.device)
        start = time.perf_counter()
        out = self.fast(
            self.signal,
            self.lengths,
            *self.caches,
            drop_extra_pre_encoded=self.drop,
            right_context=ATT_CONTEXT[1],
        )
        sync()
        encoded = time.perf_counter()
        prompted = self.runner.apply_prompts(out[0], self.indices)
        sync()
        prompt = time.perf_counter()
        self.model.decoding.rnnt_decoder_predictions_tensor(
            encoder_output=prompted, encoded_lengths=out[1], return_hypotheses=True
        )
        sync()
        end = time.perf_counter()
        self.frames_out = int(out[0].size(-1))
        return (encoded - start) * 1e3, (prompt - encoded) * 1e3, (end - prompt) * 1e3


def _sync(device: Any) -> Any:
    import torch

    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _utterance_evidence(model: Any, seconds: float, vocab: int) -> Any:
    """An utterance as the engine keeps it: real encoder output (2 frames per step) and increasing token frames."""
    import torch

    from pipecat_nemotron.asr.language_id import UtteranceEvidence
    from pipecat_nemotron.bench.encoder_step import _demo_features

    frames = round(seconds * FRAMES_PER_S)
    mel = frames * int(getattr(model.encoder, "subsampling_factor", 8)) + 8
    feats = _demo_features(model, mel)
    encoded, _ = model.encoder(audio_signal=feats, length=torch.tensor([feats.size(-1)], device=feats.device))
    encoded = encoded[0, :, :frames]  # [D, T] before the prompt
    frames = int(encoded.size(-1))
    tokens = max(1, round(seconds * TOKENS_PER_S))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (tokens,), generator=generator).tolist()
    at = [min(frames - 1, (i * frames) // tokens + 1) for i in range(tokens)]  # increasing
    evidence = UtteranceEvidence()
    for start in range(0, frames, 2):
        chunk = encoded[:, start : start + 2]
        new = [(t, f - start) for t, f in zip(ids, at, strict=True) if start <= f < start + chunk.size(1)]
        evidence = evidence.plus(chunk, [t for t, _ in new], [f for _, f in new])
    return evidence


def _flops(
    model: Any, prompts: Any, frames_per_step: int, utterance_frames: int, tokens: int
) -> dict[str, float]:
    """Rough FLOP counts: 2 per weight per frame (attention scores and the subsampling convolutions left out)."""
    kernel = [m for m in model.prompt_kernel if hasattr(m, "weight")]
    per_frame_locale = sum(2.0 * m.weight.numel() for m in kernel)
    encoder_linear = sum(
        2.0 * p.numel()
        for n, p in model.encoder.named_parameters()
        if n.startswith("layers.") and p.dim() >= 2
    )
    enc_proj = sum(2.0 * p.numel() for p in model.joint.enc.parameters() if p.dim() == 2)
    joint_out = sum(2.0 * p.numel() for p in model.joint.joint_net.parameters() if p.dim() == 2)
    return {
        "prompt_per_frame_per_locale": per_frame_locale,
        "encoder_per_frame": encoder_linear,
        "prompt_over_encoder": per_frame_locale / encoder_linear,
        "detection_per_locale": utterance_frames * (per_frame_locale + enc_proj)
        + (utterance_frames + tokens) * joint_out,
        "encoder_utterance": encoder_linear * utterance_frames,
        "frames_per_step": frames_per_step,
        "num_prompts": prompts.num_prompts,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every cell; write JSON (+ PNG) under ``args.out``; return the result."""
    import torch

    from pipecat_nemotron.asr.language_id import alignment_scores
    from pipecat_nemotron.asr.runner import ModelRunner

    spec = resolve_prompt_model(args.model, args.locales, args.models_dir)
    result = output.result_header(NAME, args)
    result["model"] = spec.as_dict()
    with common.bench_context(args), torch.inference_mode():
        model, device, dtype = common.load_bench_model(spec, args.device)
        result["dtype"] = str(dtype).replace("torch.", "")
        runner = ModelRunner(
            model, max(args.batches), device, dtype, max_batch=max(args.batches), cuda_graphs=False
        )
        if runner.prompts is None or runner.fast_step is None:
            raise SystemExit(f"--model {args.model}: not a prompt-class model with our fast encoder step")
        model.encoder.set_default_att_context_size(ATT_CONTEXT)
        prompts = runner.prompts
        languages = list(prompts.languages)
        result["languages"] = languages
        result["num_prompts"] = prompts.num_prompts
        cells = {batch: _StepCell(runner, batch, len(languages)) for batch in args.batches}
        vocab = int(model.joint.num_classes_with_blank) - 1
        evidence = _utterance_evidence(model, args.utterance_s, vocab)
        counts = sorted({min(n, len(languages)) for n in args.detect_locales}, reverse=True)
        candidates = {n: [prompts.dictionary[lang] for lang in languages[:n]] for n in counts}
        steps: dict[int, dict[str, list[float]]] = {
            b: {"encoder": [], "prompt": [], "decode": []} for b in cells
        }
        detect: dict[int, list[float]] = {n: [] for n in counts}
        sync = _sync(device)
        jobs: list[tuple[str, int]] = [("step", b) for b in cells] + [("detect", n) for n in counts]
        for i in range(args.repeats + 1):  # the first round warms every cell up and is not counted
            for kind, key in jobs if i % 2 == 0 else jobs[::-1]:
                if kind == "step":
                    times = cells[key].run()
                    if i:
                        for name, ms in zip(("encoder", "prompt", "decode"), times, strict=True):
                            steps[key][name].append(ms)
                else:
                    start = time.perf_counter()
                    scores = alignment_scores(model, evidence, candidates[key], prompts.num_prompts)
                    sync()
                    if i:
                        detect[key].append((time.perf_counter() - start) * 1e3)
                    assert scores is not None and scores.shape == (key,)
        step_rows = _step_rows(steps, cells)
        detect_rows = _detect_rows(detect, steps, cells, evidence)
        result["flops"] = _flops(model, prompts, cells[min(cells)].frames_out, evidence.num_frames, len(evidence.tokens))
    result["steps"] = step_rows
    result["detection"] = detect_rows
    table = _tables(step_rows, detect_rows, result["flops"])
    output.finish(args.out, NAME, result, _figure(step_rows, detect_rows), table)
    return result


def _step_rows(steps: dict[int, dict[str, list[float]]], cells: dict[int, _StepCell]) -> list[dict[str, Any]]:
    """One row per batch size: the median encoder, prompt and decode times of a step, ms."""
    rows = []
    for batch, t in steps.items():
        med = {k: statistics.median(v) for k, v in t.items()}
        rows.append(
            {
                "batch": batch,
                "frames_per_row": cells[batch].frames_out,
                "encoder_ms": med["encoder"],
                "prompt_ms": med["prompt"],
                "decode_ms": med["decode"],
                "prompt_percent_of_encoder": 100.0 * med["prompt"] / med["encoder"],
                "prompt_percent_of_step": 100.0 * med["prompt"] / sum(med.values()),
                "times": t,
            }
        )
        print(
            f"[bench] batch {batch}: encoder {med['encoder']:.2f} ms, prompt {med['prompt']:.3f} ms "
            f"({rows[-1]['prompt_percent_of_encoder']:.2f}% of it), decode {med['decode']:.2f} ms",
            flush=True,
        )
    return rows


def _detect_rows(
    detect: dict[int, list[float]],
    steps: dict[int, dict[str, list[float]]],
    cells: dict[int, _StepCell],
    evidence: Any,
) -> list[dict[str, Any]]:
    """One row per locale count: the median detection time against the encoder time of the same audio, ms."""
    frames = evidence.num_frames
    steps_of_audio = frames / max(1, cells[min(cells)].frames_out)
    audio_ms = statistics.median(steps[min(cells)]["encoder"]) * steps_of_audio
    rows = []
    for n, t in detect.items():
        ms = statistics.median(t)
        rows.append(
            {
                "locales": n,
                "frames": frames,
                "tokens": len(evidence.tokens),
                "detect_ms": ms,
                "encoder_batch": min(cells),
                "encoder_steps": steps_of_audio,
                "encoder_ms_same_audio": audio_ms,
                "detect_over_encoder": ms / audio_ms,
                "times": t,
            }
        )
        print(
            f"[bench] detection over {n} locales ({frames} frames, {len(evidence.tokens)} tokens): "
            f"{ms:.1f} ms = {ms / audio_ms:.3f} x the encoder time of the same audio ({audio_ms:.0f} ms)",
            flush=True,
        )
    return rows


def _tables(step_rows: list[dict[str, Any]], detect_rows: list[dict[str, Any]], f: dict[str, float]) -> str:
    """The two tables and the FLOP line, as printed and written next to the JSON."""
    table = output.format_rows(
        step_rows,
        [
            ("batch", "batch"),
            ("encoder step ms", "encoder_ms"),
            ("prompt ms", "prompt_ms"),
            ("prompt % of encoder", "prompt_percent_of_encoder"),
            ("decode ms", "decode_ms"),
            ("prompt % of step", "prompt_percent_of_step"),
        ],
    )
    table += "\n\n" + output.format_rows(
        detect_rows,
        [
            ("locales", "locales"),
            ("frames", "frames"),
            ("tokens", "tokens"),
            ("detection ms", "detect_ms"),
            ("encoder ms of the same audio", "encoder_ms_same_audio"),
            ("detection / encoder", "detect_over_encoder"),
        ],
    )
    return table + (
        f"\n\nFLOP (2 per weight and frame): prompt {f['prompt_per_frame_per_locale'] / 1e6:.2f} M per frame and "
        f"locale, encoder {f['encoder_per_frame'] / 1e6:.0f} M per frame ({100 * f['prompt_over_encoder']:.2f}%)"
    )


def _figure(step_rows: list[dict[str, Any]], detect_rows: list[dict[str, Any]]) -> Any:
    """Left: a step's parts per batch size; right: detection vs the encoder time of the same audio."""
    fig, axes = output.new_figure(1, 2)
    ax = axes[0][0]
    labels = [str(r["batch"]) for r in step_rows]
    bottom = [0.0] * len(step_rows)
    for part in ("encoder", "prompt", "decode"):
        values = [r[f"{part}_ms"] for r in step_rows]
        ax.bar(labels, values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xlabel("batch")
    ax.set_ylabel("ms per step (median)")
    ax.set_title("160 ms step: encoder, language prompt, decode")
    ax.legend()
    ax = axes[0][1]
    names = [f"detect {r['locales']} loc." for r in detect_rows]
    if detect_rows:
        names.append("encoder, same audio")
    values = [r["detect_ms"] for r in detect_rows] + [detect_rows[0]["encoder_ms_same_audio"]] * bool(
        detect_rows
    )
    ax.bar(names, values, color=["C3"] * len(detect_rows) + ["C0"] * bool(detect_rows))
    ax.set_ylabel("ms per utterance (median)")
    ax.set_title("auto detection at the final")
    return fig


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point: ``python -m pipecat_nemotron.bench multilingual [options]``."""
    return common.bench_main(NAME, __doc__, add_arguments, run, argv)
