"""Wire protocol ``nemotron-asr.v1``: the JSON messages (and, from :mod:`.close_codes`, the close codes).

One WebSocket connection is one ASR session (one engine stream). The client sends a ``config`` message
first, then binary PCM frames and JSON control messages; the server answers ``ready``, then ``partial`` and
``final`` results, ``latency`` acknowledgements and ``error`` messages. See ``docs/PROTOCOL.md`` for the full
specification. Every message is a JSON object with a ``"type"`` field; unknown fields are ignored (so fields
can be added within a version), unknown types are a protocol error. Optional messages added within v1 are used
only when the server lists them in ``ready.features`` (:data:`SERVER_FEATURES`): ``peek`` / ``peek_result``,
the ``words`` of ``final`` messages (``word_timings``) and ``set_language`` / ``language`` (``language``).

This module is shared by the server (:mod:`pipecat_nemotron.server.app`), the Pipecat client
(:mod:`pipecat_nemotron.stt.remote.service`) and the load generator (:mod:`pipecat_nemotron.bench.load`). It imports
nothing heavy.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from pipecat_nemotron.server.close_codes import AUTH_BACKOFF_REASON as AUTH_BACKOFF_REASON
from pipecat_nemotron.server.close_codes import CLOSE_REASONS as CLOSE_REASONS
from pipecat_nemotron.server.close_codes import PERMANENT_CLOSE_CODES as PERMANENT_CLOSE_CODES
from pipecat_nemotron.server.close_codes import CloseCode as CloseCode
from pipecat_nemotron.server.close_codes import close_reason as close_reason
from pipecat_nemotron.server.close_codes import is_permanent as is_permanent

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

#: The optional features this server supports, announced in ``ready.features`` (a client uses a feature only
#: when it is listed there, so old clients and old servers keep working with new ones).
SERVER_FEATURES: tuple[str, ...] = (PEEK_FEATURE, WORD_TIMINGS_FEATURE, LANGUAGE_FEATURE)


class ProtocolError(ValueError):
    """A client message violates the protocol (the server closes with :attr:`CloseCode.PROTOCOL_ERROR`)."""


# ---- client -> server --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigMessage:
    """First message of a session (client to server).

    Attributes:
        latency_ms: Latency mode: one of the served model's (80, 160, 560 or 1120 ms; the multilingual model
            adds 320). The protocol accepts any positive multiple of 80 ms; the server checks the model's modes.
        sample_rate: Rate of the PCM the client will send, Hz.
        encoding: Audio encoding; only ``"pcm_s16le"`` in v1.
        num_channels: Interleaved channels (1 to 8, downmixed to mono on the server).
        interim_results: Send ``partial`` messages (False: only finals).
        protocol: Protocol version the client speaks.
        token: Bearer token, for clients that cannot set an ``Authorization`` header (browsers).
        client: Free-form client name and version, for logs.
        word_timings: Ask for each ``final``'s ``words`` (with timings and confidence) and ``confidence``; a
            server with the ``word_timings`` feature sends them, others ignore this field.
        language: Language of a multilingual model: a locale (``"es-ES"``), a bare language (``"es"``) or
            ``"auto"``; None: the server's default. Added within v1 (feature ``language``; older servers ignore
            it). A language the model lacks is a protocol error naming the model's languages.

    """

    type: ClassVar[str] = "config"
    latency_ms: int = 160
    sample_rate: int = 16000
    encoding: str = ENCODING_PCM_S16LE
    num_channels: int = 1
    interim_results: bool = True
    protocol: str = PROTOCOL_VERSION
    token: str | None = field(default=None, repr=False)  # a credential: never in a repr (logs, tracebacks)
    client: str | None = None
    word_timings: bool = False
    language: str | None = None

    def validate(self) -> ConfigMessage:
        """Return self if every field is supported.

        Raises:
            ProtocolError: Naming the field and its allowed values.

        """
        if self.protocol != PROTOCOL_VERSION:
            raise ProtocolError(f"protocol must be {PROTOCOL_VERSION!r}, got {self.protocol!r}")
        if self.encoding != ENCODING_PCM_S16LE:
            raise ProtocolError(f"encoding must be {ENCODING_PCM_S16LE!r}, got {self.encoding!r}")
        if not _is_int(self.sample_rate) or self.sample_rate not in SUPPORTED_SAMPLE_RATES:
            raise ProtocolError(
                f"sample_rate must be one of {list(SUPPORTED_SAMPLE_RATES)} (Hz), got {self.sample_rate!r}"
            )
        if not _is_int(self.num_channels) or not 1 <= self.num_channels <= 8:
            raise ProtocolError(f"num_channels must be an integer from 1 to 8, got {self.num_channels!r}")
        _check_latency(self.latency_ms)
        for name in ("interim_results", "word_timings"):
            if not isinstance(getattr(self, name), bool):
                raise ProtocolError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.token is not None and not isinstance(self.token, str):
            raise ProtocolError("token must be a string")
        _check_language(self.language)
        return self

    @property
    def bytes_per_ms(self) -> float:
        """PCM bytes per millisecond of audio at this config."""
        return 2 * self.num_channels * self.sample_rate / 1000.0

    def to_json(self) -> str:
        """Serialize (``token``, ``client`` and ``language`` are omitted when unset, ``word_timings`` when false)."""
        data = {"type": self.type, **asdict(self)}
        return json.dumps({k: v for k, v in data.items() if v is not None and (k != "word_timings" or v)})


class _BareMessage:
    """A client message that is only its ``type``."""

    type: ClassVar[str]

    def to_json(self) -> str:
        """Serialize."""
        return json.dumps({"type": self.type})


@dataclass(frozen=True)
class FinalizeMessage(_BareMessage):
    """End the current utterance (client to server): the server answers with exactly one ``final``.

    Audio sent after this message belongs to the next utterance.
    """

    type: ClassVar[str] = "finalize"


@dataclass(frozen=True)
class SetLatencyMessage:
    """Switch the latency mode (client to server); acknowledged by a ``latency`` message.

    Attributes:
        latency_ms: One of the served model's modes (``ready.latency_modes``). Applies at once if the current
            utterance has not started decoding, else after the next ``final``.

    """

    type: ClassVar[str] = "set_latency"
    latency_ms: int = 160

    def to_json(self) -> str:
        """Serialize."""
        return json.dumps({"type": self.type, "latency_ms": self.latency_ms})


@dataclass(frozen=True)
class SetLanguageMessage:
    """Switch the language of a multilingual model (client to server); acknowledged by a ``language`` message.

    Only when ``ready.features`` lists ``"language"`` (added within v1; older servers close with 4400).

    Attributes:
        language: A locale (``"es-ES"``), a bare language (``"es"``) or ``"auto"``; None: the server's
            default. Applies at once if the current utterance has not started decoding, else after the next
            ``final`` (an utterance is decoded in one language). One the model lacks gets a non-fatal ``error``.

    """

    type: ClassVar[str] = "set_language"
    language: str | None = None

    def to_json(self) -> str:
        """Serialize."""
        return json.dumps({"type": self.type, "language": self.language})


@dataclass(frozen=True)
class KeepaliveMessage(_BareMessage):
    """Resets the server's idle timer without sending audio (client to server)."""

    type: ClassVar[str] = "keepalive"


