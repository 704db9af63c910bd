"""Voices, languages and init-only options of the in-process Magpie TTS engine (no Pipecat, no NeMo imports)."""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_MAGPIE_MODEL = "nvidia/magpie_tts_multilingual_357m"
"""Hub id of the released multilingual Magpie checkpoint."""

VOICES: dict[str, int] = {"john": 0, "sofia": 1, "aria": 2, "jason": 3, "leo": 4}
"""Voice name -> baked speaker index of ``magpie_tts_multilingual_357m``."""

LANGUAGES: tuple[str, ...] = ("en", "es", "de", "fr", "it", "vi", "zh")
"""Languages ``magpie_tts_multilingual_357m`` speaks (ISO 639-1 codes)."""

_LANGUAGE_ALIASES = {"cmn": "zh"}


def normalize_voice(voice: str) -> str:
    """Return the canonical (lower-case) voice name.

    Args:
        voice: A voice name in any case, e.g. ``"Aria"``.

    Returns:
        The key of :data:`VOICES`, e.g. ``"aria"``.

    Raises:
        ValueError: Listing the allowed voices.

    """
    name = voice.strip().lower() if isinstance(voice, str) else voice
    if name not in VOICES:
        raise ValueError(f"Unknown Magpie voice {voice!r}; allowed voices: {', '.join(VOICES)}")
    return name


def normalize_language(language: str) -> str:
    """Return the ISO 639-1 code Magpie uses for a language.

    Regional variants resolve to their base language (``"en-US"`` -> ``"en"``, ``"zh_CN"`` -> ``"zh"``), which
    is also how Pipecat ``Language`` values (a ``str`` enum) are accepted.

    Args:
        language: A language code such as ``"en"``, ``"de-DE"`` or ``Language.ES``.

    Returns:
        One of :data:`LANGUAGES`.

    Raises:
        ValueError: Listing the allowed languages.

    """
    text = str(getattr(language, "value", language)).strip().lower().replace("_", "-")
    base = text.split("-", 1)[0]
    base = _LANGUAGE_ALIASES.get(base, base)
    if base not in LANGUAGES:
        raise ValueError(
            f"Unsupported Magpie language {language!r}; allowed languages: {', '.join(LANGUAGES)}"
        )
    return base


@dataclass(frozen=True)
class MagpieSynthesisOptions:
    """Init-only options for each synthesis request (validated on construction).

    Attributes:
        max_duration_s: Upper bound on the audio one request may produce, in seconds. Synthesis stops there even if
            the model never emits its end-of-speech token (a runaway or a random-weight model); a warning is logged.
        first_chunk_frames: Codec frames (about 46 ms each at 22,050 Hz) decoded into the first audio chunk. Lower
            means earlier first audio.
        chunk_frames: Codec frames in the second audio chunk (and every later one without ``max_chunk_frames``).
            Each chunk costs one codec decode call.
        max_chunk_frames: Growing chunks: each later chunk doubles from ``chunk_frames`` up to this many frames
            (None: every later chunk has ``chunk_frames``). Fewer codec calls per sentence; first audio unchanged.
        use_cfg: Classifier-free guidance (a second, unconditional pass: about twice the decoder compute). None:
            the checkpoint's choice (:func:`uses_guidance`): on, as NeMo's ``do_tts`` uses it, unless the
            checkpoint's ``inference_parameters.cfg_scale`` is 1, where guidance changes nothing.
        seed: Seed of the request's own random generator (None: a fresh random seed). On the fast step a seeded
            request gives the same audio whichever requests share its batch.

    """

    max_duration_s: float = 20.0
    first_chunk_frames: int = 2
    chunk_frames: int = 4
    max_chunk_frames: int | None = None
    use_cfg: bool | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.max_duration_s, (int, float)) and math.isfinite(self.max_duration_s)) or (
            self.max_duration_s <= 0
        ):
            raise ValueError(
                f"max_duration_s must be a positive number of seconds, got {self.max_duration_s!r}"
            )
        if self.use_cfg is not None and not isinstance(self.use_cfg, bool):
            raise ValueError(f"use_cfg must be None, True or False, got {self.use_cfg!r}")
        if self.seed is not None and (
            not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0
        ):
            raise ValueError(f"seed must be None or an integer >= 0, got {self.seed!r}")
        for name in ("first_chunk_frames", "chunk_frames"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        cap = self.max_chunk_frames
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < self.chunk_frames):
            raise ValueError(
                f"max_chunk_frames must be None or an integer >= chunk_frames ({self.chunk_frames}), got {cap!r}"
            )

    def chunk_frames_at(self, index: int) -> int:
        """Codec frames of the request's audio chunk number ``index`` (0: the first), as :func:`chunk_frames_at`."""
        return chunk_frames_at(index, self.first_chunk_frames, self.chunk_frames, self.max_chunk_frames)

    def max_frames(self, sample_rate: int, samples_per_frame: int) -> int:
        """Codec frames that fit in ``max_duration_s`` (at least one).

        Args:
            sample_rate: Codec output sample rate, in Hz.
            samples_per_frame: Audio samples per codec frame.

        """
        return max(1, math.ceil(self.max_duration_s * sample_rate / samples_per_frame))


def chunk_frames_at(index: int, first: int, chunk: int, cap: int | None) -> int:
    """Codec frames of audio chunk number ``index``: ``first``, then ``chunk``, then doubling up to ``cap``.

    Args:
        index: The chunk's place in the request (0: the first chunk).
        first: Frames of the first chunk.
        chunk: Frames of the second chunk (and of every later one when ``cap`` is None).
        cap: Most frames of a later chunk, which doubles the one before it (None: no growth).

    """
    if index == 0:
        return first
    if cap is None:
        return chunk
    return min(chunk << min(index - 1, 32), cap)


def uses_guidance(options: MagpieSynthesisOptions, cfg_scale: float) -> bool:
    """Whether a request runs classifier-free guidance: its own ``use_cfg``, else the checkpoint's.

    Guided logits are ``cfg_scale * conditional + (1 - cfg_scale) * unconditional``: at a scale of 1 they are the
    conditional logits, so a checkpoint whose ``inference_parameters.cfg_scale`` is 1 (the bundled tiny Magpie:
    ``docs/TINY_MAGPIE.md``) skips the unconditional pass.

    Args:
        options: The request's options.
        cfg_scale: The checkpoint's ``inference_parameters.cfg_scale``.

    Returns:
        True to run the unconditional pass beside the conditional one.

    """
    if options.use_cfg is not None:
        return options.use_cfg
    return float(cfg_scale) != 1.0
