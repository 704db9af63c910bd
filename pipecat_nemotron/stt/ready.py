"""Whether a Nemotron STT service can transcribe yet: what ``wait_until_ready()`` waits for, and how it fails."""

from __future__ import annotations

import asyncio

__all__ = ["NemotronSTTUnavailableError", "Readiness"]


class NemotronSTTUnavailableError(RuntimeError):
    """A Nemotron STT service cannot transcribe: its model did not load, or its server refused or is unreachable.

    Raised by ``wait_until_ready()`` of both STT services; ``__cause__`` is the error that stopped it.
    """


class Readiness:
    """One service's readiness: unknown (waiters wait), ready, or failed with a reason (waiters raise).

    A failure is not final: a later success (a reconnect) clears it.
    """

    def __init__(self) -> None:
        self._settled = asyncio.Event()
        self._error: NemotronSTTUnavailableError | None = None

    @property
    def settled(self) -> bool:
        """Ready, or known to have failed."""
        return self._settled.is_set()

    def ready(self) -> None:
        """The service can transcribe now."""
        self._error = None
        self._settled.set()

    def fail(self, reason: str, cause: BaseException | None = None) -> None:
        """The service cannot transcribe; waiters raise :class:`NemotronSTTUnavailableError` (``reason``)."""
        error = NemotronSTTUnavailableError(reason)
        error.__cause__ = cause
        self._error = error
        self._settled.set()

    async def wait(self, timeout: float | None = None) -> None:
        """Wait until settled (at most ``timeout`` seconds); raise the failure, if that is how it settled.

        Raises:
            NemotronSTTUnavailableError: It failed.
            TimeoutError: ``timeout`` passed first.

        """
        await asyncio.wait_for(self._settled.wait(), timeout)
        if self._error is not None:
            raise self._error
