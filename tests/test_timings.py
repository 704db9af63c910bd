"""Word timings and confidence on the bundled tiny model: against the audio, across turns, right vs wrong words.

Timing clips are single espeak-ng words joined by known silences (``word_clips.py``), so every word's true start
and end are known from the samples. Numbers and their causes: ``docs/TRANSCRIPTS.md``.
"""

from __future__ import annotations

import asyncio
import io
import json
from dataclasses import fields

import numpy as np
import pytest
import pytest_asyncio
import websockets
from helpers import FRAME_BYTES, to_pcm16, turn
from pipecat.frames.frames import InterimTranscriptionFrame, TranscriptionFrame
from pipecat.tests.utils import SleepFrame, run_test
from word_clips import HELDOUT_MANIFEST, TimingErrors, WordClip, WordSpan, correct_words, sentence_clips

from pipecat_nemotron.agent.wav_input import read_float32
from pipecat_nemotron.asr import EngineConfig, NemotronEngine
from pipecat_nemotron.asr.types import Transcript, WordTiming
from pipecat_nemotron.asr.words import TimingCalibration, TokenTrace, WordAligner, calibration_for
from pipecat_nemotron.models import TINY_MODEL_PATH as TRAINED_MODEL
from pipecat_nemotron.observers.transcripts import TranscriptCollector
from pipecat_nemotron.server.app import ASRServer, ServerConfig
from pipecat_nemotron.server.protocol import (
    PROTOCOL_VERSION,
    WORD_TIMINGS_FEATURE,
    ConfigMessage,
    FinalizeMessage,
    FinalMessage,
    PartialMessage,
    ReadyMessage,
    parse_server_message,
)
from pipecat_nemotron.server.protocol_server import transcript_from_final
from pipecat_nemotron.stt import NemotronSTTService
from pipecat_nemotron.stt.remote.service import NemotronServerSTTService

pytestmark = pytest.mark.asyncio(loop_scope="module")

#: Clips per timing test (about 7 words each).
CLIPS = 40


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine():
    config = EngineConfig(
        model=str(TRAINED_MODEL), device="cpu", max_streams=200, max_batch_size=64, warmup=False
    )
    async with NemotronEngine(config) as eng:
        yield eng


@pytest.fixture(scope="module")
def clips() -> list[WordClip]:
    return sentence_clips(CLIPS)


def _words(words: tuple[WordTiming, ...]) -> list[tuple[str, float, float]]:
    return [(w.text, w.start_ms, w.end_ms) for w in words]


@pytest.mark.parametrize("latency_ms", [160, 560])
async def test_word_starts_match_the_audio(
    engine: NemotronEngine, clips: list[WordClip], latency_ms: int
) -> None:
    finals = await asyncio.gather(*(engine.transcribe(c.audio, latency_ms=latency_ms) for c in clips))
    errors = TimingErrors.measure(clips, [_words(f.words) for f in finals])
    summary = errors.summary()
    assert errors.matched >= 0.85 * errors.total, summary
    assert summary["start_median_abs_ms"] <= 80.0, summary  # the target (measured: ~70 ms)
    # Regression guard below the measured level (81% within 200 ms, p95 419 ms at 160 ms over 100 clips:
    # scripts/eval_word_timings.py timings --modes 160; 86% on these 40): the 95% target is not
    # reachable with this model (see test_95_percent_of_word_starts_within_200ms).
    assert summary["start_within_200ms"] >= 0.70, summary
    assert summary["end_median_abs_ms"] <= 130.0, summary
    for final in finals:
        assert all(
            0.0 <= w.confidence <= 1.0 and w.start_ms <= w.end_ms <= final.utterance_audio_ms for w in final.words
        )
        assert " ".join(w.text for w in final.words) == final.text


