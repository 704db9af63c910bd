"""The parts of protocol ``nemotron-asr.v1`` both directions share.

Constants, features, the protocol error and the field checks. Re-exported by :mod:`pipecat_nemotron.server.protocol`, where users import them from.
"""

from __future__ import annotations

import json
from typing import Any

#: Protocol name and version. Sent in ``config`` and ``ready``; also offered as the WebSocket subprotocol.
PROTOCOL_VERSION = "nemotron-asr.v1"

#: Default WebSocket path of a session.
DEFAULT_PATH = "/v1/asr"

#: The one audio encoding of v1: signed 16-bit little-endian PCM, channels interleaved.
ENCODING_PCM_S16LE = "pcm_s16le"

#: Input sample rates a session may declare, Hz (audio is resampled to 16 kHz on the server).
SUPPORTED_SAMPLE_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)

#: Latency modes of the English streaming model, ms: what ``ready.latency_modes`` defaults to when a server
#: does not send it. The protocol accepts any positive multiple of :data:`LATENCY_STEP_MS` up to
#: :data:`MAX_LATENCY_MS`; the server checks it against the loaded model's modes (``ready.latency_modes``; the
#: multilingual model adds 320).
PROTOCOL_LATENCY_MODES = (80, 160, 560, 1120)

#: Latency modes are multiples of the encoder frame, ms.
LATENCY_STEP_MS = 80

#: Longest latency mode the protocol accepts, ms (the model family's longest is 1120).
MAX_LATENCY_MS = 4000

#: Longest language code accepted, characters (locales are 5; the rest is room for future codes).
MAX_LANGUAGE_CHARS = 32

#: Optional feature: the client may send ``peek`` (answered by ``peek_result``). Added within v1.
PEEK_FEATURE = "peek"

#: Optional feature: ``final`` carries ``words`` and ``confidence`` if the ``config`` asks (``word_timings``).
#: Added within v1.
WORD_TIMINGS_FEATURE = "word_timings"

#: Optional feature: ``config.language``, the ``set_language`` message (answered by ``language``), and
#: ``ready.languages`` / ``ready.language``. Added within v1.
LANGUAGE_FEATURE = "language"

#: Optional feature: per-session phrase boosting, ``config.boost_phrases`` / ``config.boost_alpha`` and the
#: ``set_boost_phrases`` message (answered by ``boost``); the server's limits are in ``ready.limits``
#: (``max_boost_phrases``, ``max_boost_phrase_chars``). Added within v1.
BOOST_FEATURE = "boost"

#: Optional feature: the ``gap`` message (audio the client withheld, counted in positions, never decoded).
#: Added within v1.
GAP_FEATURE = "gap"

#: Optional feature: ``config.eou`` asks for the model's end-of-utterance events (``eou`` messages). Announced
#: only while the loaded model emits ``<EOU>``. Added within v1.
EOU_FEATURE = "eou"

#: The optional features this server supports, announced in ``ready.features`` (a client uses a feature only
#: when it is listed there, so old clients and old servers keep working with new ones).
SERVER_FEATURES: tuple[str, ...] = (
    PEEK_FEATURE, WORD_TIMINGS_FEATURE, LANGUAGE_FEATURE, BOOST_FEATURE, GAP_FEATURE, EOU_FEATURE
)


class ProtocolError(ValueError):
    """A client message violates the protocol (the server closes with :attr:`CloseCode.PROTOCOL_ERROR`)."""


# ---- client -> server --------------------------------------------------------------------------------------


def is_int(value: object) -> bool:
    """True for an int that is not a bool (JSON ``true`` is not a number here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_latency(value: object) -> int:
    """A latency the protocol accepts: a positive multiple of 80 ms (the server checks the model's modes)."""
    if not is_int(value) or not LATENCY_STEP_MS <= value <= MAX_LATENCY_MS or value % LATENCY_STEP_MS:  # type: ignore[operator]
        raise ProtocolError(
            f"latency_ms must be a multiple of {LATENCY_STEP_MS} from {LATENCY_STEP_MS} to {MAX_LATENCY_MS} ms, "
            f"one of the served model's modes (ready.latency_modes; the English model: "
            f"{list(PROTOCOL_LATENCY_MODES)}), got {value!r}"
        )
    return int(value)  # type: ignore[call-overload]


def check_language(value: object) -> str | None:
    """A language the protocol accepts: None or a short non-empty code (the server checks the model's)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_LANGUAGE_CHARS:
        raise ProtocolError(
            f"language must be a code such as 'es-ES', 'es' or 'auto' (at most {MAX_LANGUAGE_CHARS} characters), "
            f"or null, got {value!r:.60}"
        )
    return value


def check_boost_phrases(value: object, name: str = "boost_phrases") -> tuple[str, ...]:
    """A phrase list the protocol accepts: a JSON array of strings.

    The server checks its limits and the model's vocabulary.

    Raises:
        ProtocolError: Anything else (a bare string included: it is one phrase, not a list of them).

    """
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) for p in value):
        raise ProtocolError(
            f"{name} must be a list of strings (phrases such as [\"Okafor\", \"Zyrtec\"]), got {value!r:.80}"
        )
    return tuple(value)


def check_boost_alpha(value: object, name: str = "boost_alpha") -> float | None:
    """A boosting weight the protocol accepts: null or a number (the server checks its range)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(f"{name} must be a number or null, got {value!r:.60}")
    return float(value)


def load_object(text: str | bytes) -> dict[str, Any]:
    """Parse a control message's JSON object.

    Raises:
        ProtocolError: Not JSON text, nested too deeply, or not an object.

    """
    try:
        data = json.loads(text)
    except (UnicodeDecodeError, ValueError) as e:
        raise ProtocolError(f"control messages must be JSON text: {e}") from e
    except RecursionError:
        # json's decoder recurses once per nesting level; a message of [[[[... (well within the size limit)
        # exhausts the stack. Not a server fault: the message is simply not a protocol message.
        raise ProtocolError("control message JSON is nested too deeply") from None
    if not isinstance(data, dict):
        raise ProtocolError("a control message must be a JSON object with a 'type' field")
    return data
