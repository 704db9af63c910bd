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
    from pipecat_nemotron.server.context import SessionContext
    from pipecat_nemotron.server.transport import Transport

#: How often a session whose reads are paused checks that its client is still connected, s.
GONE_POLL_S = 0.05

#: Control messages a ``peek`` counts as in a session's control budget: a peek costs a model step (a flush of
#: up to one chunk, batched with every session's chunks), a ``keepalive`` nothing. With the default budget
#: (20 a second after a burst of 100) a session may peek 4 times a second, 20 at once: an eager end of turn
#: peeks about once per pause.
PEEK_CONTROL_COST = 5.0

#: Control messages a ``set_boost_phrases`` counts as: a list the engine has not seen builds a boosting tree
#: (~0.2 s of CPU for 1,000 phrases, on the engine's builder thread; the session's next step waits for it), CPU
#: the model steps of every session share. With the default budget a session may replace its phrases twice a
#: second, 10 times at once; a real client sets them once per conversation.
BOOST_CONTROL_COST = 10.0

#: Shortfalls below which a bucket counts as refilled (a timer may fire a clock tick early), ms and messages.
_CREDIT_SLACK_MS = 1.0
_CREDIT_SLACK = 0.001

class Pacer:
    """The read allowance of one session (see :meth:`pace`).

    Args:
        context: The server as the session sees it (its config holds the limits; its metrics count the time
            paused).
        transport: The session's connection (polled while paused).
        backlog_ms: The session's audio received but not yet decoded, ms.

    Attributes:
        credit_ms: Audio the client may still send ahead of real time, ms (the session spends it).
        control_credit: Control messages the client may still send at once (the session spends them).

    """

    def __init__(self, context: SessionContext, transport: Transport, backlog_ms: Callable[[], float]) -> None:
        self.context = context
        self.transport = transport
        self._backlog_ms = backlog_ms
        self.credit_ms = context.config.burst_ms
        self._credit_at = time.monotonic()
        self.control_credit = float(context.config.control_burst)

    async def pace(self) -> None:
        """Pause reading (TCP backpressure throttles the client) while it is ahead of its allowance or backlogged.

        Two token buckets: audio may run ``burst_ms`` ahead of real time, refilled at real time, and at
        ``max_speed`` x real time while the engine has spare capacity (:class:`~pipecat_nemotron.server.engine_load.EngineLoad`), so a client that
        sent audio far ahead catches up instead of staying behind for the rest of its session. JSON control
        messages may come ``control_burst`` at once, refilled at ``max_control_rate`` per second (each ``finalize`` and ``set_latency`` costs engine and event-loop time, so a flood of them would delay
        every other session's results). Separately, reading pauses while the engine holds more than
        ``max_backlog_ms`` of this session's audio, and the session is dropped (4029) if that lasts
        ``backlog_timeout_s``. A paused session costs no engine time, so it never slows the others; it polls
        its connection and ends at once if the client has gone (raising :class:`ClientGone`).
        """
        cfg = self.context.config
        while True:
            wait_s = self._refill()
            if wait_s <= 0:
                break
            self.context.metrics.throttled_seconds.inc(wait_s)
            await self.sleep_unless_gone(wait_s)
        if self._backlog_ms() > cfg.max_backlog_ms:
            started = time.monotonic()
            resume_ms = cfg.max_backlog_ms / 2
            while self._backlog_ms() > resume_ms:
                waited = time.monotonic() - started
                if waited > cfg.backlog_timeout_s:
                    self.context.metrics.throttled_seconds.inc(waited)
                    raise SessionError(
                        CloseCode.BACKLOG,
                        f"the session stayed more than {cfg.max_backlog_ms:g} ms behind real time for "
                        f"{cfg.backlog_timeout_s:g} s (server overloaded)",
                    )
                await self.sleep_unless_gone(0.02)
            self.context.metrics.throttled_seconds.inc(time.monotonic() - started)

    def _refill(self) -> float:
        """Refill both buckets for the time since the last call; how long to wait before the next read, s.

        The wait is at most :data:`GONE_POLL_S` at a time: the audio refill rate follows the engine's load.
        """
        cfg = self.context.config
        now = time.monotonic()
        elapsed_s = now - self._credit_at
        self._credit_at = now
        speed = cfg.max_speed if self.context.load.spare() else min(1.0, cfg.max_speed)
        refilled_ms = min(cfg.burst_ms, self.credit_ms + elapsed_s * 1000.0 * speed) - self.credit_ms
        if refilled_ms > elapsed_s * 1000.0:
            self.context.metrics.caught_up_seconds.inc((refilled_ms - elapsed_s * 1000.0) / 1000.0)
        self.credit_ms += refilled_ms
        self.control_credit = min(
            float(cfg.control_burst), self.control_credit + elapsed_s * cfg.max_control_rate
        )
        wait_s = 0.0
        if self.credit_ms < -_CREDIT_SLACK_MS:
            wait_s = min(-self.credit_ms / (1000.0 * speed), GONE_POLL_S)
        if self.control_credit < 1.0 - _CREDIT_SLACK:
            wait_s = max(wait_s, (1.0 - self.control_credit) / cfg.max_control_rate)
        return wait_s

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
