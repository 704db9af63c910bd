"""End of turn decided by the audio and the transcript together (``turn_end="smart" | "vad" | "text"``).

- ``"smart"``: Pipecat's default, Smart Turn v3 on the audio; a turn it calls incomplete waits for its 3 s
  fallback silence.
- ``"vad"``: every VAD stop ends the turn.
- ``"eou"``: the recogniser's own end of utterance (a model that emits ``<EOU>``) ends the turn; the STT owns turn
  detection, and a turn whose ``<EOU>`` never comes ends after the fallback silence (3 s).
- ``"eou_smart"``: as ``"eou"``, and when no ``<EOU>`` has come by the VAD stop's final, Smart Turn decides.
- ``"text"``: at the VAD stop the turn's final words are read (:mod:`pipecat_nemotron.agent.turn_end.rules`, per
  language): a complete sentence commits at once, visibly continuing text holds even when Smart Turn calls the
  turn complete, and otherwise Smart Turn decides. With the eager end of turn on, the same reading gates the
  predictions.

See :mod:`pipecat_nemotron.agent.turn_end.strategy` for where each runs, and ``docs/ARCHITECTURE.md`` (Turn ends).
"""

from pipecat_nemotron.agent.turn_end.decision import (
    EOU_TURN_END_MODES,
    TURN_END_MODES,
    CommittedBy,
    TurnEndDecision,
    TurnEndLog,
    TurnEndMode,
    VADStopAnalyzer,
    decide,
    validate_turn_end,
)
from pipecat_nemotron.agent.turn_end.rules import RULES, TextVerdict, TurnEndRules, rules_for
from pipecat_nemotron.agent.turn_end.strategy import (
    DEFAULT_EOU_WAIT_S,
    EouTurnCommit,
    TextTurnCommit,
    TranscriptTurnStopStrategy,
    smart_turn_analyzer,
    turn_commit_for,
    user_turn_strategies_for,
)

__all__ = [
    "DEFAULT_EOU_WAIT_S",
    "EOU_TURN_END_MODES",
    "RULES",
    "EouTurnCommit",
    "TURN_END_MODES",
    "CommittedBy",
    "TextTurnCommit",
    "TextVerdict",
    "TranscriptTurnStopStrategy",
    "TurnEndDecision",
    "TurnEndLog",
    "TurnEndMode",
    "TurnEndRules",
    "VADStopAnalyzer",
    "decide",
    "rules_for",
    "smart_turn_analyzer",
    "turn_commit_for",
    "user_turn_strategies_for",
    "validate_turn_end",
]
