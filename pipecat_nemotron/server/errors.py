"""Exceptions that end an ASR session (the server's counterpart of :mod:`pipecat_nemotron.asr.errors`)."""

from __future__ import annotations

from pipecat_nemotron.server.protocol import CloseCode


class SessionError(Exception):
    """Ends a session with a close code and an ``error`` message.

    Args:
        code: The close code.
        message: Human-readable explanation (sent to the client).

    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = int(code)
        self.message = message


class ClientGone(SessionError):
    """The client closed before sending its config (not an error worth a message)."""

    def __init__(self) -> None:
        super().__init__(CloseCode.NORMAL, "")
