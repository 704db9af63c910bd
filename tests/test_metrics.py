"""VoiceLatencyObserver: per-turn stages, JSONL output and percentiles."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import numpy as np
import pytest
from helpers import LLM, SINK, STT, TTS, FakeClock, TurnTimes, feed_turn, push
from loguru import logger
from openai_server import FakeOpenAIServer, openai_server  # noqa: F401  (fixture)
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    DataFrame,
    EndFrame,
    Frame,
    LLMContextFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    MetricsFrame,
    TranscriptionFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.metrics.metrics import ProcessingMetricsData, TTFBMetricsData
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.settings import STTSettings
from pipecat.services.stt_service import STTService
from pipecat.tests.utils import SleepFrame, run_test
from pipecat.utils.time import time_now_iso8601

from pipecat_nemotron.llm.service import create_nemotron_llm
from pipecat_nemotron.observers.metrics import (
    ASRFinalizeMetricsData,
    TurnLatency,
    VoiceLatencyObserver,
    asr_finalize_metrics_frame,
    format_summary,
    load_turns,
    percentile,
    summarize,
)


def test_asr_finalize_frame() -> None:
    frame = asr_finalize_metrics_frame("NemotronSTT#0", "nemotron-asr", 18.5)
    (data,) = frame.data
    assert isinstance(data, ASRFinalizeMetricsData) and isinstance(data, ProcessingMetricsData)
    assert data.value == pytest.approx(0.0185)
    assert data.metric == "asr_finalize" and data.model == "nemotron-asr"
    with pytest.raises(ValueError):
        asr_finalize_metrics_frame("x", None, -1.0)


async def test_one_turn_hooks(tmp_path) -> None:
    clock = FakeClock()
    path = tmp_path / "out" / "turns.jsonl"
    observer = VoiceLatencyObserver(jsonl_path=path, time_source=clock)
    lines: list[str] = []
    sink_id = logger.add(lambda m: lines.append(str(m)), level="INFO", format="{message}")
    seen: list[TurnLatency] = []
    observer.add_event_handler("on_turn_latency", lambda obs, turn: seen.append(turn))
    try:
        await feed_turn(observer, clock, 1_000.0, text="secret words")
        await push(observer, clock, 1_010.0, SINK, EndFrame())
        await asyncio.sleep(0)  # let the event task run
    finally:
        logger.remove(sink_id)

    (turn,) = observer.turns
    assert seen == [turn]
    assert turn.turn == 1
    assert turn.speech_end_ts == pytest.approx(1_001.0)
    assert turn.vad_stop_secs == pytest.approx(0.2)
    assert turn.ttfs_ms == pytest.approx(250.0)
    assert turn.asr_finalize_ms == pytest.approx(18.0)
    assert turn.llm_ttfb_ms == pytest.approx(160.0)
    assert turn.tts_ttfb_ms == pytest.approx(100.0)
    # speech end -> transcript (250) -> LLM start (+10) -> token (+160) -> audio (+100) -> bot (+20)
    assert turn.v2v_ms == pytest.approx(540.0)
    assert turn.processors == {"stt": STT.name, "llm": LLM.name, "tts": TTS.name}
    assert 0 < turn.asr_finalize_ms <= turn.ttfs_ms <= turn.v2v_ms
    assert turn.ttfs_ms + turn.llm_ttfb_ms + turn.tts_ttfb_ms <= turn.v2v_ms
    assert sum(turn.breakdown_ms.values()) == pytest.approx(turn.v2v_ms, abs=0.01)
    assert turn.breakdown_ms["endpointing_wait"] == pytest.approx(200.0)
    assert turn.transcript is None

    (line,) = path.read_text().splitlines()
    record = json.loads(line)
    assert record["v2v_ms"] == pytest.approx(540.0) and "transcript" not in record
    assert load_turns(path) == [turn]

    log = "\n".join(lines)
    assert "turn 1: v2v 540 ms" in log
    assert "secret words" not in log  # no transcript text at INFO
    assert "p50" in log and "voice-to-voice" in log  # session summary at EndFrame


async def test_percentiles_and_missing_stage() -> None:
    clock = FakeClock()
    observer = VoiceLatencyObserver(time_source=clock, record_text=True, log_turns=False)
    llm_values = [0.10, 0.20, 0.30, 0.40, 0.90]
    for i, llm in enumerate(llm_values):
        times = TurnTimes(llm=llm, tts=None if i == 4 else 0.1)
        await feed_turn(observer, clock, 2_000.0 + 10 * i, text=f"turn {i}", t=times)
    turns = observer.turns
    assert [t.turn for t in turns] == [1, 2, 3, 4, 5]
    assert turns[4].tts_ttfb_ms is None and turns[4].transcript == "turn 4"

    stats = observer.summary(log=False)
    llm_ms = [v * 1000 for v in llm_values]
    for q, value in (
        (50, stats["llm_ttfb_ms"].p50),
        (90, stats["llm_ttfb_ms"].p90),
        (99, stats["llm_ttfb_ms"].p99),
    ):
        assert value == pytest.approx(float(np.percentile(llm_ms, q)))
    assert stats["tts_ttfb_ms"].count == 4
    assert stats["v2v_ms"].p50 == pytest.approx(float(np.percentile([t.v2v_ms for t in turns], 50)))
    table = format_summary(stats)
    assert "LLM TTFB" in table and "ASR finalize" in table
    assert summarize([])["v2v_ms"].count == 0
    assert percentile([5.0], 99) == 5.0


async def test_interrupted_segment_resets() -> None:
    """A user pause (VAD stop, then speech again) is not a turn; the last segment is."""
    clock = FakeClock()
    observer = VoiceLatencyObserver(time_source=clock, log_turns=False)
    await push(observer, clock, 10.0, STT, VADUserStartedSpeakingFrame())
    await push(observer, clock, 11.2, STT, VADUserStoppedSpeakingFrame(stop_secs=0.2, timestamp=11.2))
    await push(observer, clock, 11.3, STT, asr_finalize_metrics_frame(STT.name, None, 99.0))
    await feed_turn(observer, clock, 11.5, t=TurnTimes(finalize=0.02))
    (turn,) = observer.turns
    assert turn.asr_finalize_ms == pytest.approx(20.0)
    assert turn.speech_end_ts == pytest.approx(12.5)


# --- through a Pipecat pipeline, with a scripted STT and TTS ----------------------------------


@dataclass
class UserSaysFrame(DataFrame):
    text: str = ""


class FakeUser(FrameProcessor):
    """Turns UserSaysFrame into the VAD frames a transport would push."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, UserSaysFrame):
            await self.push_frame(VADUserStartedSpeakingFrame(start_secs=0.2))
            await asyncio.sleep(0.05)
            await self.push_frame(VADUserStoppedSpeakingFrame(stop_secs=0.2, timestamp=time.time()))
            await self.push_frame(frame)
        else:
            await self.push_frame(frame, direction)


