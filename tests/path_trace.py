"""Which of the package's files a real chunk or a real reply passes through: ``sys.setprofile`` on every thread.

:class:`PathTrace` records, for each call made into ``pipecat_nemotron``, the file it was made in, from the first
call of a named function (``start``) until the first call of another (``stop``), on the threads it is installed
on. docs/ARCHITECTURE.md lists both paths; ``tests/test_architecture_map.py`` compares them with a trace.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pipecat_nemotron

PACKAGE = str(Path(pipecat_nemotron.__file__).parent) + "/"


class PathTrace:
    """Files of the package called between a ``start`` and a ``stop`` function, on every traced thread.

    Args:
        start: Function name (in ``start_file``) whose first call starts recording.
        start_file: Package-relative file ``start`` must be defined in.
        stop: Function names (in ``stop_file``) whose first call stops recording.
        stop_file: Package-relative file the ``stop`` functions are defined in.

    """

    def __init__(self, start: str, start_file: str, stop: tuple[str, ...], stop_file: str) -> None:
        self._start, self._start_file = start, start_file
        self._stop, self._stop_file = stop, stop_file
        self._recording = False
        self._stopped = False
        self.files: set[str] = set()
        self.threads: set[str] = set()

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        """A ``sys.setprofile`` function."""
        if event != "call":
            return
        path = frame.f_code.co_filename
        if not path.startswith(PACKAGE):
            return
        file = path[len(PACKAGE) :]
        name = frame.f_code.co_name
        if not self._recording and not self._stopped and name == self._start and file == self._start_file:
            self._recording = True
        elif self._recording and name in self._stop and file == self._stop_file:
            self._recording, self._stopped = False, True
        if self._recording:
            self.files.add(file)
            self.threads.add(threading.current_thread().name)

    def install(self) -> None:
        """Trace the calling thread, and every thread started from now until :meth:`uninstall`."""
        sys.setprofile(self.hook)
        threading.setprofile(self.hook)

    def uninstall(self) -> None:
        """Stop tracing the calling thread and threads started from now (started ones keep tracing, unrecorded)."""
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
