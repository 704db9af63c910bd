"""Pacing of one session's reads: token buckets for audio and control messages, and the engine-backlog guard.

While a session is paced its reads pause, so TCP backpressure throttles its client; a paused session costs no
engine time and polls its connection, ending at once if the client has gone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipecat_nemotron.server.errors import ClientGone, SessionError
from pipecat_nemotron.server.protocol import CloseCode

if TYPE_CHECKING:
    from pipecat_nemotron.server.service import ASRService
    from pipecat_nemotron.server.transport import Transport

#: How often a session whose reads are paused checks that its client is still connected, s.
GONE_POLL_S = 0.05


class Pacer:
    """The read allowance of one session (see :meth:`pace`).

    Args:
        service: The server core (its config holds the limits; its metrics count the time paused).
        transport: The session's connection (polled while paused).
        backlog_ms: The session's audio received but not yet decoded, ms.

    Attributes:
        credit_ms: Audio the client may still send ahead of real time, ms (the session spends it).
        control_credit: Control messages the client may still send at once (the session spends them).

    """

    def __init__(self, service: ASRService, transport: Transport, backlog_ms: Callable[[], float]) -> None:
        self.service = service
        self.transport = transport
        self._backlog_ms = backlog_ms
        self.credit_ms = service.config.burst_ms
        self._credit_at = time.monotonic()
        self.control_credit = float(service.config.control_burst)

    async def pace(self) -> None:
        """Pause reading (TCP backpressure throttles the client) while it is ahead of its allowance or backlogged.

        Two token buckets: audio may run ``burst_ms`` ahead of real time, refilled at ``max_speed`` x real time;
        JSON control messages may come ``control_burst`` at once, refilled at ``max_control_rate`` per second
        (each ``finalize`` and ``set_latency`` costs engine and event-loop time, so a flood of them would delay
        every other session's results). Separately, reading pauses while the engine holds more than
        ``max_backlog_ms`` of this session's audio, and the session is dropped (4029) if that lasts
        ``backlog_timeout_s``. A paused session costs no engine time, so it never slows the others; it polls
        its connection and ends at once if the client has gone (raising :class:`ClientGone`).
        """
        cfg = self.service.config
        now = time.monotonic()
        elapsed_s = now - self._credit_at
        self._credit_at = now
        self.credit_ms = min(cfg.burst_ms, self.credit_ms + elapsed_s * 1000.0 * cfg.max_speed)
        self.control_credit = min(
            float(cfg.control_burst), self.control_credit + elapsed_s * cfg.max_control_rate
        )
        wait_s = 0.0
        if self.credit_ms < 0:
            wait_s = -self.credit_ms / (1000.0 * cfg.max_speed)
        if self.control_credit < 1.0:
            wait_s = max(wait_s, (1.0 - self.control_credit) / cfg.max_control_rate)
        if wait_s > 0:
            self.service.metrics.throttled_seconds.inc(wait_s)
            await self.sleep_unless_gone(wait_s)
        if self._backlog_ms() > cfg.max_backlog_ms:
            started = time.monotonic()
            resume_ms = cfg.max_backlog_ms / 2
            while self._backlog_ms() > resume_ms:
                waited = time.monotonic() - started
                if waited > cfg.backlog_timeout_s:
                    self.service.metrics.throttled_seconds.inc(waited)
                    raise SessionError(
                        CloseCode.BACKLOG,
                        f"the session stayed more than {cfg.max_backlog_ms:g} ms behind real time for "
                        f"{cfg.backlog_timeout_s:g} s (server overloaded)",
                    )
                await self.sleep_unless_gone(0.02)
            self.service.metrics.throttled_seconds.inc(time.monotonic() - started)

    async def sleep_unless_gone(self, seconds: float) -> None:
        """Sleep ``seconds``, checking the connection every ``GONE_POLL_S``; raise ``ClientGone`` when it is gone."""
        deadline = time.monotonic() + seconds
        while True:
            if self.transport.peer_gone():
                raise ClientGone()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            await asyncio.sleep(min(remaining, GONE_POLL_S))
