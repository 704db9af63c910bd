"""End of turn read from the transcript (``turn_end="text"``): the rules, the decision, and both places it runs.

The rules and :func:`decide` on unit cases (English and Spanish, punctuated as the real models write and lower case
as the tiny ones do); the user-aggregator strategy in Pipecat's ``LLMUserAggregator`` with a turn analyzer whose
verdict the test sets (Smart Turn complete / incomplete), fed the frames a VAD and a finalizing STT send.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from helpers import FLUSH, Then, Until, run_steps
from pipecat.audio.turn.base_turn_analyzer import BaseTurnAnalyzer, BaseTurnParams, EndOfTurnState
from pipecat.frames.frames import (
    InputAudioRawFrame,
    TranscriptionFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.transcriptions.language import Language

from pipecat_nemotron.agent.turn_end import (
    RULES,
    TextVerdict,
    TurnEndDecision,
    TurnEndLog,
    decide,
    rules_for,
    turn_commit_for,
    user_turn_strategies_for,
)

EN, ES = RULES["en"], RULES["es"]


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        # A complete question, as the real model writes it and as the tiny model does.
        ("What is nine plus four?", TextVerdict.COMPLETE),
        ("hello what is four times six", TextVerdict.COMPLETE),
        ("Set a timer for six minutes.", TextVerdict.COMPLETE),
        ("hi set a timer for eight minutes thanks", TextVerdict.COMPLETE),
        ("Where are you from?", TextVerdict.COMPLETE),  # punctuated: a preposition may end a question
        # A pause mid-clause.
        ("set a timer for", TextVerdict.CONTINUES),
        ("what is nine plus", TextVerdict.CONTINUES),
        ("Set a timer for", TextVerdict.CONTINUES),
        # Trailing "and", trailing comma: continues even with a full stop before.
        ("what is the weather and", TextVerdict.CONTINUES),
        ("What is the weather, and", TextVerdict.CONTINUES),
        ("Hi. Set a timer,", TextVerdict.CONTINUES),
        ("What is the weather and?", TextVerdict.CONTINUES),
        # A punctuating model's full stop at a pause after a word no statement ends on; a question may.
        ("Hi. Set a timer for.", TextVerdict.CONTINUES),
        ("What is nine plus.", TextVerdict.CONTINUES),
        ("What is it for?", TextVerdict.COMPLETE),
        ("Log me in.", TextVerdict.COMPLETE),
        # No telling: the audio decides.
        ("my number is four three nine", TextVerdict.UNKNOWN),
        ("what is the weather", TextVerdict.UNKNOWN),  # short of min_words
        ("Set a timer", TextVerdict.UNKNOWN),  # punctuating model, no mark at the end
        # A cased model writes its marks: none yet is no sentence end, though lower case would read complete.
        ("Set a timer for six", TextVerdict.UNKNOWN),
        ("set a timer for six", TextVerdict.COMPLETE),
        ("Hi set a timer for eight minutes thanks", TextVerdict.UNKNOWN),
        ("", TextVerdict.UNKNOWN),
    ],
)
def test_english_rules(text: str, verdict: TextVerdict) -> None:
    assert EN.verdict(text) is verdict


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("¿Qué hora es?", TextVerdict.COMPLETE),
        ("Pon un temporizador de cinco minutos.", TextVerdict.COMPLETE),
        ("dime la hora por favor", TextVerdict.COMPLETE),  # the tiny bilingual model: folded, unpunctuated
        ("cuanto es dos mas tres", TextVerdict.COMPLETE),
        ("pon un temporizador de", TextVerdict.CONTINUES),
        ("cuanto es dos mas", TextVerdict.CONTINUES),
        ("Quiero un café y", TextVerdict.CONTINUES),
        ("Hola, pon la", TextVerdict.CONTINUES),
        ("Pon un temporizador de.", TextVerdict.CONTINUES),
        ("¿Cuánto es dos más tres?", TextVerdict.COMPLETE),
        ("mi numero es cuatro tres", TextVerdict.UNKNOWN),
        ("Dime la hora por favor", TextVerdict.UNKNOWN),  # cased, so punctuating: no "." yet
    ],
)
def test_spanish_rules(text: str, verdict: TextVerdict) -> None:
    assert ES.verdict(text) is verdict


def test_rules_are_chosen_by_the_transcripts_language() -> None:
    assert rules_for(Language.ES_ES) is ES and rules_for("es") is ES and rules_for("es-419") is ES
    assert rules_for(Language.EN_US) is EN and rules_for(None) is EN and rules_for("de") is EN
    assert rules_for(None, default="es") is ES


def test_decide_combines_the_words_and_smart_turn() -> None:
    # A complete sentence commits at once, even when Smart Turn calls the turn incomplete.
    assert decide(TextVerdict.COMPLETE, False) == TurnEndDecision(True, "text", TextVerdict.COMPLETE, False)
    # Text that visibly continues holds, even when Smart Turn calls it complete.
    assert decide(TextVerdict.CONTINUES, True) == TurnEndDecision(False, "text", TextVerdict.CONTINUES, True)
    # Otherwise Smart Turn decides; without an analyzer, the VAD stop.
    assert decide(TextVerdict.UNKNOWN, True).commit and decide(TextVerdict.UNKNOWN, True).by == "smart"
    assert not decide(TextVerdict.UNKNOWN, False).commit and decide(None, False).by == "smart"
    assert decide(None, None) == TurnEndDecision(True, "vad")


def test_modes_are_validated() -> None:
    with pytest.raises(ValueError, match=r"turn_end must be one of \['smart', 'vad', 'text', 'eou', 'eou_smart'\]"):
        user_turn_strategies_for("words")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="turn_end must be one of"):
        turn_commit_for("audio")  # type: ignore[arg-type]


# ---- the user-aggregator strategy ------------------------------------------------------------------------------


class FixedAnalyzer(BaseTurnAnalyzer):
    """Pipecat's analyzer interface with a verdict the test sets; completes after ``stop_ms`` of silence."""

    def __init__(self, complete: bool, stop_ms: float = 600.0) -> None:
        super().__init__()
        self.complete = complete
        self.stop_ms = stop_ms
        self._silence_ms = 0.0
        self._speech = False

    @property
    def speech_triggered(self) -> bool:
        return self._speech

    @property
    def params(self) -> BaseTurnParams:
        return BaseTurnParams()

    def append_audio(self, buffer: bytes, is_speech: bool) -> EndOfTurnState:
        if is_speech:
            self._speech, self._silence_ms = True, 0.0
            return EndOfTurnState.INCOMPLETE
        if self._speech:
            self._silence_ms += len(buffer) / 32
            if self._silence_ms >= self.stop_ms:
                self._speech = False
                return EndOfTurnState.COMPLETE
        return EndOfTurnState.INCOMPLETE

    async def analyze_end_of_turn(self) -> tuple[EndOfTurnState, None]:
        if self.complete:
            self._speech = False
        return (EndOfTurnState.COMPLETE if self.complete else EndOfTurnState.INCOMPLETE), None

    def clear(self) -> None:
        self._speech, self._silence_ms = False, 0.0


