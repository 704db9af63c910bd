"""What an in-process STT session receives while its model loads: the audio and the finalize marks, in order.

A session can start before its engine is loaded (a bot that does not preload, a cold start). Nothing it says
is dropped meanwhile: :class:`HeldInput` keeps its audio and its VAD-stop finalizes in arrival order, and hands
them to the stream once the engine runs, before anything newer. If the model never loads, it says how much
audio was lost.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

__all__ = ["HeldInput"]


class HeldInput:
    """Audio (int16 PCM bytes) and finalize marks received before the session's stream opened, in order.

    Items stay held, and newer ones queue behind them, until :meth:`replay` has handed every one to the stream.
    """

    def __init__(self) -> None:
        self._items: list[bytes | None] = []  # None: a finalize mark

    def __bool__(self) -> bool:
        """True while anything is held (new input must queue behind it)."""
        return bool(self._items)

    def hold_audio(self, audio: bytes) -> None:
        """Keep a chunk of audio."""
        self._items.append(audio)

    def hold_finalize(self) -> None:
        """Keep a finalize (the user stopped speaking) at this point of the audio."""
        self._items.append(None)

    def seconds(self, sample_rate: int) -> float:
        """Audio held, seconds (``sample_rate``: of the 16-bit mono input, Hz)."""
        return sum(len(a) for a in self._items if a is not None) / (2.0 * sample_rate)

    def drop(self, sample_rate: int) -> float:
        """Forget everything held; return how much audio it was, seconds."""
        dropped_s = self.seconds(sample_rate)
        self._items.clear()
        return dropped_s

    async def replay(
        self, push_audio: Callable[[bytes], Awaitable[None]], finalize: Callable[[], Awaitable[None]]
    ) -> None:
        """Hand every held item to the stream, oldest first; items held meanwhile are replayed too."""
        while self._items:
            item = self._items[0]
            if item is None:
                await finalize()
            else:
                await push_audio(item)
            self._items.pop(0)
