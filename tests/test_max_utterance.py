"""No reply grows without bound: an utterance longer than ``max_utterance_s`` is split (issue 22, item 12).

Ten minutes of speech without a finalize, in-process and over the server: every final fits the server's
``max_message_bytes``, and the finals together hold exactly the tokens of the same audio decoded as one utterance
(no word lost or changed at a cut). Cheap: the bundled tiny model in the 1120 ms mode, fed faster than real time.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from helpers import one_torch_thread, to_pcm16, turn
from pipecat.frames.frames import TranscriptionFrame
from pipecat.tests.utils import SleepFrame, run_test
from ws_client import open_session, stream

from pipecat_nemotron.agent.wav_input import read_float32
from pipecat_nemotron.asr import EngineConfig, NemotronEngine, Transcript
from pipecat_nemotron.asr.splits import SPLIT_WINDOW_S, choose_split
from pipecat_nemotron.bench.wer import normalize_text
from pipecat_nemotron.models import DEMO_AUDIO_DIR, TINY_MODEL_PATH
from pipecat_nemotron.server.app import ASRServer, ServerConfig
from pipecat_nemotron.server.protocol import (
    ConfigMessage,
    FinalMessage,
    dump_server_message,
    parse_server_message,
    words_to_wire,
)
from pipecat_nemotron.stt import NemotronSTTService
from pipecat_nemotron.stt.remote.service import NemotronServerSTTService

CLIPS = ("demo_weather.wav", "demo_timer.wav", "demo_math.wav")


def speech(seconds: float) -> tuple[np.ndarray, str]:
    """The demo clips back to back (no pause longer than their own edges), at least ``seconds``; and its words."""
    transcripts = json.loads((DEMO_AUDIO_DIR / "transcripts.json").read_text())
    clips = [read_float32(DEMO_AUDIO_DIR / name) for name in CLIPS]
    out: list[np.ndarray] = []
    words: list[str] = []
    while sum(c.size for c in out) < seconds * 16_000:
        out.append(clips[len(out) % len(clips)])
        words.append(transcripts[CLIPS[len(words) % len(clips)]])
    return np.concatenate(out), " ".join(words)


async def _engine(max_utterance_s: float | None, **config) -> NemotronEngine:
    eng = NemotronEngine(
        EngineConfig(
            model=str(TINY_MODEL_PATH),
            device="cpu",
            max_streams=2,
            warmup=False,
            max_utterance_s=max_utterance_s,
            **config,
        )
    )
    await eng.start()
    return eng


async def _stream_finals(engine: NemotronEngine, pcm: bytes, latency_ms: int) -> list[Transcript]:
    """Push ``pcm`` at once, finalize, close; every final the stream delivered, in order."""
    s = engine.open_stream(latency_ms=latency_ms)
    finals: list[Transcript] = []

    async def read() -> None:
        async for update in s.updates():
            if update.is_final:
                finals.append(update)

    reader = asyncio.create_task(read())
    for i in range(0, len(pcm), 32_000):
        await s.push(pcm[i : i + 32_000])
    await s.finalize()
    await s.close()
    await reader
    return finals


def _final_bytes(update: Transcript) -> int:
    """Size of the server's ``final`` message for ``update``, with word timings (the largest form)."""
    msg = FinalMessage(
        utterance=update.utterance,
        text=update.text,
        latency_ms=update.latency_ms,
        session_audio_ms=update.start_ms + (update.utterance_audio_ms or 0.0),
        utterance_audio_ms=update.utterance_audio_ms or 0.0,
        words=words_to_wire(update.words),
        confidence=update.confidence,
    )
    return len(dump_server_message(msg).encode())


def test_split_point_is_the_longest_pause_near_the_limit() -> None:
    starts = lambda token: token % 2 == 0  # noqa: E731  (even ids start words)
    limit = 6000  # 60 s in mel frames; the window is the last 5 s
    assert choose_split([2, 3], [10, 20], starts, 5999, limit) is None  # below the limit
    assert choose_split([], [], starts, 7000, limit) is None  # nothing said: nothing to deliver
    # Words at 5510, 5600 and 5900; the longest blank run in [5500, 6000] is 5600..5900.
    split = choose_split([2, 3, 4, 5, 6, 7], [5500, 5510, 5590, 5600, 5890, 5900], starts, 6050, limit)
    assert (split.tokens, split.cut_frame) == (4, 5745)
    # The trailing silence counts: nothing said in the window.
    split = choose_split([2, 3], [100, 200], starts, 6100, limit)
    assert (split.tokens, split.cut_frame) == (2, 5750)
    # One "word" through the whole window: cut at the limit between tokens.
    split = choose_split([2] + [3] * 60, [5400 + 10 * i for i in range(61)], starts, 6100, limit)
    assert (split.tokens, split.cut_frame) == (60, 6000)
    assert SPLIT_WINDOW_S == 5.0