class SlowAnalyzer(FixedAnalyzer):
    """A :class:`FixedAnalyzer` whose verdict (Smart Turn's inference) comes only once the test calls :meth:`answer`,
    or fails then; without ``answers`` it never comes.

    :func:`_turn` answers after the transcript and the silence have been handled: the verdict comes later than
    everything else in the turn, on every machine.
    """

    def __init__(self, complete: bool, answers: bool = True, fail: bool = False) -> None:
        super().__init__(complete)
        self.answers, self.fail = answers, fail
        self.asked = 0
        self._answer = asyncio.Event()

    async def analyze_end_of_turn(self) -> tuple[EndOfTurnState, None]:
        self.asked += 1
        await self._answer.wait()
        if self.fail:
            raise RuntimeError("turn model crashed")
        return await super().analyze_end_of_turn()

    def answer(self) -> None:
        self._answer.set()


def _audio(seconds: float) -> list[InputAudioRawFrame]:
    return [InputAudioRawFrame(b"\0\0" * 320, 16000, 1) for _ in range(int(seconds / 0.02))]


def _user_aggregator(
    mode: str, analyzer: BaseTurnAnalyzer, log: TurnEndLog, stops: list[object]
) -> object:
    """Pipecat's user aggregator with the ``mode`` strategies; each committed turn appends its strategy to ``stops``."""
    strategies = user_turn_strategies_for(mode, analyzer=analyzer, log=log)  # type: ignore[arg-type]
    user = LLMContextAggregatorPair(
        LLMContext(), user_params=LLMUserAggregatorParams(user_turn_strategies=strategies)
    ).user()

    @user.event_handler("on_user_turn_stopped")
    async def _stopped(_aggregator: object, strategy: object, _message: object) -> None:
        if strategy is not None:  # None: the aggregation flushed at the end of the session
            stops.append(strategy)

    return user


