"""A setting changed between turns applies to the next thing the user says (issue 22, item 4).

The silence after a final belongs to the next utterance and is decoded as it arrives, so "between utterances"
means: no word of the current utterance yet. In-process (engine and ``NemotronSTTService``) and over the server.
The bundled trained tiny models emit nothing on silence, which is what makes the situation real.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from helpers import audio_frames, one_torch_thread, to_pcm16, turn, wait_caught_up
from pipecat.frames.frames import STTUpdateSettingsFrame, TranscriptionFrame
from pipecat.tests.utils import SleepFrame, run_test
from ws_client import open_session, stream

from pipecat_nemotron.agent.wav_input import read_float32
from pipecat_nemotron.asr import EngineConfig, NemotronEngine
from pipecat_nemotron.bench.wer import normalize_text
from pipecat_nemotron.models import DEMO_AUDIO_DIR, TINY_MODEL_PATH, TINY_MULTILINGUAL_MODEL_PATH
from pipecat_nemotron.server.app import ASRServer, ServerConfig
from pipecat_nemotron.server.protocol import (
    ConfigMessage,
    FinalMessage,
    LatencyMessage,
    PeekResultMessage,
    ReadyMessage,
    SetLatencyMessage,
    parse_server_message,
)
from pipecat_nemotron.stt import NemotronSTTService, NemotronSTTSettings

#: What the user says after the pause: the trained tiny model transcribes it exactly in every mode.
SECOND = "hi set a timer for twenty minutes thanks"
#: The pause between the turns: 1.1 s of silence, decoded before the change (as in the issue).
PAUSE = np.zeros(17_600, dtype=np.float32)


def _clip(name: str) -> np.ndarray:
    return read_float32(DEMO_AUDIO_DIR / name)


async def _engine(model=TINY_MODEL_PATH, **config) -> NemotronEngine:
    eng = NemotronEngine(EngineConfig(model=str(model), device="cpu", max_streams=4, **config))
    await eng.start()
    return eng


@pytest.mark.parametrize("finalize_mode", ["soft", "hard"])
async def test_latency_change_after_decoded_silence_applies_to_the_next_words(finalize_mode: str) -> None:
    with one_torch_thread():
        engine = await _engine(finalize_mode=finalize_mode)
        try:
            stream = engine.open_stream(latency_ms=160)
            await stream.push(to_pcm16(_clip("demo_math.wav")))
            first = await stream.finalize()
            await stream.push(to_pcm16(PAUSE))
            await wait_caught_up(stream)
            assert stream.tokens == () and stream.backlog_ms < 200  # the pause is decoded, in the 160 ms mode
            cut = PAUSE.size - round(stream.backlog_ms * 16)
            stream.set_latency(560)
            assert stream.latency_ms == 560  # no word of the utterance yet: applies now
            second_clip = _clip("demo_timer.wav")
            await stream.push(to_pcm16(second_clip))
            second = await stream.finalize()
            await stream.close()
            assert first.latency_ms == 160
            assert (second.latency_ms, normalize_text(second.text)) == (560, SECOND)
            # Positions still count from the previous final's boundary, whatever was cut.
            assert second.start_ms == pytest.approx(first.start_ms + first.utterance_audio_ms)
            assert second.utterance_audio_ms == pytest.approx((PAUSE.size + second_clip.size) / 16)
            assert second.words[0].text == "Hi."  # a mark joins the word before it
            assert 800 <= second.words[0].utterance_start_ms <= 1600  # "hi" starts ~1.1 s in
            starts = [w.start_ms for w in second.words]
            assert starts == sorted(starts)
            if finalize_mode == "hard":
                # The decode restarted at the first sample not yet decoded: the final is exactly the offline
                # decode, in the new mode, of the audio from there.
                audio = np.concatenate([PAUSE, second_clip])
                alone = await engine.transcribe(to_pcm16(audio[cut:]), latency_ms=560)
                assert second.tokens == alone.tokens
        finally:
            await engine.stop()


async def test_change_waits_for_the_boundary_once_a_word_was_emitted() -> None:
    with one_torch_thread():
        engine = await _engine()
        try:
            stream = engine.open_stream(latency_ms=160)
            await stream.push(to_pcm16(_clip("demo_math.wav")))
            await wait_caught_up(stream)
            assert stream.tokens  # words emitted: the utterance stays in its mode
            stream.set_latency(560)
            await stream.settled()
            assert stream.latency_ms == 160
            first = await stream.finalize()
            assert first.latency_ms == 160 and stream.latency_ms == 560
            # Requested after a finalize whose final is pending: for the utterance after it.
            await stream.push(to_pcm16(_clip("demo_timer.wav")))
            pending = stream.finalize_nowait()
            stream.set_latency(1120)
            second = await pending
            await stream.push(to_pcm16(_clip("demo_weather.wav")))
            third = await stream.finalize()
            await stream.close()
            assert (second.latency_ms, third.latency_ms) == (560, 1120)
        finally:
            await engine.stop()


async def test_language_change_after_decoded_silence_applies_to_the_next_words() -> None:
    with one_torch_thread():
        engine = await _engine(TINY_MULTILINGUAL_MODEL_PATH)
        try:
            stream = engine.open_stream(latency_ms=160, language="en-US")
            await stream.push(to_pcm16(_clip("demo_math.wav")))
            first = await stream.finalize()
            await stream.push(to_pcm16(PAUSE))
            await wait_caught_up(stream)
            assert stream.tokens == ()
            stream.set_language("es")
            assert stream.language == "es-ES"
            await stream.push(to_pcm16(_clip("demo_timer.wav")))
            second = await stream.finalize()
            await stream.close()
            assert (first.language, second.language) == ("en-US", "es-ES")
        finally:
            await engine.stop()


async def test_service_applies_a_settings_frame_sent_in_the_pause_to_the_next_turn() -> None:
    with one_torch_thread():
        engine = await _engine()
        try:
            stt = NemotronSTTService(engine=engine, latency_ms=160)
            frames = [
                SleepFrame(sleep=0.2),
                *turn(to_pcm16(_clip("demo_math.wav")), wait=1.0),
                *audio_frames(to_pcm16(PAUSE)),
                SleepFrame(sleep=1.1),  # the pause is decoded meanwhile
                STTUpdateSettingsFrame(delta=NemotronSTTSettings(latency_ms=560)),
                SleepFrame(sleep=0.1),
                *turn(to_pcm16(_clip("demo_timer.wav")), wait=2.0),
            ]
            down, _ = await run_test(stt, frames_to_send=frames, start_timeout=5.0)
        finally:
            await engine.stop()
    finals = [f for f in down if isinstance(f, TranscriptionFrame)]
    assert [normalize_text(f.text) for f in finals] == ["hello what is four times six", SECOND]
    assert [f.result.latency_ms for f in finals] == [160, 560]


async def _messages_until(ws, kind: type, timeout: float = 30.0) -> list:
    """Server messages up to and including the first of type ``kind``."""
    out = []
    async with asyncio.timeout(timeout):
        while True:
            msg = parse_server_message(await ws.recv())
            out.append(msg)
            if isinstance(msg, kind):
                return out


async def test_server_set_latency_in_the_pause_applies_now() -> None:
    with one_torch_thread():
        engine = await _engine()
        server = ASRServer(engine, ServerConfig(port=0, host="127.0.0.1", insecure=True))
        await server.start()
        try:
            ws, ready = await open_session(server.url, ConfigMessage(latency_ms=160))
            assert isinstance(ready, ReadyMessage)
            await stream(ws, to_pcm16(_clip("demo_math.wav")))
            await ws.send('{"type": "finalize"}')
            first = (await _messages_until(ws, FinalMessage))[-1]
            await stream(ws, to_pcm16(PAUSE))
            # A peek is answered once every chunk before it is decoded: the pause is decoded, without a word.
            await ws.send('{"type": "peek"}')
            peek = (await _messages_until(ws, PeekResultMessage))[-1]
            assert peek.text == ""
            await ws.send(SetLatencyMessage(560).to_json())
            ack = (await _messages_until(ws, LatencyMessage))[-1]
            await stream(ws, to_pcm16(_clip("demo_timer.wav")))
            await ws.send('{"type": "finalize"}')
            second = (await _messages_until(ws, FinalMessage))[-1]
            await ws.close()
        finally:
            await server.stop(drain_timeout_s=0)
            await engine.stop()
    assert ack == LatencyMessage(latency_ms=560, applied="now")
    assert (first.latency_ms, second.latency_ms) == (160, 560)
    assert normalize_text(second.text) == SECOND
