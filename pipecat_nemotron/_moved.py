"""Old import paths of modules that moved: each old module is an alias of the new one, with a warning."""

from __future__ import annotations

import importlib
import sys
import warnings

#: Old module path -> new module path (the STT layer moved into ``pipecat_nemotron.stt`` in 0.2).
MOVED = {
    "pipecat_nemotron.stt_base": "pipecat_nemotron.stt.base",
    "pipecat_nemotron.stt_settings": "pipecat_nemotron.stt.settings",
    "pipecat_nemotron.stt_ready": "pipecat_nemotron.stt.ready",
    "pipecat_nemotron.stt_ttfs": "pipecat_nemotron.stt.ttfs",
    "pipecat_nemotron.stt_finals": "pipecat_nemotron.stt.finals",
    "pipecat_nemotron.stt_replay": "pipecat_nemotron.stt.remote.replay",
    "pipecat_nemotron.transcript_result": "pipecat_nemotron.stt.result",
    "pipecat_nemotron.eager": "pipecat_nemotron.stt.eager",
    "pipecat_nemotron.server_stt": "pipecat_nemotron.stt.remote.service",
    "pipecat_nemotron.server_stt_handshake": "pipecat_nemotron.stt.remote.handshake",
    "pipecat_nemotron.server_stt_finals": "pipecat_nemotron.stt.remote.finals",
    "pipecat_nemotron.server_stt_reconnect": "pipecat_nemotron.stt.remote.reconnect",
    "pipecat_nemotron.server_stt_settings": "pipecat_nemotron.stt.remote.handshake",
}


def alias(old: str) -> None:
    """Make module ``old`` the module it moved to, warning once per import.

    Call it from the old module's body: the import system returns whatever ``sys.modules[old]`` holds when the
    body ends, so every name (private ones and later monkeypatches included) is the new module's own.

    Args:
        old: The old module's ``__name__``.

    """
    new = MOVED[old]
    warnings.warn(f"{old} moved to {new}; import it from there", DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
