"""``NemotronServerSTTService`` and its parts: the client of a ``pipecat-nemotron serve`` server.

* :mod:`~pipecat_nemotron.stt.remote.service` - the Pipecat service: connection, audio, frames, settings.
* :mod:`~pipecat_nemotron.stt.remote.handshake` - ``hello`` / ``ready`` and the server's refusals.
* :mod:`~pipecat_nemotron.stt.remote.replay` - the audio kept until its final arrives, replayed on reconnect.
* :mod:`~pipecat_nemotron.stt.remote.finals` - the finals owed by the server, and the end of a session.
* :mod:`~pipecat_nemotron.stt.remote.peeks` - the eager end of turn's peeks in flight.
* :mod:`~pipecat_nemotron.stt.remote.reconnect` - the reconnect loop and its policy.
"""
