"""The silence gate of :class:`~pipecat_nemotron.stt.remote.service.NemotronServerSTTService`: speech only, with a preroll.

The server encodes every sample it receives. Between the user's turns (the VAD says nobody speaks) the service
holds the audio back instead, keeping only the last ``preroll`` of it; when the user starts speaking it sends a
``gap`` message for what it withheld, then the held preroll, then live audio. The server counts the gap in every
position it reports, so timestamps are those of the audio as spoken, and decodes none of it.

Withheld audio is counted in whole ``quantum``s (the latency mode's chunk), so the audio after a gap keeps its
place on the server's chunk grid: the encoder steps over the same samples as if the silence had been sent. A
long silence is reported every ``report_every`` bytes (the report doubles as a keepalive).
All sizes here are bytes of the session's PCM; the service converts to and from time.
"""

from __future__ import annotations

from collections import deque

__all__ = ["SilenceGate"]


class SilenceGate:
    """Audio held back while the user is silent: a preroll, and the withheld bytes not yet reported.

    Args:
        preroll_bytes: Audio kept to send before the speech (covers the VAD's start delay), bytes.
        quantum_bytes: Withheld audio is counted in multiples of this, bytes (even: whole 16-bit samples).
        report_every: Report withheld audio once this much is counted, bytes (a multiple of ``quantum_bytes``).

    Raises:
        ValueError: A size out of range (the message names it).

    """

    def __init__(self, *, preroll_bytes: int, quantum_bytes: int, report_every: int) -> None:
        if preroll_bytes < 0:
            raise ValueError(f"preroll_bytes must be >= 0, got {preroll_bytes}")
        self.preroll_bytes = preroll_bytes
        self.quantum_bytes = self.report_every = 0
        self.set_quantum(quantum_bytes, report_every)
        self._held: deque[bytes] = deque()
        self._held_bytes = 0
        self._head_cut = 0  # bytes of the oldest held chunk already counted as withheld
        self._withheld = 0  # counted, not yet reported
        self.withheld_total = 0  # every byte withheld since the gate was made (reported or not)

    def set_quantum(self, quantum_bytes: int, report_every: int) -> None:
        """Count withheld audio in multiples of ``quantum_bytes`` from now on; report every ``report_every`` bytes.

        Raises:
            ValueError: ``quantum_bytes`` not a positive even number, or ``report_every`` below it.

        """
        if quantum_bytes <= 0 or quantum_bytes % 2:
            raise ValueError(f"quantum_bytes must be a positive even number, got {quantum_bytes}")
        if report_every < quantum_bytes:
            raise ValueError(f"report_every ({report_every}) must be >= quantum_bytes ({quantum_bytes})")
        self.quantum_bytes, self.report_every = quantum_bytes, report_every

    @property
    def held_bytes(self) -> int:
        """Audio held to be sent (the preroll and what is not yet counted), bytes."""
        return self._held_bytes - self._head_cut

    def hold(self, audio: bytes) -> int:
        """Hold ``audio`` back; return the withheld bytes to report now (0 until ``report_every`` is reached)."""
        self._held.append(audio)
        self._held_bytes += len(audio)
        excess = self.held_bytes - self.preroll_bytes
        if excess >= self.quantum_bytes:
            count = excess - excess % self.quantum_bytes
            self._cut(count)
            self._withheld += count
            self.withheld_total += count
        if self._withheld >= self.report_every:
            return self._take_withheld()
        return 0

    def release(self) -> tuple[int, list[bytes]]:
        """Open the gate: the withheld bytes not yet reported, and the held audio to send, oldest first."""
        withheld = self._take_withheld()
        chunks = list(self._held)
        if chunks and self._head_cut:
            chunks[0] = chunks[0][self._head_cut :]
        self.clear()
        return withheld, chunks

    def clear(self) -> None:
        """Forget the held audio and the unreported count (a new session starts from what was replayed)."""
        self._held.clear()
        self._held_bytes = self._head_cut = self._withheld = 0

    def _take_withheld(self) -> int:
        withheld, self._withheld = self._withheld, 0
        return withheld

    def _cut(self, count: int) -> None:
        """Count ``count`` bytes from the front of the held audio as withheld (a chunk may be cut inside)."""
        self._head_cut += count
        while self._held and self._head_cut >= len(self._held[0]):
            chunk = self._held.popleft()
            self._head_cut -= len(chunk)
            self._held_bytes -= len(chunk)
