"""Eager end of turn through the whole local agent: bundled speech → our STT (peeks on a pause) → a real
OpenAI-compatible server on loopback (fixed time to first token) → tiny Magpie → simulated playback.

Pipecat's machinery does the rest: ``EagerUserTurnStrategies`` (recommended by the STT) start a speculative
inference on the ``EagerTranscriptionFrame``, the LLM service's ``SpeculationGate`` holds its reply until the
turn is committed (VAD stop, then the finalized transcript) and drops it when the prediction is withdrawn.
"""

from __future__ import annotations

import asyncio
import time
import wave
from pathlib import Path

import numpy as np
import pytest
from helpers import STT, FakeClock, FrameRecorder, TurnTimes, feed_turn, push
from openai_server import FakeOpenAIServer
from pipecat.frames.frames import (
    EagerEndOfTurnCancelFrame,
    EagerTranscriptionFrame,
    TextFrame,
    TranscriptionFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection

from pipecat_nemotron.agent.assembly import AgentSettings, SimulatedPlayback, VoiceAgent, build_voice_agent
from pipecat_nemotron.agent.wav_input import read_pcm16, run_worker_on_wav
from pipecat_nemotron.asr import EngineConfig, NemotronEngine
from pipecat_nemotron.llm.service import create_nemotron_llm
from pipecat_nemotron.models import DEMO_AUDIO_DIR, TINY_MODEL_PATH
from pipecat_nemotron.observers.latency_stats import summarize_eager
from pipecat_nemotron.observers.metrics import VoiceLatencyObserver
from pipecat_nemotron.stt import NemotronSTTService
from pipecat_nemotron.stt.eager import EagerSettings, PauseDetector, PauseEvent, ends_mid_sentence
from pipecat_nemotron.tts.magpie import MagpieSynthesisOptions
from pipecat_nemotron.tts.service import MagpieTTSService

LLM_DELAY_S = 0.15
#: The VAD silence that commits a turn in these tests, s: long, so a peek on a loaded 2-core CPU always lands
#: before the commit (the benchmark runs the agent's real 0.2 s).
COMMIT_S = 0.5
#: demo_timer.wav ("hi set a timer for twenty minutes thanks") has a word gap after "for" at 1.77-1.80 s.
PAUSE_AT_S = 1.785
PAUSE_S = 0.25


class NumberedServer(FakeOpenAIServer):
    """Answers its N-th chat request "Reply number N." and remembers when each arrived (monotonic s)."""

    def __init__(self) -> None:
        super().__init__(first_token_delay_s=LLM_DELAY_S)
        self.arrived: list[float] = []
        self.first_arrived = asyncio.Event()

    async def _chat(self, request):  # type: ignore[no-untyped-def]
        self.arrived.append(time.monotonic())
        self.first_arrived.set()
        self.reply = f"Reply number {len(self.arrived)}."
        return await super()._chat(request)

    def user_texts(self) -> list[str]:
        """The last user message of every request, in order."""
        return [[m["content"] for m in r["messages"] if m["role"] == "user"][-1] for r in self.requests]


class TimedRecorder(FrameRecorder):
    """A :class:`FrameRecorder` that also notes when each frame passed (monotonic s)."""

    def __init__(self, types: tuple[type, ...]) -> None:
        super().__init__(types)
        self.times: list[float] = []

    async def process_frame(self, frame, direction: FrameDirection) -> None:
        if isinstance(frame, self.types):
            self.times.append(time.monotonic())
        await super().process_frame(frame, direction)


class SpokenText(SimulatedPlayback):
    """The playback stand-in, also keeping every text frame that reaches the transport."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    async def process_frame(self, frame, direction: FrameDirection) -> None:
        if isinstance(frame, TextFrame) and direction == FrameDirection.DOWNSTREAM:
            self.texts.append(frame.text)
        await super().process_frame(frame, direction)


def paused_timer_wav(path: Path) -> Path:
    """demo_timer.wav with ``PAUSE_S`` of silence inserted after "for" (mid-sentence, shorter than the commit)."""
    audio = read_pcm16(DEMO_AUDIO_DIR / "demo_timer.wav")
    at = int(PAUSE_AT_S * 16000)
    paused = np.concatenate([audio[:at], np.zeros(int(PAUSE_S * 16000), dtype=np.int16), audio[at:]])
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(paused.tobytes())
    return path


class CommitAfterTheSpeculativeRequest(NemotronSTTService):
    """The in-process STT, holding the first VAD stop until the LLM server has received a request.

    In a live session the eager peek lands well before the VAD's commit (``COMMIT_S``), but a loaded machine can
    decode later than that. Holding the VAD stop (and so the final that answers it) makes the order the test is
    about certain: the prediction out, its speculative LLM request made, then the commit. A prediction that never
    starts a request leaves the stop held until the liveness guard gives up (``gave_up``).
    """

    def __init__(self, server: NumberedServer, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._server = server
        self._held = False
        self.gave_up = False

    async def process_frame(self, frame, direction: FrameDirection) -> None:  # type: ignore[no-untyped-def]
        if isinstance(frame, VADUserStoppedSpeakingFrame) and not self._held:
            self._held = True
            try:
                await asyncio.wait_for(self._server.first_arrived.wait(), 60)
            except TimeoutError:
                self.gave_up = True
        await super().process_frame(frame, direction)


async def run_agent(
    asr: NemotronEngine, magpie, server: NumberedServer, wav: Path, stt: NemotronSTTService | None = None
) -> tuple:
    """One session of ``wav`` through the eager agent; returns the agent, the STT's pushes and the playback."""
    stt = stt or NemotronSTTService(engine=asr, latency_ms=160, eager=EagerSettings())
    pushed = TimedRecorder((TranscriptionFrame, EagerTranscriptionFrame))
    playback = SpokenText()
    agent = build_voice_agent(
        stt=stt,
        llm=create_nemotron_llm(base_url=server.base_url),
        tts=MagpieTTSService(engine=magpie, options=MagpieSynthesisOptions(max_duration_s=0.3)),
        output_processor=playback,
        after_stt=[pushed],
        vad_stop_secs=COMMIT_S,
        idle_timeout_secs=None,
    )
    agent.observer._record_text = True
    await run_worker_on_wav(agent.worker, stt, wav, trailing_silence_s=3.0, timeout_s=120)
    return agent, pushed, playback


def finals_and_eagers(pushed: TimedRecorder) -> tuple[list[tuple[float, str]], list[tuple[float, str]]]:
    finals = [
        (t, f.text) for t, f in zip(pushed.times, pushed.frames, strict=True) if type(f) is TranscriptionFrame
    ]
    eagers = [
        (t, f.text)
        for t, f in zip(pushed.times, pushed.frames, strict=True)
        if type(f) is EagerTranscriptionFrame
    ]
    return finals, eagers


def context_texts(agent: VoiceAgent, role: str) -> list[str]:
    assert agent.context is not None
    return [m["content"] for m in agent.context.get_messages() if m.get("role") == role]


async def test_turn_answered_eagerly(magpie_engine) -> None:  # noqa: F811
    wav = DEMO_AUDIO_DIR / "demo_math.wav"
    async with NemotronEngine(EngineConfig(model=str(TINY_MODEL_PATH), device="cpu", max_streams=2)) as asr:
        async with NumberedServer() as server:
            stt = CommitAfterTheSpeculativeRequest(server, engine=asr, latency_ms=160, eager=EagerSettings())
            agent, pushed, playback = await run_agent(asr, magpie_engine, server, wav, stt)
    assert not stt.gave_up, "no LLM request before the commit: the prediction started no inference"
    (final_at, final), *_ = finals_and_eagers(pushed)[0]
    eagers = finals_and_eagers(pushed)[1]
    assert final and [text for _, text in eagers] == [final]
    # The one LLM request (no second inference) started from the prediction, before the committed final.
    assert server.user_texts() == [final]
    assert server.arrived[0] < final_at
    # The reply spoken is the speculative one, kept; the context holds the committed transcript and that reply.
    assert playback.audio_seconds > 0
    assert context_texts(agent, "user") == [final]
    assert context_texts(agent, "assistant") == ["Reply number 1."]
    (turn,) = agent.observer.turns
    assert turn.eager and turn.eager_outcome == "kept" and turn.eager_cancelled == 0
    assert turn.eager_lead_ms is not None and turn.eager_lead_ms > 0
    assert turn.transcript == final and turn.v2v_ms is not None


async def test_mid_sentence_pause_cancels_the_eager_reply(magpie_engine, tmp_path) -> None:  # noqa: F811
    wav = paused_timer_wav(tmp_path / "timer_with_pause.wav")
    async with NemotronEngine(EngineConfig(model=str(TINY_MODEL_PATH), device="cpu", max_streams=2)) as asr:
        whole = (await asr.transcribe(read_pcm16(wav).tobytes(), latency_ms=160)).text
        async with NumberedServer() as server:
            agent, pushed, playback = await run_agent(asr, magpie_engine, server, wav)
    finals, eagers = finals_and_eagers(pushed)
    assert [text for _, text in finals] == [whole]
    # The pause was predicted to end the turn, then withdrawn when the user went on. (The tiny model, trained on
    # template sentences, hears "hi set a timer for" + silence as "... for twenty minutes": not the whole turn.)
    assert eagers and eagers[0][1] != whole
    (turn,) = agent.observer.turns
    assert turn.eager_cancelled >= 1 and turn.eager_predictions == len(eagers)
    # The answer is to the whole sentence; nothing of an answer to a partial one reached the transport or context.
    texts = server.user_texts()
    assert texts[-1] == whole and texts[0] == eagers[0][1]
    answered = len(texts)
    wasted = [f"number {i}" for i, text in enumerate(texts, start=1) if text != whole]
    assert wasted and not any(w in t for w in wasted for t in playback.texts)
    assert context_texts(agent, "user") == [whole]
    assert context_texts(agent, "assistant") == [f"Reply number {answered}."]
    assert playback.audio_seconds > 0


async def test_pause_detector_signals() -> None:
    asr = PauseDetector(silence_ms=160, signal="asr")
    assert asr.on_decoded(0.0) is None  # no text yet: no pause
    assert asr.on_decoded(160.0, text_changed=True) is None
    assert asr.on_decoded(320.0) is PauseEvent.PAUSE and asr.paused
    assert asr.on_decoded(480.0) is None
    assert asr.on_decoded(640.0, text_changed=True) is PauseEvent.RESUME and not asr.paused
    asr.reset()
    assert asr.on_decoded(2000.0) is None
    vad = PauseDetector(silence_ms=64)
    vad.start(16000)
    assert vad.uses_vad and not vad.uses_asr
    assert await vad.on_audio(b"\0\0" * 3200) is None  # silence before any speech is no pause
    assert ends_mid_sentence("set a timer for") and ends_mid_sentence("what is two Plus,")
    assert (
        not ends_mid_sentence("what time is it")
        and not ends_mid_sentence("")
        and not ends_mid_sentence("a b", frozenset())
    )
    with pytest.raises(ValueError, match="eager_signal"):
        PauseDetector(signal="both-ish")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eager_silence_ms"):
        PauseDetector(silence_ms=0)


async def test_observer_records_eager_turns() -> None:
    clock = FakeClock()
    observer = VoiceLatencyObserver(time_source=clock, log_turns=False)
    # Turn 1: predicted 120 ms before the final (the final transcript is at t0 + 1.25 in feed_turn), kept.
    await push(observer, clock, 1_001.13, STT, EagerTranscriptionFrame("what time is it", "u", ""))
    await feed_turn(observer, clock, 1_000.0, t=TurnTimes())
    # Turn 2: a prediction withdrawn, then one that stood.
    await push(observer, clock, 2_000.5, STT, EagerTranscriptionFrame("what", "u", ""))
    await push(observer, clock, 2_000.6, STT, EagerEndOfTurnCancelFrame())
    await push(observer, clock, 2_000.65, STT, EagerEndOfTurnCancelFrame())  # a second hop: counted once
    await feed_turn(observer, clock, 2_000.0)
    first, second = observer.turns
    assert first.eager and first.eager_outcome == "kept" and first.eager_lead_ms == pytest.approx(120.0)
    assert (
        second.eager_outcome == "cancelled" and second.eager_cancelled == 1 and second.eager_lead_ms is None
    )
    stats = summarize_eager(observer.turns)
    assert (stats.predictions, stats.kept, stats.cancelled, stats.cancelled_share) == (2, 1, 1, 0.5)


def test_agent_settings_eager() -> None:
    on = AgentSettings.from_env(
        {"NEMOTRON_ASR_EAGER_END_OF_TURN": "true", "NEMOTRON_ASR_EAGER_SILENCE_MS": "96"}
    )
    assert on.asr_eager_end_of_turn and on.asr_eager_silence_ms == 96.0
    assert "eager end of turn after 96 ms" in on.describe()[0]
    assert not AgentSettings.from_env({}).asr_eager_end_of_turn
    with pytest.raises(ValueError, match="NEMOTRON_ASR_EAGER_END_OF_TURN"):
        AgentSettings.from_env({"NEMOTRON_ASR_EAGER_END_OF_TURN": "maybe"})
    with pytest.raises(ValueError, match="NEMOTRON_ASR_EAGER_SILENCE_MS"):
        AgentSettings.from_env({"NEMOTRON_ASR_EAGER_SILENCE_MS": "soon"})


def test_report_plots_eager_turns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipecat_nemotron.observers.latency_stats import TurnLatency
    from pipecat_nemotron.observers.report import main

    turns = [
        TurnLatency(
            turn=1, v2v_ms=330.0, eager=True, eager_outcome="kept", eager_lead_ms=130.0, eager_predictions=1
        ),
        TurnLatency(
            turn=2,
            v2v_ms=470.0,
            eager=True,
            eager_outcome="cancelled",
            eager_predictions=1,
            eager_cancelled=1,
        ),
        TurnLatency(turn=3, v2v_ms=460.0),
    ]
    path = tmp_path / "turns.jsonl"
    path.write_text("".join(t.to_json() + "\n" for t in turns))
    assert main([str(path), "-o", str(tmp_path / "latency.png")]) == 0
    assert (tmp_path / "latency.png").read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert "eager end of turn: 2 predictions in 2/3 turns, 1 kept, 1 cancelled (50%)" in out
