"""NeMo's own decoding step for :class:`~pipecat_nemotron.tts.magpie.engine.MagpieEngine` (``step="nemo"``).

One request at a time through ``MagpieTTSModel.generate_speech``; each generated frame is seen through the
per-frame hook of :mod:`~pipecat_nemotron.tts.magpie._nemo_private` and decoded to audio as it comes. The worker
(:mod:`~pipecat_nemotron.tts.magpie.scheduler`) admits requests with the same policy as the fast step's, one at a
time; NeMo's loop is the step, so a request's frame budget and its cancellation are checked in the frame hook.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pipecat_nemotron.tts.magpie.codec_stream import CodecDecoding
from pipecat_nemotron.tts.magpie.options import uses_guidance
from pipecat_nemotron.tts.magpie.runner import text_chunks
from pipecat_nemotron.tts.magpie.stream import Synthesis
from pipecat_nemotron.tts.magpie.streaming import StreamingDecoder

Deliver = Callable[[Synthesis, np.ndarray | None], None]
"""Hands one decoded audio chunk of a request (None: nothing decoded) to its caller."""


class _Abort(Exception):
    """Raised from the frame hook to leave NeMo's decoding loop (cancelled, or the frame budget is spent)."""


class NemoStep:
    """NeMo's ``generate_speech`` for one request at a time (the engine's worker thread only).

    Args:
        model: A loaded ``MagpieTTSModel``.
        codec: The engine's codec decoding.

    """

    def __init__(self, model: Any, codec: CodecDecoding) -> None:
        self.model = model
        self.codec = codec
        self.sample_rate = int(model.output_sample_rate)
        self.samples_per_frame = int(model.codec_model_samples_per_frame)

    def synthesize(self, synthesis: Synthesis, deliver: Deliver) -> None:
        """Run one request to its end, streaming its audio; set ``synthesis.ending``.

        Its frames are counted in ``synthesis.frames``; it ends ``truncated`` at ``synthesis.max_frames``,
        ``cancelled`` at the first frame after a cancel, else ``completed``.

        Raises:
            Exception: Whatever NeMo or the codec raised (the request fails).

        """
        decoder = self.codec.new_decoder(synthesis.options)
        try:
            self._generate(synthesis, self._frame_hook(synthesis, decoder, deliver))
        except _Abort as abort:
            synthesis.ending = str(abort)
        else:
            synthesis.ending = "completed"
        if synthesis.ending != "cancelled":
            with torch.inference_mode():
                deliver(synthesis, decoder.flush())

    def _frame_hook(
        self, synthesis: Synthesis, decoder: StreamingDecoder, deliver: Deliver
    ) -> Callable[[Any], None]:
        """The per-frame hook: decode audio frames as they come; raise :class:`_Abort` on cancel or budget spent."""
        codebook_size = self.model.codebook_size

        def on_frames(frames: Any) -> None:
            if synthesis.cancelled:
                raise _Abort("cancelled")
            for i in range(frames.shape[-1]):
                frame = frames[:, i]
                if bool((frame >= codebook_size).any()):
                    continue  # Special tokens (end of speech) carry no audio.
                synthesis.frames += 1
                deliver(synthesis, decoder.push(frame))
                if synthesis.frames >= synthesis.max_frames:
                    raise _Abort("truncated")

        return on_frames

    def _generate(self, synthesis: Synthesis, on_frames: Callable[[Any], None]) -> None:
        """Generate the text chunk by chunk with NeMo's ``generate_speech``; ``on_frames`` sees each frame."""
        from pipecat_nemotron.tts.magpie._nemo_private import frame_hook

        model = self.model
        chunks = text_chunks(model, synthesis.text, synthesis.language)
        use_local_transformer = str(getattr(model.local_transformer_type, "value", "none")) != "none"
        device = next(model.parameters()).device
        seed = synthesis.options.seed
        with (
            torch.inference_mode(),
            frame_hook(model, on_frames),
            torch.random.fork_rng(enabled=seed is not None),
        ):
            if seed is not None:
                torch.manual_seed(seed)
            chunk_state = model.create_chunk_state(batch_size=1)
            for index, tokens in enumerate(chunks):
                batch = {
                    "text": tokens.unsqueeze(0).to(device),
                    "text_lens": torch.tensor([tokens.shape[0]], device=device, dtype=torch.long),
                    "speaker_indices": synthesis.speaker_index,
                }
                model.generate_speech(
                    batch,
                    chunk_state=chunk_state,
                    end_of_text=[index == len(chunks) - 1],
                    beginning_of_text=index == 0,
                    use_cfg=uses_guidance(synthesis.options, model.inference_parameters.cfg_scale),
                    use_local_transformer_for_inference=use_local_transformer,
                )
