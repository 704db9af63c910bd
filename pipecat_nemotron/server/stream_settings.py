"""A session's stream settings: the latency mode and language it opens with, and its ``set_*`` replies.

The protocol (:mod:`~pipecat_nemotron.server.protocol`) accepts any latency that is a multiple of 80 ms and any
short language code; what the loaded model supports (``engine.info.latency_modes``, ``engine.info.languages``)
is checked here: at the ``config`` (a fatal protocol error naming the model's modes or languages) and at each
``set_latency`` / ``set_language`` (a non-fatal ``error``; the session goes on in its current setting).
"""

from __future__ import annotations

from dataclasses import replace

from pipecat_nemotron.engine import ASRStream, NemotronEngine, TranscriptUpdate
from pipecat_nemotron.server.errors import SessionError
from pipecat_nemotron.server.protocol import (
    CloseCode,
    ConfigMessage,
    ErrorMessage,
    FinalMessage,
    LanguageMessage,
    LatencyMessage,
    PartialMessage,
    ServerMessage,
    close_reason,
)


def check_config(engine: NemotronEngine, config: ConfigMessage) -> None:
    """Check a session's ``config`` against the loaded model before its stream opens.

    Raises:
        SessionError: 4400, a latency mode or a language the model lacks (the message names the model's).

    """
    modes = list(engine.info.latency_modes)
    if config.latency_ms not in modes:
        raise SessionError(
            CloseCode.PROTOCOL_ERROR, f"this model supports latency_ms in {modes}, got {config.latency_ms}"
        )
    try:
        engine.resolve_language(config.language)
    except ValueError as e:
        raise SessionError(CloseCode.PROTOCOL_ERROR, str(e)) from None


async def latency_reply(stream: ASRStream, latency_ms: int) -> ServerMessage:
    """Ask ``stream`` for another latency mode; the ``latency`` acknowledgement, or a non-fatal ``error``.

    ``applied`` is ``"now"`` when the current utterance has no word yet (the change applies to it, see
    :mod:`~pipecat_nemotron.engine.changes`); the reply waits for the stream's chunk in the running model step,
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


def partial_message(update: TranscriptUpdate, audio_ms: float) -> PartialMessage:
    """The ``partial`` message of an engine update (``language`` only on a multilingual model)."""
    return PartialMessage(
        utterance=update.utterance,
        text=update.text,
        latency_ms=update.latency_ms,
        audio_ms=audio_ms,
        queue_ms=update.queue_ms,
        step_ms=update.step_ms,
        lag_ms=update.lag_ms,
        language=update.language,
    )


def with_language(final: FinalMessage, update: TranscriptUpdate) -> FinalMessage:
    """``final`` carrying the language its utterance was decoded with, and the one detected under ``auto``.

    Both stay None (absent from the JSON) on an English-only model.
    """
    if update.language is None:
        return final
    return replace(final, language=update.language, detected_language=update.detected_language)


def _refusal(message: str) -> ErrorMessage:
    code = CloseCode.PROTOCOL_ERROR
    return ErrorMessage(code=code, reason=close_reason(code), message=message, fatal=False)
