"""What an agent process starts once and every session shares: the models and the embedded LLM server.

:class:`AgentProcess` turns :class:`~pipecat_nemotron.agent.settings.AgentSettings` into running parts, at process
start and side by side:

- the ASR engine and the in-process Magpie, loaded (:meth:`AgentSettings.preload`);
- with no LLM configured, llama.cpp's server with a small GGUF on loopback
  (:class:`~pipecat_nemotron.llm.embedded.EmbeddedLLMServer`);
- with no TTS configured, the embedded Magpie: the real ``nvidia/magpie_tts_multilingual_357m`` on a CUDA GPU, else
  the tiny Magpie built into a temporary folder (random weights: it speaks noise, of arbitrary length up to
  :data:`TINY_MAGPIE_MAX_DURATION_S` per sentence, until a trained one is bundled).

:attr:`AgentProcess.settings` then names what runs (the LLM at the server's URL, the TTS at the built model), so
bots build every session's services from it. Stopping ends the LLM server and removes the built model; it runs on
exit, Ctrl-C and error alike when used as ``async with``::

    async with AgentProcess(AgentSettings.from_env(os.environ)) as process:
        agent = build_voice_agent(stt=process.settings.create_stt(), llm=process.settings.create_llm(), ...)
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

from loguru import logger

from pipecat_nemotron.agent.settings import AgentSettings
from pipecat_nemotron.llm.embedded import EmbeddedLLMServer
from pipecat_nemotron.runtime.devices import resolve_device

__all__ = ["REAL_MAGPIE_MODEL", "TINY_MAGPIE_EOS_BIAS", "TINY_MAGPIE_MAX_DURATION_S", "AgentProcess"]

#: The Magpie the embedded default runs on a CUDA GPU.
REAL_MAGPIE_MODEL = "nvidia/magpie_tts_multilingual_357m"

#: The random tiny Magpie's end-of-speech bias: 0.25 lets it end on its own after a few seconds, whatever the
#: text (a larger bias ends it at once, a smaller one runs to the cap below).
TINY_MAGPIE_EOS_BIAS = 0.25

#: The most audio one sentence of the random tiny Magpie may take, seconds (it does not read the text).
TINY_MAGPIE_MAX_DURATION_S = 6.0


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
        self._tts_folder: tempfile.TemporaryDirectory[str] | None = None
        self._started = False

    async def __aenter__(self) -> AgentProcess:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Build the embedded Magpie, load the models and start the embedded LLM server, side by side.

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
        """The real Magpie's id on a CUDA GPU; else the tiny Magpie, built into a temporary folder."""
        if resolve_device(self.settings.asr_device).startswith("cuda"):
            return REAL_MAGPIE_MODEL
        from pipecat_nemotron.tts.magpie.tiny import build_tiny_magpie

        self._tts_folder = tempfile.TemporaryDirectory(prefix="nemotron-tiny-magpie-")
        folder = Path(self._tts_folder.name)
        path, _ = await asyncio.to_thread(_build_quietly, build_tiny_magpie, folder)
        return str(path)

    async def stop(self) -> None:
        """Stop the embedded LLM server and remove the built Magpie (the loaded models stay shared). Idempotent."""
        if self.llm_server is not None:
            await self.llm_server.stop()
        if self._tts_folder is not None:
            with contextlib.suppress(OSError):
                self._tts_folder.cleanup()
            self._tts_folder = None


def _system_prompt(settings: AgentSettings) -> str | None:
    """The system prompt the agent's LLM service sends (what the warm-up request puts in the server's cache)."""
    from pipecat_nemotron.llm.service import NemotronLLMSettings

    return NemotronLLMSettings.from_env(settings.llm_env).system_prompt


def _build_quietly(build: Any, folder: Path) -> tuple[Path, Path]:
    """``build(folder)`` with NeMo's constructor warnings (about its own buffers) silenced: nothing a user can fix."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return build(folder, end_of_speech_bias=TINY_MAGPIE_EOS_BIAS)
