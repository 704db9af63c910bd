"""The baseline of ``buffered-vs-cache-aware``: NeMo's ``BufferedRNNTPipeline`` (``nemo.collections.asr.inference``).

Every step it re-encodes a window of ``left 1.6 s + chunk + right context`` and decodes the chunk's frames (stateful
RNNT decoding, ``request_type=frame``). NeMo is imported only when a baseline is built.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.bench.audio import Clip
from pipecat_nemotron.bench.stats import sync_device

#: Buffered baseline geometry per latency mode: (chunk, right context) in seconds; chunk + right = latency.
BUFFERED_SPLIT: dict[int, tuple[float, float]] = {
    80: (0.08, 0.0),
    160: (0.08, 0.08),
    560: (0.24, 0.32),
    1120: (0.56, 0.56),
}
#: Left context of the buffered window, seconds (NeMo's usual 1.6 s).
BUFFERED_LEFT_S = 1.6


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
                "sample_rate": MODEL_SAMPLE_RATE,
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

        from pipecat_nemotron.asr.loading import quiet_nemo

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

    def run(self, clips: Sequence[Clip], latency_ms: int, streams: int) -> tuple[list[str], float, float]:
        """Transcribe ``clips`` with ``streams`` concurrent streams (one chunk per stream per batched step).

        Returns:
            The transcripts (in clip order), the seconds spent inside ``transcribe_step`` calls, and the seconds
            of audio processed (clips plus flush silence).

        """
        import torch
        from nemo.collections.asr.inference.streaming.framing.request import Frame
        from nemo.collections.asr.inference.streaming.framing.request_options import ASRRequestOptions

        pipeline = self.pipelines[latency_ms]
        chunk = int(round(pipeline.chunk_size * MODEL_SAMPLE_RATE))
        # Flush: silence covering the right context after each clip. NeMo's stateful buffered pipeline decodes
        # only the chunk region of the last frame too, so without it the words spoken in the last right-context
        # window are dropped (the engine's finalize flushes by itself). In a live session that silence is just the
        # audio after speech, so it counts as processed audio: cost per second stays the steady-state cost.
        flush = np.zeros(
            int(round(pipeline.right_padding_size * MODEL_SAMPLE_RATE)) if self.flush else 0, np.float32
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
                sync_device()
                step_s += time.perf_counter() - t
                for w, frame, out in zip(owners, frames, outputs, strict=True):
                    slot = active[w]
                    assert slot is not None
                    if out.final_transcript:
                        texts[slot[0]].append(out.final_transcript)
                    if frame.is_last:
                        active[w] = None
        processed_s = sum(c.seconds for c in clips) + len(clips) * flush.size / MODEL_SAMPLE_RATE
        return [" ".join("".join(t).split()) for t in texts], step_s, processed_s

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id
