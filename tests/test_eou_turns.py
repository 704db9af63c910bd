"""The recogniser's own end of turn (``turn_end="eou"`` / ``"eou_smart"``): the commit, the settings, the errors.

:class:`~pipecat_nemotron.agent.turn_end.EouTurnCommit` on its own (the events a service feeds it: finals, ``<EOU>``,
words, speech, audio), then where a model without ``<EOU>`` is refused (the service, the agent settings, the agent),
and the protocol's ``eou`` feature on the wire. The turn ended by a trained model's ``<EOU>`` in a Pipecat pipeline,
in process and through the server, is in ``tests/test_tiny_eou_model.py``.
"""

from __future__ import annotations

import pytest
from pipecat.audio.turn.base_turn_analyzer import BaseTurnAnalyzer, BaseTurnParams, EndOfTurnState
from pipecat.turns.user_turn_strategies import ExternalUserTurnStrategies

from pipecat_nemotron.agent.assembly import build_voice_agent
from pipecat_nemotron.agent.settings import AgentSettings
from pipecat_nemotron.agent.turn_end import (
    EouTurnCommit,
    TurnEndLog,
    turn_commit_for,
    user_turn_strategies_for,
)
from pipecat_nemotron.asr.eou import EOU_PIECE, nemo_file_has_eou
from pipecat_nemotron.asr.errors import EndOfUtteranceUnavailableError
from pipecat_nemotron.models import TINY_EOU_MODEL_PATH, TINY_MODEL_PATH
from pipecat_nemotron.server.protocol import (
    EOU_FEATURE,
    ConfigMessage,
    EouMessage,
    dump_server_message,
    parse_client_message,
    parse_server_message,
)
from pipecat_nemotron.stt import EagerSettings, NemotronSTTService

#: 20 ms of 16 kHz silence (16-bit mono).
FRAME = bytes(640)


class FixedAnalyzer(BaseTurnAnalyzer):
    """A turn analyzer whose verdict the test sets (Smart Turn's place in ``"eou_smart"``)."""

    def __init__(self, complete: bool) -> None:
        super().__init__()
        self.complete = complete

    @property
    def speech_triggered(self) -> bool:
        """Never waiting on speech of its own."""
        return False

    @property
    def params(self) -> BaseTurnParams:
        """No ``stop_secs``: the hold falls back after 3 s, Smart Turn's."""
        return BaseTurnParams()

    def append_audio(self, buffer: bytes, is_speech: bool) -> EndOfTurnState:
        """Audio decides nothing here."""
        return EndOfTurnState.INCOMPLETE

    async def analyze_end_of_turn(self) -> tuple[EndOfTurnState, None]:
        """The verdict set by the test."""
        return (EndOfTurnState.COMPLETE if self.complete else EndOfTurnState.INCOMPLETE), None

    def clear(self) -> None:
        """Nothing to clear."""


def _commit(analyzer: BaseTurnAnalyzer | None = None) -> tuple[EouTurnCommit, TurnEndLog]:
    log = TurnEndLog()
    commit = turn_commit_for("eou_smart" if analyzer is not None else "eou", analyzer=analyzer, log=log)
    assert isinstance(commit, EouTurnCommit) and commit.wants_eou
    commit.start(16000)
    return commit, log


async def test_an_eou_after_the_words_commits_the_turn_at_its_final() -> None:
    commit, log = _commit()
    commit.on_speech_start(0.2)
    commit.on_words()
    assert commit.holds_prediction("What time is it?")  # no <EOU> yet: a pause predicts nothing
    assert commit.on_eou() is False  # nothing held yet: it only marks the utterance ended
    assert not commit.holds_prediction("What time is it?")
    commit.on_vad_stop()
    assert await commit.complete("What time is it?")
    assert [(d.commit, d.by) for _, d in log.decisions] == [(True, "eou")]


async def test_without_an_eou_the_turn_holds_until_the_model_says_so() -> None:
    commit, log = _commit()
    commit.on_speech_start(0.2)
    commit.on_eou()
    commit.on_words()  # words after the <EOU>: the user went on, it ended nothing
    commit.on_vad_stop()
    assert not await commit.complete("Set a timer for")
    assert commit.on_eou() is True  # the model now says the utterance ended: the held turn commits
    assert [(d.commit, d.by) for _, d in log.decisions] == [(False, "eou"), (True, "eou")]
    assert commit.on_eou() is False  # committed once


async def test_an_eou_after_a_held_final_commits_at_the_final_of_what_came_since() -> None:
    """The model needed more audio than the wait: its <EOU> (and the "?" it wrote with it) come after a held final.

    The STT finalizes the open utterance then (``final_follows``); that final, the turn's last words, commits it,
    so Pipecat's aggregator, which waits for a final after an interim, ends the turn with the whole text.
    """
    commit, log = _commit()
    commit.on_speech_start(0.2)
    commit.on_vad_stop()
    assert not await commit.complete("Is it Thursday today")
    assert commit.held
    commit.on_words()  # the interim "?" of the next segment
    assert commit.on_eou(final_follows=True) is False  # not here: at the final that follows
    assert commit.held
    assert await commit.complete("?")
    assert not commit.held
    assert [(d.commit, d.by) for _, d in log.decisions] == [(False, "eou"), (True, "eou")]


