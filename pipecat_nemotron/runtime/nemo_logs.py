"""Quiet NeMo's logging for a block of code, on the calling thread only.

NeMo logs hundreds of INFO lines while it imports, builds or restores a model, and a few per synthesised sentence
("Decoding timestep 0", "End detected ..."). The ASR engine, Magpie TTS and the model builders all silence them
with :func:`quiet_nemo`. It drops records by the thread that emits them rather than changing NeMo's process-wide
level, so an engine loading or running on one thread never silences (or un-silences) NeMo on another: the ASR
engine and Magpie run side by side in one bot process.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

#: The standard-library logger behind ``nemo.utils.logging`` (Python warnings NeMo captures go through it too).
NEMO_LOGGER_NAME = "nemo_logger"


class _PerThreadLevels(logging.Filter):
    """Drops records below the level the emitting thread asked for (threads that asked nothing see everything)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._levels: dict[int, list[int]] = {}

    def push(self, level: int) -> None:
        with self._lock:
            self._levels.setdefault(threading.get_ident(), []).append(level)

    def pop(self) -> None:
        ident = threading.get_ident()
        with self._lock:
            levels = self._levels.get(ident, [])
            if levels:
                levels.pop()
            if not levels:
                self._levels.pop(ident, None)

    def filter(self, record: logging.LogRecord) -> bool:
        levels = self._levels.get(record.thread or 0)
        return not levels or record.levelno >= levels[-1]


_FILTER = _PerThreadLevels()
# NeMo creates this logger with ``logging.getLogger`` too, so the filter is in place whenever NeMo is imported.
logging.getLogger(NEMO_LOGGER_NAME).addFilter(_FILTER)


@contextlib.contextmanager
def quiet_nemo(level: int = logging.ERROR) -> Iterator[None]:
    """Drop NeMo's log records below ``level`` that the calling thread emits inside the block.

    Blocks nest (the innermost level applies); other threads are unaffected.

    Args:
        level: The lowest ``logging`` level still shown: ``logging.ERROR`` (default) hides NeMo's INFO and its
            warnings, ``logging.WARNING`` keeps the warnings.

    """
    _FILTER.push(level)
    try:
        yield
    finally:
        _FILTER.pop()