@pytest.mark.xfail(
    strict=True,
    reason="unmet requirement: the tiny model emits many words in the same frame as a neighbouring word (late, "
    "or anticipated like 'thank you'), places the others from their end, and the joint's blank probability stays "
    "~1.0 until emission, so NeMo's RNNT outputs carry no earlier onset: 81% of starts are within 200 ms "
    "(scripts/eval_word_timings.py timings --modes 160; docs/TRANSCRIPTS.md, docs/BENCHMARKS.md §6)",
)
async def test_95_percent_of_word_starts_within_200ms(engine: NemotronEngine, clips: list[WordClip]) -> None:
    finals = await asyncio.gather(*(engine.transcribe(c.audio, latency_ms=160) for c in clips))
    summary = TimingErrors.measure(clips, [_words(f.words) for f in finals]).summary()
    assert summary["start_within_200ms"] >= 0.95, summary


@pytest.mark.parametrize(("latency_ms", "finalize_mode"), [(160, "soft"), (560, "soft"), (160, "hard")])
async def test_timings_stay_monotonic_across_turns_of_one_stream(
    clips: list[WordClip], latency_ms: int, finalize_mode: str
) -> None:
    """Turns of one stream: word times count from the stream's start, grow turn after turn, match the audio."""
    turns = clips[:8]
    config = EngineConfig(model=str(TRAINED_MODEL), device="cpu", max_streams=2, finalize_mode=finalize_mode)
    async with NemotronEngine(config) as eng:
        stream = eng.open_stream(latency_ms=latency_ms)
        finals = []
        for clip in turns:
            await stream.push(clip.audio)
            finals.append(await stream.finalize())
        await stream.close()
    offset = 0.0
    shifted: list[WordClip] = []
    for clip, final in zip(turns, finals, strict=True):
        assert final.start_ms == pytest.approx(offset, abs=0.1)
        starts = [w.start_ms for w in final.words]
        assert starts == sorted(starts)
        assert all(offset <= w.start_ms <= w.end_ms <= offset + final.utterance_audio_ms + 1e-6 for w in final.words)
        assert all(w.start_ms == pytest.approx(offset + w.utterance_start_ms) for w in final.words)
        truth = tuple(WordSpan(w.text, w.start_ms + offset, w.end_ms + offset) for w in clip.words)
        shifted.append(WordClip(clip.audio, truth))
        offset += final.utterance_audio_ms  # the next turn's words start after every word of this one
    summary = TimingErrors.measure(shifted, [_words(f.words) for f in finals]).summary()
    assert summary["start_median_abs_ms"] <= 80.0, summary  # later turns are placed on the right frame grid


async def test_confidence_is_lower_on_wrong_words(engine: NemotronEngine) -> None:
    """Mean word confidence over the held-out set: words the model gets wrong score lower than right ones."""
    rows = json.loads(HELDOUT_MANIFEST.read_text())
    audio = [read_float32(HELDOUT_MANIFEST.parent / r["audio"]) for r in rows]
    finals = await asyncio.gather(*(engine.transcribe(a, latency_ms=160) for a in audio))
    right: list[float] = []
    wrong: list[float] = []
    for row, final in zip(rows, finals, strict=True):
        for word, ok in zip(
            final.words, correct_words([w.text for w in final.words], row["text"].split()), strict=True
        ):
            (right if ok else wrong).append(word.confidence)
        if final.words:
            assert final.confidence == pytest.approx(np.mean([w.confidence for w in final.words]))
    assert len(wrong) >= 10, "the held-out set should hold some errors"
    assert np.mean(wrong) < np.mean(right) - 0.2, (np.mean(right), np.mean(wrong))  # measured: 0.67 vs 0.22


async def test_partials_carry_the_words_so_far(engine: NemotronEngine, clips: list[WordClip]) -> None:
    stream = engine.open_stream(latency_ms=160)
    updates = []

    async def read() -> None:
        async for update in stream.updates():
            updates.append(update)

    reader = asyncio.create_task(read())
    for i in range(0, clips[0].audio.size, 1600):
        await stream.push(clips[0].audio[i : i + 1600])
        await asyncio.sleep(0)
    final = await stream.finalize()
    await stream.close()
    await reader
    partials = [u for u in updates if not u.is_final]
    assert partials and updates[-1].is_final and updates[-1].words == final.words
    for update in partials:
        assert " ".join(w.text for w in update.words) == update.text
        assert update.confidence is not None and 0.0 <= update.confidence <= 1.0


