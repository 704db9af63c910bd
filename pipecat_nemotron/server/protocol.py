"""Wire protocol ``nemotron-asr.v1``: the JSON messages (and, from :mod:`.close_codes`, the close codes).

One WebSocket connection is one ASR session (one engine stream). The client sends a ``config`` message
first, then binary PCM frames and JSON control messages; the server answers ``ready``, then ``partial`` and
``final`` results, ``latency`` acknowledgements and ``error`` messages. See ``docs/PROTOCOL.md`` for the full
specification. Every message is a JSON object with a ``"type"`` field; unknown fields are ignored (so fields
can be added within a version), unknown types are a protocol error. Optional messages added within v1 are used
only when the server lists them in ``ready.features`` (:data:`SERVER_FEATURES`): ``peek`` / ``peek_result``,
the ``words`` of ``final`` messages (``word_timings``), ``set_language`` / ``language`` (``language``) and
``config.boost_phrases``, ``set_boost_phrases`` / ``boost`` (``boost``), and ``gap`` (``gap``).

This module is shared by the server (:mod:`pipecat_nemotron.server.app`), the Pipecat client
(:mod:`pipecat_nemotron.stt.remote.service`) and the load generator (:mod:`pipecat_nemotron.bench.load`). It imports
nothing heavy. Its parts: :mod:`~pipecat_nemotron.server.protocol_common` (constants, features, the
protocol error, field checks) and :mod:`~pipecat_nemotron.server.protocol_server` (server-to-client messages and
their converters); this module holds the client-to-server messages and re-exports the rest.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar

from pipecat_nemotron.server.close_codes import AUTH_BACKOFF_REASON as AUTH_BACKOFF_REASON
from pipecat_nemotron.server.close_codes import CLOSE_REASONS as CLOSE_REASONS
from pipecat_nemotron.server.close_codes import PERMANENT_CLOSE_CODES as PERMANENT_CLOSE_CODES
from pipecat_nemotron.server.close_codes import CloseCode as CloseCode
from pipecat_nemotron.server.close_codes import close_reason as close_reason
from pipecat_nemotron.server.close_codes import is_permanent as is_permanent
from pipecat_nemotron.server.protocol_common import BOOST_FEATURE as BOOST_FEATURE
from pipecat_nemotron.server.protocol_common import DEFAULT_PATH as DEFAULT_PATH
from pipecat_nemotron.server.protocol_common import ENCODING_PCM_S16LE as ENCODING_PCM_S16LE
from pipecat_nemotron.server.protocol_common import EOU_FEATURE as EOU_FEATURE
from pipecat_nemotron.server.protocol_common import GAP_FEATURE as GAP_FEATURE
from pipecat_nemotron.server.protocol_common import LANGUAGE_FEATURE as LANGUAGE_FEATURE
from pipecat_nemotron.server.protocol_common import LATENCY_STEP_MS as LATENCY_STEP_MS
from pipecat_nemotron.server.protocol_common import MAX_LANGUAGE_CHARS as MAX_LANGUAGE_CHARS
from pipecat_nemotron.server.protocol_common import MAX_LATENCY_MS as MAX_LATENCY_MS
from pipecat_nemotron.server.protocol_common import PEEK_FEATURE as PEEK_FEATURE
from pipecat_nemotron.server.protocol_common import PROTOCOL_LATENCY_MODES as PROTOCOL_LATENCY_MODES
from pipecat_nemotron.server.protocol_common import PROTOCOL_VERSION as PROTOCOL_VERSION
from pipecat_nemotron.server.protocol_common import SERVER_FEATURES as SERVER_FEATURES
from pipecat_nemotron.server.protocol_common import SUPPORTED_SAMPLE_RATES as SUPPORTED_SAMPLE_RATES
from pipecat_nemotron.server.protocol_common import WORD_TIMINGS_FEATURE as WORD_TIMINGS_FEATURE
from pipecat_nemotron.server.protocol_common import ProtocolError as ProtocolError
from pipecat_nemotron.server.protocol_common import (
    check_boost_alpha,
    check_boost_phrases,
    check_language,
    check_latency,
    is_int,
    load_object,
)
from pipecat_nemotron.server.protocol_server import BoostMessage as BoostMessage
from pipecat_nemotron.server.protocol_server import EouMessage as EouMessage
from pipecat_nemotron.server.protocol_server import ErrorMessage as ErrorMessage
from pipecat_nemotron.server.protocol_server import FinalMessage as FinalMessage
from pipecat_nemotron.server.protocol_server import LanguageMessage as LanguageMessage
from pipecat_nemotron.server.protocol_server import LatencyMessage as LatencyMessage
from pipecat_nemotron.server.protocol_server import PartialMessage as PartialMessage
from pipecat_nemotron.server.protocol_server import PeekResultMessage as PeekResultMessage
from pipecat_nemotron.server.protocol_server import ReadyMessage as ReadyMessage
from pipecat_nemotron.server.protocol_server import ServerMessage as ServerMessage
from pipecat_nemotron.server.protocol_server import dump_server_message as dump_server_message
from pipecat_nemotron.server.protocol_server import parse_server_message as parse_server_message
from pipecat_nemotron.server.protocol_server import words_from_wire as words_from_wire
from pipecat_nemotron.server.protocol_server import words_to_wire as words_to_wire


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
        boost_phrases: Phrases to boost in this session's decoding (names, product words), cased as the model
            writes them; None or empty: none. Added within v1 (feature ``boost``; older servers ignore it). Not a
            list of strings, more or longer phrases than ``ready.limits`` allow, or characters the model cannot
            write: a protocol error (4400) naming the limit or the characters.
        boost_alpha: Boosting weight (None: the server's default); only with ``boost_phrases``.
        eou: Ask for the model's end-of-utterance events (``eou`` messages before each utterance's ``final``).
            Added within v1 (feature ``eou``, listed only while the model emits ``<EOU>``; older servers ignore
            it). On a model without the token: a protocol error (4400) naming the models that have it.

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
    boost_phrases: tuple[str, ...] | None = None
    boost_alpha: float | None = None
    eou: bool = False

    def validate(self) -> ConfigMessage:
        """Return self if every field is supported.

        Raises:
            ProtocolError: Naming the field and its allowed values.

        """
        if self.protocol != PROTOCOL_VERSION:
            raise ProtocolError(f"protocol must be {PROTOCOL_VERSION!r}, got {self.protocol!r}")
        if self.encoding != ENCODING_PCM_S16LE:
            raise ProtocolError(f"encoding must be {ENCODING_PCM_S16LE!r}, got {self.encoding!r}")
        if not is_int(self.sample_rate) or self.sample_rate not in SUPPORTED_SAMPLE_RATES:
            raise ProtocolError(
                f"sample_rate must be one of {list(SUPPORTED_SAMPLE_RATES)} (Hz), got {self.sample_rate!r}"
            )
        if not is_int(self.num_channels) or not 1 <= self.num_channels <= 8:
            raise ProtocolError(f"num_channels must be an integer from 1 to 8, got {self.num_channels!r}")
        check_latency(self.latency_ms)
        for name in ("interim_results", "word_timings", "eou"):
            if not isinstance(getattr(self, name), bool):
                raise ProtocolError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.token is not None and not isinstance(self.token, str):
            raise ProtocolError("token must be a string")
        check_language(self.language)
        if self.boost_phrases is not None:
            check_boost_phrases(self.boost_phrases)
        check_boost_alpha(self.boost_alpha)
        return self

    @property
    def bytes_per_ms(self) -> float:
        """PCM bytes per millisecond of audio at this config."""
        return 2 * self.num_channels * self.sample_rate / 1000.0

    def to_json(self) -> str:
        """Serialize; what a client does not use is left out, so it sends what older clients send.

        Optional fields are omitted when unset, ``word_timings`` and ``eou`` when false, ``boost_phrases`` when
        empty.
        """
        data = {"type": self.type, **asdict(self)}
        optional = ("word_timings", "boost_phrases", "eou")
        return json.dumps({k: v for k, v in data.items() if v is not None and (k not in optional or v)})


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
class SetBoostPhrasesMessage:
    """Replace the session's boosted phrases (client to server); acknowledged by a ``boost`` message.

    Only when ``ready.features`` lists ``"boost"`` (added within v1; older servers close with 4400).

    Attributes:
        phrases: The new phrases, cased as the model writes them; empty: boost nothing. Applies from the next
            utterance (an utterance is decoded with one list). More or longer phrases than ``ready.limits``
            allow, or characters the model cannot write, get a non-fatal ``error``: the session keeps its list.
        alpha: Boosting weight; None: the server's default.

    """

    type: ClassVar[str] = "set_boost_phrases"
    phrases: tuple[str, ...] = ()
    alpha: float | None = None

    def to_json(self) -> str:
        """Serialize (``alpha`` omitted when None)."""
        data: dict[str, object] = {"type": self.type, "phrases": list(self.phrases)}
        if self.alpha is not None:
            data["alpha"] = self.alpha
        return json.dumps(data)


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


#: Longest ``gap`` one message may report, ms (an hour; a client reports a long silence in several).
MAX_GAP_MS = 3_600_000.0


@dataclass(frozen=True)
class GapMessage:
    """Audio the client withheld here (silence between turns), client to server.

    Only when ``ready.features`` lists ``"gap"`` (added within v1; older servers close with 4400). The server
    counts ``ms`` in every position it reports (``session_audio_ms``, ``utterance_audio_ms``, word times) as if
    that audio had been sent at this point, but decodes none of it. Like any message it resets the idle timer.

    Attributes:
        ms: Audio withheld, ms, in [0, :data:`MAX_GAP_MS`].

    """

    type: ClassVar[str] = "gap"
    ms: float = 0.0

    def to_json(self) -> str:
        """Serialize."""
        return json.dumps({"type": self.type, "ms": self.ms})


ClientMessage = (
    ConfigMessage
    | FinalizeMessage
    | SetLatencyMessage
    | SetLanguageMessage
    | SetBoostPhrasesMessage
    | KeepaliveMessage
    | CloseMessage
    | PeekMessage
    | GapMessage
)


def _check_gap_ms(ms: object) -> float:
    """A ``gap``'s ``ms``: a number from 0 to :data:`MAX_GAP_MS`."""
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 <= ms <= MAX_GAP_MS:
        raise ProtocolError(f"gap needs ms, a number of milliseconds from 0 to {MAX_GAP_MS:g}, got {ms!r:.60}")
    return float(ms)


