"""Step time of our encoder step against NeMo's, per latency mode and batch size, on one loaded model.

Each measurement is one steady-state step (full 70-frame context, real log-mel chunks of the bundled demo
speech) of the encoder followed by the greedy RNNT decode of its output, for a batch of B streams. The two
steps alternate within every repetition so machine noise hits both alike; the table gives medians and the
NeMo/fast ratio. The encoder outputs of the two steps are compared on every measured step (max |diff|).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

from pipecat_nemotron.bench import common, output

NAME = "encoder-step"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of this benchmark."""
    from pipecat_nemotron.asr.config import LATENCY_MODES

    common.add_common_args(parser, model_default="600m", manifest=False)
    lists = {
        "--modes": (sorted(LATENCY_MODES), "latency modes, ms"),
        "--batches": ([1, 4, 16], "streams per step"),
    }
    for flag, (default, what) in lists.items():
        parser.add_argument(flag, type=int, nargs="+", default=default, help=f"{what} (default: %(default)s)")
    parser.add_argument(
        "--repeats", type=int, default=5, help="measured steps per cell and step (default: 5)"
    )


def _demo_features(model: Any, frames: int) -> Any:
    """Log-mel of the bundled demo speech, looped to at least ``frames`` frames: ``[1, features, frames]``."""
    import torch

    from pipecat_nemotron.agent.wav_input import read_float32
    from pipecat_nemotron.models import DEMO_AUDIO_DIR

    signal = torch.from_numpy(read_float32(DEMO_AUDIO_DIR / "demo_weather.wav"))[None].to(model.device)
    features, _ = model.preprocessor(input_signal=signal, length=torch.tensor([signal.size(-1)]))
    repeats = -(-frames // features.size(-1))
    return features.repeat(1, 1, repeats)[:, :, :frames]


class _Cell:
    """One (mode, batch) measurement: the same chunks and full caches for both steps."""

    def __init__(self, model: Any, fast: Any, right: int, batch: int, dtype: Any) -> None:
        import torch

        encoder = model.encoder
        cfg = encoder.streaming_cfg
        self.model, self.fast, self.right = model, fast, right
        frames = int(cfg.chunk_size[1]) + int(cfg.pre_encode_cache_size[1])
        feats = _demo_features(model, frames * batch)
        self.signal = feats.view(1, feats.size(1), batch, frames).permute(2, 0, 1, 3)[:, 0].to(dtype)
        self.lengths = torch.full((batch,), frames, device=feats.device)
        self.drop = int(cfg.drop_extra_pre_encoded)
        channel, time_cache, cached = encoder.get_initial_cache_state(batch, dtype=dtype, device=feats.device)
        channel.normal_(std=0.5)
        cached.fill_(int(cfg.last_channel_cache_size))
        self.nemo_caches = (channel, time_cache, cached)
        self.fast_caches = (fast.project_layer_inputs(channel), time_cache, cached)

    def run(self, step: str) -> tuple[float, Any]:
        """One step (encoder + greedy decode); returns its wall time (ms) and the encoder output."""
        import torch

        from pipecat_nemotron.asr.fast_step import nemo_encoder_step

        device = self.signal.device
        start = time.perf_counter()
        if step == "fast":
            out = self.fast(
                self.signal,
                self.lengths,
                *self.fast_caches,
                drop_extra_pre_encoded=self.drop,
                right_context=self.right,
            )
        else:
            out = nemo_encoder_step(
                self.model.encoder,
                self.signal,
                self.lengths,
                *self.nemo_caches,
                drop_extra_pre_encoded=self.drop,
            )
        self.model.decoding.rnnt_decoder_predictions_tensor(
            encoder_output=out[0], encoded_lengths=out[1], return_hypotheses=True
        )
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) * 1000.0, out[0]


def _measure(model: Any, mode: int, batch: int, repeats: int, dtype: Any) -> dict[str, Any]:
    from pipecat_nemotron.asr.config import LATENCY_MODES, LEFT_CONTEXT_FRAMES
    from pipecat_nemotron.asr.fast_step import FastEncoderStep

    right = LATENCY_MODES[mode]
    model.encoder.set_default_att_context_size([LEFT_CONTEXT_FRAMES, right])
    cell = _Cell(model, FastEncoderStep(model.encoder), right, batch, dtype)
    times: dict[str, list[float]] = {"nemo": [], "fast": []}
    max_diff = 0.0
    for i in range(repeats + 1):  # the first round warms both up and is not counted
        outs = {}
        for step in ("nemo", "fast") if i % 2 == 0 else ("fast", "nemo"):
            ms, outs[step] = cell.run(step)
            if i:
                times[step].append(ms)
        max_diff = max(max_diff, float((outs["nemo"] - outs["fast"]).abs().max()))
    nemo_ms, fast_ms = statistics.median(times["nemo"]), statistics.median(times["fast"])
    return {
        "mode_ms": mode,
        "batch": batch,
        "nemo_ms": nemo_ms,
        "fast_ms": fast_ms,
        "nemo_over_fast": nemo_ms / fast_ms,
        "max_abs_diff": max_diff,
        "times": times,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every (mode, batch) cell; write JSON under ``args.out``; return the result."""
    import torch

    spec = common.resolve_model(args.model, args.models_dir)
    result = output.result_header(NAME, args)
    result["model"] = spec.as_dict()
    with common.bench_context(args), torch.inference_mode():
        model, _, dtype = common.load_bench_model(spec, args.device)
        result["dtype"] = str(dtype).replace("torch.", "")
        rows = []
        for mode in args.modes:
            for batch in args.batches:
                row = _measure(model, mode, batch, args.repeats, dtype)
                rows.append(row)
                print(
                    f"[bench] {mode} ms, batch {batch}: NeMo {row['nemo_ms']:.1f} ms, fast {row['fast_ms']:.1f} ms "
                    f"({row['nemo_over_fast']:.2f}x)",
                    flush=True,
                )
    result["rows"] = rows
    table = output.format_rows(
        rows,
        [
            ("mode ms", "mode_ms"),
            ("batch", "batch"),
            ("NeMo step ms", "nemo_ms"),
            ("fast step ms", "fast_ms"),
            ("NeMo / fast", "nemo_over_fast"),
            ("max |enc diff|", lambda r: f"{r['max_abs_diff']:.1e}"),
        ],
    )
    output.finish(args.out, NAME, result, None, table)
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point: ``python -m pipecat_nemotron.bench encoder-step [options]``."""
    return common.bench_main(NAME, __doc__, add_arguments, run, argv)
