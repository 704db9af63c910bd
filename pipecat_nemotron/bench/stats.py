"""Statistics of benchmark samples, and the process's resource meters (RSS, GPU memory, wall and CPU time).

torch is imported only inside the functions that ask about the GPU.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


def summarize(values: Sequence[float]) -> dict[str, float | int | None]:
    """``n``, ``mean``, ``p50``, ``p90``, ``p99``, ``max`` of ``values`` (None entries when empty)."""
    if len(values) == 0:
        return {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    a = np.asarray(values, dtype=float)
    return {
        "n": int(a.size),
        "mean": float(a.mean()),
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
    }


def linear_slope(t: Sequence[float], y: Sequence[float]) -> float | None:
    """Least-squares slope of ``y`` over ``t`` (units of y per unit of t), or None with fewer than 3 points."""
    if len(t) < 3:
        return None
    tt = np.asarray(t, dtype=float)
    if float(tt.max() - tt.min()) <= 0:
        return None
    return float(np.polyfit(tt, np.asarray(y, dtype=float), 1)[0])


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` or None when either is missing or ``b`` is 0."""
    if a is None or b is None or b == 0:
        return None
    return a / b


# ---- resources --------------------------------------------------------------------------------------------


def rss_bytes() -> int:
    """Resident set size of this process, bytes (``/proc/self/statm``; peak RSS where that is missing)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def gpu_bytes() -> int | None:
    """GPU memory allocated by torch on the current device, bytes (None without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.memory_allocated())


def sync_device() -> None:
    """Wait for queued GPU work (no-op on CPU)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


@dataclass
class Meter:
    """Wall and process-CPU seconds of a block (``with Meter() as m: ...``), GPU work synchronised at both ends.

    Attributes:
        wall_s: Wall-clock seconds.
        cpu_s: CPU seconds of this process (all threads).

    """

    wall_s: float = 0.0
    cpu_s: float = 0.0
    _t: tuple[float, float] = field(default=(0.0, 0.0), repr=False)

    def __enter__(self) -> Meter:
        sync_device()
        self._t = (time.perf_counter(), time.process_time())
        return self

    def __exit__(self, *exc: object) -> None:
        sync_device()
        self.wall_s = time.perf_counter() - self._t[0]
        self.cpu_s = time.process_time() - self._t[1]