@dataclass(frozen=True)
class CloseMessage(_BareMessage):
    """End the session (client to server): the server sends the finals still owed, then closes with 1000."""

    type: ClassVar[str] = "close"


@dataclass(frozen=True)
class PeekMessage(_BareMessage):
    """Ask for the current utterance's text as its final would be now, without ending it (client to server).

    Only when ``ready.features`` lists ``"peek"``. Answered by one ``peek_result``, in order; covers the audio
    sent before it. Costs the server one batched model step.
    """

    type: ClassVar[str] = "peek"


ClientMessage = (
    ConfigMessage
    | FinalizeMessage
    | SetLatencyMessage
    | SetLanguageMessage
    | KeepaliveMessage
    | CloseMessage
    | PeekMessage
)


def parse_client_message(text: str | bytes) -> ClientMessage:
    """Parse one JSON control message sent by a client.

    Args:
        text: The text frame.

    Returns:
        The typed message (unknown fields ignored).

    Raises:
        ProtocolError: Not JSON, not an object, unknown ``type``, or a field of the wrong type.

    """
    data = _load_object(text)
    kind = data.get("type")
    if kind == "config":
        known = {f.name: data[f.name] for f in fields(ConfigMessage) if f.name in data}
        try:
            msg = ConfigMessage(**known)
        except TypeError as e:  # pragma: no cover - dataclass kwargs are filtered above
            raise ProtocolError(f"invalid config: {e}") from e
        return msg.validate()
    if kind == "set_latency":
        if "latency_ms" not in data:
            raise ProtocolError("set_latency needs latency_ms")
        return SetLatencyMessage(latency_ms=_check_latency(data["latency_ms"]))
    if kind == "set_language":
        if "language" not in data:
            raise ProtocolError(
                "set_language needs language (a code such as 'es-ES', 'es' or 'auto', or null)"
            )
        return SetLanguageMessage(language=_check_language(data["language"]))
    bare = {cls.type: cls for cls in (FinalizeMessage, KeepaliveMessage, CloseMessage, PeekMessage)}
    if isinstance(kind, str) and kind in bare:
        return bare[kind]()
    raise ProtocolError(
        f"unknown message type {kind!r}; expected one of config, finalize, set_latency, set_language, keepalive, "
        "close, peek"
    )


