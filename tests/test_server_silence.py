"""Silence held back between turns (``NemotronServerSTTService(skip_silence=True)``, the protocol's ``gap``).

What a user relies on: the server encodes only speech and its preroll, yet every final (its text, its last word,
its position in the session and its word times) is what sending every sample gives.
"""

from __future__ import annotations

import pytest
from helpers import TOKEN, audio_frames, clip, finals_of, open_session
from pipecat.frames.frames import VADUserStartedSpeakingFrame, VADUserStoppedSpeakingFrame
from pipecat.tests.utils import run_test
from ws_client import raw_messages

from pipecat_nemotron.asr import NemotronEngine
from pipecat_nemotron.server.app import ASRServer
from pipecat_nemotron.server.protocol import (
    GAP_FEATURE,
    ConfigMessage,
    GapMessage,
    ProtocolError,
    parse_client_message,
)
from pipecat_nemotron.stt.remote.gate import SilenceGate
from pipecat_nemotron.stt.remote.service import NemotronServerSTTService

SILENCE_20MS = bytes(640)
#: The VAD reports the speech start this long after the speech began (Pipecat's default start_secs).
VAD_START_DELAY_FRAMES = 10


def session(clips: list[bytes], lead_s: float = 3.0, tail_s: float = 1.0) -> list:
    """Turns as a transport and Silero would deliver them: silence, speech with the VAD's start delay, VAD stop."""
    frames: list = []
    for pcm in clips:
        frames += audio_frames(SILENCE_20MS * int(lead_s * 50))
        speech = audio_frames(pcm)
        frames += [
            *speech[:VAD_START_DELAY_FRAMES],
            VADUserStartedSpeakingFrame(),
            *speech[VAD_START_DELAY_FRAMES:],
        ]
        frames += [*audio_frames(SILENCE_20MS * 10), VADUserStoppedSpeakingFrame(stop_secs=0.2)]
    return frames + audio_frames(SILENCE_20MS * int(tail_s * 50))


async def finals(url: str, frames: list, *, skip_silence: bool) -> tuple[list, NemotronServerSTTService]:
    stt = NemotronServerSTTService(url=url, token=TOKEN, skip_silence=skip_silence)
    down, _ = await run_test(stt, frames_to_send=frames, start_timeout=5.0)  # the end waits for every final
    return [f for f in finals_of(down) if f.text], stt


@pytest.mark.asyncio(loop_scope="module")
async def test_skipped_silence_gives_the_finals_and_positions_of_every_sample(
    server: ASRServer, engine: NemotronEngine
) -> None:
    clips = [clip(), clip("demo_timer.wav", seed=66), clip("demo_weather.wav", seed=67)]
    frames = session(clips)
    sent, _ = await finals(server.url, frames, skip_silence=False)
    skipped, stt = await finals(server.url, frames, skip_silence=True)
    assert stt.ready is None or GAP_FEATURE in stt.ready.features
    # Before the first VAD frame every sample goes (the service cannot tell silence yet); after it, only the
    # preroll of each lead-in silence does.
    assert stt.audio_withheld_s > 2.0 * (len(clips) - 1), "the silence between turns never reached the server"
    assert [f.text for f in skipped] == [f.text for f in sent]
    # The last word survives: each turn's final is the clip transcribed offline.
    assert [f.text for f in skipped] == [(await engine.transcribe(c)).text for c in clips]
    for a, b in zip(skipped, sent, strict=True):
        assert a.result.start_ms == pytest.approx(b.result.start_ms, abs=0.5)
        assert a.result.utterance_audio_ms == pytest.approx(b.result.utterance_audio_ms, abs=0.5)
        assert [w.text for w in a.result.words] == [w.text for w in b.result.words]
        for wa, wb in zip(a.result.words, b.result.words, strict=True):
            assert wa.start_ms == pytest.approx(wb.start_ms, abs=0.5)
            assert wa.end_ms == pytest.approx(wb.end_ms, abs=0.5)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_gap_counts_in_the_utterance_the_next_finalize_ends(server: ASRServer) -> None:
    """A gap read while a final is still owed moves the next utterance, not the one that final ends."""
    pcm = clip()
    ms = len(pcm) / 32  # 16 kHz, 2 bytes a sample
    ws, ready = await open_session(server.url, ConfigMessage(word_timings=True))
    assert GAP_FEATURE in ready.features
    for frame in audio_frames(pcm):
        await ws.send(frame.audio)
    await ws.send('{"type": "finalize"}')
    await ws.send(GapMessage(ms=4000.0).to_json())  # before the first final is ready, most likely
    for frame in audio_frames(pcm):
        await ws.send(frame.audio)
    await ws.send('{"type": "finalize"}')
    await ws.send('{"type": "close"}')
    finals = [m for m in await raw_messages(ws) if m["type"] == "final"]
    assert [f["utterance_audio_ms"] for f in finals] == pytest.approx([ms, ms + 4000.0], abs=0.5)
    assert [f["session_audio_ms"] for f in finals] == pytest.approx([ms, 2 * ms + 4000.0], abs=0.5)
    first, second = ([w["start_ms"] for w in f["words"]] for f in finals)
    assert first and len(second) == len(first)
    assert all(b - a == pytest.approx(ms + 4000.0, abs=80.0) for a, b in zip(first, second, strict=True))


@pytest.mark.asyncio(loop_scope="module")
async def test_without_a_vad_before_it_every_sample_is_sent(server: ASRServer, engine: NemotronEngine) -> None:
    pcm = bytes(640 * 100) + clip()
    stt = NemotronServerSTTService(url=server.url, token=TOKEN)
    down, _ = await run_test(stt, frames_to_send=audio_frames(pcm), start_timeout=5.0)
    assert stt.audio_withheld_s == 0.0
    assert [f.text for f in finals_of(down) if f.text] == [(await engine.transcribe(pcm)).text]


def test_gate_holds_a_preroll_and_counts_withheld_audio_in_whole_chunks() -> None:
    gate = SilenceGate(preroll_bytes=1000, quantum_bytes=300, report_every=900)
    reported = [gate.hold(bytes([i]) * 100) for i in range(30)]  # 3000 bytes of "silence"
    assert sum(reported) == 1800 and all(r in (0, 900) for r in reported)
    assert gate.withheld_total == 1800  # 2000 bytes over the preroll, counted in whole 300-byte chunks
    withheld, held = gate.release()
    assert withheld == 0  # the last count was reported
    data = b"".join(held)
    assert len(data) == 1200 and data == b"".join(bytes([i]) * 100 for i in range(30))[1800:]
    assert gate.held_bytes == 0


def test_gate_reports_what_it_withheld_when_the_speech_starts() -> None:
    gate = SilenceGate(preroll_bytes=0, quantum_bytes=200, report_every=10_000)
    assert gate.hold(bytes(250)) == 0
    withheld, held = gate.release()
    assert withheld == 200 and b"".join(held) == bytes(50)


def test_gap_message_is_checked() -> None:
    assert parse_client_message('{"type": "gap", "ms": 4160}') == GapMessage(ms=4160.0)
    assert parse_client_message(GapMessage(ms=12.5).to_json()) == GapMessage(ms=12.5)
    for bad in ('{"type": "gap"}', '{"type": "gap", "ms": -1}', '{"type": "gap", "ms": "5"}',
                '{"type": "gap", "ms": 1e12}', '{"type": "gap", "ms": true}'):  # fmt: skip
        with pytest.raises(ProtocolError, match="gap needs ms"):
            parse_client_message(bad)
