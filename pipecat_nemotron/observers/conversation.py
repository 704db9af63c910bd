"""Both sides of a conversation, turn by turn: what the user said, what the agent answered, and the reply's audio.

:class:`ConversationLog` is an observer: attach it to the worker (``build_voice_agent(observers=[log])``). It
records, in the order the services pushed them:

- the user's final transcripts (``TranscriptionFrame``), gathered until the LLM starts its answer;
- each LLM answer (``LLMFullResponseStartFrame`` … ``LLMTextFrame`` … ``LLMFullResponseEndFrame``), one
  :class:`ConversationTurn` per answer, with the errors pushed while it ran and whether an interruption cut it;
- the TTS audio of each answer, with the wall time it reached the pipeline, so :func:`write_conversation_wav`
  can place both sides of the conversation on one timeline.

:meth:`ConversationLog.unanswered` names every turn that got no answer (no text, an LLM error, or no audio when the
agent speaks), and the user speech still waiting for one at the end: a demo or test reports each rather than
letting it pass silently.
"""

from __future__ import annotations

import time
import wave
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pipecat.frames.frames import (
    ErrorFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed

__all__ = ["BotAudio", "ConversationLog", "ConversationTurn", "write_conversation_wav"]


@dataclass
class BotAudio:
    """One piece of the agent's speech.

    Attributes:
        wall_s: When it reached the pipeline, Unix seconds (``time.time()``).
        audio: Mono int16 PCM.
        sample_rate: Hz.

    """

    wall_s: float
    audio: np.ndarray
    sample_rate: int


@dataclass
class ConversationTurn:
    """One answer of the agent and the user speech it answers.

    Attributes:
        index: 1-based position in the conversation.
        user_text: The user's final transcripts since the previous answer, joined.
        reply_text: What the LLM answered (streamed text, joined).
        complete: The LLM finished the answer (``LLMFullResponseEndFrame``).
        interrupted: An interruption arrived before the answer ended.
        errors: Errors pushed while the answer ran (an LLM server that failed, say).
        audio: The answer's speech, in order.

    """

    index: int
    user_text: str
    reply_text: str = ""
    complete: bool = False
    interrupted: bool = False
    errors: list[str] = field(default_factory=list)
    audio: list[BotAudio] = field(default_factory=list)

    @property
    def spoken_s(self) -> float:
        """Seconds of speech the TTS produced for the answer."""
        return sum(len(a.audio) / a.sample_rate for a in self.audio)


class ConversationLog(BaseObserver):
    """Records each user turn and the agent's answer to it (see the module docstring).

    Args:
        speaks: The agent has a TTS: an answer with no audio counts as unanswered.
        on_answer: Called with each turn when its answer ends (complete, interrupted or failed).

    """

    def __init__(
        self, *, speaks: bool = True, on_answer: Callable[[ConversationTurn], None] | None = None
    ) -> None:
        super().__init__(observe_every_push=False)
        self.speaks = speaks
        self.on_answer = on_answer
        self.turns: list[ConversationTurn] = []
        self._heard: list[str] = []
        self._current: ConversationTurn | None = None

    @property
    def pending_user_text(self) -> str:
        """User speech heard since the last answer began (no answer has started for it yet)."""
        return " ".join(self._heard)

    async def on_push_frame(self, data: FramePushed) -> None:
        """Record transcripts, answers, errors, interruptions and the answers' audio."""
        frame = data.frame
        if isinstance(frame, TranscriptionFrame):
            if frame.text.strip():
                self._heard.append(frame.text.strip())
        elif isinstance(frame, LLMFullResponseStartFrame):
            self._end_answer()
            self._current = ConversationTurn(len(self.turns) + 1, " ".join(self._heard))
            self._heard = []
            self.turns.append(self._current)
        elif isinstance(frame, LLMTextFrame) and self._current is not None:
            self._current.reply_text += frame.text
        elif isinstance(frame, LLMFullResponseEndFrame) and self._current is not None:
            self._current.complete = True
            self._end_answer()
        elif isinstance(frame, TTSAudioRawFrame) and self.turns:
            # The audio of an answer trails its text: it belongs to the latest answer.
            pcm = np.frombuffer(frame.audio, dtype=np.int16)
            if frame.num_channels > 1:
                pcm = pcm[:: frame.num_channels]
            self.turns[-1].audio.append(BotAudio(time.time(), pcm.copy(), frame.sample_rate))
        elif isinstance(frame, InterruptionFrame) and self._current is not None:
            self._current.interrupted = True
            self._end_answer()
        elif isinstance(frame, ErrorFrame) and self.turns:
            self.turns[-1].errors.append(str(frame.error))

    def _end_answer(self) -> None:
        turn, self._current = self._current, None
        if turn is not None and self.on_answer is not None:
            self.on_answer(turn)

    def unanswered(self) -> list[str]:
        """Why each turn went unanswered, one line each (empty when every user turn got an answer)."""
        problems: list[str] = []
        for turn in self.turns:
            said = f"turn {turn.index} ({turn.user_text!r})"
            if turn.errors:
                problems.append(f"{said}: the LLM failed: {'; '.join(turn.errors)}")
            elif not turn.reply_text.strip() and not turn.interrupted:
                problems.append(f"{said}: the LLM answered no text")
            elif self.speaks and not turn.audio and not turn.interrupted:
                problems.append(f"{said}: the answer {turn.reply_text.strip()!r} produced no audio")
        if self._heard:
            problems.append(f"the user's last words ({self.pending_user_text!r}) got no answer before the end")
        return problems


def _resample(pcm: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Linear-interpolation resampling of int16 mono PCM (a listening copy, not an analysis signal)."""
    if rate == target or len(pcm) == 0:
        return pcm.astype(np.float32)
    n = int(round(len(pcm) * target / rate))
    x = np.linspace(0.0, len(pcm) - 1, n)
    return np.interp(x, np.arange(len(pcm)), pcm.astype(np.float32))


def write_conversation_wav(
    path: str | Path,
    user_audio: np.ndarray,
    user_rate: int,
    user_start_s: float,
    turns: Sequence[ConversationTurn],
    *,
    sample_rate: int = 16000,
) -> Path:
    """Mix both sides onto one timeline and write a mono 16-bit WAV.

    The user's audio starts at ``user_start_s`` (the wall time it began to stream); each answer's audio plays from
    when it reached the pipeline, after the answer's previous piece (an output transport plays it at real time).

    Args:
        path: The WAV to write (folders are created).
        user_audio: The user's mono int16 PCM, as streamed.
        user_rate: Its sample rate, Hz.
        user_start_s: When it began to stream, Unix seconds.
        turns: The conversation's turns (:attr:`ConversationLog.turns`).
        sample_rate: The WAV's rate, Hz.

    Returns:
        The written path.

    """
    user = _resample(np.asarray(user_audio), user_rate, sample_rate)
    pieces: list[tuple[int, np.ndarray]] = []
    for turn in turns:
        cursor = 0
        for piece in turn.audio:
            start = max(cursor, int(round((piece.wall_s - user_start_s) * sample_rate)))
            samples = _resample(piece.audio, piece.sample_rate, sample_rate)
            pieces.append((start, samples))
            cursor = start + len(samples)
    length = max([len(user)] + [start + len(samples) for start, samples in pieces])
    mix = np.zeros(length, dtype=np.float32)
    mix[: len(user)] += user
    for start, samples in pieces:
        mix[start : start + len(samples)] += samples
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(out), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate)
        wav.writeframes(np.clip(mix, -32768, 32767).astype(np.int16).tobytes())
    return out
