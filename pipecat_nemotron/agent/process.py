"""What an agent process starts once and every session shares: the models and the embedded LLM server.

:class:`AgentProcess` turns :class:`~pipecat_nemotron.agent.settings.AgentSettings` into running parts, at process
start and side by side:

- the ASR engine and the in-process Magpie, loaded (:meth:`AgentSettings.preload`);
- with no LLM configured, llama.cpp's server with a small GGUF on loopback
  (:class:`~pipecat_nemotron.llm.embedded.EmbeddedLLMServer`);
- with no TTS configured, the embedded Magpie: the real ``nvidia/magpie_tts_multilingual_357m`` on a CUDA GPU, else
  the bundled tiny Magpie trained to speak (``docs/TINY_MAGPIE.md``: espeak-ng-like voices, the agent's domain),
  each sentence capped at :data:`TINY_MAGPIE_MAX_DURATION_S`.

:attr:`AgentProcess.settings` then names what runs (the LLM at the server's URL, the TTS at the embedded
model), so bots build every session's services from it. Stopping ends the LLM server; it runs on exit, Ctrl-C and
error alike when used as ``async with``::

    async with AgentProcess(AgentSettings.from_env(os.environ)) as process:
        agent = build_voice_agent(stt=process.settings.create_stt(), llm=process.settings.create_llm(), ...)
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

from loguru import logger

from pipecat_nemotron.agent.settings import AgentSettings
from pipecat_nemotron.llm.embedded import EmbeddedLLMServer
from pipecat_nemotron.runtime.devices import resolve_device

__all__ = ["REAL_MAGPIE_MODEL", "TINY_MAGPIE_MAX_DURATION_S", "AgentProcess"]

#: The Magpie the embedded default runs on a CUDA GPU.
REAL_MAGPIE_MODEL = "nvidia/magpie_tts_multilingual_357m"

#: The most audio one sentence of the tiny Magpie may take, seconds: it ends its sentences itself (its longest
#: training utterance is 6.2 s), so the cap only bounds a sentence it fails to end.
TINY_MAGPIE_MAX_DURATION_S = 10.0


class AgentProcess:
    """Start the agent's shared parts once per process; stop them on exit.

    Attributes:
        settings: What runs: the input settings until :meth:`start` returns, then with the embedded LLM's URL and
            the embedded Magpie's model filled in.
        llm_server: The embedded LLM server (None when an LLM is configured, or before start).
        startup_s: How long :meth:`start` took, seconds (None before it returned).

    """

    def __init__(self, settings: AgentSettings, *, llm_log_path: Path | None = None) -> None:
        """Prepare, start nothing.

        Args:
            settings: The agent's settings (usually ``AgentSettings.from_env(os.environ)``).
            llm_log_path: Where the embedded LLM server writes its log (None: a temporary file, removed at stop).

        """
        self.settings = settings
        self.llm_server: EmbeddedLLMServer | None = None
        self.startup_s: float | None = None
        self._llm_log_path = llm_log_path
        self._started = False

    async def __aenter__(self) -> AgentProcess:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Choose the embedded Magpie, load the models and start the embedded LLM server, side by side.

        Raises:
            EmbeddedLLMError: The embedded LLM server cannot start (the message names the fix).
            ModelLoadError: The ASR model could not be loaded.
            MagpieEngineError: The Magpie model could not be loaded.

        Whatever started before the failure is stopped before the error propagates.

        """
        if self._started:
            raise RuntimeError("AgentProcess.start() was already called; use a new AgentProcess")
        self._started = True
        began = time.perf_counter()
        try:
            settings = self.settings
            if settings.tts_embedded and settings.tts_model is None and not settings.tts_nim_server:
                model = await self._embedded_magpie()
                tiny = model != REAL_MAGPIE_MODEL
                settings = settings.with_tts_model(model, TINY_MAGPIE_MAX_DURATION_S if tiny else None)
            if settings.llm_embedded is not None and not settings.llm_configured:
                self.llm_server = EmbeddedLLMServer(replace(settings.llm_embedded, log_path=self._llm_log_path))
            starts = [settings.preload()]
            if self.llm_server is not None:
                starts.append(self.llm_server.start())
            results = await asyncio.gather(*starts, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            if self.llm_server is not None:
                settings = settings.with_llm_server(self.llm_server.base_url, self.llm_server.model)
                await self.llm_server.warm_up(_system_prompt(settings))
            self.settings = settings
        except BaseException:
            await self.stop()
            raise
        self.startup_s = time.perf_counter() - began
        logger.info(f"Agent process ready in {self.startup_s:.1f} s")

    async def _embedded_magpie(self) -> str:
        """The real Magpie's id on a CUDA GPU; else the bundled tiny Magpie.

        Raises:
            FileNotFoundError: The bundled tiny Magpie is missing (a broken install), naming the fix.

        """
        if resolve_device(self.settings.asr_device).startswith("cuda"):
            return REAL_MAGPIE_MODEL
        from pipecat_nemotron.models import TINY_MAGPIE_CODEC_PATH, TINY_MAGPIE_PATH

        for path in (TINY_MAGPIE_PATH, TINY_MAGPIE_CODEC_PATH):
            if not path.is_file():
                raise FileNotFoundError(
                    f"The bundled tiny Magpie is missing: {path} (reinstall pipecat-nemotron), or configure a TTS: "
                    "MAGPIE_TTS_MODEL=<.nemo or hub id>, or MAGPIE_NIM_SERVER=host:port."
                )
        return str(TINY_MAGPIE_PATH)

    async def stop(self) -> None:
        """Stop the embedded LLM server (the loaded models stay shared). Idempotent."""
        if self.llm_server is not None:
            await self.llm_server.stop()


def _system_prompt(settings: AgentSettings) -> str | None:
    """The system prompt the agent's LLM service sends (what the warm-up request puts in the server's cache)."""
    from pipecat_nemotron.llm.service import NemotronLLMSettings

    return NemotronLLMSettings.from_env(settings.llm_env).system_prompt
