"""The client-side replay buffer of :class:`~pipecat_nemotron.stt.remote.service.NemotronServerSTTService`.

A connection to the ASR server can drop mid-turn. So that no finalized turn is lost, the service keeps the audio
of every utterance whose final has not arrived yet, one :class:`Segment` per utterance, and replays it (with the
utterance's ``finalize``) on the next session. Between turns only a short preroll is kept; in total the buffer is
bounded. All sizes here are bytes of 16-bit mono PCM; the service converts to and from time.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

__all__ = ["ReplayBuffer", "Segment", "pieces"]


def pieces(audio: bytes, max_bytes: int) -> list[bytes]:
    """``audio`` cut into messages of at most ``max_bytes`` (an even number: whole 16-bit samples)."""
    if len(audio) <= max_bytes:
        return [audio]
    return [audio[i : i + max_bytes] for i in range(0, len(audio), max_bytes)]


@dataclass
class Segment:
    """Audio of one utterance not yet confirmed by its final, kept for replay after a reconnect.

    Attributes:
        chunks: The audio, in the pieces it arrived in.
        nbytes: Total size of ``chunks``, bytes.
        finalized: Whether the utterance was finalized (its final is owed).
        finalize_sent_at: ``time.monotonic()`` when its ``finalize`` was last sent, seconds (None: not sent).
        dropped: Audio dropped from its front to bound the buffer and not yet reported, bytes (lost if the
            utterance is replayed).
        received: Audio of the utterance the current session's server has, bytes: ``nbytes`` plus what was
            trimmed from the front since the session began it. A forced final's cut counts from its start.

    """

    chunks: deque[bytes] = field(default_factory=deque)
    nbytes: int = 0
    finalized: bool = False
    finalize_sent_at: float | None = None
    dropped: int = 0
    received: int = 0

    def append(self, audio: bytes) -> None:
        """Keep ``audio`` at the end of the utterance."""
        self.chunks.append(audio)
        self.nbytes += len(audio)
        self.received += len(audio)

    def cut(self, nbytes: int) -> None:
        """The server split the utterance (a forced final) ``nbytes`` after its start: forget that audio.

        The final covered it, so a replay must not send it again; the rest is the utterance the server goes on
        decoding, and what was dropped of the covered part is no longer missing from any owed final.
        """
        front = self.received - self.nbytes  # trimmed before the first chunk held
        keep = max(0, self.received - nbytes)
        self.dropped = 0 if nbytes >= front else min(self.dropped, front - nbytes)
        excess = self.nbytes - keep
        while excess > 0 and self.chunks:
            chunk = self.chunks.popleft()
            if len(chunk) > excess:  # split a chunk at the cut
                self.chunks.appendleft(chunk[excess:])
                self.nbytes -= excess
                break
            self.nbytes -= len(chunk)
            excess -= len(chunk)
        self.received = keep

    def drop_front(self, nbytes: int) -> int:
        """Drop whole chunks from the front until at least ``nbytes`` are gone (or empty); return bytes dropped."""
        dropped = 0
        while self.chunks and dropped < nbytes:
            chunk = self.chunks.popleft()
            dropped += len(chunk)
        self.nbytes -= dropped
        return dropped

    def messages(self, max_bytes: int) -> Iterator[bytes]:
        """The audio packed into as few messages as fit in ``max_bytes`` each (a larger chunk is split)."""
        buf = bytearray()
        for chunk in self.chunks:
            for piece in pieces(chunk, max_bytes):
                if len(buf) + len(piece) > max_bytes and buf:
                    yield bytes(buf)
                    buf.clear()
                buf += piece
        if buf:
            yield bytes(buf)


class ReplayBuffer:
    """The unconfirmed utterances of a session, oldest first; the last one is open (receiving audio)."""

    def __init__(self) -> None:
        """Start with one open, empty utterance."""
        self._segments: deque[Segment] = deque([Segment()])
        self._finals_done = asyncio.Event()
        self._finals_done.set()

    def __iter__(self) -> Iterator[Segment]:
        """The utterances, oldest first."""
        return iter(self._segments)

    @property
    def nbytes(self) -> int:
        """Audio held, bytes."""
        return sum(s.nbytes for s in self._segments)

    @property
    def open_segment(self) -> Segment:
        """The utterance receiving audio now."""
        return self._segments[-1]

    @property
    def owes_finals(self) -> bool:
        """Whether some finalized utterance still waits for its final."""
        return any(s.finalized for s in self._segments)

    def clear(self) -> None:
        """Forget everything (the session was cancelled)."""
        self._segments = deque([Segment()])
        self._finals_done.set()

    def append(self, audio: bytes) -> None:
        """Keep ``audio`` in the open utterance."""
        self._segments[-1].append(audio)

    def finalize(self) -> Segment:
        """Close the open utterance (its final is now owed) and open the next; return the closed one."""
        segment = self._segments[-1]
        segment.finalized = True
        self._segments.append(Segment())
        self._finals_done.clear()
        return segment

    def cut_oldest(self, nbytes: int) -> None:
        """A forced final covered the first ``nbytes`` of the utterance the server decodes now (the oldest)."""
        self._segments[0].cut(nbytes)

    def confirm(self) -> Segment | None:
        """A final arrived: forget the oldest finalized utterance and return it (None if none was owed)."""
        segment = self._segments.popleft() if self._segments[0].finalized else None
        if not self.owes_finals:
            self._finals_done.set()
        return segment

    async def replay(
        self, send: Callable[[str | bytes], Awaitable[None]], max_bytes: int, finalize: str
    ) -> None:
        """Send every held utterance, oldest first, on a new session.

        Each utterance's audio goes in messages of at most ``max_bytes``, then, if it was finalized, ``finalize``
        (the message text).
        """
        for seg in self._segments:
            seg.received = seg.nbytes  # the new session's utterance starts at the first byte held
            for message in seg.messages(max_bytes):
                await send(message)
            if seg.finalized:
                await send(finalize)
                seg.finalize_sent_at = time.monotonic()

    async def wait_for_finals(self) -> None:
        """Return once no final is owed (every finalized utterance was confirmed, or the buffer cleared)."""
        await self._finals_done.wait()

    def trim(self, *, preroll_bytes: int | None, max_bytes: int) -> int:
        """Bound the buffer.

        Args:
            preroll_bytes: Audio the open utterance keeps while the user is not speaking, bytes (None while the
                user speaks: keep it all).
            max_bytes: Most audio held in total, bytes; the oldest goes first.

        Returns:
            Bytes of unconfirmed audio dropped to stay under ``max_bytes`` (the preroll trim is not counted).

        """
        open_seg = self._segments[-1]
        if preroll_bytes is not None and open_seg.nbytes > preroll_bytes + 8192:
            open_seg.drop_front(open_seg.nbytes - preroll_bytes)
        total = self.nbytes
        dropped = 0
        while total > max_bytes:
            seg = next((s for s in self._segments if s.nbytes > 0), None)
            if seg is None:
                break
            n = seg.drop_front(total - max_bytes)
            seg.dropped += n
            total -= n
            dropped += n
        return dropped

    def take_dropped(self) -> int:
        """Audio the bound dropped from the utterances held now, not yet taken; bytes (resets their counts).

        Called when the utterances are replayed on a new session: that audio is missing from their finals.
        Audio dropped from utterances confirmed since was delivered before the drop and is not counted.
        """
        dropped = sum(s.dropped for s in self._segments)
        for s in self._segments:
            s.dropped = 0
        return dropped
