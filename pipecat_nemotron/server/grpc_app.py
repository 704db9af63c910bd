"""NVIDIA Riva's gRPC API on the model server: :class:`GrpcServer` (``grpc.aio``) and its authentication.

Pipecat's ``NvidiaSTTService`` and ``NvidiaTTSService`` (and any ``nvidia-riva-client``) work against it unchanged:
point them at ``server="host:PORT", use_ssl=False`` (docs/RIVA.md). The server shares the event loop of the
engines' schedulers; its services are :mod:`~pipecat_nemotron.server.riva_asr`
(``RivaSpeechRecognition``) and :mod:`~pipecat_nemotron.server.riva_tts` (``RivaSpeechSynthesis``). This module
and those two are the only ones that import ``grpc`` or Riva's protos.

Authentication: the WebSocket side's bearer tokens, sent as gRPC metadata ``authorization: Bearer <token>``
(what Pipecat's services send for ``api_key=``). Without a valid one a call ends with UNAUTHENTICATED before
anything is read; repeated failures from one address lock it out as on the WebSocket side (RESOURCE_EXHAUSTED).
Other metadata (Pipecat's ``function-id``) is ignored. Tokens are never logged.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
from loguru import logger

from pipecat_nemotron.server.config import ServerConfig
from pipecat_nemotron.server.errors import RequestError, RequestStatus
from pipecat_nemotron.server.security import Secret, TokenSet, log_safe, peer_key, round_up, throttle_for

if TYPE_CHECKING:
    from pipecat_nemotron.server.service import ASRService
    from pipecat_nemotron.server.tts_host import TTSHost

__all__ = ["GrpcAccess", "GrpcServer", "abort_with", "peer_host", "write_unless"]


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

    def check(self, context: grpc.aio.ServicerContext) -> None:
        """Admit a call whose metadata holds a valid bearer token (any call on an insecure server).

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


class GrpcServer:
    """Riva's ``RivaSpeechRecognition`` and ``RivaSpeechSynthesis`` services on one gRPC port.

    Args:
        config: Bind address (``host``), tokens and limits of the server.
        port: TCP port (0 picks a free one; :attr:`port` tells which after :meth:`start`).
        asr: The ASR service whose engine streams recognise (None: no ``RivaSpeechRecognition``).
        tts: The TTS host whose engine synthesises (None: no ``RivaSpeechSynthesis``).

    """

    def __init__(
        self, config: ServerConfig, port: int, asr: ASRService | None = None, tts: TTSHost | None = None
    ) -> None:
        from pipecat_nemotron.server.riva_asr import RivaASRServicer
        from pipecat_nemotron.server.riva_tts import RivaTTSServicer

        self.config = config
        self.port = port
        self.access = GrpcAccess(config)
        self._server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        self.asr = RivaASRServicer(asr, self.access) if asr is not None else None
        self.tts = RivaTTSServicer(tts, self.access) if tts is not None else None
        if self.asr is not None:
            self.asr.register(self._server)
        if self.tts is not None:
            self.tts.register(self._server)
        self._started = False

    @property
    def address(self) -> str:
        """``host:port`` for Pipecat's ``server=`` (after :meth:`start`)."""
        host = self.config.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"{host}:{self.port}"

    async def start(self) -> None:
        """Bind the port and serve (calls before the models are ready get UNAVAILABLE)."""
        host = self.config.host
        bind = f"[{host}]" if ":" in host and not host.startswith("[") else host
        self.port = self._server.add_insecure_port(f"{bind}:{self.port}")
        if self.port == 0:
            raise OSError(f"could not bind the gRPC port on {host}; choose another with --grpc-port")
        await self._server.start()
        self._started = True
        services = [n for n, s in (("RivaSpeechRecognition", self.asr), ("RivaSpeechSynthesis", self.tts)) if s]
        logger.info(f"Riva gRPC listening on {self.address} ({', '.join(services)}; plaintext: use_ssl=False)")

    def begin_drain(self) -> None:
        """Refuse new recognition streams from now on (synthesis refuses through its host)."""
        if self.asr is not None:
            self.asr.draining = True

    async def stop(self, grace_s: float = 0.0) -> None:
        """Stop taking calls; let running ones finish for up to ``grace_s``, then cancel them.

        Args:
            grace_s: How long running calls may go on, s.

        """
        self.begin_drain()
        if self._started:
            self._started = False
            await self._server.stop(grace_s if grace_s > 0 else None)
