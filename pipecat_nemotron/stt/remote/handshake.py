"""The opening of a :class:`~pipecat_nemotron.stt.remote.service.NemotronServerSTTService` session, and its ``ready``.

:func:`receive_ready` sends the ``config`` and waits for the server's answer: ``ready``, or an ``error`` and a
close (:class:`ServerRefusedError`). :func:`language_problem` checks a language against the ``ready``: a change
the server would refuse is refused in the pipeline, with an ``ErrorFrame``, instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from loguru import logger
from websockets.exceptions import ConnectionClosed

from pipecat_nemotron.asr.languages import LanguagePrompts, resolve_prompt
from pipecat_nemotron.server.protocol import (
    DEFAULT_PATH,
    LANGUAGE_FEATURE,
    PROTOCOL_VERSION,
    ConfigMessage,
    ErrorMessage,
    ProtocolError,
    ReadyMessage,
    close_reason,
    parse_server_message,
)
from pipecat_nemotron.server.security import MaskedHeaders, Secret
from pipecat_nemotron.stt.remote.boost import BoostSetting

#: Default server URL (a server on this machine).
DEFAULT_URL = f"ws://127.0.0.1:8765{DEFAULT_PATH}"

#: Environment variable holding the bearer token when ``token`` is not passed.
TOKEN_ENV = "NEMOTRON_ASR_TOKEN"

#: Largest audio message sent, bytes (64 KiB = 2 s at 16 kHz), unless the server announces a smaller limit.
MAX_AUDIO_MESSAGE_BYTES = 65536


@dataclass(frozen=True)
class ServerAddress:
    """Where a session opens and with what credentials.

    Attributes:
        url: Session WebSocket URL (``ws://`` or ``wss://``).
        token: Bearer token, held as a :class:`Secret`: never in a repr, a log line or a traceback's variables.
        extra_headers: More handshake headers (values masked in reprs).
        timeout_s: Time allowed to connect, and again to get ``ready``, s.

    """

    url: str
    token: Secret
    extra_headers: MaskedHeaders
    timeout_s: float

    def __post_init__(self) -> None:
        if not self.url.startswith(("ws://", "wss://")):
            raise ValueError(f"url must start with ws:// or wss://, got {self.url!r}")

    async def connect(self, websocket_connect: Callable[..., Awaitable[Any]]) -> Any:
        """Open the WebSocket (subprotocol ``nemotron-asr.v1``) with Pipecat's ``_websocket_connect``."""
        headers = MaskedHeaders(self.extra_headers)
        if self.token:
            headers["Authorization"] = "Bearer " + self.token.reveal()
        return await asyncio.wait_for(
            websocket_connect(
                self.url,
                additional_headers=headers or None,
                subprotocols=[PROTOCOL_VERSION],
                open_timeout=self.timeout_s,
            ),
            self.timeout_s + 1.0,
        )


class ServerRefusedError(ConnectionError):
    """The server refused or closed the session with a close code.

    Attributes:
        code: The WebSocket close code (see :class:`~pipecat_nemotron.server.protocol.CloseCode`).

    """

    def __init__(self, code: int | None, message: str) -> None:
        super().__init__(message)
        self.code = code


def session_config(
    latency_ms: int, sample_rate: int, language: str | None, boost: BoostSetting, eou: bool = False
) -> ConfigMessage:
    """The ``config`` a Pipecat client opens a session with: its settings, word timings on.

    Phrases are left out when there are none, and ``eou`` when false, so a client without them sends what older
    clients send.
    """
    return ConfigMessage(
        latency_ms=latency_ms,
        sample_rate=sample_rate,
        word_timings=True,
        client="pipecat-nemotron/NemotronServerSTTService",
        language=language,
        boost_phrases=boost.phrases or None,
        boost_alpha=boost.alpha,
        eou=eou,
    )


async def receive_ready(ws: Any, config: ConfigMessage, timeout_s: float) -> ReadyMessage:
    """Send ``config`` on the open WebSocket ``ws`` and return the server's ``ready``.

    Raises:
        ServerRefusedError: The server answered with an ``error`` (after waiting briefly for its close), with
            something other than ``ready``, or closed the connection without an answer.
        TimeoutError: No answer within ``timeout_s``.

    """
    try:
        await ws.send(config.to_json())
        text = await asyncio.wait_for(ws.recv(), timeout_s)
    except ConnectionClosed as e:
        code = e.rcvd.code if e.rcvd is not None else None
        reason = e.rcvd.reason if e.rcvd is not None else ""
        raise ServerRefusedError(
            code, f"the server closed the connection ({close_reason(code or 1006)}): {reason}"
        ) from e
    msg = parse_server_message(text)
    if isinstance(msg, ErrorMessage):
        try:
            await asyncio.wait_for(ws.wait_closed(), 2.0)
        except (asyncio.TimeoutError, TimeoutError):
            pass
        raise ServerRefusedError(msg.code, f"{msg.reason}: {msg.message}")
    if not isinstance(msg, ReadyMessage):
        raise ServerRefusedError(None, f"expected 'ready', got {msg.type!r}")
    return msg


def audio_message_bytes(ready: ReadyMessage, cap: int) -> int:
    """Largest audio message to send on the session ``ready`` opened, bytes (even: whole 16-bit samples).

    The server's announced ``max_message_bytes`` (inclusive; larger closes with 4009), at most ``cap``.
    """
    limit = int(ready.limits.get("max_message_bytes", cap)) if ready.limits else 0
    limit = limit if limit > 0 else cap
    return max(2, min(limit, cap) // 2 * 2)


def language_problem(ready: ReadyMessage | None, language: Any) -> str | None:
    """Why the session's server cannot decode ``language`` (None: it can, or no session is open yet).

    The engine's own check (:func:`~pipecat_nemotron.asr.languages.resolve_prompt`) over the model the ``ready``
    announces: its ``languages``, or English only when it lists none.

    Raises:
        ValueError: ``language`` is not a language code at all.

    """
    if ready is None:
        return None
    prompts = LanguagePrompts.from_keys(ready.languages) if ready.languages else None
    try:
        resolve_prompt(prompts, language, ready.model or "the ASR server's model")
    except ValueError as e:
        older = "" if LANGUAGE_FEATURE in ready.features else " (a server without the 'language' feature)"
        return f"{e}{older}"
    return None


async def server_messages(ws: Any, name: str) -> AsyncIterator[Any]:
    """The session's server messages, parsed, until the connection closes (binary and malformed ones skipped).

    Args:
        ws: The session's WebSocket.
        name: The service's name, for the warning about a malformed message.

    """
    try:
        async for message in ws:
            if isinstance(message, bytes):
                continue
            try:
                yield parse_server_message(message)
            except ProtocolError as e:
                logger.warning(f"{name}: ignoring a malformed server message: {e}")
    except ConnectionClosed:
        return
