"""The eager end of turn gated by the transcript (``turn_end="text"``), in the in-process STT with the tiny model.

A question with a pause inside it ("what is nine ... plus four please", its two halves spoken by espeak-ng):
today's eager end of turn predicts the end at the pause (a number is no hold word) and must withdraw it; with the
``"text"`` commit the words so far ("What is nine", cased with no mark: a punctuating model's unfinished sentence)
are no complete sentence, so it predicts only at the end.
"""

from __future__ import annotations

import pytest
from helpers import Until, WatchedSTTService, of, paused_turn, run_steps, to_pcm16
from pipecat.frames.frames import (
    EagerEndOfTurnCancelFrame,
    EagerTranscriptionFrame,
    ProposedUserStoppedSpeakingFrame,
    TranscriptionFrame,
)
from word_clips import spoken_word

from pipecat_nemotron.agent.turn_end import TextVerdict, TurnEndLog, turn_commit_for
from pipecat_nemotron.asr import NemotronEngine
from pipecat_nemotron.stt import EagerSettings
from pipecat_nemotron.stt.eager import HOLD_WORDS, TurnCommit, pause_held_by

pytestmark = pytest.mark.asyncio(loop_scope="module")

VOICE = "en-us+aunty"  # a training voice of the tiny model


def _words(text: str, seed: int) -> bytes:
    """``text`` spoken in one go by espeak-ng (16 kHz int16; ``seed`` sets the level, -12..-3 dBFS peak)."""
    audio = spoken_word(text, VOICE)
    peak_db = -3.0 - 9.0 * ((seed * 0.37) % 1.0)
    return to_pcm16(audio * 10 ** (peak_db / 20) / max(float(abs(audio).max()), 1e-9))


async def _eager_run(stt: WatchedSTTService) -> tuple[list, list, list]:
    # A pause after "nine" (no hold word): the question visibly goes on, and a punctuating model writes no mark yet.
    steps = paused_turn(stt, _words("what is nine", 3), resume=_words("plus four please", 4))
    down, _ = await run_steps(stt, steps)
    return of(down, EagerTranscriptionFrame), of(down, EagerEndOfTurnCancelFrame), of(down, TranscriptionFrame)


async def test_text_gate_cancels_fewer_predictions_on_a_paused_sentence(engine: NemotronEngine) -> None:  # noqa: F811
    today = WatchedSTTService(engine=engine, eager=EagerSettings())
    predictions, cancels, finals = await _eager_run(today)
    # Today: a prediction at the pause inside the sentence, withdrawn when the user goes on.
    assert len(predictions) == 2 and len(cancels) == 1, ([p.text for p in predictions], [f.text for f in finals])

    log = TurnEndLog()
    gated = WatchedSTTService(
        engine=engine, eager=EagerSettings(turn_commit=turn_commit_for("text", log=log))
    )
    predictions, cancels, finals = await _eager_run(gated)
    assert len(cancels) < 1 and len(predictions) == 1, [p.text for p in predictions]
    # The one prediction is the whole sentence, kept: the committed final matches it, committed by the words.
    (final,) = finals
    assert predictions[0].text == final.text and final.text.rstrip(".?!").endswith("please")
    commits = [d for _, d in log.decisions if d.commit]
    assert commits and commits[0].by == "text" and commits[0].verdict is TextVerdict.COMPLETE


async def test_text_commit_holds_after_a_trailing_preposition(engine: NemotronEngine) -> None:  # noqa: F811
    # The VAD stops after "set a timer for": the final is in, but the words say the user is not done.
    log = TurnEndLog()
    stt = WatchedSTTService(
        engine=engine, eager=EagerSettings(turn_commit=turn_commit_for("text", log=log))
    )
    steps = [
        *paused_turn(stt, _words("set a timer for", 5), commits=False),
        Until("the commit's decision on the final", lambda *_: bool(log.decisions)),
    ]
    down, _ = await run_steps(stt, steps)
    (final,) = of(down, TranscriptionFrame)
    assert final.text.endswith("for"), final.text
    assert stt.peeks == 1 and not of(down, EagerTranscriptionFrame)  # the pause was peeked at: no prediction
    decisions = [d for _, d in log.decisions]
    assert decisions[0].commit is False and decisions[0].verdict is TextVerdict.CONTINUES
    # Only the session's end (no speech) proposes a turn stop, not the held final.
    assert len(of(down, ProposedUserStoppedSpeakingFrame)) <= 1



def test_a_pause_before_any_word_or_after_a_held_one_predicts_nothing() -> None:
    """The eager peek's decision: no word yet (a peek right after a final), a hold word, or words the text commit
    reads as going on hold the prediction and say why; a complete sentence predicts."""
    text_commit = turn_commit_for("text")
    assert pause_held_by("", HOLD_WORDS, text_commit) == "before any word"
    assert pause_held_by("  ", HOLD_WORDS, TurnCommit()) == "before any word"
    assert pause_held_by("Set a timer for", HOLD_WORDS, TurnCommit()) == "after 'for'"
    assert pause_held_by("Hi. Set a timer for.", frozenset(), text_commit) == "after 'for.'"
    assert pause_held_by("my number is four", HOLD_WORDS, text_commit) == "after 'four'"  # no telling: held
    assert pause_held_by("my number is four", HOLD_WORDS, TurnCommit()) is None
    assert pause_held_by("What is nine plus four?", HOLD_WORDS, text_commit) is None
