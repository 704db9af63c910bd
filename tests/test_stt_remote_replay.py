"""Unit tests of the server STT's replay buffer (``pipecat_nemotron.stt.remote.replay``): no server, no model.

What a user relies on: after a reconnect every unconfirmed utterance is sent again, in order, with its
``finalize``; confirmed audio never is; the bounds drop the oldest audio and say how much.
"""

from __future__ import annotations

import asyncio

import pytest

from pipecat_nemotron.stt.remote.replay import ReplayBuffer, pieces

FINALIZE = '{"type": "finalize"}'


async def _replayed(buffer: ReplayBuffer, max_bytes: int = 1 << 16) -> list[str | bytes]:
    sent: list[str | bytes] = []

    async def send(message: str | bytes) -> None:
        sent.append(message)

    await buffer.replay(send, max_bytes, FINALIZE)
    return sent


async def test_unconfirmed_utterances_replay_in_order_with_their_finalize() -> None:
    buffer = ReplayBuffer()
    buffer.append(b"a1")
    buffer.append(b"a2")
    buffer.finalize()
    buffer.append(b"b1")
    buffer.finalize()
    buffer.append(b"c1")  # open: no finalize yet
    assert buffer.owes_finals and buffer.nbytes == 8
    assert await _replayed(buffer) == [b"a1a2", FINALIZE, b"b1", FINALIZE, b"c1"]
    first = buffer.confirm()
    assert first is not None and first.finalize_sent_at is not None  # the round trip can be measured
    assert await _replayed(buffer) == [b"b1", FINALIZE, b"c1"]


async def test_confirmations_release_the_wait_only_when_no_final_is_owed() -> None:
    buffer = ReplayBuffer()
    await asyncio.wait_for(buffer.wait_for_finals(), 1)  # nothing owed: returns at once
    buffer.append(b"xx")
    buffer.finalize()
    buffer.append(b"yy")
    buffer.finalize()
    waiter = asyncio.create_task(buffer.wait_for_finals())
    assert buffer.confirm() is not None
    await asyncio.sleep(0)
    assert not waiter.done()
    assert buffer.confirm() is not None
    await asyncio.wait_for(waiter, 1)
    assert buffer.confirm() is None  # a final nobody asked for confirms nothing


async def test_cleared_buffer_releases_waiters() -> None:
    buffer = ReplayBuffer()
    buffer.append(b"zz")
    buffer.finalize()
    waiter = asyncio.create_task(buffer.wait_for_finals())
    buffer.clear()
    await asyncio.wait_for(waiter, 1)
    assert buffer.nbytes == 0 and not buffer.owes_finals


def test_bound_drops_oldest_audio_and_reports_it_once() -> None:
    buffer = ReplayBuffer()
    for _ in range(4):
        buffer.append(b"\0" * 100)
    buffer.finalize()
    buffer.append(b"\1" * 100)
    dropped = buffer.trim(preroll_bytes=None, max_bytes=300)
    assert dropped == 200 and buffer.nbytes == 300
    assert buffer.take_dropped() == 200 and buffer.take_dropped() == 0


def test_preroll_keeps_only_the_last_audio_between_turns() -> None:
    buffer = ReplayBuffer()
    for _ in range(100):
        buffer.append(b"\0" * 640)  # 2 s of 16 kHz int16
    assert buffer.trim(preroll_bytes=3200, max_bytes=1 << 20) == 0  # the preroll trim is not a loss
    assert 3200 <= buffer.open_segment.nbytes <= 3200 + 640


async def test_forced_final_cuts_the_audio_it_covered() -> None:
    buffer = ReplayBuffer()
    buffer.append(b"AAAA")
    buffer.append(b"BBBB")
    buffer.cut_oldest(6)  # the server's longest utterance split after 6 bytes
    assert await _replayed(buffer) == [b"BB"]


@pytest.mark.parametrize(("size", "limit", "expected"), [(5, 8, [5]), (10, 4, [4, 4, 2]), (8, 8, [8])])
def test_pieces_never_exceed_the_message_limit(size: int, limit: int, expected: list[int]) -> None:
    assert [len(p) for p in pieces(b"x" * size, limit)] == expected


async def test_replayed_messages_pack_chunks_up_to_the_limit() -> None:
    buffer = ReplayBuffer()
    for _ in range(5):
        buffer.append(b"y" * 3)
    assert [len(m) for m in await _replayed(buffer, max_bytes=7)] == [6, 6, 3]
