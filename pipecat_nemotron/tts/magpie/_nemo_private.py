"""Every use of private NeMo ``MagpieTTSModel`` internals, in one place.

NeMo 3.0 has no public per-frame generator for ``MagpieTTSModel``: ``generate_speech`` runs its whole
autoregressive loop and returns all codes at the end. This module touches three private things:

- ``_check_eos_and_update_state(...)``: called by ``generate_speech`` once per decoding step, right after the
  step's codes are sampled. Wrapping it on the instance lets us see each frame as it is produced (and abort the
  loop by raising), without copying NeMo's loop.
- ``_codec_helper.codes_to_audio(codes, codes_len)``: decodes codec codes to audio (NeMo's own decode path,
  including any codebook converter); ``_codec_helper.codec_model`` / ``.codec_converter``: the same two parts, for
  the stateful streaming decode (:mod:`~pipecat_nemotron.tts.magpie.codec_stream`).
- ``_lt_helper``: the local transformer and its projections, which the fast step
  (:mod:`~pipecat_nemotron.tts.magpie.fast_step`) runs piecewise.
- The baked-speaker buffers (``_baked_embedding_T``/``_D``), written only when building the tiny test model.
- torch's ``_BatchNorm`` base class, to refuse a codec decoder with batch norm (not streamable).

No other module of the package reaches into a private member of NeMo, torch, or another module of ours.

:func:`check_compatibility` verifies the first two against the installed NeMo and raises
:class:`NeMoCompatibilityError` if they have moved; the engine calls it at load time and
``tests/test_tts.py`` calls it too, so an incompatible NeMo fails loudly rather than silently not streaming.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

_HOOKED_METHOD = "_check_eos_and_update_state"
_HOOK_PARAMS = ("audio_codes_next", "chunk_end_frame_lens", "current_step")


class NeMoCompatibilityError(RuntimeError):
    """The installed NeMo no longer has the private members frame-level streaming relies on."""


def check_compatibility(model: Any) -> None:
    """Check that ``model`` exposes the private members this module uses.

    Args:
        model: A loaded ``MagpieTTSModel``.

    Raises:
        NeMoCompatibilityError: Naming what is missing (pin ``nemo_toolkit`` to a tested version, 3.0.x).

    """
    problems: list[str] = []
    method = getattr(type(model), _HOOKED_METHOD, None)
    if not callable(method):
        problems.append(f"MagpieTTSModel.{_HOOKED_METHOD} is gone")
    else:
        params = inspect.signature(method).parameters
        missing = [p for p in _HOOK_PARAMS if p not in params]
        if missing:
            problems.append(f"MagpieTTSModel.{_HOOKED_METHOD} lost parameters {missing}")
        generate = getattr(type(model), "generate_speech", None)
        try:
            source = inspect.getsource(generate) if generate is not None else ""
        except (OSError, TypeError):  # Source not shipped: the runtime check in frame_hook still applies.
            source = f"self.{_HOOKED_METHOD}("
        if f"self.{_HOOKED_METHOD}(" not in source:
            problems.append(f"MagpieTTSModel.generate_speech no longer calls {_HOOKED_METHOD}")
    helper = getattr(model, "_codec_helper", None)
    if not callable(getattr(helper, "codes_to_audio", None)):
        problems.append("MagpieTTSModel._codec_helper.codes_to_audio is gone")
    for attr in ("codebook_size", "num_audio_codebooks", "frame_stacking_factor", "output_sample_rate"):
        if not hasattr(model, attr):
            problems.append(f"MagpieTTSModel.{attr} is gone")
    if problems:
        raise NeMoCompatibilityError(
            "pipecat-nemotron's Magpie streaming does not support this NeMo version ("
            + "; ".join(problems)
            + "). Install nemo_toolkit 3.0.x."
        )


FrameCallback = Callable[[torch.Tensor], None]
"""Receives the frames one decoding step keeps, shape ``(num_codebooks, k)`` with ``k`` >= 0, item 0 only."""


@contextlib.contextmanager
def frame_hook(model: Any, on_frames: FrameCallback) -> Iterator[list[int]]:
    """Call ``on_frames`` with each decoding step's kept frames while ``generate_speech`` runs.

    A step's frames are those NeMo itself keeps: when the step detects the end of speech (or of a text chunk),
    frames at and after the end index are cut, exactly as ``generate_speech`` trims ``predicted_codes``. Batch
    item 0 only (the engine synthesises one request at a time). ``on_frames`` may raise to abort generation.

    Args:
        model: A loaded ``MagpieTTSModel``; the hook is installed on this instance only, and removed on exit.
        on_frames: Callback run on the generating thread, after NeMo's own bookkeeping for the step.

    Yields:
        A one-element list counting hook calls (decoding steps), for tests and for detecting a silent NeMo change.

    """
    original = getattr(model, _HOOKED_METHOD)
    signature = inspect.signature(original)
    calls = [0]

    def hooked(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        calls[0] += 1
        arguments = signature.bind(*args, **kwargs).arguments
        codes = arguments["audio_codes_next"][0]  # (C, frame_stacking_factor)
        step = int(arguments["current_step"])
        ends: dict[int, int] = arguments["chunk_end_frame_lens"]
        stacked = codes.shape[-1]
        keep = stacked if 0 not in ends else max(0, min(stacked, ends[0] - step * stacked))
        on_frames(codes[:, :keep])
        return result

    setattr(model, _HOOKED_METHOD, hooked)
    try:
        yield calls
    finally:
        # Removing the instance attribute restores the class method.
        with contextlib.suppress(AttributeError):
            delattr(model, _HOOKED_METHOD)


def codes_to_audio(model: Any, codes: torch.Tensor) -> torch.Tensor:
    """Decode codec frames to audio with the model's own codec.

    Args:
        model: A loaded ``MagpieTTSModel``.
        codes: Codes of shape ``(num_codebooks, T)`` (ids below ``model.codebook_size``), on the model's device.

    Returns:
        Float audio in [-1, 1], shape ``(T * samples_per_frame,)``, at ``model.output_sample_rate`` Hz, on the
        model's device.

    """
    codes = codes.unsqueeze(0)
    codes_len = torch.tensor([codes.shape[-1]], device=codes.device, dtype=torch.long)
    audio, audio_len, _ = model._codec_helper.codes_to_audio(codes, codes_len)
    return audio[0, : int(audio_len[0])]


def codes_to_audio_batch(model: Any, codes: torch.Tensor, lens: torch.Tensor) -> list[torch.Tensor]:
    """Decode many right-padded code sequences ``(B, num_codebooks, T)`` of lengths ``lens (B,)`` in one call.

    Returns:
        Each item's float audio, ``(lens[i] * samples_per_frame,)``, on the model's device.

    """
    audio, audio_len, _ = model._codec_helper.codes_to_audio(codes, lens.to(codes.device))
    return [audio[i, : int(audio_len[i])] for i in range(codes.shape[0])]


def codec_parts(model: Any) -> tuple[Any, Any]:
    """The codec model and the optional codebook converter ``codes_to_audio`` decodes with.

    Returns:
        ``(AudioCodecModel, converter or None)``.

    Raises:
        NeMoCompatibilityError: NeMo's codec helper no longer holds them.

    """
    helper = getattr(model, "_codec_helper", None)
    if helper is None or not hasattr(helper, "codec_model") or not hasattr(helper, "codec_converter"):
        raise NeMoCompatibilityError("MagpieTTSModel._codec_helper no longer has codec_model / codec_converter")
    return helper.codec_model, helper.codec_converter


def local_transformer_helper(model: Any) -> Any:
    """NeMo's ``LocalTransformerHelper`` of ``model``: ``local_transformer``, its in/out projections, the embeddings.

    Raises:
        NeMoCompatibilityError: The model no longer keeps it where NeMo 3.0 does.

    """
    helper = getattr(model, "_lt_helper", None)
    if helper is None or not hasattr(helper, "local_transformer"):
        raise NeMoCompatibilityError("MagpieTTSModel._lt_helper.local_transformer is gone")
    return helper


def is_batch_norm(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a batch norm of any dimension (torch's private ``_BatchNorm`` base, lazy ones too)."""
    return isinstance(module, torch.nn.modules.batchnorm._BatchNorm)


def set_baked_speakers(model: Any, contexts: torch.Tensor) -> None:
    """Give a ``decoder_ce`` model fixed speaker contexts, as the released checkpoint has (tiny test models only).

    Args:
        model: A ``MagpieTTSModel`` of type ``decoder_ce``.
        contexts: One context per speaker, shape ``(speakers, frames, embedding_dim)``.

    """
    speakers, frames, width = contexts.shape
    model.baked_context_embedding = torch.nn.Embedding(speakers, frames * width)
    model.baked_context_embedding.weight.data = contexts.reshape(speakers, frames * width).clone()
    model.baked_context_embedding.weight.requires_grad_(False)
    model._baked_embedding_T = torch.tensor(frames)
    model._baked_embedding_D = torch.tensor(width)
    model.baked_context_embedding_len = torch.full((speakers,), frames)
    if model.num_baked_speakers != speakers:
        raise NeMoCompatibilityError("MagpieTTSModel no longer reads baked speakers from these attributes")
