"""Settings of the server's Magpie TTS: :class:`TTSHostConfig` (validated on construction; no engine here)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipecat_nemotron.tts.magpie.options import DEFAULT_MAGPIE_MODEL, normalize_voice

#: Output rates a synthesis request may ask for, Hz (0: the codec's own rate).
MIN_OUTPUT_RATE = 8000
MAX_OUTPUT_RATE = 48000


@dataclass(frozen=True)
class TTSHostConfig:
    """The Magpie engine the server hosts, and the limits of its synthesis calls.

    Attributes:
        model: Magpie hub id or ``.nemo`` path.
        codec_model_path: Codec ``.nemo`` overriding the one the checkpoint names (a local checkpoint whose codec
            was saved elsewhere).
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        dtype: ``"float32"`` or ``"bfloat16"`` (the fast step).
        max_batch: Requests decoded together per step.
        max_streams: Synthesis calls served at once; the next is refused (RESOURCE_EXHAUSTED) while the others
            go on.
        max_text_chars: Longest text of one request, characters (longer: INVALID_ARGUMENT). Pipecat's
            ``NvidiaTTSService`` sends at most 200 per request.
        max_duration_s: Most audio one request may produce, s (the engine stops there: ``truncated``).
        max_buffered_s: Audio made for a call but not yet taken by its client, s. Past it the call's audio
            waits in its engine stream until the client takes some (the engine never waits for a client, so no
            other call slows).
        stall_timeout_s: How long a call's client may take nothing while its buffer is past ``max_buffered_s``,
            s. Then it has stopped reading: its call is cancelled (RESOURCE_EXHAUSTED), its engine row freed, and
            it is logged. A client that reads slowly is never cancelled.
        default_voice: Voice of a request that names none.
        warmup: Synthesise a short sentence after loading.

    """

    model: str = DEFAULT_MAGPIE_MODEL
    codec_model_path: str | None = None
    device: str = "auto"
    dtype: str = "float32"
    max_batch: int = 8
    max_streams: int = 32
    max_text_chars: int = 2000
    max_duration_s: float = 20.0
    max_buffered_s: float = 30.0
    stall_timeout_s: float = 5.0
    default_voice: str = "aria"
    warmup: bool = True

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_streams", "max_text_chars"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                flag = "--tts-" + name.replace("_", "-")
                raise ValueError(f"TTS {name} ({flag}) must be an integer >= 1, got {value!r}")
        for name in ("max_duration_s", "max_buffered_s", "stall_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                flag = " (--tts-max-duration-s)" if name == "max_duration_s" else ""
                raise ValueError(f"TTS {name}{flag} must be a positive number of seconds, got {value!r}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f'TTS dtype must be "float32" or "bfloat16", got {self.dtype!r} (--tts-dtype)')
        object.__setattr__(self, "default_voice", normalize_voice(self.default_voice))