async def _turn(
    mode: str,
    text: str,
    smart_complete: bool,
    silence_s: float = 0.4,
    language: Language | None = None,
    analyzer: BaseTurnAnalyzer | None = None,
) -> tuple[int, TurnEndLog]:
    """One user turn through Pipecat's user aggregator: (user turns committed within ``silence_s``, the log).

    Driven by events, not sleeps: the transcript is handled before the silence's audio (audio frames are system
    frames: they would overtake it), a :class:`SlowAnalyzer` that answers does so once both are handled (and the
    turn must still be undecided then), and the session ends once the turn's outcome is in the log (and a commit
    reached ``on_user_turn_stopped``).
    """
    log, stops = TurnEndLog(), []
    user = _user_aggregator(mode, analyzer or FixedAnalyzer(smart_complete), log, stops)
    steps: list = [
        VADUserStartedSpeakingFrame(),
        VADUserStoppedSpeakingFrame(stop_secs=0.2),
        TranscriptionFrame(text, "user", "now", language, finalized=True),
        FLUSH,
        *_audio(silence_s),
        FLUSH,
    ]
    if isinstance(analyzer, SlowAnalyzer) and analyzer.answers:

        def answer() -> None:
            assert analyzer.asked == 1 and not log.decisions and not stops, "decided before the verdict"
            analyzer.answer()

        steps.append(Then(answer))

    def settled(_down: list, _up: list) -> bool:
        return bool(log.decisions) and (not log.decisions[-1][1].commit or bool(stops))

    steps.append(Until("the turn's decision", settled))
    await run_steps(user, steps)
    return len(stops), log


async def test_text_commits_a_complete_question_that_smart_turn_holds() -> None:
    committed, log = await _turn("text", "hello what is four times six", smart_complete=False)
    assert committed == 1 and log.last_commit == TurnEndDecision(True, "text", TextVerdict.COMPLETE, False)
    # Smart Turn alone holds the same turn (until its fallback silence, longer than this one).
    committed, log = await _turn("smart", "hello what is four times six", smart_complete=False)
    assert committed == 0 and [d.by for _, d in log.decisions] == ["smart"]


async def test_a_complete_sentence_does_not_wait_for_the_analyzers_inference() -> None:
    # Smart Turn's verdict never comes here: the words commit without it.
    slow = SlowAnalyzer(complete=False, answers=False)
    committed, log = await _turn("text", "What is nine plus four?", smart_complete=False, analyzer=slow)
    assert committed == 1 and log.last_commit == TurnEndDecision(True, "text", TextVerdict.COMPLETE, None)
    # Words that tell nothing wait for the verdict (it comes after the silence here), then it decides.
    slow = SlowAnalyzer(complete=True)
    committed, log = await _turn("text", "my number is four three nine", smart_complete=True, silence_s=0.8, analyzer=slow)
    assert committed == 1 and [d for _, d in log.decisions] == [TurnEndDecision(True, "smart", TextVerdict.UNKNOWN, True)]
    # A hold by the words also waits for it (the record keeps both verdicts).
    slow = SlowAnalyzer(complete=True)
    committed, log = await _turn("text", "set a timer for", smart_complete=True, silence_s=0.8, analyzer=slow)
    assert committed == 0 and [d for _, d in log.decisions] == [TurnEndDecision(False, "text", TextVerdict.CONTINUES, True)]


async def test_an_analyzer_that_fails_leaves_the_vad_stop_to_decide() -> None:
    broken = SlowAnalyzer(complete=False, fail=True)
    committed, log = await _turn("text", "my number is four three nine", smart_complete=False, analyzer=broken)
    assert committed == 1 and [d for _, d in log.decisions] == [TurnEndDecision(True, "vad", TextVerdict.UNKNOWN, None)]


async def test_text_holds_a_mid_clause_pause_that_smart_turn_calls_complete() -> None:
    committed, log = await _turn("text", "set a timer for", smart_complete=True)
    assert committed == 0 and log.last_commit is None
    assert [d for _, d in log.decisions] == [TurnEndDecision(False, "text", TextVerdict.CONTINUES, True)]
    committed, _ = await _turn("smart", "set a timer for", smart_complete=True)
    assert committed == 1


async def test_a_held_turn_ends_after_the_fallback_silence() -> None:
    # Trailing "and", Smart Turn complete: held, then the analyzer's fallback silence (3 s by default) ends it.
    committed, log = await _turn("text", "what is the weather and", smart_complete=True, silence_s=3.2)
    assert committed == 1 and [d.by for _, d in log.decisions] == ["text", "timeout"]


async def test_when_the_words_tell_nothing_smart_turn_decides() -> None:
    committed, log = await _turn("text", "my number is four three nine", smart_complete=True)
    assert committed == 1 and log.last_commit is not None and log.last_commit.by == "smart"
    committed, _ = await _turn("text", "my number is four three nine", smart_complete=False)
    assert committed == 0


async def test_vad_mode_commits_every_vad_stop() -> None:
    committed, log = await _turn("vad", "set a timer for", smart_complete=False)
    assert committed == 1 and log.last_commit == TurnEndDecision(True, "vad")