def parse_client_message(text: str | bytes) -> ClientMessage:
    """Parse one JSON control message sent by a client.

    Args:
        text: The text frame.

    Returns:
        The typed message (unknown fields ignored).

    Raises:
        ProtocolError: Not JSON, not an object, unknown ``type``, or a field of the wrong type.

    """
    data = load_object(text)
    kind = data.get("type")
    if kind == "config":
        known = {f.name: data[f.name] for f in fields(ConfigMessage) if f.name in data}
        if known.get("boost_phrases") is not None:  # a JSON array: the message holds a tuple
            known["boost_phrases"] = check_boost_phrases(known["boost_phrases"])
        try:
            msg = ConfigMessage(**known)
        except TypeError as e:  # pragma: no cover - dataclass kwargs are filtered above
            raise ProtocolError(f"invalid config: {e}") from e
        return msg.validate()
    if kind == "set_latency":
        if "latency_ms" not in data:
            raise ProtocolError("set_latency needs latency_ms")
        return SetLatencyMessage(latency_ms=check_latency(data["latency_ms"]))
    if kind == "set_language":
        if "language" not in data:
            raise ProtocolError(
                "set_language needs language (a code such as 'es-ES', 'es' or 'auto', or null)"
            )
        return SetLanguageMessage(language=check_language(data["language"]))
    if kind == "set_boost_phrases":
        if "phrases" not in data:
            raise ProtocolError('set_boost_phrases needs phrases (a list of strings; [] boosts nothing)')
        phrases = check_boost_phrases(data["phrases"], "phrases")
        return SetBoostPhrasesMessage(phrases=phrases, alpha=check_boost_alpha(data.get("alpha"), "alpha"))
    if kind == "gap":
        return GapMessage(ms=_check_gap_ms(data.get("ms")))
    bare = {cls.type: cls for cls in (FinalizeMessage, KeepaliveMessage, CloseMessage, PeekMessage)}
    if isinstance(kind, str) and kind in bare:
        return bare[kind]()
    raise ProtocolError(
        f"unknown message type {kind!r}; expected one of config, finalize, set_latency, set_language, "
        "set_boost_phrases, keepalive, close, peek, gap"
    )