# ---- server -> client --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadyMessage:
    """The session is open (server to client); audio may be sent from now on.

    Attributes:
        session_id: Server-assigned id (in server logs and metrics).
        protocol: Protocol version the server speaks.
        model: Model the server runs.
        latency_ms: Latency mode in force.
        latency_modes: Modes the served model supports, ms (the multilingual model adds 320).
        chunk_ms: Audio per model step in this mode, ms.
        limits: Server limits the client should respect: ``max_message_bytes``, ``idle_timeout_s``,
            ``burst_ms`` (audio the client may send ahead of real time), ``max_backlog_ms``.
        server_id: Which server process (or Ray Serve replica) holds the session, for logs and debugging.
        features: Optional messages the server supports (:data:`SERVER_FEATURES`; empty from older servers).
        languages: The served model's language prompts (locales, then ``"auto"`` if it has it); empty for an
            English-only model and from older servers. Added within v1.
        language: The language prompt in force (``"es-ES"``, ``"auto"``); None on an English-only model (and
            from older servers). Added within v1.

    """

    type: ClassVar[str] = "ready"
    session_id: str = ""
    server_id: str = ""
    protocol: str = PROTOCOL_VERSION
    model: str = ""
    latency_ms: int = 160
    latency_modes: tuple[int, ...] = PROTOCOL_LATENCY_MODES
    chunk_ms: float = 0.0
    limits: dict[str, float] = field(default_factory=dict)
    features: tuple[str, ...] = ()
    languages: tuple[str, ...] = ()
    language: str | None = None


@dataclass(frozen=True)
class PartialMessage:
    """The current utterance's text changed (server to client).

    Attributes:
        utterance: 0-based utterance index within the session (increments after each ``final``).
        text: The utterance's text so far.
        latency_ms: Latency mode that produced it.
        audio_ms: Audio of the session decoded so far when the message was sent, ms from the session start.
        queue_ms: Time the chunk waited for a model step, ms (server side).
        step_ms: Duration of the batched model step, ms.
        lag_ms: From the chunk's last needed sample arriving at the server to this result, ms.
        language: The language prompt the text was decoded with, on a multilingual model; None (and absent
            from the JSON) on an English-only one. Added within v1.

    """

    type: ClassVar[str] = "partial"
    utterance: int = 0
    text: str = ""
    latency_ms: int = 160
    audio_ms: float = 0.0
    queue_ms: float = 0.0
    step_ms: float = 0.0
    lag_ms: float = 0.0
    language: str | None = None