async def test_serve_max_utterance_s_flag_reaches_ready_limits(capsys: pytest.CaptureFixture[str]) -> None:
    from pipecat_nemotron.cli import build_parser, main, serve_configs

    base = ["serve", "--model", str(TINY_MODEL_PATH), "--device", "cpu", "--insecure", "--host", "127.0.0.1"]
    default_engine, _ = serve_configs(build_parser().parse_args(base))
    assert default_engine.max_utterance_s == EngineConfig().max_utterance_s == 60.0
    assert serve_configs(build_parser().parse_args([*base, "--max-utterance-s", "none"]))[0].max_utterance_s is None
    with pytest.raises(ValueError, match="max_utterance_s"):
        serve_configs(build_parser().parse_args([*base, "--max-utterance-s", "1"]))
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "--max-utterance-s" in capsys.readouterr().out
    engine_config, server_config = serve_configs(
        build_parser().parse_args([*base, "--max-utterance-s", "12.5", "--port", "0", "--max-sessions", "2"])
    )
    engine = NemotronEngine(replace(engine_config, warmup=False))
    await engine.start()
    server = ASRServer(engine, server_config)
    await server.start()
    try:
        ws, ready = await open_session(server.url, ConfigMessage(latency_ms=1120))
        await ws.close()
    finally:
        await server.stop(drain_timeout_s=0)
        await engine.stop()
    assert ready.limits["max_utterance_s"] == 12.5


@pytest.mark.parametrize("value", [1.0, 0, -5, 4000.0, True, "60"])
def test_max_utterance_s_is_validated(value) -> None:
    with pytest.raises(ValueError, match="max_utterance_s must be seconds from 2 to 3600"):
        EngineConfig(max_utterance_s=value)
    assert (
        EngineConfig().max_utterance_s == 60.0 and EngineConfig(max_utterance_s=None).max_utterance_s is None
    )


async def test_ten_minutes_without_a_pause_give_bounded_finals_and_every_word() -> None:
    audio, spoken = speech(600.0)
    limit_bytes = ServerConfig(host="127.0.0.1", insecure=True).max_message_bytes
    with one_torch_thread():
        engine = await _engine(60.0)
        try:
            t0 = time.perf_counter()
            finals = await _stream_finals(engine, to_pcm16(audio), 1120)
            decode_s = time.perf_counter() - t0
        finally:
            await engine.stop()
    print(f"{audio.size / 16000:.0f} s of speech decoded in {decode_s:.1f} s; {len(finals)} finals")
    assert [f.forced for f in finals] == [True] * (len(finals) - 1) + [False]
    assert len(finals) >= 10
    assert [f.utterance for f in finals] == list(range(len(finals)))
    # Each utterance at most 60 s, and together they tile the audio.
    assert all(0 < f.utterance_audio_ms <= 60_000 for f in finals)
    for before, after in zip(finals, finals[1:], strict=False):
        assert after.start_ms == pytest.approx(before.start_ms + before.utterance_audio_ms)
    assert finals[-1].start_ms + finals[-1].utterance_audio_ms == pytest.approx(audio.size / 16)
    # No word lost at a cut: the finals together are the words spoken (the tiny model gets all 1,570 right).
    assert normalize_text(" ".join(f.text for f in finals if f.text)) == normalize_text(spoken)
    words = tuple(w for f in finals for w in f.words)
    assert normalize_text(" ".join(w.text for w in words)) == normalize_text(spoken)
    # Every final fits the server's message limit; unsplit, the same speech would not.
    sizes = [_final_bytes(f) for f in finals]
    print(f"final message sizes with words: max {max(sizes)} bytes")
    assert max(sizes) <= min(limit_bytes, 20 * 1024)
    unsplit = replace(finals[-1], text=spoken, words=words, start_ms=0.0, utterance_audio_ms=audio.size / 16)
    print(f"the same speech as one final: {_final_bytes(unsplit)} bytes (limit {limit_bytes})")
    assert _final_bytes(unsplit) > limit_bytes
    # Word times stay on the session's clock across cuts.
    starts = [w.start_ms for w in words]
    assert starts == sorted(starts)
    assert all(f.start_ms <= w.start_ms <= f.start_ms + f.utterance_audio_ms for f in finals for w in f.words)


