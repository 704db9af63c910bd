"""How :class:`~pipecat_nemotron.server_stt.NemotronServerSTTService` applies its settings on the server.

``latency_ms`` and ``language`` changes go to the open session as ``set_latency`` / ``set_language`` messages
(a reconnect's ``config`` carries the current values anyway); both are checked first against the session's
``ready`` (the model's ``latency_modes`` and ``languages``, protocol feature ``"language"``), so a change the
server would refuse is refused in the pipeline, with an ``ErrorFrame``, instead.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from loguru import logger

from pipecat_nemotron.engine.languages import LanguagePrompts, resolve_prompt
from pipecat_nemotron.server.protocol import (
    LANGUAGE_FEATURE,
    ReadyMessage,
    SetLanguageMessage,
    SetLatencyMessage,
)


def language_problem(ready: ReadyMessage | None, language: Any) -> str | None:
    """Why the session's server cannot decode ``language`` (None: it can, or no session is open yet).

    The engine's own check (:func:`~pipecat_nemotron.engine.languages.resolve_prompt`) over the model the ``ready``
    announces: its ``languages``, or English only when it lists none.

    Raises:
        ValueError: ``language`` is not a language code at all.

    """
    if ready is None:
        return None
    prompts = LanguagePrompts.from_keys(ready.languages) if ready.languages else None
    try:
        resolve_prompt(prompts, language, ready.model or "the ASR server's model")
    except ValueError as e:
        older = "" if LANGUAGE_FEATURE in ready.features else " (a server without the 'language' feature)"
        return f"{e}{older}"
    return None


class ServerSettingsMixin:
    """The settings hooks of :class:`~pipecat_nemotron.stt_base.NemotronSTTBase`, over the server session.

    Mixed in before ``NemotronSTTBase``; uses the service's ``_ready``, ``_websocket`` and ``_send_lock``.
    """

    _ready: ReadyMessage | None
    _websocket: Any
    _send_lock: asyncio.Lock
    if TYPE_CHECKING:  # NemotronSTTBase's properties
        latency_ms: int
        language: str | None

    def _model_change_refusal(self) -> str:
        """The model is the server's."""
        return "the model is chosen by the ASR server and cannot change here"

    def _latency_modes(self) -> tuple[int, ...] | None:
        """The server model's modes, from the session's ``ready`` (None while disconnected)."""
        return self._ready.latency_modes if self._ready is not None else None

    def _language_problem(self, language: Any) -> str | None:
        """Why the server's model cannot decode ``language``, from the ``ready`` (None while disconnected)."""
        return language_problem(self._ready, language)

    async def _apply_latency(self) -> None:
        """Tell the server the new mode (a reconnect's ``config`` carries it anyway)."""
        await self._send_setting(SetLatencyMessage(latency_ms=self.latency_ms))

    async def _apply_language(self) -> None:
        """Tell the server the new language (a reconnect's ``config`` carries it anyway)."""
        ready = self._ready
        if ready is not None and LANGUAGE_FEATURE not in ready.features:
            logger.warning(
                f"{self}: the ASR server has no 'language' feature (an older server); language unchanged"
            )
            return
        await self._send_setting(SetLanguageMessage(language=self.language))

    async def _send_setting(self, msg: SetLatencyMessage | SetLanguageMessage) -> None:
        async with self._send_lock:
            if self._ready is not None and self._websocket is not None:
                try:
                    await self._websocket.send(msg.to_json())
                except Exception as e:  # the reconnect's config carries the new setting
                    logger.debug(f"{self}: {msg.type} send failed: {e!r}")
