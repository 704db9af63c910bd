"""What one server session may use of the server: :class:`SessionContext`.

A session reads its limits, opens its stream on the engine, counts what it does, checks a ``config`` token and
asks whether a slot frees up; that is all. It holds this context, not the :class:`~pipecat_nemotron.server.
service.ASRService` that admits it, so the session and the pacer can be built and tested with nothing else.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipecat_nemotron.asr import NemotronEngine
    from pipecat_nemotron.server.config import ServerConfig
    from pipecat_nemotron.server.engine_load import EngineLoad
    from pipecat_nemotron.server.metrics import ServerMetrics
    from pipecat_nemotron.server.security import Secret

__all__ = ["SessionContext"]


@dataclass(frozen=True)
class SessionContext:
    """The server as one session sees it.

    Attributes:
        config: The server's limits and security.
        engine: The engine every session's stream runs on.
        metrics: Where sessions count audio, drops and refusals.
        load: How busy the engine is (the pacer lets a session that is behind read faster while it has room).
        server_id: This server's name, for ``ready`` and logs.
        model_name: The served model's name for clients (``ready.model``), once the engine is loaded.
        check_token: Whether a ``config`` message's token is valid.
        slot_freed: Wait up to the given seconds for a stream slot held by a session that is ending.

    """

    config: ServerConfig
    engine: NemotronEngine
    metrics: ServerMetrics
    load: EngineLoad
    server_id: str
    model_name: Callable[[], str]
    check_token: Callable[[str | Secret | None], bool]
    slot_freed: Callable[[float], Awaitable[bool]]
