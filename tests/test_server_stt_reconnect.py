"""The server client's reconnect policy (``pipecat_nemotron.stt.remote.reconnect``) against a real ASR server.

A :class:`fault_proxy.FaultProxy` on loopback sits between ``NemotronServerSTTService`` and a real
``ASRServer`` (tiny trained model on CPU) and refuses, drops or ends sessions on cue.
"""

from __future__ import annotations

import random
import re
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from fault_proxy import FaultProxy
from helpers import Until, audio_frames, one_torch_thread, run_steps, started_engine, turn
from loguru import logger
from pipecat.frames.frames import (
    ErrorFrame,
    MetricsFrame,
    TranscriptionFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.tests.utils import SleepFrame, run_test
from processes import free_port

from pipecat_nemotron.agent.wav_input import read_pcm16
from pipecat_nemotron.asr import EngineConfig, NemotronEngine, Transcript
from pipecat_nemotron.models import DEMO_AUDIO_DIR, TINY_MODEL_PATH
from pipecat_nemotron.server.app import ASRServer, ServerConfig
from pipecat_nemotron.stt.remote.reconnect import ASRReconnectMetricsData, ReconnectPolicy
from pipecat_nemotron.stt.remote.replay import Segment
from pipecat_nemotron.stt.remote.service import NemotronServerSTTService

pytestmark = pytest.mark.asyncio(loop_scope="module")
SYNC = pytest.mark.filterwarnings("ignore:The test <Function:pytest.PytestWarning")
TOKEN = "test-token-0123456789abcdef"
FAST = {"reconnect_backoff_min_wait": 0.02, "reconnect_backoff_max_wait": 0.1}


def demo(name: str) -> bytes:
    return read_pcm16(DEMO_AUDIO_DIR / name, convert=True).tobytes()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> AsyncIterator[NemotronEngine]:
    async with started_engine(TINY_MODEL_PATH, one_thread=True) as eng:
        yield eng


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(engine: NemotronEngine) -> AsyncIterator[ASRServer]:
    srv = ASRServer(engine, ServerConfig(port=0, tokens=(TOKEN,), max_sessions=4))
    await srv.start()
    yield srv
    await srv.stop(drain_timeout_s=0)


def finals(frames: list) -> list[str]:
    return [f.text for f in frames if isinstance(f, TranscriptionFrame)]


def errors(frames: list) -> list[str]:
    return [f.error for f in frames if isinstance(f, ErrorFrame)]


# ---- the policy -------------------------------------------------------------------------------------------------


@SYNC
def test_policy_waits_grow_jittered_up_to_the_cap_and_bad_values_name_the_field() -> None:
    policy = ReconnectPolicy(min_wait_s=0.25, max_wait_s=5.0, jitter=0.5)
    rng = random.Random(7)
    for attempt in range(1, 40):
        base = min(5.0, 0.25 * 2 ** (attempt - 2)) if attempt > 1 else 0.125
        low = 0.0 if attempt == 1 else base * 0.5
        for _ in range(20):
            assert low <= policy.wait_s(attempt, rng) <= base
    # Clients displaced together spread out: their first and capped waits differ.
    firsts = {round(policy.wait_s(1, random.Random(seed)), 6) for seed in range(50)}
    capped = {round(policy.wait_s(12, random.Random(seed)), 6) for seed in range(50)}
    assert len(firsts) == 50 and len(capped) == 50
    assert ReconnectPolicy().timeout_s is None  # as long as the pipeline runs
    for field, value in [("min_wait_s", 0), ("jitter", 1.0), ("timeout_s", 0), ("max_quick_failures", 0)]:
        with pytest.raises(ValueError, match=field):
            ReconnectPolicy(**{field: value})
    with pytest.raises(ValueError, match="max_wait_s"):
        ReconnectPolicy(min_wait_s=2, max_wait_s=1)


@SYNC
def test_a_forced_final_cut_counts_from_the_utterance_start_the_server_saw() -> None:
    """The cut is on the server's clock: audio already trimmed from the front (preroll) still counts."""
    seg = Segment()
    for chunk in (b"a" * 100, b"b" * 100, b"c" * 100):
        seg.append(chunk)
    seg.drop_front(100)  # the preroll trim between turns: the server has it, the buffer no longer does
    seg.cut(150)
    assert b"".join(seg.chunks) == b"b" * 50 + b"c" * 100 and seg.nbytes == seg.received == 150
    seg.cut(1000)
    assert seg.nbytes == seg.received == 0 and not seg.chunks


# ---- against a server --------------------------------------------------------------------------------------------


async def test_refusals_and_sessions_lost_at_once_do_not_stop_the_client(
    server: ASRServer, engine: NemotronEngine
) -> None:
    """Twelve refused handshakes (HTTP 500/503, 4013, 4503) and three sessions cut right after opening (1006):
    Pipecat's loop gave up after 10 attempts, or after 3 connections under 5 s; the call's final must arrive."""
    pcm = demo("demo_weather.wav")
    expected = (await engine.transcribe(pcm)).text
    refusals = ["http500", "http503", "close4013", "close4503"] * 3
    async with FaultProxy(server.url, [*refusals, "drop", "drop", "drop"], drop_after_bytes=8000) as proxy:
        stt = NemotronServerSTTService(url=proxy.url, token=TOKEN, final_timeout_s=60, **FAST)
        down, up = await run_test(stt, frames_to_send=[SleepFrame(sleep=0.2), *turn(pcm, wait=1.0)], start_timeout=5)
    assert finals(down) == [expected]
    assert stt.is_usable and proxy.done[:15] == [*refusals, "drop", "drop", "drop"]
    assert stt.keeper.reconnects and stt.keeper.reconnects[-1].replayed_s == pytest.approx(len(pcm) / 32000, abs=1e-6)
    assert not [e for e in errors(up) if "for good" in e or "could not reconnect" in e]


async def test_a_permanent_refusal_stops_at_once(server: ASRServer) -> None:
    async with FaultProxy(server.url, ["http401"]) as proxy:
        stt = NemotronServerSTTService(url=proxy.url, token=TOKEN, **FAST)
        _, up = await run_test(stt, frames_to_send=[SleepFrame(sleep=0.5)], start_timeout=5)
    assert proxy.done == ["http401"] and not stt.is_usable
    assert any("HTTP 401" in e and "for good" in e for e in errors(up)), errors(up)


async def test_sessions_the_server_ends_at_once_stop_after_max_quick_failures(server: ASRServer) -> None:
    async with FaultProxy(server.url, ["end4500"] * 5, drop_after_bytes=3200) as proxy:
        stt = NemotronServerSTTService(
            url=proxy.url, token=TOKEN, reconnect=ReconnectPolicy(min_wait_s=0.02, max_wait_s=0.1, max_quick_failures=3)
        )
        frames = [SleepFrame(sleep=0.2), VADUserStartedSpeakingFrame(), *audio_frames(demo("demo_math.wav"))]
        _, up = await run_test(stt, frames_to_send=[*frames, SleepFrame(sleep=2.0)], start_timeout=5)
    assert proxy.done == ["end4500"] * 3 and not stt.is_usable
    assert any("ended 3 sessions in a row" in e and "4500" in e for e in errors(up)), errors(up)


async def test_by_default_sessions_the_server_ends_at_once_are_retried(server: ASRServer, engine: NemotronEngine) -> None:
    """A replica short of engine slots for a moment answered 4500 three times in a row (the Ray fault test)."""
    pcm = demo("demo_math.wav")
    expected = (await engine.transcribe(pcm)).text
    async with FaultProxy(server.url, ["end4500"] * 4, drop_after_bytes=3200) as proxy:
        stt = NemotronServerSTTService(url=proxy.url, token=TOKEN, final_timeout_s=60, **FAST)
        down, _ = await run_test(stt, frames_to_send=[SleepFrame(sleep=0.2), *turn(pcm, wait=1.0)], start_timeout=5)
    assert proxy.done[:5] == ["end4500"] * 4 + ["forward"] and stt.is_usable
    assert finals(down) == [expected]


async def test_the_time_budget_ends_an_outage_with_a_permanent_error() -> None:
    url = f"ws://127.0.0.1:{free_port()}/v1/asr"  # nothing listens
    with pytest.raises(ValueError, match="timeout_s"):
        NemotronServerSTTService(url=url, max_reconnect_attempts=10)  # its replacement is named
    stt = NemotronServerSTTService(url=url, reconnect=ReconnectPolicy(min_wait_s=0.05, max_wait_s=0.1, timeout_s=0.5))
    # The session runs until the budget's error comes (however long the failed attempts take on this machine).
    budget_spent = Until("the reconnect budget's error", lambda _down, up: any("within 0.5 s" in e for e in errors(up)))
    _, up = await run_steps(stt, [budget_spent])
    assert not stt.is_usable
    (error,) = [e for e in errors(up) if "within 0.5 s" in e]
    assert "transcription stopped" in error and stt.keeper.failed_attempts, (error, stt.keeper.failed_attempts)


async def test_the_replay_buffer_is_bounded_and_what_it_dropped_is_reported(
    server: ASRServer, engine: NemotronEngine
) -> None:
    pcm = demo("demo_timer.wav")
    async with FaultProxy(server.url, ["drop", "http503", "http503", "http503"], drop_after_bytes=9600) as proxy:
        stt = NemotronServerSTTService(url=proxy.url, token=TOKEN, replay_max_s=0.5, final_timeout_s=60, **FAST)
        frames = [
            SleepFrame(sleep=0.2),
            VADUserStartedSpeakingFrame(),
            *audio_frames(pcm),
            VADUserStoppedSpeakingFrame(stop_secs=0.2),
            SleepFrame(sleep=1.0),
        ]
        down, up = await run_test(stt, frames_to_send=frames, start_timeout=5)
    assert len(stt.keeper.reconnects) == 1, stt.keeper.reconnects
    rec = stt.keeper.reconnects[0]
    assert rec.attempts == 4 and rec.replayed_s <= 0.5
    assert rec.dropped_s > 0 and rec.replayed_s + rec.dropped_s == pytest.approx(len(pcm) / 32000, abs=1e-6)
    reported = [e for e in errors(up) if "dropped from the replay buffer" in e]
    assert len(reported) == 1 and f"{rec.dropped_s:.2f} s" in reported[0]
    metrics = [d for f in down if isinstance(f, MetricsFrame) for d in f.data if isinstance(d, ASRReconnectMetricsData)]
    assert len(metrics) == 1 and metrics[0].dropped_s == rec.dropped_s and metrics[0].attempts == 4


async def test_a_client_refused_for_a_bad_token_ends_cleanly_without_owing_finals(server: ASRServer) -> None:
    """Issue 22: a bad token logged ``finals still owed 5 s after the end of the session`` at the end."""
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="DEBUG")
    try:
        stt = NemotronServerSTTService(url=server.url, token="wrong-token-0123456789", **FAST)
        _, up = await run_test(
            stt, frames_to_send=[SleepFrame(sleep=0.3), *turn(demo("demo_math.wav"), wait=0.2)], start_timeout=5
        )
    finally:
        logger.remove(sink)
    assert any("4001" in e for e in errors(up)) and not stt.is_usable
    assert not [line for line in lines if re.search("finals still owed", line)]