async def test_an_eou_that_never_comes_ends_the_turn_after_the_fallback_silence() -> None:
    commit, log = _commit()
    commit.on_speech_start(0.2)
    commit.on_vad_stop()
    assert not await commit.complete("What is nine")
    # 3 s of fallback from the speech end, 0.2 s of it already gone at the VAD stop: 2.8 s of silence frames.
    frames = 0
    while not commit.on_audio(FRAME, speaking=False):
        frames += 1
        assert frames < 1000, "a held turn must end"
    assert frames + 1 == 140  # 2.8 s of 20 ms frames
    # (The session's end finalizes the words the random model wrote on the silence: a third decision.)
    assert [(d.commit, d.by) for _, d in log.decisions][:2] == [(False, "eou"), (True, "timeout")]


async def test_speech_ends_a_hold_and_the_turn_goes_on() -> None:
    commit, log = _commit()
    commit.on_vad_stop()
    assert not await commit.complete("What is nine")
    commit.on_speech_start(0.2)  # the user goes on: no fallback counts while the turn continues
    assert not any(commit.on_audio(FRAME, speaking=True) for _ in range(500))
    commit.on_words()
    commit.on_eou()
    commit.on_vad_stop()
    assert await commit.complete("plus four?")
    assert [(d.commit, d.by) for _, d in log.decisions] == [(False, "eou"), (True, "eou")]


@pytest.mark.parametrize("complete", [True, False])
async def test_eou_smart_lets_smart_turn_decide_when_no_eou_came(complete: bool) -> None:
    commit, log = _commit(FixedAnalyzer(complete))
    commit.on_speech_start(0.2)
    commit.on_vad_stop()
    assert await commit.complete("What time is it?") is complete
    assert [(d.commit, d.by, d.smart_complete) for _, d in log.decisions] == [(complete, "smart", complete)]
    if not complete:  # held by Smart Turn: the model's <EOU> still ends it
        assert commit.on_eou() is True
    # With the <EOU> in, Smart Turn is not waited for.
    commit.on_speech_start(0.2)
    commit.on_eou()
    commit.on_vad_stop()
    assert await commit.complete("Thanks.")
    assert log.last_commit is not None and log.last_commit.by == "eou"


@pytest.mark.parametrize("bad", [-0.1, float("inf"), float("nan"), "1"])
def test_the_eou_wait_must_be_a_finite_number_of_seconds(bad) -> None:
    with pytest.raises(ValueError, match="eou_wait_s must be a finite number of seconds >= 0"):
        turn_commit_for("eou", eou_wait_s=bad)


def test_the_eou_modes_wait_for_the_eou_after_a_vad_stop_by_default() -> None:
    """Only the EOU commits wait; the default is the documented one (README, docs/ARCHITECTURE.md)."""
    from pipecat_nemotron.agent.turn_end import DEFAULT_EOU_WAIT_S

    assert DEFAULT_EOU_WAIT_S == 1.5
    assert turn_commit_for("eou").eou_wait_s == DEFAULT_EOU_WAIT_S
    assert turn_commit_for("eou_smart", analyzer=FixedAnalyzer(True)).eou_wait_s == DEFAULT_EOU_WAIT_S
    assert turn_commit_for("vad").eou_wait_s == 0.0


def test_the_aggregator_follows_the_stt_in_the_eou_modes() -> None:
    for mode in ("eou", "eou_smart"):
        assert isinstance(user_turn_strategies_for(mode), ExternalUserTurnStrategies)  # type: ignore[arg-type]


def test_a_nemo_files_vocabulary_says_whether_it_has_the_eou_token(tiny_eou_model) -> None:
    assert nemo_file_has_eou(tiny_eou_model) is True
    assert nemo_file_has_eou(TINY_MODEL_PATH) is False
    assert nemo_file_has_eou("nvidia/nemotron-speech-streaming-en-0.6b") is None  # a hub id: the engine checks


def test_a_model_without_the_token_is_refused_when_the_service_is_built() -> None:
    with pytest.raises(EndOfUtteranceUnavailableError, match=EOU_PIECE) as refused:
        NemotronSTTService(model=str(TINY_MODEL_PATH), turn_commit=turn_commit_for("eou"))
    assert "tiny_nemotron_asr_eou.nemo" in str(refused.value) and "turn_end" in str(refused.value)
    with pytest.raises(EndOfUtteranceUnavailableError):
        NemotronSTTService(model=str(TINY_MODEL_PATH), eager=EagerSettings(turn_commit=turn_commit_for("eou_smart")))
    with pytest.raises(ValueError, match="EagerSettings"):
        NemotronSTTService(
            model=str(TINY_MODEL_PATH), eager=EagerSettings(), turn_commit=turn_commit_for("eou")
        )


