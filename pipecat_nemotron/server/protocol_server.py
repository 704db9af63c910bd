"""Server-to-client messages of protocol ``nemotron-asr.v1`` and their converters.

JSON both ways, and the words of a ``final``. Re-exported by :mod:`pipecat_nemotron.server.protocol`, where
users import them from.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from pipecat_nemotron.server.close_codes import CloseCode
from pipecat_nemotron.server.protocol_common import (
    PROTOCOL_LATENCY_MODES,
    PROTOCOL_VERSION,
    ProtocolError,
    load_object,
)

if TYPE_CHECKING:
    from pipecat_nemotron.asr.types import Transcript, WordTiming

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
        session_audio_ms: Audio of the session decoded so far when the message was sent, ms from the session start.
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
    session_audio_ms: float = 0.0
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
        session_audio_ms: Audio of the session decoded so far, ms from the session start.
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
    session_audio_ms: float = 0.0
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
class BoostMessage:
    """Acknowledges ``set_boost_phrases`` (server to client). Added within v1 (feature ``boost``).

    Attributes:
        count: How many phrases the session boosts from now on (0: none).
        applied: ``"now"``, or ``"next_utterance"`` when the current utterance had started decoding.

    """

    type: ClassVar[str] = "boost"
    count: int = 0
    applied: str = "now"


@dataclass(frozen=True)
class ErrorMessage:
    """Something went wrong (server to client).

    Attributes:
        code: A :class:`CloseCode` value.
        reason: Short machine-readable reason (see :data:`CLOSE_REASONS`).
        message: Human-readable explanation, naming the fix where there is one.
        fatal: True when the server closes the connection with ``code`` right after this message.
        request: The client message a non-fatal refusal answers; only ``"set_boost_phrases"`` (so a client can
            tell its list was refused and keep the previous one), absent otherwise. Added within v1.

    """

    type: ClassVar[str] = "error"
    code: int = CloseCode.INTERNAL
    reason: str = "internal"
    message: str = ""
    fatal: bool = True
    request: str | None = None


@dataclass(frozen=True)
class PeekResultMessage:
    """Answers one ``peek`` (server to client), in order: the text the utterance would end with now.

    Attributes:
        utterance: 0-based utterance index within the session (the utterance goes on).
        text: What a ``finalize`` now would return.
        utterance_audio_ms: Audio of the utterance the peek covers, ms.
        peek_ms: From the ``peek`` message to the text, on the server, ms.

    """

    type: ClassVar[str] = "peek_result"
    utterance: int = 0
    text: str = ""
    utterance_audio_ms: float = 0.0
    peek_ms: float = 0.0


@dataclass(frozen=True)
class EouMessage:
    """The model says the current utterance ended (server to client; feature ``eou``, added within v1).

    Sent only to a session whose ``config`` asked for ``eou``, when the model emits its ``<EOU>`` token: before
    the utterance's ``final`` (which still comes only for a ``finalize``). A client that ends turns on it sends
    ``finalize`` (if it has not yet) and ends the user's turn when that ``final`` arrives.

    Attributes:
        utterance: 0-based utterance index within the session (the one the model says ended).
        text: The utterance's text so far.
        latency_ms: Latency mode that produced it.
        eou_ms: Where the model emitted ``<EOU>``, ms from the session start (the end of its 80 ms frame).
        session_audio_ms: Audio of the session decoded so far when the message was sent, ms from the session start.

    """

    type: ClassVar[str] = "eou"
    utterance: int = 0
    text: str = ""
    latency_ms: int = 160
    eou_ms: float = 0.0
    session_audio_ms: float = 0.0


ServerMessage = (
    ReadyMessage
    | PartialMessage
    | FinalMessage
    | LatencyMessage
    | LanguageMessage
    | BoostMessage
    | ErrorMessage
    | PeekResultMessage
    | EouMessage
)

_SERVER_TYPES: dict[str, type[Any]] = {
    cls.type: cls
    for cls in (
        ReadyMessage,
        PartialMessage,
        FinalMessage,
        LatencyMessage,
        LanguageMessage,
        BoostMessage,
        ErrorMessage,
        PeekResultMessage,
        EouMessage,
    )
}

#: Fields left out of a message's JSON while None: added within v1, so old clients see identical messages.
_OMITTED_WHEN_NONE: dict[type[Any], tuple[str, ...]] = {
    FinalMessage: ("words", "confidence", "language", "detected_language", "forced"),
    PartialMessage: ("language",),
    ErrorMessage: ("request",),
}


def dump_server_message(msg: ServerMessage) -> str:
    """Serialize a server message to its JSON text."""
    data = asdict(msg)
    if isinstance(msg, ReadyMessage):
        data["latency_modes"] = list(msg.latency_modes)
        data["features"] = list(msg.features)
        data["languages"] = list(msg.languages)
    for key in (
        "session_audio_ms",
        "utterance_audio_ms",
        "queue_ms",
        "step_ms",
        "lag_ms",
        "ttf_ms",
        "chunk_ms",
        "peek_ms",
        "eou_ms",
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
    data = load_object(text)
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


def words_to_wire(words: tuple[WordTiming, ...]) -> list[dict[str, Any]]:
    """Words as a ``final`` message sends them: text, start and end (ms from the session's start), confidence."""
    return [w.to_dict() for w in words]


def words_from_wire(msg: FinalMessage) -> tuple[WordTiming, ...]:
    """The words of a ``final`` message (none if the session did not ask for them).

    Their times within the utterance too: the utterance starts at ``session_audio_ms - utterance_audio_ms`` of the
    session.
    """
    from pipecat_nemotron.asr.types import WordTiming

    start = max(0.0, msg.session_audio_ms - msg.utterance_audio_ms)
    return tuple(
        WordTiming(
            text=str(w.get("text", "")),
            start_ms=float(w.get("start_ms", 0.0)),
            end_ms=float(w.get("end_ms", 0.0)),
            utterance_start_ms=float(w.get("start_ms", 0.0)) - start,
            utterance_end_ms=float(w.get("end_ms", 0.0)) - start,
            confidence=float(w.get("confidence", 0.0)),
        )
        for w in msg.words or ()
        if isinstance(w, dict)
    )


def transcript_from_final(msg: FinalMessage) -> Transcript:
    """The transcript record of a ``final`` message (words only if the session asked for them).

    The server client's side of the one record: what :class:`~pipecat_nemotron.stt.remote.service.
    NemotronServerSTTService` puts in ``TranscriptionFrame.result``. Times count from the server session's start.
    """
    from pipecat_nemotron.asr.types import Transcript

    return Transcript(
        text=msg.text,
        kind="final",
        utterance=msg.utterance,
        latency_ms=msg.latency_ms,
        language=msg.language,
        detected_language=msg.detected_language,
        words=words_from_wire(msg),
        confidence=msg.confidence,
        start_ms=max(0.0, msg.session_audio_ms - msg.utterance_audio_ms),
        utterance_audio_ms=msg.utterance_audio_ms,
        forced=bool(msg.forced),
        step_ms=msg.step_ms,
        ttf_ms=msg.ttf_ms,
    )
