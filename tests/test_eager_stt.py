"""The eager end of turn in both STT services, and the ``peek`` message of the ASR server's protocol.

Each service alone in a pipeline (Pipecat's ``run_test``): a pause in the audio makes it push the peeked text as an
``EagerTranscriptionFrame``, speech after the pause withdraws it, and the VAD stop commits the turn (final, then a
proposed turn stop). The server-backed service peeks over the wire (``peek`` / ``peek_result``).
"""

from __future__ import annotations

import asyncio

import pytest
from helpers import (
    SYNC,
    TOKEN,
    Until,
    WatchedServerSTTService,
    WatchedSTTService,
    audio_frames,
    clip,
    of,
    open_session,
    paused_turn,
    run_steps,
)
from pipecat.audio.turn.base_turn_analyzer import BaseTurnAnalyzer, BaseTurnParams, EndOfTurnState
from pipecat.frames.frames import (
    EagerEndOfTurnCancelFrame,
    EagerTranscriptionFrame,
    Frame,
    ProposedUserStartedSpeakingFrame,
    ProposedUserStoppedSpeakingFrame,
    TranscriptionFrame,
)
from pipecat.turns.user_turn_strategies import EagerUserTurnStrategies
from ws_client import stream

from pipecat_nemotron.agent.wav_input import silence
from pipecat_nemotron.asr import NemotronEngine
from pipecat_nemotron.server.app import ASRServer
from pipecat_nemotron.server.protocol import (
    PEEK_FEATURE,
    FinalMessage,
    PeekMessage,
    PeekResultMessage,
    ReadyMessage,
    dump_server_message,
    parse_client_message,
    parse_server_message,
)
from pipecat_nemotron.stt import NemotronSTTService
from pipecat_nemotron.stt.eager import EagerSettings

pytestmark = pytest.mark.asyncio(loop_scope="module")


def assert_committed_after(down: list[Frame], eager: Frame) -> TranscriptionFrame:
    (final,) = of(down, TranscriptionFrame)
    (stop,) = of(down, ProposedUserStoppedSpeakingFrame)
    assert down.index(eager) < down.index(final) < down.index(stop) and final.finalized
    return final  # type: ignore[return-value]


@SYNC
def test_peek_messages_round_trip() -> None:
    assert parse_client_message('{"type": "peek"}') == PeekMessage()
    result = PeekResultMessage(utterance=3, text="what is", utterance_audio_ms=1234.567, peek_ms=8.0)
    assert parse_server_message(dump_server_message(result)) == PeekResultMessage(3, "what is", 1234.57, 8.0)
    # A ready from a server without the feature (an older one) parses with no features; ours lists "peek".
    assert parse_server_message('{"type": "ready", "session_id": "s"}').features == ()  # type: ignore[union-attr]
    ready = parse_server_message(dump_server_message(ReadyMessage(features=(PEEK_FEATURE,))))
    assert isinstance(ready, ReadyMessage) and ready.features == (PEEK_FEATURE,)


async def test_server_answers_peek_with_the_final_to_be(server: ASRServer, engine: NemotronEngine) -> None:  # noqa: F811
    pcm = clip()
    ws, ready = await open_session(server.url)
    try:
        assert isinstance(ready, ReadyMessage) and PEEK_FEATURE in ready.features
        await stream(ws, pcm, speed=8.0)
        await ws.send(PeekMessage().to_json())
        await ws.send('{"type": "finalize"}')
        peek = final = None
        async with asyncio.timeout(20):
            while final is None:
                msg = parse_server_message(await ws.recv())
                if isinstance(msg, PeekResultMessage):
                    peek = msg
                elif isinstance(msg, FinalMessage):
                    final = msg
        assert peek is not None and peek.text == final.text and peek.utterance == final.utterance == 0
        assert peek.utterance_audio_ms == pytest.approx(final.utterance_audio_ms, abs=1.0)
    finally:
        await ws.close()


