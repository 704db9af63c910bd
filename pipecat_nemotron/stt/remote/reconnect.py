"""How :class:`~pipecat_nemotron.stt.remote.service.NemotronServerSTTService` keeps its session through server faults.

A live call cannot wait for an operator: while its ASR server restarts (a replica replaced, a proxy restarted,
a rolling update) the bot keeps the user's unconfirmed audio and keeps trying, for as long as the call lasts
unless told otherwise. :class:`ReconnectPolicy` says how (jittered exponential backoff, a time budget, what
counts as a quick failure); :class:`SessionKeeper` runs the receive loop under it.

What stops reconnection, at once: a permanent refusal (4001 token, 4003 origin, 4009, 4400; HTTP 401/403 at the
handshake); and, only if asked (``max_quick_failures``), the server ending that many sessions in a row on purpose
(4500, 4008, 4029, 1000) within ``stable_after_s`` of opening them. Refusals of a handshake (HTTP 5xx, 404 while a
proxy restarts, 4013 capacity, 4503 draining) and lost connections (1006, 1001) never count as quick failures:
they are what a restarting cluster looks like. Without a time budget the keeper gives up only on those.

Pipecat's ``WebsocketService`` retries 10 times without jitter and gives up after three connections that each
lasted under 5 s, counting a refused handshake as one; that suits a cloud API with bad credentials, not a
cluster of our own servers mid-restart, so this module replaces its loop for the server client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from loguru import logger
from pipecat.frames.frames import ErrorFrame, MetricsFrame
from pipecat.metrics.metrics import MetricsData
from websockets.exceptions import InvalidStatus

from pipecat_nemotron.server.protocol import CloseCode, close_reason, is_permanent
from pipecat_nemotron.stt.remote.handshake import ServerRefusedError

__all__ = [
    "ASR_RECONNECT_METRIC",
    "ASRReconnectMetricsData",
    "ReconnectPolicy",
    "ReconnectRecord",
    "SessionKeeper",
    "SessionLost",
    "describe_failure",
    "is_permanent_failure",
]

#: ``metric`` of :class:`ASRReconnectMetricsData`.
ASR_RECONNECT_METRIC = "asr_reconnect"

#: Close codes with which the server ends a running session on purpose: a session so ended within
#: ``stable_after_s`` of opening counts as a quick failure (1000 here is a close the client did not ask for).
SERVER_ENDED_CODES = frozenset(
    {CloseCode.NORMAL, CloseCode.INTERNAL, CloseCode.IDLE_TIMEOUT, CloseCode.BACKLOG}
)

#: HTTP statuses of a refused WebSocket upgrade that retrying cannot fix (a proxy's authentication).
PERMANENT_HTTP_STATUSES = frozenset({401, 403})


@dataclass(frozen=True)
class ReconnectPolicy:
    """How the server client reconnects after losing its session.

    The wait before attempt ``n`` of an outage: attempt 1 within ``jitter * min_wait_s`` (at once, spread so
    that clients displaced together do not all arrive in the same millisecond); attempt ``n >= 2`` draws from
    ``[(1 - jitter) * w, w]`` with ``w = min(max_wait_s, min_wait_s * 2 ** (n - 2))``. A session that ends within
    ``stable_after_s`` does not reset the backoff: the next outage continues where the last one stopped.

    Attributes:
        min_wait_s: Backoff after the first failed attempt, s.
        max_wait_s: Largest backoff, s. A restarted Ray Serve proxy takes ~30 s to return: with 5 s the client
            is back within ~5 s of it.
        jitter: Fraction of each wait drawn at random, in [0, 1).
        timeout_s: Give up (a permanent ``ErrorFrame``) after an outage this long, s; None: keep trying while
            the pipeline runs.
        stable_after_s: A session that lasted this long resets the backoff and the quick-failure count, s.
        max_quick_failures: Sessions in a row that the server ended on purpose (4500, 4008, 4029, 1000) within
            ``stable_after_s`` before giving up; None (default): never give up for that. Our server ends a
            session it will never accept with a permanent code, so a quick 4500 is a server fault (in the fault
            test: a replica short of engine slots for a moment after a proxy restart) and worth retrying.

    Raises:
        ValueError: A value out of range (the message names it).

    """

    min_wait_s: float = 0.25
    max_wait_s: float = 5.0
    jitter: float = 0.5
    timeout_s: float | None = None
    stable_after_s: float = 5.0
    max_quick_failures: int | None = None

    def __post_init__(self) -> None:
        """Check the ranges."""
        if not self.min_wait_s > 0:
            raise ValueError(f"ReconnectPolicy.min_wait_s must be > 0 s, got {self.min_wait_s}")
        if not self.max_wait_s >= self.min_wait_s:
            raise ValueError(
                f"ReconnectPolicy.max_wait_s ({self.max_wait_s}) must be >= min_wait_s ({self.min_wait_s})"
            )
        if not 0 <= self.jitter < 1:
            raise ValueError(f"ReconnectPolicy.jitter must be in [0, 1), got {self.jitter}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(
                f"ReconnectPolicy.timeout_s must be > 0 s or None (no limit), got {self.timeout_s}"
            )
        if not self.stable_after_s >= 0:
            raise ValueError(f"ReconnectPolicy.stable_after_s must be >= 0 s, got {self.stable_after_s}")
        if self.max_quick_failures is not None and self.max_quick_failures < 1:
            raise ValueError(
                f"ReconnectPolicy.max_quick_failures must be >= 1, got {self.max_quick_failures}"
            )

    def with_waits(self, min_wait_s: float | None, max_wait_s: float | None) -> ReconnectPolicy:
        """A copy with the backoff bounds replaced where given (None keeps this policy's)."""
        return dataclasses.replace(
            self,
            min_wait_s=self.min_wait_s if min_wait_s is None else min_wait_s,
            max_wait_s=self.max_wait_s if max_wait_s is None else max_wait_s,
        )

    def wait_s(self, attempt: int, rng: random.Random) -> float:
        """The wait before reconnect attempt ``attempt`` (1-based, counted across quick sessions), s."""
        if attempt <= 1:
            return rng.uniform(0.0, self.jitter * self.min_wait_s)
        base = min(self.max_wait_s, self.min_wait_s * 2.0 ** min(attempt - 2, 30))
        return base * rng.uniform(1.0 - self.jitter, 1.0)


@dataclass(frozen=True)
class ReconnectRecord:
    """One outage that ended in a new session.

    Attributes:
        cause: Why the previous session ended (``"1006 (unknown): ..."``, ``"not connected"``, ...).
        outage_s: From losing the session (or the first failed connect) to the new session's ``ready``, s.
        attempts: Connection attempts, the successful one included.
        replayed_s: Unconfirmed audio replayed on the new session, s.
        dropped_s: Audio of the replayed utterances that the bounded replay buffer had dropped (missing from
            their finals), s.

    """

    cause: str
    outage_s: float
    attempts: int
    replayed_s: float = 0.0
    dropped_s: float = 0.0

    def metrics_frame(self, processor: str) -> MetricsFrame:
        """The ``MetricsFrame`` reporting this reconnect (:class:`ASRReconnectMetricsData`)."""
        data = ASRReconnectMetricsData(
            processor=processor,
            value=self.outage_s,
            attempts=self.attempts,
            replayed_s=self.replayed_s,
            dropped_s=self.dropped_s,
        )
        return MetricsFrame(data=[data])

    def dropped_error(self, replay_max_s: float) -> ErrorFrame | None:
        """The (non-fatal) ``ErrorFrame`` naming the audio the replay buffer dropped; None if none was."""
        if self.dropped_s <= 0:
            return None
        return ErrorFrame(
            f"Nemotron ASR: {self.dropped_s:.2f} s of unconfirmed audio was dropped from the replay buffer "
            f"(replay_max_s={replay_max_s:g}) before the reconnect and is missing from the transcript"
        )


class ASRReconnectMetricsData(MetricsData):
    """A reconnect of the server client, pushed in a ``MetricsFrame`` when the new session is ready.

    Parameters
    ----------
        value: Outage, s (lost session to new ``ready``).
        attempts: Connection attempts, the successful one included.
        replayed_s: Audio replayed, s.
        dropped_s: Audio the replay buffer had dropped, s.
        metric: Always :data:`ASR_RECONNECT_METRIC`.

    """

    value: float
    attempts: int
    replayed_s: float
    dropped_s: float
    metric: str = ASR_RECONNECT_METRIC


class SessionLost(ConnectionError):
    """The server session ended in a way that calls for a reconnect.

    Attributes:
        code: The close code (None: the connection dropped without a close frame, or none was open).

    """

    def __init__(self, code: int | None, message: str) -> None:
        super().__init__(message)
        self.code = code


def session_end(code: int | None, reason: str) -> str:
    """The error of a session the server closed with a permanent ``code`` (a reconnect would fail the same way).

    Raises:
        SessionLost: Any other code (or none): the caller reconnects.

    """
    if is_permanent(code):
        return f"the Nemotron ASR server closed the session ({code} {close_reason(code or 0)}): {reason}"
    raise SessionLost(code, reason or "the connection was lost")


def _http_status(error: BaseException) -> int | None:
    if isinstance(error, InvalidStatus):
        return int(error.response.status_code)
    return None


def is_permanent_failure(error: BaseException) -> bool:
    """True if a failed connection attempt cannot succeed on retry (a permanent close code, HTTP 401/403)."""
    if isinstance(error, ServerRefusedError):
        return is_permanent(error.code)
    return _http_status(error) in PERMANENT_HTTP_STATUSES


def describe_failure(error: BaseException) -> str:
    """A short description of why a session ended or an attempt failed, for logs and errors."""
    status = _http_status(error)
    if status is not None:
        return f"HTTP {status} at the WebSocket upgrade"
    if isinstance(error, ServerRefusedError | SessionLost) and error.code is not None:
        return f"{error.code} ({close_reason(error.code)}): {error}"
    text = str(error) or type(error).__name__
    return f"{type(error).__name__}: {text}" if isinstance(error, OSError | TimeoutError) else text


class SessionKeeper:
    """The server client's receive loop: receive until the session ends, then reconnect under the policy.

    Args:
        policy: The policy.
        name: The service's name, for logs.
        receive: Receives the open session's messages; returns when the session ended for good (a permanent
            close, already reported, or a deliberate disconnect); raises (:class:`SessionLost` or any
            connection error) when it should be replaced.
        connect: Opens a new session (closing the old one first), replays, and returns the seconds of audio
            replayed and of audio the replay buffer had dropped; raises on failure (a permanent refusal is
            reported by it and makes ``stopped`` true).
        stopped: True once the service is disconnecting or unusable: no more attempts.
        report: ``report(error, force_treat_as_permanent)`` pushes an ``ErrorFrame`` (permanent: the service
            stops); Pipecat's ``_report_error``.
        reconnected: Called with the record of each outage that ended in a new session (after it is logged).
        rng: Random source of the jitter (seeded in tests).
        clock: Monotonic clock, s.

    Attributes:
        reconnects: Every outage that ended in a new session, oldest first.
        failed_attempts: Why each failed connection attempt failed (the first connect's included), the
            last 100.

    """

    def __init__(
        self,
        policy: ReconnectPolicy,
        *,
        name: str,
        receive: Callable[[], Awaitable[None]],
        connect: Callable[[], Awaitable[tuple[float, float]]],
        stopped: Callable[[], bool],
        report: Callable[[ErrorFrame, bool], Awaitable[None]],
        reconnected: Callable[[ReconnectRecord], Awaitable[None]],
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self._name = name
        self._receive = receive
        self._connect = connect
        self._stopped = stopped
        self._report = report
        self._reconnected = reconnected
        self._rng = rng or random.Random()
        self._clock = clock
        self._step = 0  # backoff position, carried across sessions that end quickly
        self._quick_failures = 0
        self.reconnects: list[ReconnectRecord] = []
        self.failed_attempts: deque[str] = deque(maxlen=100)
        self._first_failure: Exception | None = None  # why the connect at StartFrame failed

    async def connect_failed(self, error: Exception) -> None:
        """The first connection (at ``StartFrame``) failed: stop if it was refused for good, else :meth:`run` retries."""
        self.failed_attempts.append(describe_failure(error))
        self._first_failure = error
        logger.warning(f"{self._name}: could not connect to the ASR server: {describe_failure(error)}")
        if not self._stopped() and is_permanent_failure(error):
            await self._say(f"the ASR server refused the session for good ({describe_failure(error)})", True)

    async def _say(self, message: str, permanent: bool) -> None:
        await self._report(ErrorFrame(f"Nemotron ASR: {message}"), permanent)

    async def run(self) -> None:
        """Receive and reconnect until the session ends for good (see the class docstring)."""
        while True:
            opened_at = self._clock()
            try:
                await self._receive()
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - any way the session ended: reconnect, below
                cause = (
                    e if isinstance(e, SessionLost) or self._first_failure is None else self._first_failure
                )
                self._first_failure = None
            if self._stopped():
                return
            if await self._gives_up_after_session(cause, self._clock() - opened_at):
                return
            if not await self._reconnect(cause):
                return

    async def _gives_up_after_session(self, cause: Exception, lasted_s: float) -> bool:
        """Account for a session that ended after ``lasted_s``; True if the quick failures say stop."""
        if not isinstance(cause, SessionLost):
            return False  # no session was open (the first connect failed)
        if lasted_s >= self.policy.stable_after_s:
            self._step = 0
            self._quick_failures = 0
            return False
        if cause.code not in SERVER_ENDED_CODES:
            return False  # lost to the network or a restarting server: not the session's fault
        self._quick_failures += 1
        limit = self.policy.max_quick_failures
        if limit is None or self._quick_failures < limit:
            return False
        await self._say(
            f"the ASR server ended {self._quick_failures} sessions in a row within "
            f"{self.policy.stable_after_s:g} s of opening them (last: {describe_failure(cause)}); not reconnecting",
            True,
        )
        return True

    async def _reconnect(self, cause: Exception) -> bool:
        """Attempt new sessions until one opens (True), the budget runs out or a refusal is permanent (False)."""
        start = self._clock()
        last = describe_failure(cause)
        await self._say(f"no ASR server session ({last}); reconnecting, unconfirmed audio kept", False)
        attempts = 0
        while True:
            self._step += 1
            attempts += 1
            wait = self.policy.wait_s(self._step, self._rng)
            elapsed = self._clock() - start
            budget = self.policy.timeout_s
            if budget is not None and elapsed + wait > budget:
                await self._say(
                    f"could not reconnect to the ASR server within {budget:g} s ({attempts - 1} attempts; "
                    f"last: {last}); transcription stopped",
                    True,
                )
                return False
            await asyncio.sleep(wait)
            if self._stopped():
                return False
            try:
                replayed_s, dropped_s = await self._connect()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - every failure is classified and retried or reported
                if self._stopped():
                    return False  # a permanent refusal, reported by connect
                last = describe_failure(e)
                self.failed_attempts.append(last)
                if is_permanent_failure(e):
                    await self._say(f"the ASR server refused the session for good ({last})", True)
                    return False
                logger.warning(
                    f"{self._name}: reconnect attempt {attempts} failed after {self._clock() - start:.1f} s "
                    f"of outage ({last}); retrying"
                )
                continue
            record = ReconnectRecord(
                describe_failure(cause), self._clock() - start, attempts, replayed_s, dropped_s
            )
            logger.info(
                f"{self._name}: reconnected after {record.outage_s:.2f} s ({attempts} attempt(s); lost: "
                f"{record.cause}); replayed {replayed_s:.2f} s of unconfirmed audio"
            )
            self.reconnects.append(record)
            await self._reconnected(record)
            return True
