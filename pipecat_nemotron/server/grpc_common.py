"""What the Riva gRPC services share: who may call (:class:`GrpcAccess`), and ending or writing a call.

Authentication: the WebSocket side's bearer tokens, sent as gRPC metadata ``authorization: Bearer <token>``
(what Pipecat's services send for ``api_key=``). Without a valid one a call ends with UNAUTHENTICATED before
anything is read; repeated failures from one address lock it out as on the WebSocket side (RESOURCE_EXHAUSTED).
Other metadata (Pipecat's ``function-id``) is ignored. Tokens are never logged.
"""

from __future__ import annotations

import asyncio
from typing import Any, NoReturn

import grpc
from loguru import logger

from pipecat_nemotron.server.config import ServerConfig, throttle_for
from pipecat_nemotron.server.errors import RequestError, RequestStatus
from pipecat_nemotron.server.security import Secret, TokenSet, log_safe, peer_key, round_up

__all__ = ["GrpcAccess", "abort_with", "peer_host", "set_status", "write_unless"]


def peer_host(peer: str) -> str:
    """The client address of a gRPC peer string (``ipv4:127.0.0.1:5000`` → ``127.0.0.1``, ``ipv6:[::1]:5000``)."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return rest.rsplit(":", 1)[0].strip("[]")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    return peer


async def abort_with(context: grpc.aio.ServicerContext, error: RequestError) -> NoReturn:
    """End the call with ``error``'s status and message."""
    await context.abort(grpc.StatusCode[error.status.name], error.message)
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def set_status(context: Any, error: RequestError) -> None:
    """Set ``error``'s status and message on a context that ends the call when an exception follows.

    That is Ray Serve's ``RayServegRPCContext``: its proxy sends the status set before the deployment's method
    raised.
    """
    context.set_code(grpc.StatusCode[error.status.name])
    context.set_details(error.message)


async def write_unless(context: grpc.aio.ServicerContext, message: Any, abandoned: asyncio.Event) -> bool:
    """Send ``message``, unless ``abandoned`` is set first (a client that stops reading blocks the write).

    Returns:
        True once written; False if ``abandoned`` was set (the call must then end with its error).

    """
    if abandoned.is_set():
        return False
    write = asyncio.ensure_future(context.write(message))
    stop = asyncio.ensure_future(abandoned.wait())
    try:
        await asyncio.wait({write, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not write.done():
            write.cancel()
    if write.done() and not write.cancelled():
        write.result()
        return True
    return False


class GrpcAccess:
    """Who may call: the server's bearer tokens in the ``authorization`` metadata, with the per-address lockout.

    Args:
        config: The server's tokens, ``insecure`` switch and lockout settings.

    """

    def __init__(self, config: ServerConfig) -> None:
        self._insecure = config.insecure and not config.tokens
        self._tokens = TokenSet(config.tokens)  # digests only: nothing here prints a token
        self._throttle = throttle_for(config)

    def check(self, context: Any) -> None:
        """Admit a call whose metadata holds a valid bearer token (any call on an insecure server).

        ``context``: a ``grpc.aio.ServicerContext``, or anything with its ``peer()`` and ``invocation_metadata()``
        (Ray Serve's ``RayServegRPCContext``).

        Raises:
            RequestError: UNAUTHENTICATED without a valid token; RESOURCE_EXHAUSTED while the address is locked
                out after failed authentications.

        """
        if self._insecure:
            return
        key = peer_key(peer_host(context.peer()))
        locked_s = self._throttle.retry_after(key)
        if locked_s > 0:
            raise RequestError(
                RequestStatus.RESOURCE_EXHAUSTED,
                f"too many failed authentications from this address; retry after {round_up(locked_s)} s",
            )
        header = next(
            (value for name, value in context.invocation_metadata() or () if name.lower() == "authorization"),
            None,
        )
        if self._tokens.matches_header(Secret.of(header if isinstance(header, str) else None)):
            self._throttle.succeeded(key)
            return
        lockout_s = self._throttle.failed(key) if header is not None else 0.0
        if lockout_s > 0:
            logger.warning(
                f"Riva gRPC: peer {log_safe(key)} failed authentication too often; refusing it for {lockout_s:g} s"
            )
        raise RequestError(
            RequestStatus.UNAUTHENTICATED,
            "a bearer token is required: send metadata 'authorization: Bearer <token>' (Pipecat: api_key=<token>)",
        )
