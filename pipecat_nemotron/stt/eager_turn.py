"""``EagerTurn``: one Nemotron STT session's eager end of turn, from the pauses it hears to the frames it pushes.

When the user pauses (:class:`~pipecat_nemotron.stt.eager.PauseDetector`), it peeks at the utterance's
final-quality text and pushes it as the predicted end of the turn (Pipecat's ``EagerTranscriptionFrame``); when the
user speaks again it withdraws it (``EagerEndOfTurnCancelFrame``). It owns turn detection for its service: a
``ProposedUserStartedSpeakingFrame`` at each VAD start, a ``ProposedUserStoppedSpeakingFrame`` when the
:class:`~pipecat_nemotron.stt.eager.TurnCommit` commits the turn. A service with the eager end of turn off has
none, and none of this runs, unless its turn commit reads the model's end-of-utterance events
(``TurnCommit.wants_eou``): then the service owns turn detection without predicting (``pauses=None``), and an
``<EOU>`` commits the turn (and, with predictions on, is what predicts it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from loguru import logger
from pipecat.frames.frames import Frame, ProposedUserStartedSpeakingFrame, ProposedUserStoppedSpeakingFrame
from pipecat.transcriptions.language import Language

from pipecat_nemotron.stt.eager import PauseDetector, PauseEvent, TurnCommit, pause_held_by

__all__ = ["EagerHooks", "EagerService", "EagerTurn"]


class EagerService(Protocol):
    """The public methods of a Pipecat STT service with the eager end of turn that :class:`EagerTurn` uses."""

    @property
    def eager_end_of_turn_pending(self) -> bool:
        """Whether a prediction is out (Pipecat's ``EagerEndOfTurnSTTServiceMixin``)."""
        ...

    def create_task(self, coroutine: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        """Start a task the service's task manager owns."""
        ...

    async def cancel_task(self, task: asyncio.Task[Any], timeout: float | None = 1.0) -> None:
        """Cancel a task the service started."""
        ...

    async def broadcast_frame(self, frame_cls: type[Frame], **kwargs: Any) -> None:
        """Push a frame of ``frame_cls`` upstream and downstream."""
        ...


@dataclass(frozen=True)
class EagerHooks:
    """What :class:`EagerTurn` asks of its service beyond Pipecat's public processor methods.

    Attributes:
        peek: The open utterance's text as its final would be now, without ending it.
        predict: Push ``text`` as the predicted end of turn (Pipecat's eager end of turn).
        withdraw: Withdraw the prediction, if one is out.
        user_speaking: Whether the user is speaking (Pipecat's VAD state as the service sees it).
        language: The ``language`` of the frames pushed now.

    """

    peek: Callable[[], Awaitable[str]]
    predict: Callable[[str], Awaitable[None]]
    withdraw: Callable[[], Awaitable[None]]
    user_speaking: Callable[[], bool]
    language: Callable[[], Language | None]


class EagerTurn:
    """The eager end of turn of one STT service: pauses predict the turn's end, speech withdraws the prediction.

    Args:
        service: The STT service it runs in: its tasks, its broadcasts and whether a prediction is out.
        pauses: Decides when the user pauses; None: no predictions, only turn detection (an EOU commit).
        commit: Decides whether a VAD stop commits the turn.
        hold_words: Words a turn rarely ends on: a pause after one predicts nothing.
        hooks: The service's side of the prediction (:class:`EagerHooks`).

    """

    def __init__(
        self,
        service: EagerService,
        pauses: PauseDetector | None,
        commit: TurnCommit,
        hold_words: frozenset[str],
        hooks: EagerHooks,
    ) -> None:
        self._service = service
        self.pauses = pauses
        self.commit = commit
        self.hold_words = hold_words
        self._hooks = hooks
        self._peek_task: asyncio.Task[None] | None = None

    @property
    def predicts(self) -> bool:
        """Whether pauses predict the end of the turn (the eager end of turn is on)."""
        return self.pauses is not None

    def start(self, sample_rate: int) -> None:
        """Start the service's own VAD (and the turn analyzer's) at the input sample rate, Hz."""
        self.commit.start(sample_rate)
        if self.pauses is None:
            logger.info(f"{self._service}: owns turn detection ({type(self.commit).__name__}, no predictions)")
            return
        self.pauses.start(sample_rate)
        logger.info(
            f"{self._service}: eager end of turn on ({self.pauses.signal} signal, {self.pauses.silence_ms:g} ms pause)"
        )

    async def on_vad_start(self, start_secs: float) -> None:
        """The VAD heard the user start: withdraw any prediction and open a turn."""
        await self._withdraw()
        if self.pauses is not None:
            self.pauses.reset()
        self.commit.on_speech_start(start_secs)
        await self._service.broadcast_frame(ProposedUserStartedSpeakingFrame)

    async def on_vad_stop(self) -> None:
        """The VAD stop: the final comes next and settles the prediction; a peek still running would repeat it."""
        await self._cancel_peek()
        if self.pauses is not None:
            self.pauses.reset()
        self.commit.on_vad_stop()

    async def on_audio(self, audio: bytes) -> None:
        """Input audio (16-bit PCM): the turn analyzer may end a turn it held open; the VAD listens for a pause."""
        if self.commit.on_audio(audio, self._hooks.user_speaking()):
            await self._service.broadcast_frame(ProposedUserStoppedSpeakingFrame)
        if self.pauses is not None and self._hooks.user_speaking():
            await self._on_pause_event(await self.pauses.on_audio(audio))

    async def on_decoded(self, decoded_ms: float, text_changed: bool) -> None:
        """The ASR decoded more of the session's audio (ms, any origin); ``text_changed``: the transcript grew."""
        if self.pauses is not None and self._hooks.user_speaking():
            await self._on_pause_event(self.pauses.on_decoded(decoded_ms, text_changed))

    async def on_eou(self, final_follows: bool = False) -> None:
        """The model emitted ``<EOU>``: it commits a turn held open; before the VAD stop it predicts the end.

        Args:
            final_follows: The service finalizes the utterance now; its final commits the turn.

        """
        if self.commit.on_eou(final_follows):
            await self._service.broadcast_frame(ProposedUserStoppedSpeakingFrame)
            return
        if self.pauses is not None and self._hooks.user_speaking():
            await self._on_pause_event(PauseEvent.PAUSE)

    async def on_final(self, text: str, language: Language | None) -> None:
        """A finalized transcript: commit the turn (``ProposedUserStoppedSpeakingFrame``) if it is complete."""
        if await self.commit.complete(text, language):
            await self._service.broadcast_frame(ProposedUserStoppedSpeakingFrame)

    async def close(self) -> None:
        """Stop a peek still running (the session ends)."""
        await self._cancel_peek()

    async def _on_pause_event(self, event: PauseEvent | None) -> None:
        if event is PauseEvent.PAUSE and self._peek_task is None and not self._service.eager_end_of_turn_pending:
            self._peek_task = self._service.create_task(self._peek(), name=f"{self._service}::eager_peek")
        elif event is PauseEvent.RESUME:
            await self._withdraw()

    async def _peek(self) -> None:
        """Peek at the utterance and, if the user is still pausing, push it as the predicted end of turn."""
        try:
            text = await self._hooks.peek()
        except Exception as e:  # the stream failed or closed meanwhile: no prediction this time
            logger.debug(f"{self._service}: eager peek failed: {e!r}")
            return
        finally:
            if self._peek_task is asyncio.current_task():
                self._peek_task = None
        held = pause_held_by(text, self.hold_words, self.commit, self._hooks.language())
        if held is not None:
            logger.debug(f"{self._service}: a pause {held} is no end of turn; none predicted")
        elif self._hooks.user_speaking() and self.pauses is not None and (self.pauses.paused or self.commit.wants_eou):
            logger.debug(f"{self._service}: eager end of turn: {text!r}")
            await self._hooks.predict(text)

    async def _cancel_peek(self) -> None:
        task, self._peek_task = self._peek_task, None
        if task is not None and not task.done():
            await self._service.cancel_task(task)

    async def _withdraw(self) -> None:
        """The user speaks again: drop a peek in flight and withdraw the prediction (if one is out)."""
        if self._peek_task is not None:
            logger.debug(f"{self._service}: user resumed before the eager peek returned; dropped")
        await self._cancel_peek()
        if self._service.eager_end_of_turn_pending:
            logger.debug(f"{self._service}: user resumed; eager end of turn withdrawn")
        await self._hooks.withdraw()
