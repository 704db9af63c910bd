"""A session's stream settings: the latency mode, language and boosted phrases it opens with, and its ``set_*`` replies.

The protocol (:mod:`~pipecat_nemotron.server.protocol`) accepts any latency that is a multiple of 80 ms, any
short language code and any list of strings as phrases; what the loaded model supports
(``engine.info.latency_modes``, ``engine.info.languages``, the characters its vocabulary writes) and the server's
limits on phrases (:func:`boost_limits`) are checked here: at the ``config`` (a fatal protocol error naming the
model's modes or languages, or the limit) and at each ``set_latency`` / ``set_language`` /
``set_boost_phrases`` (a non-fatal ``error``; the session goes on in its current setting).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from pipecat_nemotron.asr import ASRStream, NemotronEngine, Transcript
from pipecat_nemotron.asr.boosting import validate_boost_phrases
from pipecat_nemotron.asr.eou import eou_unavailable_message
from pipecat_nemotron.asr.errors import BoostingUnavailableError
from pipecat_nemotron.server.config import ServerConfig
from pipecat_nemotron.server.errors import SessionError
from pipecat_nemotron.server.protocol import (
    BOOST_FEATURE,
    EOU_FEATURE,
    SERVER_FEATURES,
    BoostMessage,
    CloseCode,
    ConfigMessage,
    ErrorMessage,
    FinalMessage,
    LanguageMessage,
    LatencyMessage,
    PartialMessage,
    ReadyMessage,
    ServerMessage,
    SetBoostPhrasesMessage,
    close_reason,
)

if TYPE_CHECKING:
    from pipecat_nemotron.server.context import SessionContext


class BoostLimits(NamedTuple):
    """What a session may boost: the server's limits within the engine's (:func:`boost_limits`)."""

    max_phrases: int
    max_chars: int

    def check(self, phrases: tuple[str, ...]) -> tuple[str, ...]:
        """``phrases`` normalised as the engine keeps them (whitespace collapsed, repeats removed).

        Raises:
            BoostPhraseError: Too many or too long phrases (a ``ValueError`` naming the limit).

        """
        return validate_boost_phrases(phrases, max_phrases=self.max_phrases, max_chars=self.max_chars)

    def announced(self) -> dict[str, float]:
        """The entries of ``ready.limits`` (only where the ``boost`` feature is announced)."""
        return {"max_boost_phrases": self.max_phrases, "max_boost_phrase_chars": self.max_chars}


def boost_limits(engine: NemotronEngine, config: ServerConfig) -> BoostLimits:
    """The limits on a session's phrases: the server's (``ServerConfig``), never above the engine's."""
    engine_phrases, engine_chars = engine.config.max_boost_phrases, engine.config.max_boost_phrase_chars
    return BoostLimits(
        engine_phrases if config.max_boost_phrases is None else min(config.max_boost_phrases, engine_phrases),
        engine_chars if config.max_boost_phrase_chars is None else min(config.max_boost_phrase_chars, engine_chars),
    )


def server_features(limits: BoostLimits, eou: bool = False) -> tuple[str, ...]:
    """``ready.features``: every optional feature, some only while they can be used.

    ``boost`` only while the server allows a phrase, ``eou`` only while the model emits ``<EOU>`` (``eou``).
    """
    return tuple(
        f for f in SERVER_FEATURES if (f != BOOST_FEATURE or limits.max_phrases > 0) and (f != EOU_FEATURE or eou)
    )


def ready_message(context: SessionContext, session_id: str, stream: ASRStream, limits: BoostLimits) -> ReadyMessage:
    """The ``ready`` of a session whose stream opened: the model, the stream's settings, the limits, the features."""
    engine = context.engine
    features = server_features(limits, eou=engine.info.eou)
    return ReadyMessage(
        session_id=session_id,
        server_id=context.server_id,
        model=context.model_name(),
        latency_ms=stream.latency_ms,
        latency_modes=engine.info.latency_modes,
        chunk_ms=stream.chunk_ms,
        limits={
            **context.config.announced_limits(),
            "max_utterance_s": engine.config.max_utterance_s,
            **(limits.announced() if BOOST_FEATURE in features else {}),
        },
        features=features,
        languages=engine.info.languages,
        language=stream.language,
    )


