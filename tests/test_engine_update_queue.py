"""Unit tests of a stream's update queue (``pipecat_nemotron.asr.stream.UpdateQueue``): no model.

What a reader of ``ASRStream.updates()`` relies on: updates in order, unread partials coalesced (a slow reader
sees the latest text, not a backlog), finals never dropped, and a failure raised after what came before it.
"""

from __future__ import annotations

import asyncio

import pytest

from pipecat_nemotron.asr.errors import StreamFailedError
from pipecat_nemotron.asr.stream import UpdateQueue
from pipecat_nemotron.asr.types import Transcript


def _update(text: str, utterance: int = 0, final: bool = False, forced: bool = False) -> Transcript:
    return Transcript(text=text, kind="final" if final else "partial", utterance=utterance, latency_ms=160, forced=forced)


async def _drain(queue: UpdateQueue) -> list[str]:
    texts = []
    while (update := await queue.get()) is not None:
        texts.append(update.text)
    return texts


async def test_unread_partials_coalesce_finals_never_do() -> None:
    queue = UpdateQueue()
    for update in (
        _update("a"),
        _update("a b"),
        _update("a b c", final=True),
        _update("d", utterance=1),
        _update("d e", utterance=1),
        _update("d e", utterance=1, final=True),
        _update("f", utterance=2, final=True),
    ):
        queue.put(update)
    queue.close()
    assert await _drain(queue) == ["a b", "a b c", "d e", "d e", "f"]


async def test_a_partial_of_the_next_utterance_does_not_replace_the_last_one() -> None:
    queue = UpdateQueue()
    queue.put(_update("one", utterance=0))
    queue.put(_update("two", utterance=1))
    queue.close()
    assert await _drain(queue) == ["one", "two"]


async def test_reader_waits_for_the_next_update_and_ends_at_close() -> None:
    queue = UpdateQueue()
    reader = asyncio.create_task(_drain(queue))
    await asyncio.sleep(0)
    queue.put(_update("hello", final=True))
    await asyncio.sleep(0)
    queue.close()
    assert await asyncio.wait_for(reader, 1) == ["hello"]


async def test_failure_is_raised_after_the_updates_queued_before_it() -> None:
    queue = UpdateQueue()
    queue.put(_update("kept", final=True))
    queue.close(StreamFailedError("the stream failed"))
    update = await queue.get()
    assert update is not None and update.text == "kept"
    with pytest.raises(StreamFailedError, match="the stream failed"):
        await queue.get()


def test_take_forced_finals_empties_the_queue_and_keeps_only_forced_finals() -> None:
    queue = UpdateQueue()
    queue.put(_update("part"))
    queue.put(_update("first minute", final=True, forced=True))
    queue.put(_update("ordinary", utterance=1, final=True))
    queue.put(_update("second minute", utterance=2, final=True, forced=True))
    assert [u.text for u in queue.take_forced_finals()] == ["first minute", "second minute"]
    assert queue.take_forced_finals() == []