async def test_a_spanish_transcript_is_read_with_the_spanish_rules() -> None:
    # No language on the frame: the English rules, which do not know "de"; Smart Turn's verdict stands.
    committed, _ = await _turn("text", "pon un temporizador de", smart_complete=True)
    assert committed == 1
    committed, log = await _turn("text", "pon un temporizador de", smart_complete=True, language=Language.ES_ES)
    assert committed == 0 and [d.verdict for _, d in log.decisions] == [TextVerdict.CONTINUES]


# ---- configuration -------------------------------------------------------------------------------------------


def test_agent_settings_and_build_voice_agent_take_the_mode(tmp_path: Path) -> None:
    from pipecat.processors.aggregators.llm_response_universal import LLMUserAggregator

    from pipecat_nemotron.agent.assembly import AgentSettings, build_voice_agent
    from pipecat_nemotron.agent.turn_end import TextTurnCommit, TranscriptTurnStopStrategy
    from pipecat_nemotron.llm.service import create_nemotron_llm

    assert AgentSettings.from_env({"NEMOTRON_TURN_END": "Text"}).turn_end == "text"
    assert AgentSettings.from_env({}).turn_end is None
    with pytest.raises(ValueError, match="NEMOTRON_TURN_END must be one of"):
        AgentSettings.from_env({"NEMOTRON_TURN_END": "words"})
    model = str(tmp_path / "absent.nemo")  # services are built, never started
    settings = AgentSettings(asr_model=model, asr_device="cpu", turn_end="text")
    llm = create_nemotron_llm(base_url="http://127.0.0.1:9/v1")  # never called
    agent = build_voice_agent(stt=settings.create_stt(), llm=llm, turn_end="text")
    (user,) = [p for p in agent.processors if isinstance(p, LLMUserAggregator)]
    stops = user._params.user_turn_strategies.stop
    assert [type(s) for s in stops] == [TranscriptTurnStopStrategy] and agent.turn_end_log is not None
    # Eager end of turn: the STT commits, with the same decision.
    eager = AgentSettings(asr_model=model, asr_device="cpu", asr_eager_end_of_turn=True, turn_end="text")
    stt = eager.create_stt()
    assert isinstance(stt.turn_commit, TextTurnCommit) and stt.turn_commit.mode == "text"
    agent = build_voice_agent(stt=stt, turn_end="text")
    assert agent.turn_end_log is stt.turn_commit.log is not None
    with pytest.raises(ValueError, match=r"turn_commit=turn_commit_for\('smart'\)"):
        build_voice_agent(stt=eager.create_stt(), turn_end="smart")


def test_bench_turns_counts_a_cut_inside_an_utterance_as_premature() -> None:
    from pipecat_nemotron.bench.turns import Utterance, premature

    utterances = [Utterance(1.0, 3.0, True, "a"), Utterance(8.0, 9.5, False, "b")]
    # A turn ended at a VAD stop at 2.0 s (inside the first utterance) and one at its very end; none in the second.
    assert premature(utterances, [2.0, 2.95, 9.6]) == [True, False]
    assert premature(utterances, []) == [False, False]


# ---- the STT's commit (eager end of turn on) -------------------------------------------------------------------


async def test_stt_commit_reads_the_words_and_every_hold_ends() -> None:
    log = TurnEndLog()
    commit = turn_commit_for("text", analyzer=FixedAnalyzer(True, stop_ms=1e9), log=log)
    commit.start(16000)
    silence = b"\0\0" * 320  # 20 ms
    # A complete question commits at the VAD stop; a pause before it predicts, one mid-clause does not.
    assert not commit.holds_prediction("what is nine plus four") and commit.holds_prediction("set a timer for")
    commit.on_vad_stop()
    assert await commit.complete("what is nine plus four") is True
    # Smart Turn calls the stop complete, the words hold it; the user goes on: the hold ends, no commit.
    commit.on_speech_start(0.2)
    commit.on_vad_stop()
    assert await commit.complete("set a timer for") is False
    commit.on_speech_start(0.2)
    assert not any(commit.on_audio(silence, speaking=False) for _ in range(200))
    # Held again and the user says nothing more: committed after Smart Turn's fallback silence (3 s less the VAD's).
    commit.on_vad_stop()
    assert await commit.complete("set a timer for") is False
    ended = [commit.on_audio(silence, speaking=False) for _ in range(150)]
    assert ended.index(True) + 1 == 140  # 2.8 s of 20 ms frames
    assert [d.by for _, d in log.decisions] == ["text", "text", "text", "timeout"]
    # The words of a held turn count with the next final's: "set a timer for" + "six minutes" reads complete.
    commit.on_speech_start(0.2)
    commit.on_vad_stop()
    assert await commit.complete("set a timer for") is False
    commit.on_speech_start(0.2)
    commit.on_vad_stop()
    assert await commit.complete("six minutes please") is True and log.last_commit.by == "text"