@pytest.mark.parametrize("finalize_mode", ["soft", "hard"])
async def test_transcribe_joins_the_parts_of_a_long_clip(finalize_mode: str) -> None:
    pcm = to_pcm16(speech(25.0)[0])
    with one_torch_thread():
        bounded = await _engine(8.0, finalize_mode=finalize_mode)
        unbounded = await _engine(None, finalize_mode=finalize_mode)
        try:
            joined = await bounded.transcribe(pcm, latency_ms=1120)
            whole = await unbounded.transcribe(pcm, latency_ms=1120)
        finally:
            await bounded.stop()
            await unbounded.stop()
    assert joined.tokens == whole.tokens and joined.text == whole.text
    assert joined.utterance_audio_ms == pytest.approx(whole.utterance_audio_ms) and joined.utterance == 0


async def _unsplit_final(pcm: bytes) -> Any:
    """The final of ``pcm`` as one utterance (no length limit), 1120 ms mode."""
    unbounded = await _engine(None)
    try:
        return await unbounded.transcribe(pcm, latency_ms=1120)
    finally:
        await unbounded.stop()


async def test_service_pushes_forced_finals_as_transcription_frames_in_order() -> None:
    pcm = to_pcm16(speech(25.0)[0])
    with one_torch_thread():
        expected = await _unsplit_final(pcm)
        engine = await _engine(8.0)
        try:
            stt = NemotronSTTService(engine=engine, latency_ms=1120)
            down, _ = await run_test(
                stt, frames_to_send=[SleepFrame(sleep=0.2), *turn(pcm, wait=4.0)], start_timeout=5.0
            )
        finally:
            await engine.stop()
    finals = [f for f in down if isinstance(f, TranscriptionFrame)]
    assert len(finals) >= 3
    assert " ".join(f.text for f in finals) == expected.text
    assert [f.finalized for f in finals] == [False] * (len(finals) - 1) + [True]
    assert [f.result.utterance for f in finals] == sorted(f.result.utterance for f in finals)


@pytest.mark.serial
async def test_server_delivers_forced_finals_within_max_message_bytes() -> None:
    pcm = to_pcm16(speech(40.0)[0])
    with one_torch_thread():
        expected = await _unsplit_final(pcm)
        engine = await _engine(10.0)
        server = ASRServer(
            engine,
            ServerConfig(
                port=0,
                host="127.0.0.1",
                insecure=True,
                max_message_bytes=16 * 1024,
                max_speed=100.0,
                burst_ms=60_000.0,
                max_backlog_ms=60_000.0,
            ),
        )
        await server.start()
        try:
            ws, ready = await open_session(server.url, ConfigMessage(latency_ms=1120, word_timings=True))
            await stream(ws, pcm, speed=200.0)
            await ws.send('{"type": "finalize"}')
            await ws.send('{"type": "close"}')
            raw: list[str] = []
            async with asyncio.timeout(120):
                async for message in ws:
                    raw.append(message)
            # The server STT service pushes the forced finals as TranscriptionFrames too, in order.
            stt = NemotronServerSTTService(url=server.url, latency_ms=1120)
            down, _ = await run_test(
                stt, frames_to_send=[SleepFrame(sleep=0.5), *turn(pcm, wait=6.0)], start_timeout=10.0
            )
        finally:
            await server.stop(drain_timeout_s=0)
            await engine.stop()
    finals = [m for m in map(parse_server_message, raw) if isinstance(m, FinalMessage)]
    assert len(finals) >= 4
    assert [f.forced for f in finals] == [True] * (len(finals) - 1) + [None]
    assert '"forced"' not in raw[-1]  # absent from ordinary finals
    assert [f.utterance for f in finals] == list(range(len(finals)))
    assert " ".join(f.text for f in finals if f.text) == expected.text
    assert all(len(r.encode()) <= 16 * 1024 for r in raw)
    assert all(f.utterance_audio_ms <= 10_000 for f in finals)
    assert finals[-1].session_audio_ms == pytest.approx(len(pcm) / 32, abs=1)
    assert ready.limits["max_utterance_s"] == 10.0
    frames = [f for f in down if isinstance(f, TranscriptionFrame)]
    assert " ".join(f.text for f in frames) == expected.text
    assert [f.finalized for f in frames] == [False] * (len(frames) - 1) + [True]
