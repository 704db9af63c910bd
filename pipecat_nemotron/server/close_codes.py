"""Close codes of the ASR WebSocket protocol ``nemotron-asr.v1`` (re-exported by :mod:`.protocol`).

Every non-normal close is also announced by an ``error`` message whose ``reason`` is :data:`CLOSE_REASONS`'s
entry for the code. See ``docs/PROTOCOL.md``. Plain Python.
"""

from __future__ import annotations

from enum import IntEnum

#: WebSocket close code of a connection that ended without a close frame (RFC 6455 7.1.5): logged, never sent.
ABNORMAL_CLOSURE = 1006


class CloseCode(IntEnum):
    """WebSocket close codes the server uses (4000-4999 are application codes, RFC 6455 section 7.4.2).

    Clients should treat ``UNAUTHORIZED``, ``FORBIDDEN_ORIGIN``, ``MESSAGE_TOO_BIG`` and ``PROTOCOL_ERROR`` as
    permanent (retrying cannot help) and every other non-normal code as retryable with backoff.
    """

    #: The session ended normally (after a client ``close``).
    NORMAL = 1000
    #: The server is shutting down (after draining); reconnect, possibly to another replica.
    GOING_AWAY = 1001
    #: Missing or wrong bearer token.
    UNAUTHORIZED = 4001
    #: The request's ``Origin`` is not in the server's allow-list.
    FORBIDDEN_ORIGIN = 4003
    #: No message from the client within the idle timeout, or the client stopped reading results.
    IDLE_TIMEOUT = 4008
    #: A message exceeded the server's size limit.
    MESSAGE_TOO_BIG = 4009
    #: Every session slot is in use (existing sessions are unaffected); retry later or elsewhere.
    CAPACITY = 4013
    #: Too much, too fast: the session stayed too far behind real time (engine backlog above the limit for too
    #: long; reason ``backlog``), or the peer failed authentication too often (reason ``auth_backoff``).
    BACKLOG = 4029
    #: Malformed, unknown or out-of-order message, unsupported config, or unusable audio.
    PROTOCOL_ERROR = 4400
    #: The server failed (model step error, bug); retry.
    INTERNAL = 4500
    #: The model is still loading, or the server is draining for shutdown; retry later or elsewhere.
    NOT_READY = 4503


#: Close codes a client must not retry on: the same request would fail the same way.
PERMANENT_CLOSE_CODES = frozenset(
    {CloseCode.UNAUTHORIZED, CloseCode.FORBIDDEN_ORIGIN, CloseCode.MESSAGE_TOO_BIG, CloseCode.PROTOCOL_ERROR}
)

#: Short machine-readable reason for each close code (the ``reason`` of ``error`` messages).
CLOSE_REASONS: dict[int, str] = {
    CloseCode.NORMAL: "normal",
    CloseCode.GOING_AWAY: "going_away",
    CloseCode.UNAUTHORIZED: "unauthorized",
    CloseCode.FORBIDDEN_ORIGIN: "forbidden_origin",
    CloseCode.IDLE_TIMEOUT: "idle_timeout",
    CloseCode.MESSAGE_TOO_BIG: "message_too_big",
    CloseCode.CAPACITY: "capacity",
    CloseCode.BACKLOG: "backlog",
    CloseCode.PROTOCOL_ERROR: "protocol_error",
    CloseCode.INTERNAL: "internal",
    CloseCode.NOT_READY: "not_ready",
}


#: ``reason`` of a 4029 refusal of a peer locked out after failed authentications (``backlog`` is the other).
AUTH_BACKOFF_REASON = "auth_backoff"


def close_reason(code: int) -> str:
    """Short machine-readable reason of a close code (``"unknown"`` for codes this protocol does not define)."""
    return CLOSE_REASONS.get(int(code), "unknown")


def is_permanent(code: int | None) -> bool:
    """True if a client must not reconnect after the server closed with ``code``."""
    return code is not None and int(code) in PERMANENT_CLOSE_CODES