@dataclass(frozen=True)
class FinalMessage:
    """The final text of one utterance (server to client), one per ``finalize``, in order.

    Attributes:
        utterance: 0-based utterance index within the session.
        text: Final text (empty if nothing was said).
        latency_ms: Latency mode that produced it.
        audio_ms: Audio of the session decoded so far, ms from the session start.
        utterance_audio_ms: Audio in this utterance, ms.
        ttf_ms: Time-to-final on the server: from the ``finalize`` message to the final text, ms.
        step_ms: Duration of the model step that produced it, ms.
        words: Only when the ``config`` asked for ``word_timings``: each word as ``{"text", "start_ms",
            "end_ms", "confidence"}``, times in ms from the session's start, confidence 0 to 1.
        confidence: Only with ``words`` (and absent when there are none): the utterance's confidence, 0 to 1.
        language: The language prompt the utterance was decoded with, on a multilingual model; None (and
            absent from the JSON) on an English-only one. Added within v1.
        detected_language: For an utterance decoded with ``"auto"``: the locale the model found it to be in;
            absent otherwise. Added within v1.
        forced: ``true`` on a final the server sent without a ``finalize``: the utterance reached the server's
            longest utterance (``limits.max_utterance_s``) and was split between two words; the speech goes on
            in the next utterance. Absent otherwise. Added within v1.

    """

    type: ClassVar[str] = "final"
    utterance: int = 0
    text: str = ""
    latency_ms: int = 160
    audio_ms: float = 0.0
    utterance_audio_ms: float = 0.0
    ttf_ms: float = 0.0
    step_ms: float = 0.0
    words: list[dict[str, Any]] | None = None
    confidence: float | None = None
    language: str | None = None
    detected_language: str | None = None
    forced: bool | None = None


@dataclass(frozen=True)
class LatencyMessage:
    """Acknowledges ``set_latency`` (server to client).

    Attributes:
        latency_ms: The requested mode.
        applied: ``"now"``, or ``"next_utterance"`` when the current utterance had started decoding.

    """

    type: ClassVar[str] = "latency"
    latency_ms: int = 160
    applied: str = "now"


@dataclass(frozen=True)
class LanguageMessage:
    """Acknowledges ``set_language`` (server to client). Added within v1 (feature ``language``).

    Attributes:
        language: The language prompt the request resolved to (``"es-ES"`` for ``"es"``); None on an
            English-only model.
        applied: ``"now"``, or ``"next_utterance"`` when the current utterance had started decoding.

    """

    type: ClassVar[str] = "language"
    language: str | None = None
    applied: str = "now"


@dataclass(frozen=True)
class ErrorMessage:
    """Something went wrong (server to client).

    Attributes:
        code: A :class:`CloseCode` value.
        reason: Short machine-readable reason (see :data:`CLOSE_REASONS`).
        message: Human-readable explanation, naming the fix where there is one.
        fatal: True when the server closes the connection with ``code`` right after this message.

    """

    type: ClassVar[str] = "error"
    code: int = CloseCode.INTERNAL
    reason: str = "internal"
    message: str = ""
    fatal: bool = True


@dataclass(frozen=True)
class PeekResultMessage:
    """Answers one ``peek`` (server to client), in order: the text the utterance would end with now.

    Attributes:
        utterance: 0-based utterance index within the session (the utterance goes on).
        text: What a ``finalize`` now would return.
        audio_ms: Audio of the utterance the peek covers, ms.
        peek_ms: From the ``peek`` message to the text, on the server, ms.

    """

    type: ClassVar[str] = "peek_result"
    utterance: int = 0
    text: str = ""
    audio_ms: float = 0.0
    peek_ms: float = 0.0


