"""One client of the load test: a ``nemotron-asr.v1`` session streaming paced audio, with a finalize per pause.

The client opens a session, sends ``--frame-ms`` frames against a monotonic deadline (frame *k* at
``t0 + k * frame``; a late frame is sent at once and counted, never skipped), sends ``finalize`` ``--vad-stop-s``
into each pause, and records when each partial and final arrives. It never raises: failures land in its
:class:`ClientResult`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pipecat_nemotron.asr.audio import SAMPLES_PER_MS
from pipecat_nemotron.server.protocol import (
    ConfigMessage,
    ErrorMessage,
    FinalizeMessage,
    FinalMessage,
    PartialMessage,
    ReadyMessage,
    close_reason,
    parse_server_message,
)

#: Bytes of 16 kHz int16 mono audio per millisecond.
BYTES_PER_MS = 2 * SAMPLES_PER_MS


def frame_bytes(frame_ms: float) -> int:
    """Bytes of one ``frame_ms`` frame of 16 kHz int16 audio (whole samples)."""
    return int(round(frame_ms * BYTES_PER_MS / 2)) * 2


def frame_seconds(frame_ms: float) -> float:
    """Duration of one ``frame_ms`` frame as sent (whole samples), s."""
    return frame_bytes(frame_ms) / BYTES_PER_MS / 1000.0


def pause_frames(pause_s: float, frame_ms: float) -> int:
    """Frames of silence in a ``pause_s`` pause (at least one)."""
    return max(1, round(pause_s * 1000 * BYTES_PER_MS / frame_bytes(frame_ms)))


def schedule(
    utterances: list[bytes], first: int, pause_s: float, vad_stop_s: float, frame_ms: float
) -> Iterator:
    """Endless (frame bytes, finalize-after-this-frame) sequence: utterance, pause with a finalize, next."""
    size = frame_bytes(frame_ms)
    silence = b"\x00" * size
    pauses = pause_frames(pause_s, frame_ms)
    stop_frame = min(pauses - 1, max(0, round(vad_stop_s * 1000 * BYTES_PER_MS / size) - 1))
    k = first
    while True:
        pcm = utterances[k % len(utterances)]
        for i in range(0, len(pcm), size):
            chunk = pcm[i : i + size]
            yield chunk + silence[: size - len(chunk)], False
        for j in range(pauses):
            yield silence, j == stop_frame
        k += 1


@dataclass
class ClientResult:
    """What one client saw.

    Attributes:
        index: Client number.
        session_id: Server session id ('' if refused).
        refused_code: Close code of a refusal at connect (None if the session opened).
        close_code: Close code the session ended with.
        errors: Error descriptions (error messages, unexpected closes, missing finals).
        audio_s: Audio sent, s.
        late_frames: Frames sent more than 50 ms after their deadline (client overloaded).
        partials: ``(t_s, e2e_lag_ms, server_lag_ms)`` per partial (t from the run start).
        finals: ``(t_s, round_trip_ms, server_ttf_ms)`` per final.
        finalizes_sent: ``finalize`` messages sent.
        t_first: First frame sent, s from the run start.
        t_last: Last frame sent, s from the run start.

    """

    index: int
    session_id: str = ""
    refused_code: int | None = None
    close_code: int | None = None
    errors: list[str] = field(default_factory=list)
    audio_s: float = 0.0
    late_frames: int = 0
    partials: list[tuple[float, float, float]] = field(default_factory=list)
    finals: list[tuple[float, float, float]] = field(default_factory=list)
    finalizes_sent: int = 0
    t_first: float = 0.0
    t_last: float = 0.0


class LoadClient:
    """One session of the load test, phase by phase: connect, open the session, stream and receive, check.

    Args:
        index: Client number (also which utterance it starts with).
        utterances: 16 kHz int16 mono PCM clips, streamed in turn.
        args: The load test's options (``latency_ms``, ``frame_ms``, ``minutes``, ``pause_s``, ``vad_stop_s``).
        run_t0: Monotonic time the run started (result times are relative to it).

    """

    def __init__(self, index: int, utterances: list[bytes], args: argparse.Namespace, run_t0: float) -> None:
        self.res = ClientResult(index)
        self.utterances = utterances
        self.args = args
        self.run_t0 = run_t0
        self.frame_s = frame_seconds(args.frame_ms)
        self.send_times: list[float] = []  # monotonic send time of frame k
        self.finalize_times: list[float] = []

    async def run(self, url: str, token: str | None, start_delay_s: float) -> ClientResult:
        """Wait ``start_delay_s``, then stream to one session for ``args.minutes``; never raises."""
        await asyncio.sleep(start_delay_s)
        ws = await self._connect(url, token)
        if ws is None or not await self._open(ws):
            return self.res
        await self._stream(ws)
        if self.res.close_code not in (1000, None):
            self.res.errors.append(f"closed with {self.res.close_code} ({close_reason(self.res.close_code)})")
        if len(self.res.finals) < self.res.finalizes_sent:
            self.res.errors.append(f"{self.res.finalizes_sent - len(self.res.finals)} final(s) missing")
        return self.res

    async def _connect(self, url: str, token: str | None) -> Any:
        """The WebSocket, or None (the failure recorded)."""
        import websockets
        from websockets.exceptions import InvalidStatus

        headers = {"Authorization": f"Bearer {token}"} if token else None
        try:
            return await websockets.connect(url, additional_headers=headers, open_timeout=30, max_size=2**22)
        except (OSError, InvalidStatus, asyncio.TimeoutError, TimeoutError) as e:
            self.res.errors.append(f"connect failed: {e!r}")
            return None

    async def _open(self, ws: Any) -> bool:
        """Send the config and read the answer: True once ready, False if refused or failed (recorded)."""
        from websockets.exceptions import ConnectionClosed

        res = self.res
        try:
            config = ConfigMessage(latency_ms=self.args.latency_ms, client=f"bench.load/{res.index}")
            await ws.send(config.to_json())
            first = parse_server_message(await asyncio.wait_for(ws.recv(), 30))
            if isinstance(first, ErrorMessage):
                res.refused_code = first.code
                try:
                    await asyncio.wait_for(ws.wait_closed(), 5)
                except (asyncio.TimeoutError, TimeoutError):
                    pass
                res.close_code = ws.close_code
                return False
            assert isinstance(first, ReadyMessage), first
            res.session_id = first.session_id
            return True
        except ConnectionClosed as e:
            res.refused_code = e.rcvd.code if e.rcvd else None
            res.close_code = res.refused_code
            return False
        except Exception as e:  # noqa: BLE001 - reported, not raised
            res.errors.append(f"opening the session failed: {e!r}")
            await ws.close()
            return False

    async def _receive(self, ws: Any) -> None:
        """Record every partial's end-to-end lag and every final's round trip until the session closes."""
        from websockets.exceptions import ConnectionClosed

        res = self.res
        finals = 0
        try:
            async for raw in ws:
                now = time.monotonic()
                msg = parse_server_message(raw)
                if isinstance(msg, PartialMessage):
                    frames = math.ceil(msg.session_audio_ms / 1000.0 / self.frame_s)
                    idx = min(len(self.send_times) - 1, max(0, frames - 1))
                    if idx >= 0:
                        res.partials.append(
                            (now - self.run_t0, (now - self.send_times[idx]) * 1000.0, msg.lag_ms)
                        )
                elif isinstance(msg, FinalMessage):
                    if finals < len(self.finalize_times):
                        rtt_ms = (now - self.finalize_times[finals]) * 1000.0
                        res.finals.append((now - self.run_t0, rtt_ms, msg.ttf_ms))
                    finals += 1
                elif isinstance(msg, ErrorMessage):
                    res.errors.append(f"server error {msg.code} ({msg.reason}): {msg.message}")
        except ConnectionClosed:
            pass

    async def _stream(self, ws: Any) -> None:
        """Send paced frames (and finalizes) until ``args.minutes`` is up, then close; record the close code."""
        from websockets.exceptions import ConnectionClosed

        receiver = asyncio.get_running_loop().create_task(self._receive(ws))
        try:
            await self._send_frames(ws)
            await ws.send(json.dumps({"type": "close"}))
            await asyncio.wait_for(receiver, 15.0)
        except ConnectionClosed:
            pass
        except (asyncio.TimeoutError, TimeoutError):
            self.res.errors.append("the session did not close within 15 s of the close message")
        except Exception as e:  # noqa: BLE001
            self.res.errors.append(f"streaming failed: {e!r}")
        finally:
            receiver.cancel()
            await ws.close()
            self.res.close_code = ws.close_code

    async def _send_frames(self, ws: Any) -> None:
        """Frame *k* at ``t0 + k * frame`` (late ones at once, counted), a finalize after each pause's stop frame."""
        args, res = self.args, self.res
        t0 = time.monotonic()
        end = t0 + args.minutes * 60.0
        frames = schedule(self.utterances, res.index, args.pause_s, args.vad_stop_s, args.frame_ms)
        k = 0
        while (deadline := t0 + k * self.frame_s) < end:
            delay = deadline - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -0.05:
                res.late_frames += 1
            chunk, finalize = next(frames)
            await ws.send(chunk)
            self.send_times.append(time.monotonic())
            if k == 0:
                res.t_first = self.send_times[0] - self.run_t0
            res.t_last = self.send_times[-1] - self.run_t0
            res.audio_s += self.frame_s
            if finalize:
                await ws.send(FinalizeMessage().to_json())
                self.finalize_times.append(time.monotonic())
                res.finalizes_sent += 1
            k += 1


async def run_client(
    index: int,
    url: str,
    token: str | None,
    utterances: list[bytes],
    args: argparse.Namespace,
    run_t0: float,
    start_delay_s: float,
) -> ClientResult:
    """Stream to one session for ``args.minutes``; never raises (failures land in the result)."""
    return await LoadClient(index, utterances, args, run_t0).run(url, token, start_delay_s)
