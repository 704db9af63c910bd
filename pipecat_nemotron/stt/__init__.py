"""The Nemotron STT services for Pipecat: local (in process) and remote (a ``pipecat-nemotron serve`` server).

``NemotronSTTService`` runs Nemotron Speech streaming ASR locally, in this process. Not to be confused with
Pipecat's ``NvidiaSTTService``, which calls a *remote* Riva/NIM server over gRPC; the remote service of this
package is ``NemotronServerSTTService``, a client of our own WebSocket server.

* :mod:`~pipecat_nemotron.stt.base` - what both services share: settings changes, TTFS, interim and final frames,
  tracing, eager end of turn.
* :mod:`~pipecat_nemotron.stt.local` - ``NemotronSTTService``, on an in-process engine.
* :mod:`~pipecat_nemotron.stt.remote` - ``NemotronServerSTTService``: its handshake, replay buffer, owed finals,
  peeks and reconnect loop.
* :mod:`~pipecat_nemotron.stt.eager` - ``EagerSettings`` and when a pause predicts the end of a turn.
* :mod:`~pipecat_nemotron.stt.settings`, :mod:`~pipecat_nemotron.stt.ready`, :mod:`~pipecat_nemotron.stt.ttfs`,
  :mod:`~pipecat_nemotron.stt.finals`, :mod:`~pipecat_nemotron.stt.while_loading`,
  :mod:`~pipecat_nemotron.stt.metrics` - the runtime settings, readiness, the TTFS p99 announced, the local
  session's owed finals and what it holds while its model loads, the ASR finalize metric.

``TranscriptionFrame.result`` of both services is a :class:`~pipecat_nemotron.asr.types.Transcript` (re-exported
here). Names load on first access, so importing this package does not import Pipecat or torch.
"""

from __future__ import annotations

from pipecat_nemotron.runtime.lazy import lazy_exports

_EXPORTS = {
    "DEFAULT_FINAL_TIMEOUT_S": "pipecat_nemotron.stt.local",
    "DEFAULT_LOAD_WAIT_S": "pipecat_nemotron.stt.local",
    "NemotronSTTService": "pipecat_nemotron.stt.local",
    "NEMOTRON_TTFS_P99": "pipecat_nemotron.stt.ttfs",
    "NemotronSTTSettings": "pipecat_nemotron.stt.settings",
    "NemotronSTTUnavailableError": "pipecat_nemotron.stt.ready",
    "EagerSettings": "pipecat_nemotron.stt.eager",
    "Transcript": "pipecat_nemotron.asr.types",
    "NemotronServerSTTService": "pipecat_nemotron.stt.remote.service",
    "ReconnectPolicy": "pipecat_nemotron.stt.remote.reconnect",
    "ServerRefusedError": "pipecat_nemotron.stt.remote.handshake",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
