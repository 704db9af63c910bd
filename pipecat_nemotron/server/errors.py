"""Exceptions that end an ASR session or a Riva gRPC call (the server's counterpart of :mod:`pipecat_nemotron.asr.errors`)."""

from __future__ import annotations

import enum

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


class RequestStatus(enum.Enum):
    """Why a request-shaped call (a Riva gRPC call) was refused or ended: gRPC's status names, no gRPC import.

    The gRPC layer (:mod:`~pipecat_nemotron.server.grpc_app`) sends ``grpc.StatusCode[status.name]``.
    """

    INVALID_ARGUMENT = "invalid_argument"
    NOT_FOUND = "not_found"
    UNIMPLEMENTED = "unimplemented"
    UNAUTHENTICATED = "unauthenticated"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


class RequestError(Exception):
    """Ends one call with a status and a message for its client (the server and the other calls go on).

    Args:
        status: What went wrong, as a gRPC status name.
        message: Explanation for the client, naming the fix where there is one (no secret, no client text
            beyond what it sent).

    """

    def __init__(self, status: RequestStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
