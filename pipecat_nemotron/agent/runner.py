"""Hooks into Pipecat's development runner (``pipecat.runner.run.main``) for bots built on this package.

- :func:`preload_when_runner_starts`: the runner's web app starts the agent's shared parts (models, the embedded
  LLM server) at startup, before it accepts a connection, and stops them at shutdown.
- :func:`serve_nemotron_page`: the runner serves our offline browser page (``/nemotron``): a bare
  ``RTCPeerConnection`` to SmallWebRTC's ``/api/offer``, the RTVI data channel, live transcripts, per-turn latency
  and the bot's audio, with nothing fetched from a CDN (Pipecat's prebuilt page loads Daily's call bundle from
  the internet at connect time, so it cannot connect offline).
- :func:`offer_loopback_ice_candidates`: the bot's WebRTC stack also offers 127.0.0.1, for a browser on the same
  machine with no other network (a lab box, CI inside a loopback-only network namespace).

Each reaches into the runner's module-level FastAPI ``app`` or aioice; those reaches live here only, each checked
when called, with an error that names what changed.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from loguru import logger

from pipecat_nemotron.models import ASSETS_DIR

if TYPE_CHECKING:
    from pipecat_nemotron.agent.process import AgentProcess

#: The offline page, served by :func:`serve_nemotron_page`.
PAGE_PATH = ASSETS_DIR / "web" / "nemotron.html"

#: Where the runner serves the page.
PAGE_ROUTE = "/nemotron"


def _runner_app() -> Any:
    try:
        from pipecat.runner import run as pipecat_runner
    except ImportError as e:  # pragma: no cover - the runner extra is missing
        raise ImportError(f"Pipecat's runner is not installed: pip install 'pipecat-nemotron[runner]' ({e})") from e
    app = getattr(pipecat_runner, "app", None)
    if app is None or not hasattr(app, "router"):
        raise RuntimeError(
            "pipecat.runner.run has no module-level FastAPI `app` any more; this pipecat-nemotron version supports "
            "the runner of pipecat-ai 1.14"
        )
    return app


def preload_when_runner_starts(process: AgentProcess) -> None:
    """Make the runner start the agent's shared parts (:class:`AgentProcess`) before it accepts a connection.

    The runner's web app gets a startup step that runs on the server's event loop (the loop every session then
    runs on) before uvicorn listens: the models load, and with no LLM configured the embedded llama.cpp server
    starts. A part that fails to start stops the server with that error. At shutdown (Ctrl-C included) the
    embedded server is stopped. Sessions build their services from ``process.settings``. Call it before
    ``main()``::

        PROCESS = AgentProcess(AgentSettings.from_env(os.environ))

        if __name__ == "__main__":
            from pipecat.runner.run import main

            preload_when_runner_starts(PROCESS)
            main()

    Raises:
        TypeError: ``process`` is not an :class:`AgentProcess` (the message names the fix).

    """
    from pipecat_nemotron.agent.process import AgentProcess

    if not isinstance(process, AgentProcess):
        raise TypeError(
            f"preload_when_runner_starts takes an AgentProcess, got {type(process).__name__}: pass "
            "AgentProcess(settings) and build each session's services from its .settings"
        )
    app = _runner_app()
    previous: Callable[[Any], Any] = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[Any]:
        async with process:
            async with previous(app_) as state:
                yield state

    app.router.lifespan_context = lifespan


def serve_nemotron_page(route: str = PAGE_ROUTE) -> None:
    """Serve the offline browser page at ``route`` of the runner (``python bots/bot.py -t webrtc``).

    Open ``http://HOST:PORT/nemotron``: the page connects to the runner's SmallWebRTC ``/api/offer`` route,
    streams the microphone, and shows interim and final transcripts, per-turn latency (TTFS, ASR finalize, LLM
    and TTS time to first byte, voice-to-voice) and the bot's audio.
    """
    from fastapi.responses import HTMLResponse

    app = _runner_app()
    html = PAGE_PATH.read_text(encoding="utf-8")

    @app.get(route, include_in_schema=False)
    async def nemotron_page() -> HTMLResponse:
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})


#: The ``get_host_addresses`` wrapper installed in aioice (installing twice would wrap the wrapper).
_loopback_wrappers: dict[str, Callable[[bool, bool], list[str]]] = {}


def offer_loopback_ice_candidates() -> None:
    """Make aioice (the bot's WebRTC ICE) also offer 127.0.0.1 as a host candidate. Idempotent.

    aioice leaves loopback out of its host candidates, so a browser on the same machine with no other network
    interface (a loopback-only network namespace, an offline box) cannot connect. Browsers need
    ``--allow-loopback-in-peer-connection`` to pair with it.
    """
    try:
        from aioice import ice
    except ImportError as e:  # pragma: no cover - the webrtc extra is missing
        raise ImportError(f"aioice is not installed: pip install 'pipecat-nemotron[webrtc]' ({e})") from e
    original = getattr(ice, "get_host_addresses", None)
    if original is None:
        raise RuntimeError("aioice.ice.get_host_addresses is gone; loopback ICE candidates cannot be added")
    if original is _loopback_wrappers.get("installed"):
        return

    def get_host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        addresses = list(original(use_ipv4, use_ipv6))
        if use_ipv4 and "127.0.0.1" not in addresses:
            addresses.append("127.0.0.1")
        return addresses

    _loopback_wrappers["installed"] = get_host_addresses
    ice.get_host_addresses = get_host_addresses
    logger.info("WebRTC: offering 127.0.0.1 as an ICE host candidate (same-machine browsers)")
