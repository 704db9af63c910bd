"""What a session needs from a WebSocket connection, independent of the web framework.

:class:`Transport` is the protocol that the aiohttp server (:class:`~pipecat_nemotron.server.aiohttp_server.AiohttpTransport`)
and the Ray Serve deployment (:class:`~pipecat_nemotron.server.ray_serve.StarletteTransport`) implement;
:class:`Incoming` is one thing received through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from pipecat_nemotron.server.close_codes import ABNORMAL_CLOSURE

IncomingKind = Literal["text", "binary", "closed", "too_big", "error"]


@dataclass(frozen=True, slots=True, repr=False)
class Incoming:
    """One thing received from a client.

    ``repr`` shows only the kind and size: a config message's text may carry a bearer token, and ``slots``
    keeps loguru's traceback annotations (``diagnose``) from reading ``data`` either.

    Attributes:
        kind: ``text`` / ``binary`` message, ``closed`` (the client closed or vanished), ``too_big`` (over the
            size limit), ``error`` (a transport error).
        data: The message (text or bytes), an error description, or for ``closed`` why the server's side closed
            the connection (empty when the client closed it or vanished).

    """

    kind: IncomingKind
    data: str | bytes = b""

    def __repr__(self) -> str:
        return f"Incoming(kind={self.kind!r}, {len(self.data)} {'chars' if isinstance(self.data, str) else 'bytes'})"


class Transport(Protocol):
    """What a session needs from a WebSocket connection (already accepted)."""

    @property
    def closed(self) -> bool:
        """True once the connection is closed or closing."""
        ...

    async def receive(self, timeout: float | None) -> Incoming:
        """Next message; raises ``TimeoutError`` after ``timeout`` seconds without one."""
        ...

    def peer_gone(self) -> bool:
        """True once the client's end is gone or going (reset, FIN, closed), without reading any message.

        A session whose reads are paused (pacing, backlog) polls this to end at once when its client leaves.
        """
        ...

    async def send_text(self, text: str) -> None:
        """Send one text message.

        Raises:
            ConnectionError: The connection is closing or gone.

        """
        ...

    async def close(self, code: int, reason: str) -> None:
        """Close the connection with ``code`` (idempotent)."""
        ...


def remote_of(peer: object) -> str:
    """Format a peer address (tuple or string) for logs."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer) if peer else "?"


def peer_close_code(transport: Transport) -> int:
    """The code a transport's client closed with, for logs.

    A transport that tracks it has a ``peer_close_code`` attribute: None (read as 1006) until the client's close
    frame is read, so 1006 also when the client left without one, or with one still unread (while a session's
    reads are paused, its client's close frame sits behind audio the server has not read). A transport without
    the attribute reports 1000.
    """
    if not hasattr(transport, "peer_close_code"):
        return 1000
    code = transport.peer_close_code
    return int(code) if code is not None else ABNORMAL_CLOSURE