def check_config(engine: NemotronEngine, config: ConfigMessage, limits: BoostLimits) -> None:
    """Check a session's ``config`` against the loaded model and the server's limits before its stream opens.

    Characters the model's vocabulary cannot write are refused when the stream opens (the engine checks them).

    Raises:
        SessionError: 4400, a latency mode or a language the model lacks (the message names the model's), or
            more or longer phrases than the server allows (the message names the limit).

    """
    modes = list(engine.info.latency_modes)
    if config.latency_ms not in modes:
        raise SessionError(
            CloseCode.PROTOCOL_ERROR, f"this model supports latency_ms in {modes}, got {config.latency_ms}"
        )
    if config.eou and not engine.info.eou:
        model = engine.config.model
        name = Path(model).name if model.endswith(".nemo") else model  # never a path on the server
        raise SessionError(CloseCode.PROTOCOL_ERROR, eou_unavailable_message(name))
    try:
        engine.resolve_language(config.language)
        limits.check(config.boost_phrases or ())
    except ValueError as e:
        raise SessionError(CloseCode.PROTOCOL_ERROR, str(e)) from None


async def latency_reply(stream: ASRStream, latency_ms: int) -> ServerMessage:
    """Ask ``stream`` for another latency mode; the ``latency`` acknowledgement, or a non-fatal ``error``.

    ``applied`` is ``"now"`` when the current utterance has no word yet (the change applies to it, see
    :mod:`~pipecat_nemotron.asr.changes`); the reply waits for the stream's chunk in the running model step,
    if any, since that chunk may bring the first word.
    """
    try:
        stream.set_latency(latency_ms)
    except ValueError as e:
        return _refusal(str(e))
    await stream.settled()
    applied = "now" if stream.latency_ms == latency_ms else "next_utterance"
    return LatencyMessage(latency_ms=latency_ms, applied=applied)


async def language_reply(engine: NemotronEngine, stream: ASRStream, language: str | None) -> ServerMessage:
    """Ask ``stream`` for another language; the ``language`` acknowledgement, or a non-fatal ``error``.

    ``applied`` as in :func:`latency_reply`.
    """
    try:
        key = engine.resolve_language(language)
        stream.set_language(language)
    except ValueError as e:
        return _refusal(str(e))
    await stream.settled()
    applied = "now" if stream.language == key else "next_utterance"
    return LanguageMessage(language=key, applied=applied)


async def boost_reply(stream: ASRStream, msg: SetBoostPhrasesMessage, limits: BoostLimits) -> ServerMessage:
    """Replace ``stream``'s phrases; the ``boost`` acknowledgement, or a non-fatal ``error`` naming the problem.

    The phrases apply from the next utterance: ``applied`` is ``"now"`` only when the current utterance has no
    word yet (as in :func:`latency_reply`).
    """
    try:
        phrases = limits.check(msg.phrases)
        stream.set_boost_phrases(phrases, alpha=msg.alpha)
    except (ValueError, BoostingUnavailableError) as e:  # the model's characters, the weight, an older NeMo
        return _refusal(str(e), request=msg.type)
    await stream.settled()
    applied = "now" if stream.boost_phrases == phrases else "next_utterance"
    return BoostMessage(count=len(phrases), applied=applied)


def partial_message(update: Transcript, session_audio_ms: float) -> PartialMessage:
    """The ``partial`` message of an engine update (``language`` only on a multilingual model).

    Args:
        update: The partial.
        session_audio_ms: Audio of the session decoded so far, ms from the session start.

    """
    return PartialMessage(
        utterance=update.utterance,
        text=update.text,
        latency_ms=update.latency_ms,
        session_audio_ms=session_audio_ms,
        queue_ms=update.queue_ms,
        step_ms=update.step_ms,
        lag_ms=update.lag_ms,
        language=update.language,
    )


def with_language(final: FinalMessage, update: Transcript) -> FinalMessage:
    """``final`` carrying the language its utterance was decoded with, and the one detected under ``auto``.

    Both stay None (absent from the JSON) on an English-only model.
    """
    if update.language is None:
        return final
    return replace(final, language=update.language, detected_language=update.detected_language)


def _refusal(message: str, request: str | None = None) -> ErrorMessage:
    code = CloseCode.PROTOCOL_ERROR
    return ErrorMessage(code=code, reason=close_reason(code), message=message, fatal=False, request=request)
