"""Python's thread switch interval, for a process that runs model threads beside an event loop.

A model thread (the ASR engine's step thread, the Magpie worker) runs hundreds of small torch ops per step (about
700 for a batched step of the tiny ASR model), and each op releases the GIL and takes it back. While another
thread runs pure Python (the event loop's Pipecat pipelines, a VAD, the other model's bookkeeping), taking the GIL
back waits until that thread is asked to drop it, which CPython does only after the switch interval (5 ms by
default). A step then waits about one interval per op. Measured on 2 quiet vCPUs: a batch-8 tiny ASR step took
36 ms alone and 590 ms beside a thread spinning in Python at 0.5 ms; with 8 sessions of the whole agent in one
process, the voice-to-voice p50 was 5.5-7.2 s at 0.5 ms against 2.4-3.3 s at 0.02-0.1 ms
(``docs/BENCHMARKS.md`` §12). The interval is process-wide, so an engine only ever lowers it, never raises it, and
logs what it set.
"""

from __future__ import annotations

import sys

from loguru import logger

#: What the engines set unless told otherwise, ms: a model thread waits about this long to take the GIL back after
#: each op while another thread runs Python. 0.02, 0.05 and 0.1 ms measured alike in the agent at N = 8; the
#: longest of them switches least.
DEFAULT_SWITCH_INTERVAL_MS = 0.1


def check_switch_interval(interval_ms: object) -> None:
    """Raise ``ValueError`` naming the fix unless ``interval_ms`` is None or a positive number of ms."""
    if interval_ms is None:
        return
    if isinstance(interval_ms, bool) or not isinstance(interval_ms, int | float) or not interval_ms > 0:
        raise ValueError(
            f"gil_switch_interval_ms must be a number of ms > 0, or None to leave it; got {interval_ms!r}"
        )


def shorten_switch_interval(interval_ms: float | None = DEFAULT_SWITCH_INTERVAL_MS) -> float:
    """Lower the process's thread switch interval to ``interval_ms`` (never raise it).

    Args:
        interval_ms: The interval wanted, ms (> 0); None leaves the interval as it is.

    Returns:
        The interval in force afterwards, ms.

    Raises:
        ValueError: ``interval_ms`` is not positive.

    """
    check_switch_interval(interval_ms)
    current = sys.getswitchinterval() * 1000.0
    if interval_ms is not None and interval_ms < current:
        sys.setswitchinterval(interval_ms / 1000.0)
        logger.info(f"Python thread switch interval {current:g} ms -> {interval_ms:g} ms (model threads)")
    return sys.getswitchinterval() * 1000.0
