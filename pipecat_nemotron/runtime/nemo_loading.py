"""What every NeMo load in the process shares, whichever engine asks: one lock, and one background import.

The ASR engine (:mod:`pipecat_nemotron.asr.loading`) and the Magpie TTS engine
(:mod:`pipecat_nemotron.tts.magpie.loading`) both restore NeMo checkpoints, often on two threads at once in a bot
that preloads both; so neither engine owns these. Plain Python: importing this module imports no NeMo or torch.
"""

from __future__ import annotations

import importlib
import threading

from loguru import logger

__all__ = ["NEMO_LOAD_LOCK", "prefetch_nemo_imports", "wait_for_nemo_imports"]

#: The NeMo modules every ASR load needs; importing them is most of a cold start (~7-12 s on a 2-core CPU).
_NEMO_ASR_MODULES = ("nemo.collections.asr",)

_prefetch_lock = threading.Lock()
_prefetch_thread: threading.Thread | None = None

#: Held while NeMo is imported for a load and while a checkpoint is restored (``restore_from``/``from_pretrained``
#: of ASR models, Magpie and its codec), so that two loads on two threads (a bot preloading its ASR and TTS
#: models together) run one after the other. A restore records the folder it extracted the checkpoint to in
#: NeMo's process-wide ``AppState`` (``nemo_file_folder``), where the model's constructor looks up its artifacts
#: (the tokenizer), and it changes the process's working directory while it reads the config: two restores at
#: once read each other's folder ("Artifact not found"). NeMo's import cycles can deadlock across threads.
#: Re-entrant: Magpie restores its codec inside its own restore.
NEMO_LOAD_LOCK = threading.RLock()


def _import_nemo() -> None:
    for name in _NEMO_ASR_MODULES:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - the real load reports a missing or broken NeMo itself
            logger.debug(f"background import of {name} failed: {e!r}")
            return


def prefetch_nemo_imports() -> None:
    """Start importing NeMo's ASR collection on a background thread (once per process; returns at once).

    Services call this at construction so the import overlaps with building the pipeline and starting the
    transport. Loaders call :func:`wait_for_nemo_imports` first, so no two threads import NeMo at once.
    """
    global _prefetch_thread
    with _prefetch_lock:
        if _prefetch_thread is not None:
            return
        _prefetch_thread = threading.Thread(target=_import_nemo, name="nemo-import", daemon=True)
        _prefetch_thread.start()


def wait_for_nemo_imports() -> None:
    """Block until a background NeMo import started by :func:`prefetch_nemo_imports` has finished (if any).

    Module imports from two threads can deadlock on NeMo's import cycles; loading code waits here before it
    imports NeMo itself.
    """
    with _prefetch_lock:
        thread = _prefetch_thread
    if thread is not None:
        thread.join()