def test_agent_settings_refuse_a_model_without_the_token_and_default_to_the_tiny_eou_model() -> None:
    with pytest.raises(ValueError, match="NEMOTRON_ASR_MODEL") as refused:
        AgentSettings(turn_end="eou", asr_model=str(TINY_MODEL_PATH))
    assert EOU_PIECE in str(refused.value)
    with pytest.raises(ValueError, match=EOU_PIECE):
        AgentSettings(turn_end="eou_smart", asr_model="nvidia/nemotron-speech-streaming-en-0.6b")
    with pytest.raises(ValueError, match="NEMOTRON_TURN_END"):
        AgentSettings.from_env({"NEMOTRON_TURN_END": "eou_soon"})
    if TINY_EOU_MODEL_PATH.exists():
        settings = AgentSettings(turn_end="eou", asr_device="cpu")
        assert settings.asr_model_name() == str(TINY_EOU_MODEL_PATH)
        stt = settings.create_stt()
        assert stt.wants_eou and stt.owns_turn_detection and not stt.eager_end_of_turn_enabled


def test_build_voice_agent_needs_an_stt_that_reads_the_eou(tiny_eou_model) -> None:
    with pytest.raises(ValueError, match="turn_commit_for"):
        build_voice_agent(stt=NemotronSTTService(model=str(TINY_MODEL_PATH)), turn_end="eou")
    stt = NemotronSTTService(model=str(tiny_eou_model), turn_commit=turn_commit_for("eou"))
    # The STT owns turn detection without eager predictions: it recommends Pipecat's external strategies.
    assert isinstance(stt.service_metadata_frame().user_turn_strategies, ExternalUserTurnStrategies)
    agent = build_voice_agent(stt=stt, turn_end="eou")
    assert agent.turn_end_log is not None and agent.turn_end_log is stt.turn_commit.log  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="eou_smart"):
        build_voice_agent(stt=NemotronSTTService(model=str(tiny_eou_model), turn_commit=turn_commit_for("eou")),
                          turn_end="eou_smart")


def test_the_protocol_carries_the_eou_request_and_event() -> None:
    assert "eou" not in ConfigMessage().to_json()  # a client that does not ask sends what older clients send
    config = parse_client_message(ConfigMessage(eou=True).to_json())
    assert isinstance(config, ConfigMessage) and config.eou is True
    with pytest.raises(ValueError, match="eou"):
        parse_client_message('{"type": "config", "eou": "yes"}')
    msg = EouMessage(utterance=2, text="What time is it?", latency_ms=160, eou_ms=5120.0, session_audio_ms=5280.0)
    assert parse_server_message(dump_server_message(msg)) == msg
    assert EOU_FEATURE == "eou"


async def test_a_turn_whose_eou_never_comes_ends_after_the_fallback_silence(tmp_path) -> None:
    from helpers import Then, Until, audio_frames, noise_clip, of, run_steps, started_engine, to_pcm16
    from pipecat.frames.frames import (
        ProposedUserStoppedSpeakingFrame,
        TranscriptionFrame,
        VADUserStartedSpeakingFrame,
        VADUserStoppedSpeakingFrame,
    )

    from pipecat_nemotron.asr.architectures import build_random_model

    # A model that has the token and never emits it (its joint pushed far from <EOU>), but emits words.
    model = build_random_model(tmp_path / "no_eou.nemo", seed=5, markers=(EOU_PIECE,), marker_bias=-50.0)
    async with started_engine(model, one_thread=True) as engine:
        log = TurnEndLog()
        stt = NemotronSTTService(engine=engine, turn_commit=turn_commit_for("eou", log=log))
        steps = [
            Then(stt.wait_until_ready),
            VADUserStartedSpeakingFrame(),
            *audio_frames(to_pcm16(noise_clip(1.0, seed=2))),
            VADUserStoppedSpeakingFrame(stop_secs=0.2),
            Until("the held final", lambda *_: bool(log.decisions)),
            *audio_frames(bytes(2 * 16000 * 3)),  # 3 s of silence: the fallback (2.8 s after the VAD stop)
            Until("the turn's end", lambda down, _: bool(of(down, ProposedUserStoppedSpeakingFrame))),
        ]
        down, _ = await run_steps(stt, steps)
    assert [f.text for f in down if type(f) is TranscriptionFrame], "the random model wrote words"
    # (The session's end finalizes the words the random model wrote on the silence: a third decision.)
    assert [(d.commit, d.by) for _, d in log.decisions][:2] == [(False, "eou"), (True, "timeout")]


def test_bench_turns_runs_the_eou_modes_on_their_own_model() -> None:
    import argparse

    from pipecat_nemotron.bench import turns

    parser = argparse.ArgumentParser()
    turns.add_arguments(parser)
    args = parser.parse_args(["--modes", "smart", "text", "eou", "eou_smart", "--eou-model", "m.nemo"])
    assert args.modes == ["smart", "text", "eou", "eou_smart"] and args.eou_model == "m.nemo"
    assert parser.parse_args([]).modes == list(turns.MODES) and set(turns.EOU_MODES) <= set(turns.MODES)