# ---- the word assembly, without a model ------------------------------------------------------------------------


class _Tokenizer:
    """SentencePiece-like: ids 0..4 are the pieces below."""

    pieces = ["\u2581one", "\u2581t", "wo", "\u2581", "six"]
    vocab_size = len(pieces)

    def ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.pieces[i] for i in ids]

    def ids_to_text(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids).replace("\u2581", " ").strip()


async def test_pieces_starting_with_the_marker_start_words() -> None:
    aligner = WordAligner(_Tokenizer(), hop_ms=10.0, subsampling=8)
    tokens = [0, 1, 2, 3, 4]
    trace = TokenTrace(frames=[16, 24, 40, 48, 48], confidence=[0.9, 0.8, 0.5, 0.7, 0.6])
    words = aligner.words(tokens, trace, start_ms=1000.0)
    assert [(w.text, w.utterance_start_ms, w.utterance_end_ms, w.confidence) for w in words] == [
        ("one", 80.0, 160.0, 0.9),
        ("two", 160.0, 400.0, 0.5),  # the lowest confidence of its tokens (NeMo's "min" aggregation)
        ("six", 400.0, 480.0, 0.6),
    ]
    assert [w.start_ms for w in words] == [1080.0, 1160.0, 1400.0]


class _PunctuatedTokenizer(_Tokenizer):
    """A cased, punctuated model's pieces: ``?`` and ``,`` are pieces of their own, joined to the word before."""

    pieces = ["\u2581What", "\u2581is", "\u2581two", "?", "\u2581Hi", ","]
    vocab_size = len(pieces)


async def test_punctuation_joins_the_word_before_without_moving_its_end() -> None:
    """A punctuation piece, emitted frames after its word's last sound, is part of the word's text but not of its
    timing (as in NeMo's RNNT timestamps): "two?" ends where "two" was heard."""
    aligner = WordAligner(_PunctuatedTokenizer(), hop_ms=10.0, subsampling=8)
    trace = TokenTrace(frames=[16, 24, 40, 72, 88, 104], confidence=[0.9, 0.9, 0.8, 0.6, 0.9, 0.7])
    words = aligner.words([0, 1, 2, 3, 4, 5], trace, start_ms=0.0)
    assert [(w.text, w.start_ms, w.end_ms) for w in words] == [
        ("What", 80.0, 160.0),
        ("is", 160.0, 240.0),
        ("two?", 320.0, 400.0),
        ("Hi,", 800.0, 880.0),
    ]


async def test_calibration_shifts_and_clips_words() -> None:
    aligner = WordAligner(
        _Tokenizer(), 10.0, 8, TimingCalibration(start_offset_ms=-300.0, end_offset_ms=-50.0)
    )
    words = aligner.words([0, 1, 2], TokenTrace([16, 80, 80], [1.0, 1.0, 1.0]), 0.0, utterance_ms=700.0)
    assert [(w.start_ms, w.end_ms) for w in words] == [
        (0.0, 110.0),
        (420.0, 700.0),
    ]  # clipped at 0 and the end
    assert calibration_for("/models/tiny_nemotron_asr.nemo").start_offset_ms < 0
    assert calibration_for("nvidia/nemotron-speech-streaming-en-0.6b") == TimingCalibration()
    assert calibration_for("any", (-100.0, -20.0)) == TimingCalibration(-100.0, -20.0)


async def test_a_trace_out_of_step_with_the_tokens_gives_no_words() -> None:
    aligner = WordAligner(_Tokenizer(), 10.0, 8)
    assert aligner.words([0, 1], TokenTrace([8], [1.0]), 0.0) == ()
    assert aligner.words([], TokenTrace(), 0.0) == ()


async def test_word_timings_can_be_switched_off(clips: list[WordClip]) -> None:
    config = EngineConfig(
        model=str(TRAINED_MODEL), device="cpu", max_streams=2, warmup=False, word_timings=False
    )
    async with NemotronEngine(config) as eng:
        final = await eng.transcribe(clips[0].audio, latency_ms=160)
    assert final.text and final.words == () and final.confidence is None


# ---- through the STT services and the server ------------------------------------------------------------------


