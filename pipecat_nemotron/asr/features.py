"""Incremental log-mel features that equal the whole-utterance features frame for frame.

NeMo's mel preprocessor computes STFT frames centred on every ``hop`` samples with zero padding at both ends
of the utterance, after pre-emphasis. Chunked mel differs from whole-utterance mel at chunk edges (STFT
window effects) unless each chunk is given the audio its frames' windows cover. This module gives it exactly
that: frame ``t`` is computed from the samples ``[t*hop - n_fft/2, t*hop + n_fft/2)``, so a chunk of frames
``[t0, t0+F)`` needs the samples ``[(t0-2)*hop, (t0+F-1)*hop + n_fft/2)`` (2 hops of history, since
``n_fft/2 <= 2*hop``). The model's own preprocessor is run on that segment and the frames whose windows lie
inside it are kept. Each chunk therefore costs the same however long the stream has run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

#: Frames of history each segment starts with; the preprocessor's own frames 0..1 see its left padding.
HISTORY_FRAMES = 2


@dataclass
class FeatureCursor:
    """Per-stream position in the audio of the current feature segment (an utterance, or a whole session).

    Sample indices are relative to the segment start. ``audio`` holds samples from ``trimmed`` onward;
    older samples are dropped once no future frame needs them, so memory per stream stays constant.
    """

    audio: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    trimmed: int = 0
    next_frame: int = 0

    @property
    def end(self) -> int:
        """Number of segment samples received so far."""
        return self.trimmed + self.audio.size

    def append(self, samples: np.ndarray) -> None:
        """Add samples at the end of the segment."""
        if samples.size:
            self.audio = np.concatenate((self.audio, samples)) if self.audio.size else samples

    def take(self, start: int, stop: int) -> np.ndarray:
        """Copy segment samples ``[start, stop)``; indices before 0 or past the end read as zeros."""
        out = np.zeros(stop - start, dtype=np.float32)
        lo, hi = max(start, self.trimmed), min(stop, self.end)
        if hi > lo:
            out[lo - start : hi - start] = self.audio[lo - self.trimmed : hi - self.trimmed]
        return out

    def drop_before(self, sample: int) -> None:
        """Forget samples before ``sample``."""
        if sample > self.trimmed:
            cut = min(sample, self.end) - self.trimmed
            self.audio = self.audio[cut:]
            self.trimmed += cut

    def split_at(self, sample: int) -> FeatureCursor:
        """Return a new cursor whose segment starts at ``sample`` of this one, holding the samples after it."""
        rest = FeatureCursor()
        if sample < self.end:
            rest.append(self.audio[max(sample - self.trimmed, 0) :].copy())
        return rest


class MelFrontend:
    """Runs the model's mel preprocessor on exact per-chunk audio segments, batched across streams."""

    def __init__(self, preprocessor: Any, device: torch.device) -> None:
        """Create a frontend.

        Args:
            preprocessor: The NeMo ``AudioToMelSpectrogramPreprocessor`` of the model (fp32, eval mode).
            device: Device the preprocessor lives on.

        """
        featurizer = preprocessor.featurizer
        self.preprocessor = preprocessor
        self.device = device
        self.hop = int(featurizer.hop_length)
        self.n_fft = int(featurizer.n_fft)
        self.num_features = int(featurizer.nfilt)
        if (
            getattr(featurizer, "exact_pad", False)
            or getattr(featurizer, "stft_pad_amount", None) is not None
        ):
            raise ValueError("exact_pad preprocessors are not supported for streaming")
        if self.n_fft // 2 > HISTORY_FRAMES * self.hop:
            raise ValueError(f"n_fft={self.n_fft} needs more than {HISTORY_FRAMES} hops of history")
        if int(getattr(featurizer, "frame_splicing", 1)) != 1:
            raise ValueError("frame_splicing preprocessors are not supported for streaming")

    def samples_needed(self, next_frame: int, num_frames: int) -> int:
        """Segment samples that must have arrived before frames ``[next_frame, next_frame+num_frames)`` exist."""
        return (next_frame + num_frames - 1) * self.hop + self.n_fft // 2

    def frames_available(self, end_sample: int) -> int:
        """Whole-utterance frame count of a segment that ends at ``end_sample`` (as the offline model sees it)."""
        return end_sample // self.hop

    def chunk_segment(self, cursor: FeatureCursor, num_frames: int) -> np.ndarray:
        """Audio for the next ``num_frames`` complete frames (the caller checked :meth:`samples_needed`)."""
        start = (cursor.next_frame - HISTORY_FRAMES) * self.hop
        return cursor.take(start, self.samples_needed(cursor.next_frame, num_frames))

    def final_segment(self, cursor: FeatureCursor, end_sample: int) -> tuple[np.ndarray, int]:
        """Audio and frame count for the frames left when the segment ends at ``end_sample``.

        The preprocessor zero-pads after ``end_sample`` exactly as it does at the end of a whole utterance.
        """
        start = (cursor.next_frame - HISTORY_FRAMES) * self.hop
        num_frames = max(self.frames_available(end_sample) - cursor.next_frame, 0)
        return cursor.take(start, end_sample), num_frames

    def advance(self, cursor: FeatureCursor, num_frames: int) -> None:
        """Mark ``num_frames`` frames consumed and drop audio no later frame needs."""
        cursor.next_frame += num_frames
        cursor.drop_before((cursor.next_frame - HISTORY_FRAMES) * self.hop)

    def compute(self, segments: list[np.ndarray], num_frames: list[int]) -> torch.Tensor:
        """Mel frames for a batch of segments.

        Args:
            segments: Audio segments from :meth:`chunk_segment` / :meth:`final_segment` (may differ in length).
            num_frames: Frames to keep from each segment.

        Returns:
            Tensor ``[batch, features, max(num_frames)]`` (fp32, on the frontend's device), zero past each
            segment's ``num_frames``.

        """
        import torch  # here, not at import: the frontend's geometry is used without torch (the policy)

        with torch.inference_mode():
            lengths = [s.size for s in segments]
            batch = np.zeros((len(segments), max(lengths)), dtype=np.float32)
            for i, s in enumerate(segments):
                batch[i, : s.size] = s
            signal = torch.from_numpy(batch).to(self.device)
            length = torch.tensor(lengths, device=self.device, dtype=torch.long)
            feats, _ = self.preprocessor(input_signal=signal, length=length)
            width = max(num_frames)
            out = feats[:, :, HISTORY_FRAMES : HISTORY_FRAMES + width].clone()
            if out.size(-1) < width:
                out = torch.nn.functional.pad(out, (0, width - out.size(-1)))
            for i, n in enumerate(num_frames):
                if n < width:
                    out[i, :, n:] = 0.0
            return out
