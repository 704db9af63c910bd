"""``ASRStream.peek()``: the final-quality text of the current utterance, leaving the stream exactly as it was."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import helpers
import pytest
import pytest_asyncio
import torch
from helpers import wait_caught_up

from pipecat_nemotron.agent.wav_input import read_pcm16
from pipecat_nemotron.asr import EngineConfig, NemotronEngine, StreamClosedError, Transcript
from pipecat_nemotron.models import DEMO_AUDIO_DIR, TINY_MODEL_PATH

MODES = (80, 160, 560, 1120)
#: two_turns.wav: the first turn ends by 1.8 s, the second starts at 3.0 s (``turns.json``); 16 kHz int16.
TURN_SPLIT = int(2.4 * 16000) * 2


pytestmark = pytest.mark.asyncio(loop_scope="module")


def engine_config(finalize_mode: str = "soft") -> EngineConfig:
    return helpers.engine_config(TINY_MODEL_PATH, finalize_mode=finalize_mode, warmup=False)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine():
    async with NemotronEngine(engine_config()) as eng:
        yield eng


def two_turns() -> bytes:
    return read_pcm16(DEMO_AUDIO_DIR / "two_turns.wav").tobytes()


async def speak(stream, pcm: bytes, rng: random.Random | None, peeks: list) -> None:
    """Push ``pcm`` in 20-100 ms pieces; with ``rng``, peek at random points (waiting for some answers).

    Each peek is kept with the tokens the stream had decoded before its flush: for an awaited peek, the stream's
    tokens once it answered (the chunks before a peek are decoded first, and nothing is pushed meanwhile); for
    ``peek_nowait``, its tokens when asked (fewer, or as many).
    """
    i = 0
    while i < len(pcm):
        size = 640 * (rng.randint(1, 5) if rng else 3)
        await stream.push(pcm[i : i + size])
        i += size
        if rng is not None and rng.random() < 0.25:
            if rng.random() < 0.5:
                answer = await stream.peek()
                peeks.append((answer, stream.tokens))
            else:
                peeks.append((stream.peek_nowait(), stream.tokens))
        await asyncio.sleep(0)


async def run_session(engine: NemotronEngine, latency_ms: int, seed: int | None) -> tuple[list, list, list]:
    """Two utterances on one stream: finals, tokens at sync points, and peek answers (with ``seed``: peeks)."""
    rng = random.Random(seed) if seed is not None else None
    pcm = two_turns()
    stream = engine.open_stream(latency_ms=latency_ms)
    peeks: list = []
    synced: list[tuple[int, ...]] = []
    finals = []
    try:
        for part in (pcm[: TURN_SPLIT // 2], pcm[TURN_SPLIT // 2 : TURN_SPLIT], pcm[TURN_SPLIT:]):
            await speak(stream, part, rng, peeks)
            await wait_caught_up(stream)
            synced.append(stream.tokens)
            if len(synced) != 2:
                finals.append(await stream.finalize())
    finally:
        await stream.close()
    return finals, synced, [(p if isinstance(p, Transcript) else p.result(), d) for p, d in peeks]


@pytest.mark.parametrize("latency_ms", MODES)
async def test_peeks_leave_the_stream_unchanged(engine: NemotronEngine, latency_ms: int) -> None:
    # Two streams at once, so the peeks batch with the other stream's chunks.
    (ref_finals, ref_synced, _), *peeked = await asyncio.gather(
        run_session(engine, latency_ms, None), run_session(engine, latency_ms, seed=latency_ms)
    )
    assert [f.text for f in ref_finals] and all(f.text for f in ref_finals)
    tokenizer = engine.model.tokenizer
    for finals, synced, peeks in peeked:
        assert peeks, "the random schedule peeked"
        assert synced == ref_synced
        assert [f.tokens for f in finals] == [f.tokens for f in ref_finals]
        assert [f.text for f in finals] == [f.text for f in ref_finals]
        assert any(decoded for _, decoded in peeks), "some peek came after decoded words"
        for p, decoded in peeks:
            assert p.utterance in (0, 1) and p.latency_ms == latency_ms and p.peek_ms >= 0
            final = finals[p.utterance]
            # A peek is what the stream had decoded, then the flush of the rest of its audio. The decoded part
            # starts both the peek and its utterance's final; only the flushed tail (at most one chunk) may differ
            # from the final ("it? What" for "it, please?"), as the next chunks decode that audio with its real
            # right context.
            assert p.tokens[: len(decoded)] == decoded == final.tokens[: len(decoded)], (p, final)
            words = tokenizer.ids_to_text(list(decoded)) if decoded else ""
            assert p.text.startswith(words) and final.text.startswith(words), (words, p.text, final.text)


@pytest.mark.parametrize("finalize_mode", ["soft", "hard"])
async def test_peek_equals_the_final_it_predicts(engine: NemotronEngine, finalize_mode: str) -> None:
    pcm = two_turns()
    if finalize_mode == "hard":  # a peek right after a hard reset starts from a fresh slot, as the final does
        engine = NemotronEngine(engine_config("hard"))
        await engine.start()
    stream = engine.open_stream(latency_ms=160)
    try:
        await speak(stream, pcm[:TURN_SPLIT], None, [])
        peek = await stream.peek()
        again = await stream.peek()
        final = await stream.finalize()
        assert peek.text and peek.text == final.text and peek.tokens == final.tokens
        assert peek.kind == "peek" and peek.utterance == 0 and peek.latency_ms == 160
        assert again == replace(peek, peek_ms=again.peek_ms), "a second peek sees the same stream"
        assert peek.utterance_audio_ms == pytest.approx(final.utterance_audio_ms)

        # A peek asked while a final is pending belongs to the next utterance; one asked before it, to this one.
        await speak(stream, pcm[TURN_SPLIT:], None, [])
        before = stream.peek_nowait()
        final_future = stream.finalize_nowait()
        after = stream.peek_nowait()
        second = await final_future
        assert (await before).text == second.text and (await before).utterance == 1
        assert (await after).text == "" and (await after).utterance == 2
    finally:
        await stream.close()
        if finalize_mode == "hard":
            await engine.stop()


async def test_simultaneous_peeks_share_one_forward(engine: NemotronEngine) -> None:
    pcm = two_turns()[:TURN_SPLIT]
    streams = [engine.open_stream(latency_ms=160) for _ in range(2)]
    forwards: list[list[int]] = []

    def hook(ids: list[int], _enc: torch.Tensor, _len: torch.Tensor) -> None:
        forwards.append(list(ids))

    try:
        for s in streams:
            await s.push(pcm)
        for s in streams:
            await wait_caught_up(s)
        with engine.observe_encoder_output(hook):
            a, b = await asyncio.gather(*(s.peek() for s in streams))
        assert a.text and a.tokens == b.tokens
        assert sorted(s.stream_id for s in streams) in [sorted(ids) for ids in forwards]
    finally:
        for s in streams:
            await s.close()


async def test_peek_edges(engine: NemotronEngine) -> None:
    stream = engine.open_stream(latency_ms=160)
    empty = await stream.peek()
    assert empty.text == "" and empty.tokens == () and empty.utterance_audio_ms == 0
    await stream.push(two_turns()[:TURN_SPLIT])
    pending = stream.peek_nowait()
    await stream.close()
    with pytest.raises(StreamClosedError):
        await pending
    with pytest.raises(StreamClosedError):
        await stream.peek()