def _turn_frames(clip: WordClip) -> list:
    return [SleepFrame(sleep=0.2), *turn(to_pcm16(clip.audio), wait=2.0)]


def _check_result(frame: TranscriptionFrame, expected: tuple[WordTiming, ...]) -> None:
    result = frame.result
    assert isinstance(result, Transcript) and result.is_final and result.text == frame.text
    assert " ".join(w.text for w in result.words) == frame.text
    assert [(w.text, round(w.start_ms), round(w.end_ms)) for w in result.words] == [
        (w.text, round(w.start_ms), round(w.end_ms)) for w in expected
    ]
    assert result.confidence == pytest.approx(np.mean([w.confidence for w in expected]), abs=1e-3)


async def test_stt_frames_carry_words_and_the_collector_prints_them(
    engine: NemotronEngine, clips: list[WordClip]
) -> None:
    expected = await engine.transcribe(to_pcm16(clips[1].audio), latency_ms=160)
    stt = NemotronSTTService(engine=engine, latency_ms=160)
    out = io.StringIO()
    collector = TranscriptCollector(stt.name, out=out, show_interims=False, show_words=True)
    down, _ = await run_test(
        stt, frames_to_send=_turn_frames(clips[1]), observers=[collector], start_timeout=5.0
    )
    finals = [f for f in down if isinstance(f, TranscriptionFrame)]
    assert len(finals) == 1
    _check_result(finals[0], expected.words)
    interims = [f for f in down if isinstance(f, InterimTranscriptionFrame)]
    assert interims and all(
        isinstance(f.result, Transcript) and not f.result.is_final for f in interims
    )
    assert collector.utterances[0].result == finals[0].result
    printed = out.getvalue()
    assert "confidence" in printed and all(w.text in printed for w in expected.words)


async def test_server_final_carries_words_only_when_asked(
    engine: NemotronEngine, clips: list[WordClip]
) -> None:
    pcm = to_pcm16(clips[2].audio)
    expected = await engine.transcribe(pcm, latency_ms=160)
    srv = ASRServer(engine, ServerConfig(port=0, insecure=True))
    await srv.start()
    try:
        for asked in (False, True):
            async with websockets.connect(srv.url, subprotocols=[PROTOCOL_VERSION]) as ws:
                await ws.send(ConfigMessage(word_timings=asked).to_json())
                ready = parse_server_message(await asyncio.wait_for(ws.recv(), 10))
                assert isinstance(ready, ReadyMessage) and WORD_TIMINGS_FEATURE in ready.features
                for i in range(0, len(pcm), FRAME_BYTES * 10):
                    await ws.send(pcm[i : i + FRAME_BYTES * 10])
                await ws.send(FinalizeMessage().to_json())
                while isinstance(
                    msg := parse_server_message(raw := await asyncio.wait_for(ws.recv(), 30)), PartialMessage
                ):
                    assert "words" not in json.loads(raw)
                assert isinstance(msg, FinalMessage) and msg.text == expected.text
                if not asked:  # an old client sees exactly the v1 message it knows
                    # An old client's final: no words, (English model) no language fields, and no `forced`
                    # (only a final split at the longest utterance carries it).
                    assert set(json.loads(raw)) == {"type", *(f.name for f in fields(FinalMessage))} - {
                        "words",
                        "confidence",
                        "language",
                        "detected_language",
                        "forced",
                    }
                    continue
                result = transcript_from_final(msg)
                assert [(w.text, round(w.start_ms), round(w.utterance_start_ms)) for w in result.words] == [
                    (w.text, round(w.start_ms), round(w.utterance_start_ms)) for w in expected.words
                ]
                assert msg.confidence == pytest.approx(expected.confidence, abs=1e-3)
        stt = NemotronServerSTTService(url=srv.url)
        down, _ = await run_test(stt, frames_to_send=_turn_frames(clips[2]), start_timeout=5.0)
        finals = [f for f in down if isinstance(f, TranscriptionFrame)]
        assert len(finals) == 1
        _check_result(finals[0], expected.words)
    finally:
        await srv.stop(drain_timeout_s=0)