ServerMessage = (
    ReadyMessage
    | PartialMessage
    | FinalMessage
    | LatencyMessage
    | LanguageMessage
    | ErrorMessage
    | PeekResultMessage
)

_SERVER_TYPES: dict[str, type[Any]] = {
    cls.type: cls
    for cls in (
        ReadyMessage,
        PartialMessage,
        FinalMessage,
        LatencyMessage,
        LanguageMessage,
        ErrorMessage,
        PeekResultMessage,
    )
}

#: Fields left out of a message's JSON while None: added within v1, so old clients see identical messages.
_OMITTED_WHEN_NONE: dict[type[Any], tuple[str, ...]] = {
    FinalMessage: ("words", "confidence", "language", "detected_language", "forced"),
    PartialMessage: ("language",),
}


def dump_server_message(msg: ServerMessage) -> str:
    """Serialize a server message to its JSON text."""
    data = asdict(msg)
    if isinstance(msg, ReadyMessage):
        data["latency_modes"] = list(msg.latency_modes)
        data["features"] = list(msg.features)
        data["languages"] = list(msg.languages)
    for key in (
        "audio_ms",
        "utterance_audio_ms",
        "queue_ms",
        "step_ms",
        "lag_ms",
        "ttf_ms",
        "chunk_ms",
        "peek_ms",
    ):
        if key in data:
            data[key] = round(float(data[key]), 2)
    if isinstance(msg, ErrorMessage):
        data["code"] = int(msg.code)
    omitted = _OMITTED_WHEN_NONE.get(type(msg), ())  # word timings only when asked for, language when known
    data = {k: v for k, v in data.items() if k not in omitted or v is not None}
    return json.dumps({"type": msg.type, **data})


def parse_server_message(text: str | bytes) -> ServerMessage:
    """Parse one message sent by a server (unknown fields are ignored, for forward compatibility).

    Raises:
        ProtocolError: Not JSON, not an object, or an unknown ``type``.

    """
    data = _load_object(text)
    cls = _SERVER_TYPES.get(str(data.get("type")))
    if cls is None:
        raise ProtocolError(f"unknown server message type {data.get('type')!r}")
    names = {f.name for f in fields(cls)}
    known = {k: v for k, v in data.items() if k in names}
    if cls is ReadyMessage:
        for key in ("latency_modes", "features", "languages"):
            if key in known:
                known[key] = tuple(known[key])
    try:
        return cls(**known)
    except TypeError as e:  # pragma: no cover - kwargs are filtered above
        raise ProtocolError(f"invalid {cls.type} message: {e}") from e


# ---- helpers -----------------------------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_latency(value: object) -> int:
    """A latency the protocol accepts: a positive multiple of 80 ms (the server checks the model's modes)."""
    if not _is_int(value) or not LATENCY_STEP_MS <= value <= MAX_LATENCY_MS or value % LATENCY_STEP_MS:  # type: ignore[operator]
        raise ProtocolError(
            f"latency_ms must be a multiple of {LATENCY_STEP_MS} from {LATENCY_STEP_MS} to {MAX_LATENCY_MS} ms, "
            f"one of the served model's modes (ready.latency_modes; the English model: "
            f"{list(PROTOCOL_LATENCY_MODES)}), got {value!r}"
        )
    return int(value)  # type: ignore[call-overload]


def _check_language(value: object) -> str | None:
    """A language the protocol accepts: None or a short non-empty code (the server checks the model's)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_LANGUAGE_CHARS:
        raise ProtocolError(
            f"language must be a code such as 'es-ES', 'es' or 'auto' (at most {MAX_LANGUAGE_CHARS} characters), "
            f"or null, got {value!r:.60}"
        )
    return value


def _load_object(text: str | bytes) -> dict[str, Any]:
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