async def test_a_reconnect_after_a_forced_final_does_not_replay_its_words() -> None:
    """A forced final (the server's ``max_utterance_s``) confirms the audio it covers: a reconnect replays only
    the rest of the turn, so each word reaches the user once (before the fix, the forced final's words came
    again after the reconnect)."""
    clips = ("demo_weather.wav", "demo_timer.wav", "demo_math.wav")
    pcm = b"".join(demo(name) for name in clips)  # about 8.4 s of speech without a pause longer than its own
    with one_torch_thread():
        engine = NemotronEngine(
            EngineConfig(model=str(TINY_MODEL_PATH), device="cpu", max_streams=2, warmup=False, max_utterance_s=4.0)
        )
        await engine.start()
        server = ASRServer(engine, ServerConfig(port=0, tokens=(TOKEN,), max_sessions=2))
        await server.start()
        try:
            first, rest = await split_once(engine, pcm, latency_ms=1120)
            async with FaultProxy(server.url, ["dropforced"]) as proxy:
                stt = NemotronServerSTTService(url=proxy.url, token=TOKEN, latency_ms=1120, final_timeout_s=60, **FAST)
                down, _ = await run_test(
                    stt, frames_to_send=[SleepFrame(sleep=0.2), *turn(pcm, wait=3.0)], start_timeout=5
                )
        finally:
            await server.stop(drain_timeout_s=0)
            await engine.stop()
    assert proxy.done[:2] == ["dropforced", "forward"] and len(stt.keeper.reconnects) == 1
    frames = [f for f in down if isinstance(f, TranscriptionFrame)]
    assert frames[0].text == first.text and not frames[0].finalized  # the forced final, then the reconnect
    # The new session decoded exactly the audio after the cut (a fresh decode: its first words may differ from
    # the same audio decoded with the cut's left context, so the reference is that audio alone).
    assert " ".join(f.text for f in frames[1:] if f.text) == rest
    assert stt.keeper.reconnects[0].replayed_s == pytest.approx(len(pcm) / 32000 - first.utterance_audio_ms / 1000, abs=1e-3)


async def split_once(engine: NemotronEngine, pcm: bytes, latency_ms: int) -> tuple[Transcript, str]:
    """The first forced final of ``pcm`` decoded in process, and the text of the audio after its cut alone."""
    stream = engine.open_stream(latency_ms=latency_ms)
    try:
        await stream.push(pcm)
        await stream.finalize()
    finally:
        await stream.close()
    first = next(u for u in [u async for u in stream.updates()] if u.is_final and u.forced)
    cut = 2 * round((first.utterance_audio_ms or 0.0) * 16)
    rest = await engine.transcribe(pcm[cut:], latency_ms=latency_ms)
    return first, rest.text
