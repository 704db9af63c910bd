"""Ref-counted, process-wide sharing of loaded engines: the one idiom of both engine registries.

:class:`~pipecat_nemotron.asr.shared.SharedEngines` (ASR) and
:class:`~pipecat_nemotron.tts.magpie.shared.SharedMagpieEngines` (TTS) are both an :class:`EngineRegistry`: engines
keyed by their configuration, one reference per user (``acquire`` / ``release``), ``preload`` pins one reference
for the life of the process, an engine stays loaded when its last user leaves unless ``unload_when_unused`` is
set, and ``close_all`` stops every engine at process shutdown. They differ only where their engines do: an ASR
engine starts on the caller's event loop (its ``acquire`` is async and returns a started engine), a Magpie
engine loads on its own worker thread (its ``acquire`` is sync and returns at once; ``wait_ready`` waits).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
E = TypeVar("E")


@dataclass(eq=False)
class Held(Generic[E]):
    """One shared engine and its users.

    Attributes:
        engine: The engine.
        refs: Users holding it (a preload counts as one).
        pinned: Preloaded: it stays loaded for the life of the process.

    """

    engine: E
    refs: int = 0
    pinned: bool = False


class EngineRegistry(Generic[K, E]):
    """The bookkeeping of a registry: which engine serves which key, and who holds it. Thread-safe.

    Subclasses add ``acquire``, ``release``, ``preload`` and ``close_all`` in their engine's idiom (async or
    sync) on top of the ``_checkout`` / ``_hold`` / ``_drop`` / ``_pin`` / ``_forget`` / ``_take_all`` steps.

    Args:
        unload_when_unused: Close an engine (freeing its model) when its last user releases it. A preloaded
            engine stays loaded regardless.

    """

    def __init__(self, unload_when_unused: bool = False) -> None:
        self.unload_when_unused = unload_when_unused
        self._lock = threading.Lock()
        self._held: dict[K, Held[E]] = {}
        # Engines replaced under their key while still in use: closed at their last release.
        self._retired: list[Held[E]] = []

    def refs(self, engine: E) -> int:
        """Current users of ``engine`` (a preload counts as one; 0 for an engine the registry does not hold)."""
        with self._lock:
            held = self._find(engine)
            return held.refs if held is not None else 0

    @property
    def engines(self) -> list[E]:
        """Engines loaded or loading, one per key."""
        with self._lock:
            return [held.engine for held in self._held.values()]

    # ---- steps for subclasses ------------------------------------------------------------------------------

    def _checkout(
        self,
        key: K,
        create: Callable[[], E],
        *,
        hold: bool,
        replace_if: Callable[[E], bool] | None = None,
    ) -> tuple[Held[E], E | None]:
        """The record for ``key``, creating its engine on first use (or when ``replace_if`` rejects the old one).

        Args:
            key: The engine's configuration.
            create: Builds a new engine (called under the registry's lock).
            hold: Count the caller as a user now (else call :meth:`_hold` once the engine is usable).
            replace_if: True for an engine that can no longer serve (closed, failed to load).

        Returns:
            The record, and a replaced engine nobody holds any more (the caller closes it), or None.

        """
        with self._lock:
            held = self._held.get(key)
            orphan = None
            if held is None or (replace_if is not None and replace_if(held.engine)):
                if held is not None:
                    if held.refs:
                        self._retired.append(held)
                    else:
                        orphan = held.engine
                held = Held(create())
                self._held[key] = held
            if hold:
                held.refs += 1
            return held, orphan

    def _hold(self, held: Held[E]) -> E:
        """Count one more user of ``held``'s engine and return the engine."""
        with self._lock:
            held.refs += 1
            return held.engine

    def _drop(self, engine: E) -> bool:
        """Count one user fewer; True when the engine must be closed now (it has left the registry).

        That is when its last user leaves and it was replaced under its key, or ``unload_when_unused`` is set
        and it was not preloaded.
        """
        with self._lock:
            held = self._find(engine)
            if held is None:
                return False
            held.refs = max(0, held.refs - 1)
            if held.refs:
                return False
            if held in self._retired:
                self._retired.remove(held)
                return True
            if held.pinned or not self.unload_when_unused:
                return False
            self._held = {k: h for k, h in self._held.items() if h is not held}
            return True

    def _pin(self, engine: E) -> None:
        """Mark ``engine`` preloaded; its caller's reference becomes the one process-lifetime reference."""
        with self._lock:
            held = self._find(engine)
            if held is None:
                return
            if held.pinned:
                held.refs -= 1  # one process-lifetime reference is enough
            held.pinned = True

    def _forget(self, key: K, engine: E) -> None:
        """Drop ``key``'s record if it still holds ``engine`` (its load failed; the next acquire tries again)."""
        with self._lock:
            held = self._held.get(key)
            if held is not None and held.engine is engine:
                del self._held[key]

    def _take_all(self) -> list[Held[E]]:
        """Empty the registry and return every record it held, for the caller to close (process shutdown)."""
        with self._lock:
            taken = [*self._held.values(), *self._retired]
            self._held.clear()
            self._retired.clear()
            return taken

    def _find(self, engine: E) -> Held[E] | None:
        for held in (*self._held.values(), *self._retired):
            if held.engine is engine:
                return held
        return None
