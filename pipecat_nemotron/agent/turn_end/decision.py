"""The end-of-turn decision at a VAD stop, from the transcript's verdict and the turn analyzer's, and its record."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

from pipecat.audio.turn.base_turn_analyzer import BaseTurnAnalyzer, BaseTurnParams, EndOfTurnState

from pipecat_nemotron.agent.turn_end.rules import TextVerdict

__all__ = [
    "EOU_TURN_END_MODES",
    "TURN_END_MODES",
    "CommittedBy",
    "TurnEndDecision",
    "TurnEndLog",
    "TurnEndMode",
    "VADStopAnalyzer",
    "decide",
    "validate_turn_end",
]

#: How a VAD stop becomes the end of the user's turn: Pipecat's Smart Turn (the audio), every VAD stop, the
#: transcript read together with Smart Turn, the recogniser's own end of utterance (``<EOU>``), or ``<EOU>`` with
#: Smart Turn deciding when it has not come by the final.
TurnEndMode = Literal["smart", "vad", "text", "eou", "eou_smart"]

#: The modes that need a model that emits ``<EOU>`` (the STT owns turn detection in them).
EOU_TURN_END_MODES: tuple[str, ...] = ("eou", "eou_smart")
TURN_END_MODES: tuple[str, ...] = get_args(TurnEndMode)

#: What committed a turn: the transcript's words, Smart Turn's verdict at the VAD stop, the VAD stop alone, the
#: model's ``<EOU>``, or the fallback silence after a turn held open (Smart Turn's ``stop_secs``).
CommittedBy = Literal["text", "smart", "vad", "eou", "timeout"]


def validate_turn_end(mode: str) -> TurnEndMode:
    """``mode`` if it is one of :data:`TURN_END_MODES`; else a ``ValueError`` naming them."""
    if mode not in TURN_END_MODES:
        raise ValueError(f"turn_end must be one of {list(TURN_END_MODES)}, got {mode!r}")
    return mode  # type: ignore[return-value]


@dataclass(frozen=True)
class TurnEndDecision:
    """One decision at a VAD stop (or at the end of a hold).

    Attributes:
        commit: The turn ends now (False: held open).
        by: What decided (:data:`CommittedBy`).
        verdict: The transcript's verdict (None: the words were not read).
        smart_complete: The turn analyzer's verdict at the VAD stop (None: no analyzer, or not asked).

    """

    commit: bool
    by: CommittedBy
    verdict: TextVerdict | None = None
    smart_complete: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (``verdict`` as its value)."""
        return asdict(self) | {"verdict": self.verdict.value if self.verdict else None}


def decide(verdict: TextVerdict | None, smart_complete: bool | None) -> TurnEndDecision:
    """Combine the transcript and the analyzer at a VAD stop.

    A complete sentence commits at once and visibly continuing text holds, whatever the analyzer says; otherwise
    the analyzer decides (no analyzer: the VAD stop commits).

    Args:
        verdict: The transcript's verdict; None when the words are not read (``"smart"``, ``"vad"``).
        smart_complete: The analyzer's verdict; None without an analyzer.

    """
    if verdict is TextVerdict.COMPLETE:
        return TurnEndDecision(True, "text", verdict, smart_complete)
    if verdict is TextVerdict.CONTINUES:
        return TurnEndDecision(False, "text", verdict, smart_complete)
    if smart_complete is None:
        return TurnEndDecision(True, "vad", verdict, None)
    return TurnEndDecision(smart_complete, "smart", verdict, smart_complete)


class TurnEndLog:
    """The decisions of one session, newest last (the latest ``maxlen`` kept), with an optional listener.

    Args:
        maxlen: Decisions kept.
        on_decision: Called with every decision as it is made.

    """

    def __init__(self, maxlen: int = 256, on_decision: Callable[[TurnEndDecision], None] | None = None) -> None:
        self.decisions: deque[tuple[float, TurnEndDecision]] = deque(maxlen=maxlen)
        self.on_decision = on_decision

    def add(self, decision: TurnEndDecision) -> None:
        """Record a decision (with its ``time.time()``)."""
        self.decisions.append((time.time(), decision))
        if self.on_decision is not None:
            self.on_decision(decision)

    @property
    def last_commit(self) -> TurnEndDecision | None:
        """The latest decision that committed a turn."""
        return next((d for _, d in reversed(self.decisions) if d.commit), None)


class VADStopAnalyzer(BaseTurnAnalyzer):
    """A turn analyzer that calls every VAD stop complete: the ``"vad"`` mode on Pipecat's analyzer strategy."""

    @property
    def speech_triggered(self) -> bool:
        """Never waiting on speech of its own."""
        return False

    @property
    def params(self) -> BaseTurnParams:
        """No parameters."""
        return BaseTurnParams()

    def append_audio(self, buffer: bytes, is_speech: bool) -> EndOfTurnState:
        """Audio changes nothing: the VAD stop decides."""
        return EndOfTurnState.INCOMPLETE

    async def analyze_end_of_turn(self) -> tuple[EndOfTurnState, None]:
        """Every VAD stop ends the turn."""
        return EndOfTurnState.COMPLETE, None

    def clear(self) -> None:
        """Nothing to clear."""
