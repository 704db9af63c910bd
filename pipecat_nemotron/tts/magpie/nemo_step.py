"""NeMo's own decoding step for :class:`~pipecat_nemotron.tts.magpie.engine.MagpieEngine` (``step="nemo"``).

One request at a time through ``MagpieTTSModel.generate_speech``; each generated frame is seen through the
per-frame hook of :mod:`~pipecat_nemotron.tts.magpie._nemo_private` and decoded to audio as it comes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loguru import logger

if TYPE_CHECKING:
    from pipecat_nemotron.tts.magpie.engine import MagpieEngine
    from pipecat_nemotron.tts.magpie.stream import SynthesisStream, _Request
    from pipecat_nemotron.tts.magpie.streaming import StreamingDecoder


class _Abort(Exception):
    """Raised from the frame hook to leave NeMo's decoding loop (cancelled, or the frame budget is spent)."""


def synthesize(engine: MagpieEngine, stream: SynthesisStream) -> tuple[str, BaseException | None]:
    """Run one request on the worker thread, streaming its chunks; return its final status and error."""
    import torch

    request = stream._request
    options = request.options
    stream.stats.started_at = time.perf_counter()
    stream._status = "running"
    max_frames = options.max_frames(engine.sample_rate, engine.samples_per_frame)
    decoder = engine._new_decoder(options)
    on_frames = _frame_callback(engine, stream, decoder, max_frames)
    status = "completed"
    try:
        _generate(engine, request, on_frames)
    except _Abort as abort:
        status = str(abort)
    except Exception as e:
        logger.opt(exception=e).error(f"{engine}: synthesis #{stream.id} failed: {e}")
        return "failed", e
    if status == "cancelled":
        return status, None
    try:
        with torch.inference_mode():
            engine._emit(stream, decoder, decoder.flush())
    except Exception as e:
        logger.opt(exception=e).error(f"{engine}: decoding #{stream.id} failed: {e}")
        return "failed", e
    if status == "truncated" and not request.internal:
        logger.warning(
            f"{engine}: synthesis #{stream.id} stopped at max_duration_s={options.max_duration_s} "
            "without the model ending the speech"
        )
    return status, None


def _frame_callback(
    engine: MagpieEngine, stream: SynthesisStream, decoder: StreamingDecoder, max_frames: int
) -> Callable[[Any], None]:
    """The per-frame hook: decode audio frames as they come; raise :class:`_Abort` on cancel or budget spent."""
    model = engine.model
    stats = stream.stats

    def on_frames(frames: Any) -> None:
        if stream.cancelled:
            raise _Abort("cancelled")
        for i in range(frames.shape[-1]):
            frame = frames[:, i]
            if bool((frame >= model.codebook_size).any()):
                continue  # Special tokens (end of speech) carry no audio.
            stats.frames += 1
            engine._emit(stream, decoder, decoder.push(frame))
            if stats.frames >= max_frames:
                raise _Abort("truncated")

    return on_frames


def _generate(engine: MagpieEngine, request: _Request, on_frames: Callable[[Any], None]) -> None:
    """Generate the text chunk by chunk with NeMo's ``generate_speech``; ``on_frames`` sees each frame."""
    import torch

    from pipecat_nemotron.tts.magpie._nemo_private import frame_hook

    model = engine.model
    chunks = engine._text_chunks(request)
    use_local_transformer = str(getattr(model.local_transformer_type, "value", "none")) != "none"
    device = next(model.parameters()).device
    seed = request.options.seed
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
                "speaker_indices": request.speaker_index,
            }
            model.generate_speech(
                batch,
                chunk_state=chunk_state,
                end_of_text=[index == len(chunks) - 1],
                beginning_of_text=index == 0,
                use_cfg=request.options.use_cfg,
                use_local_transformer_for_inference=use_local_transformer,
            )