class FakeStreamingSTT(STTService):
    """Finalizes on VAD stop the way the Nemotron STT does (request/confirm finalize)."""

    def __init__(self, finalize_s: float = 0.03, **kwargs) -> None:
        super().__init__(ttfs_p99_latency=0.1, settings=STTSettings(model=None, language=None), **kwargs)
        self._finalize_s = finalize_s

    def can_generate_metrics(self) -> bool:
        return True

    async def run_stt(self, audio: bytes):
        yield None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if isinstance(frame, UserSaysFrame):
            await super().process_frame(frame, direction)
            self.request_finalize()
            started = time.perf_counter()
            await asyncio.sleep(self._finalize_s)
            self.confirm_finalize()
            await self.push_frame(
                asr_finalize_metrics_frame(self.name, "fake-asr", (time.perf_counter() - started) * 1000)
            )
            await self.push_frame(
                TranscriptionFrame(text=frame.text, user_id="u", timestamp=time_now_iso8601())
            )
            return
        await super().process_frame(frame, direction)


class RunLLMOnTranscript(FrameProcessor):
    def __init__(self, context: LLMContext) -> None:
        super().__init__()
        self._context = context

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if isinstance(frame, TranscriptionFrame):
            self._context.add_message({"role": "user", "content": frame.text})
            await self.push_frame(LLMContextFrame(context=self._context))


class FakeTTSOutput(FrameProcessor):
    """Speaks 50 ms after the first LLM text of a response, reporting a TTS TTFB."""

    def __init__(self) -> None:
        super().__init__(name="FakeTTSService#0")
        self._spoke = False

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if isinstance(frame, LLMFullResponseStartFrame):
            self._spoke = False
        elif isinstance(frame, LLMTextFrame) and not self._spoke:
            self._spoke = True
            await asyncio.sleep(0.05)
            await self.push_frame(MetricsFrame(data=[TTFBMetricsData(processor=self.name, value=0.05)]))
            await self.push_frame(BotStartedSpeakingFrame())


async def test_stages_through_a_pipecat_pipeline_with_scripted_stt_and_tts(
    openai_server: FakeOpenAIServer,  # noqa: F811
    tmp_path,
) -> None:
    """The observer on Pipecat's own frame flow: a scripted STT and TTS with fixed delays, the real LLM service.

    The STT, TTS and user here are scripted fakes (fixed finalize and TTS delays give the floors asserted below).
    Our real STT, Magpie and a loopback LLM server run under the observer in
    ``test_agent.py::test_full_local_agent_pipeline``.
    """
    openai_server.first_token_delay_s = 0.15
    path = tmp_path / "turns.jsonl"
    observer = VoiceLatencyObserver(jsonl_path=path, record_text=True)
    stt = FakeStreamingSTT()
    llm = create_nemotron_llm(base_url=openai_server.base_url)
    pipeline = Pipeline([FakeUser(), stt, RunLLMOnTranscript(LLMContext()), llm, FakeTTSOutput()])

    await run_test(
        pipeline,
        frames_to_send=[UserSaysFrame(text="hello nemotron"), SleepFrame(sleep=0.6)],
        observers=[observer],
        pipeline_params=PipelineParams(enable_metrics=True),
    )

    (turn,) = observer.turns
    assert turn.processors == {"stt": stt.name, "llm": llm.name, "tts": "FakeTTSService#0"}
    assert turn.transcript == "hello nemotron"
    assert "hello nemotron" in openai_server.last_user_text()
    # TTFS = VAD stop_secs (0.2) + finalize (0.03) + hops.
    # Floors are the fakes' fixed delays; a loaded machine only adds to them (no upper bounds).
    assert turn.ttfs_ms >= 230
    assert 25 <= turn.asr_finalize_ms < turn.ttfs_ms
    assert turn.llm_ttfb_ms >= 150
    assert turn.tts_ttfb_ms == pytest.approx(50.0)
    assert turn.ttfs_ms + turn.llm_ttfb_ms + turn.tts_ttfb_ms <= turn.v2v_ms + 1.0
    assert load_turns(path)[0].v2v_ms == turn.v2v_ms
