"""NVIDIA Riva's gRPC API on the model server: :class:`GrpcServer` (``grpc.aio``) and its authentication.

Pipecat's ``NvidiaSTTService`` and ``NvidiaTTSService`` (and any ``nvidia-riva-client``) work against it unchanged:
point them at ``server="host:PORT", use_ssl=False`` (docs/RIVA.md). The server shares the event loop of the
engines' schedulers; its services are :mod:`~pipecat_nemotron.server.riva_asr`
(``RivaSpeechRecognition``) and :mod:`~pipecat_nemotron.server.riva_tts` (``RivaSpeechSynthesis``). This module
and those two (with :mod:`~pipecat_nemotron.server.grpc_common` and, for Ray Serve's gRPC proxy,
:mod:`~pipecat_nemotron.server.riva_serve`) are the only ones that import ``grpc`` or Riva's protos.

Authentication (:mod:`~pipecat_nemotron.server.grpc_common`): the WebSocket side's bearer tokens, as gRPC
metadata ``authorization: Bearer <token>`` (what Pipecat's services send for ``api_key=``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import grpc
from loguru import logger

from pipecat_nemotron.server.config import ServerConfig
from pipecat_nemotron.server.grpc_common import GrpcAccess
from pipecat_nemotron.server.riva_asr import RivaASRServicer
from pipecat_nemotron.server.riva_tts import RivaTTSServicer

if TYPE_CHECKING:
    from pipecat_nemotron.server.service import ASRService
    from pipecat_nemotron.server.tts_host import TTSHost

__all__ = ["GrpcServer"]


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
        """Refuse new calls (UNAVAILABLE); let running ones finish for up to ``grace_s``, then cancel them.

        The port stays open while draining: gRPC's own shutdown would answer a new call with a bare CANCELLED.

        Args:
            grace_s: How long running calls may go on, s.

        """
        self.begin_drain()
        if self.tts is not None:
            self.tts.host.begin_drain()
        idle = [s.wait_idle() for s in (self.asr, self.tts) if s is not None]
        if grace_s > 0 and idle:
            try:
                await asyncio.wait_for(asyncio.gather(*idle), grace_s)
            except (asyncio.TimeoutError, TimeoutError):
                logger.info("Riva gRPC: calls still running at the end of the drain are cancelled")
        if self._started:
            self._started = False
            await self._server.stop(None)