@pytest.mark.serial
async def test_server_stt_eager_end_of_turn(server: ASRServer, engine: NemotronEngine) -> None:  # noqa: F811
    stt = WatchedServerSTTService(url=server.url, token=TOKEN, eager=EagerSettings())
    assert isinstance(stt.service_metadata_frame().user_turn_strategies, EagerUserTurnStrategies)
    down, _ = await run_steps(stt, paused_turn(stt, clip()))
    (eager,) = of(down, EagerTranscriptionFrame)
    assert of(down, ProposedUserStartedSpeakingFrame)
    assert assert_committed_after(down, eager).text == eager.text
    assert not of(down, EagerEndOfTurnCancelFrame)


@pytest.mark.serial
async def test_in_process_stt_eager_end_of_turn_and_withdrawal(engine: NemotronEngine) -> None:  # noqa: F811
    off = NemotronSTTService(engine=engine)
    assert off.service_metadata_frame().user_turn_strategies is None  # off: Pipecat's default turn strategies
    stt = WatchedSTTService(engine=engine, eager=EagerSettings())
    a, b = clip(), clip("demo_timer.wav")
    down, _ = await run_steps(stt, paused_turn(stt, a, resume=b))
    first, second = of(down, EagerTranscriptionFrame)
    (cancel,) = of(down, EagerEndOfTurnCancelFrame)
    assert down.index(first) < down.index(cancel) < down.index(second)
    final = assert_committed_after(down, second)
    assert final.text == second.text and final.text.startswith(first.text) and final.text != first.text


class HoldingAnalyzer(BaseTurnAnalyzer):
    """A turn analyzer that calls every VAD stop incomplete and completes after 0.3 s of silence."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0
        self._silent_ms = 0.0

    @property
    def speech_triggered(self) -> bool:
        return True

    @property
    def params(self) -> BaseTurnParams:
        return BaseTurnParams()

    def append_audio(self, buffer: bytes, is_speech: bool) -> EndOfTurnState:
        self._silent_ms = 0.0 if is_speech else self._silent_ms + len(buffer) / 32
        return EndOfTurnState.COMPLETE if self.asked and self._silent_ms >= 300 else EndOfTurnState.INCOMPLETE

    async def analyze_end_of_turn(self) -> tuple[EndOfTurnState, None]:
        self.asked += 1
        return EndOfTurnState.INCOMPLETE, None

    def clear(self) -> None:
        self._silent_ms = 0.0


async def test_a_turn_analyzer_holds_the_commit(engine: NemotronEngine) -> None:  # noqa: F811
    analyzer = HoldingAnalyzer()
    stt = WatchedSTTService(engine=engine, eager=EagerSettings(turn_analyzer=analyzer))
    verdicts: list[bool] = []
    complete = stt._commit.complete

    async def recorded(*args: object) -> bool:
        verdicts.append(await complete(*args))
        return verdicts[-1]

    stt._commit.complete = recorded  # type: ignore[method-assign]
    # After the VAD stop the final arrives, but the analyzer holds the turn open until 0.3 s more of silence:
    # the silence is sent once the final's verdict is in, and the run ends once the silence committed the turn.
    steps = [
        *paused_turn(stt, clip(), commits=False),
        Until("the final's verdict", lambda *_: len(verdicts) == 1),
        *audio_frames(silence(0.5, 16000)),
        Until("the commit by the silence", lambda down, _: bool(of(down, ProposedUserStoppedSpeakingFrame))),
    ]
    down, _ = await run_steps(stt, steps)
    (eager,) = of(down, EagerTranscriptionFrame)
    finals = of(down, TranscriptionFrame)
    assert [f.text for f in finals] == [eager.text] and analyzer.asked == 1
    # The final did not commit (held); the analyzer's silence did; the session's end flush (no speech) too.
    assert verdicts == [False, True] and len(of(down, ProposedUserStoppedSpeakingFrame)) == 2
