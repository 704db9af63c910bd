"""Attacks on the ASR server (``pipecat-nemotron serve``) over loopback, with the bundled tiny model on CPU.

Each test is one attack (or one weakness) and asserts what the server must do about it: close codes,
transcripts, counts and what the log holds, never how fast something happened. All traffic goes to
127.0.0.0/8, is bounded in count and time, and stops by itself. One server (``server``) is shared by the
tests that allow it; tests that need other limits start their own on the shared engine (cheap: the model is
loaded once per module). A loguru sink with ``diagnose=True`` records everything the module logs, and the
last test checks that no bearer token reached it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import gc
import json
import os
import re
import socket
import struct
import time
from collections.abc import Awaitable
from fractions import Fraction
from typing import TypeVar

import aiohttp
import pytest
import pytest_asyncio
from helpers import DEMO, clip, connect, expect_close, open_session, own_server, run_through_a_drop, wait_for
from loguru import logger
from pipecat.frames.frames import TranscriptionFrame
from ws_client import stream

import pipecat_nemotron.server.session as session_module
from pipecat_nemotron.asr import NemotronEngine
from pipecat_nemotron.server.app import ASRServer
from pipecat_nemotron.server.protocol import (
    CloseCode,
    ConfigMessage,
    ErrorMessage,
    FinalMessage,
    ReadyMessage,
    SetLatencyMessage,
)
from pipecat_nemotron.server.session import Session
from pipecat_nemotron.stt.remote.service import NemotronServerSTTService

pytestmark = pytest.mark.asyncio(loop_scope="module")

# The model and its engine (run with one torch thread) are the server tests' module fixtures, reused here.

# Letters that hex ids, numbers and English words do not form: an 8-character window of these in a log is a leak.
TOKEN = "qZvXkWmJ-pLrTnYg-HsQwZbVx-kJfPtRzM"
METRICS_TOKEN = "MzRtPfJk-xVbZwQsH-gYnTrLp-JmWkXvZq"
WRONG_TOKEN = "wrong-token-but-long-enough-0123"
EXPECTED = json.loads((DEMO / "transcripts.json").read_text())
FINALIZE = '{"type": "finalize"}'
CLOSE = '{"type": "close"}'


# ---- fixtures ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def captured_log():
    """Everything logged while this module runs, with loguru's most revealing settings (variables in tracebacks)."""
    lines: list[str] = []
    sink = logger.add(
        lines.append,
        level="TRACE",
        format="{level} | {name}:{function}:{line} | {message}",
        diagnose=True,
        backtrace=True,
        colorize=False,
    )
    yield lines
    logger.remove(sink)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(engine: NemotronEngine):
    async with own_server(
        engine,
        tokens=(TOKEN,),
        metrics_token=METRICS_TOKEN,
        max_sessions=6,
        handshake_timeout_s=1.0,
        keepalive_timeout_s=1.0,
        max_control_rate=10.0,
        control_burst=20,
    ) as srv:
        yield srv


# ---- helpers -------------------------------------------------------------------------------------------------


def log_since(lines: list[str], start: int) -> str:
    return "".join(lines[start:])


def crash_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "crashed" in line or "Traceback" in line]


def counter(metric, *labels: str) -> float:
    return (metric.labels(*labels) if labels else metric)._value.get()


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def server_socket_count(port: int) -> int:
    """Open sockets of this process whose local port is ``port``: the server's listener and accepted connections.

    Counting only these (not every fd of the process) keeps files and sockets opened meanwhile by anything else in
    the test process (an earlier test's threads, a background import) out of the measure.
    """
    inodes: set[str] = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            count += target.startswith("socket:[") and target[8:-1] in inodes
    return count


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def held_rss_bytes() -> int:
    """This process's RSS after a garbage collection and glibc's ``malloc_trim`` (freed heap handed back).

    Without the trim the RSS is the allocator's high-water mark, which follows how much was in flight at once (how
    fast the machine ran), not what is still held.
    """
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the high-water mark it is
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_bytes()


def rst_abort(ws) -> None:
    """Drop a client connection with a TCP reset (no close handshake, no FIN), like a crashed or killed peer."""
    sock = ws.transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    ws.transport.abort()


def demo(name: str) -> tuple[bytes, str]:
    return clip(name), EXPECTED[name]


async def transcribe_over(url: str, names: list[str], speed: float = 3.0, **kwargs) -> list[str]:
    """One honest session: each clip streamed at ``speed`` x real time and finalized; the finals' texts."""
    ws, ready = await open_session(url, **kwargs)
    assert isinstance(ready, ReadyMessage), ready
    for name in names:
        await stream(ws, clip(name), speed=speed)
        await ws.send(FINALIZE)
    await ws.send(CLOSE)
    messages = await expect_close(ws, CloseCode.NORMAL, timeout=60)
    return [m.text for m in messages if isinstance(m, FinalMessage)]


def upgrade_request(path: str, *headers: bytes) -> bytes:
    key = base64.b64encode(os.urandom(16))
    lines = [
        f"GET {path} HTTP/1.1".encode(),
        b"Host: 127.0.0.1",
        b"Upgrade: websocket",
        b"Connection: Upgrade",
        b"Sec-WebSocket-Version: 13",
        b"Sec-WebSocket-Key: " + key,
        *headers,
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def raw_session(
    port: int, request: bytes, timeout: float = 10.0
) -> tuple[bytes, list[str], int | None]:
    """Send a hand-made upgrade request; return the status line, the text frames and the close code (None: 1006)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    texts: list[str] = []
    code: int | None = None
    try:
        async with asyncio.timeout(timeout):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = head.split(b"\r\n", 1)[0]
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                while True:
                    b0, b1 = await reader.readexactly(2)
                    n = b1 & 0x7F
                    if n == 126:
                        n = struct.unpack("!H", await reader.readexactly(2))[0]
                    elif n == 127:
                        n = struct.unpack("!Q", await reader.readexactly(8))[0]
                    payload = await reader.readexactly(n)
                    if b0 & 0x0F == 0x1:
                        texts.append(payload.decode())
                    elif b0 & 0x0F == 0x8:
                        code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
                        break
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return status, texts, code


async def wait_closed_by_server(sock: socket.socket, timeout: float) -> bool:
    """True once the server closed ``sock`` (EOF or reset) within ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            while True:
                data = await loop.sock_recv(sock, 4096)
                if not data:
                    return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False


async def raw_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, port))
    return sock


def masked_frame(opcode: int, payload: bytes) -> bytes:
    """One client-to-server WebSocket frame (FIN set, masked as RFC 6455 requires of a client)."""
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def server_texts(data: bytes) -> list[str]:
    """The whole text frames at the start of a server-to-client byte stream (unmasked, unfragmented frames)."""
    texts: list[str] = []
    at = 0
    while at + 2 <= len(data):
        b0, b1 = data[at], data[at + 1]
        n, at = b1 & 0x7F, at + 2
        if n == 126:
            n, at = struct.unpack_from("!H", data, at)[0], at + 2
        elif n == 127:
            n, at = struct.unpack_from("!Q", data, at)[0], at + 8
        if at + n > len(data):
            break
        if b0 & 0x0F == 0x1:
            texts.append(data[at : at + n].decode())
        at += n
    return texts


async def stalled_reader(port: int, rcvbuf: int = 1024) -> socket.socket:
    """A client that opened a session (handshake, config, ``ready``) and reads no more, with a tiny TCP window.

    ``SO_RCVBUF`` is set before ``connect`` so the window it advertises (and its scaling) stays that small: once the
    client stops reading, a few KiB of the server's sends fill it and the rest waits in the server's buffers.
    """
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, upgrade_request("/v1/asr", b"Sec-WebSocket-Protocol: nemotron-asr.v1"))
    data = b""
    while b"\r\n\r\n" not in data:
        data += await loop.sock_recv(sock, 4096)
    head, _, data = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    await loop.sock_sendall(sock, masked_frame(0x1, ConfigMessage().to_json().encode()))
    while not server_texts(data):
        data += await loop.sock_recv(sock, 4096)
    assert json.loads(server_texts(data)[0])["type"] == "ready", data
    return sock


# ---- 2: undecodable credentials --------------------------------------------------------------------------------


async def test_undecodable_authorization_header_is_refused_with_4001(server: ASRServer) -> None:
    bad = b"Authorization: Bearer \xff\xfe\x80\xc3(" + b"\xa0" * 24
    status, texts, code = await raw_session(server.port, upgrade_request("/v1/asr", bad))
    assert status.startswith(b"HTTP/1.1 101"), status
    assert code == CloseCode.UNAUTHORIZED, (code, texts)
    assert texts and json.loads(texts[-1])["reason"] == "unauthorized"


async def test_lone_surrogate_config_token_is_refused_with_4001(server: ASRServer) -> None:
    ws = await connect(server.url, token=None)
    await ws.send('{"type": "config", "token": "\\ud800' + "x" * 24 + '"}')
    messages = await expect_close(ws, CloseCode.UNAUTHORIZED)
    assert isinstance(messages[-1], ErrorMessage) and messages[-1].reason == "unauthorized"


# ---- 3: deeply nested JSON -------------------------------------------------------------------------------------


async def test_deeply_nested_json_is_a_protocol_error_without_traceback(
    server: ASRServer, captured_log: list[str]
) -> None:
    start = len(captured_log)
    internal = counter(server.service.metrics.dropped, "internal")
    ws = await connect(server.url, token=None)  # the config itself, before any token
    await ws.send("[" * 60_000 + "]" * 60_000)
    messages = await expect_close(ws, CloseCode.PROTOCOL_ERROR)
    assert "nested" in messages[-1].message
    ws, ready = await open_session(server.url, token=TOKEN)  # and inside a running session
    assert isinstance(ready, ReadyMessage)
    await ws.send('{"a":' * 20_000 + "1" + "}" * 20_000)
    await expect_close(ws, CloseCode.PROTOCOL_ERROR)
    assert counter(server.service.metrics.dropped, "internal") == internal
    assert crash_lines(log_since(captured_log, start)) == []


# ---- 4: the message size limit is inclusive --------------------------------------------------------------------


async def test_message_of_exactly_the_limit_is_accepted_and_one_more_byte_refused(
    server: ASRServer, engine: NemotronEngine
) -> None:
    limit = server.config.max_message_bytes
    pcm, _ = demo("demo_timer.wav")
    exact = (pcm + b"\x00" * limit)[:limit]
    expected = (await engine.transcribe(exact)).text
    assert expected
    ws, ready = await open_session(server.url, token=TOKEN)
    assert isinstance(ready, ReadyMessage) and ready.limits["max_message_bytes"] == limit
    await ws.send(exact)
    await ws.send(FINALIZE)
    await ws.send(CLOSE)
    finals = [
        m.text for m in await expect_close(ws, CloseCode.NORMAL, timeout=30) if isinstance(m, FinalMessage)
    ]
    assert finals == [expected]
    ws, _ = await open_session(server.url, token=TOKEN)
    await ws.send(exact + b"\x00\x00")  # one sample more (two bytes): even-length PCM, over the limit
    await expect_close(ws, CloseCode.MESSAGE_TOO_BIG)


async def test_client_replay_respects_a_small_server_message_limit(engine: NemotronEngine) -> None:
    pcm, expected = demo("demo_weather.wav")
    async with own_server(engine, tokens=(TOKEN,), max_message_bytes=1024) as srv:
        stt = NemotronServerSTTService(url=srv.url, token=TOKEN, reconnect_backoff_min_wait=0.1)
        # The drop lands after 2/3 of the utterance: 1.7 s of unconfirmed audio to replay.
        down = await run_through_a_drop(
            stt, srv, pcm, drop_after_ms=1200, split=Fraction(2, 3), wait_s=3.0, timeout=30
        )
        assert counter(srv.service.metrics.dropped, "message_too_big") == 0
        assert stt.sessions_opened == 2
        assert [f.text for f in down if isinstance(f, TranscriptionFrame)] == [expected]


# ---- 5: results that cannot be sent ----------------------------------------------------------------------------


async def test_client_that_stops_reading_is_dropped_with_4008_and_frees_its_slot(
    engine: NemotronEngine, captured_log: list[str]
) -> None:
    """A real client that stops reading: once the server's send of a reply blocks ``send_timeout_s``, 4008.

    The client (a 1 KiB receive buffer) sends ``set_latency`` requests, each answered, and reads none of the answers.
    On loopback the server buffered about 580 KB of answers (kernel and asyncio buffers, ~10 000 of them) before
    a send blocked; the flood goes on until the drop, however many that takes here.
    """
    start = len(captured_log)
    loop = asyncio.get_running_loop()
    async with own_server(
        engine, insecure=True, send_timeout_s=0.3, max_control_rate=1e9, control_burst=1_000_000_000
    ) as srv:
        service = srv.service
        sock = await stalled_reader(srv.port)
        (session,) = service.sessions.values()
        batch = masked_frame(0x1, SetLatencyMessage(560).to_json().encode()) * 100

        async def flood() -> None:
            while True:  # ends when cancelled; blocks by itself once the server stops reading too
                await loop.sock_sendall(sock, batch)
                await asyncio.sleep(0)  # sock_sendall does not yield while the kernel takes the data

        flooding = asyncio.create_task(flood())
        try:
            await wait_for(lambda: not service.sessions, timeout=60, what="the stalled session to be dropped")
        finally:
            flooding.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await flooding
            sock.close()  # unread answers still queued: the close is a reset, the server's socket is already gone
        assert session.close_code == CloseCode.IDLE_TIMEOUT
        assert counter(service.metrics.dropped, "idle_timeout") == 1
        assert counter(service.metrics.ended, "dropped") == 1
        assert service.active_sessions == 0
    log = log_since(captured_log, start)
    assert "closed with 4008 (idle_timeout): the client stopped reading results" in log
    assert crash_lines(log) == []


async def test_set_latency_then_tcp_reset_is_not_a_crash(
    server: ASRServer, engine: NemotronEngine, captured_log: list[str]
) -> None:
    start = len(captured_log)
    internal = counter(server.service.metrics.dropped, "internal")
    for _ in range(15):  # the reset races the reply
        ws, ready = await open_session(server.url, token=TOKEN)
        assert isinstance(ready, ReadyMessage)
        await ws.send(SetLatencyMessage(560).to_json())
        rst_abort(ws)
    async with own_server(engine, insecure=True, burst_ms=0.0) as paused:
        for _ in range(3):  # the reply is due while the session's reads are paused and the peer is gone
            ws, ready = await open_session(paused.url, token=None)
            await ws.send(clip()[:16000])  # 0.5 s ahead of real time, no burst allowed: reads pause 0.5 s
            await ws.send(SetLatencyMessage(560).to_json())
            rst_abort(ws)
        await wait_for(lambda: not paused.service.sessions, timeout=30, what="the sessions to end")
        assert counter(paused.service.metrics.dropped, "internal") == 0
        assert counter(paused.service.metrics.ended, "disconnect") == 3  # the failed reply is a client gone
    await wait_for(lambda: not server.service.sessions, timeout=30, what="the sessions to end")
    assert counter(server.service.metrics.dropped, "internal") == internal
    assert crash_lines(log_since(captured_log, start)) == []


# ---- 6: slowloris ------------------------------------------------------------------------------------------------


async def test_half_sent_requests_and_silent_connections_are_closed(server: ASRServer) -> None:
    gc.collect()
    baseline = server_socket_count(server.port)
    timeout_s = server.config.handshake_timeout_s
    partial = b"GET /v1/asr HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
    socks = [await raw_socket(port=server.port) for _ in range(24)]
    loop = asyncio.get_running_loop()
    for i, sock in enumerate(socks):
        if i % 3 == 0:
            await loop.sock_sendall(sock, partial)  # a request that never ends
        elif i % 3 == 1:
            await loop.sock_sendall(sock, b"GET /metr")  # a request line that never ends
        # i % 3 == 2: silent

    async def drip(sock: socket.socket) -> None:  # one byte at a time: data must not extend the deadline
        with contextlib.suppress(OSError):
            for byte in partial:
                await loop.sock_sendall(sock, bytes([byte]))
                await asyncio.sleep(timeout_s / 8)

    drippers = [await raw_socket(port=server.port) for _ in range(4)]
    drip_tasks = [asyncio.create_task(drip(s)) for s in drippers]
    # A finished HTTP request on a keep-alive connection, then silence: closed after the keep-alive timeout.
    idle = await raw_socket(port=server.port)
    await loop.sock_sendall(idle, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert (await loop.sock_recv(idle, 4096)).startswith(b"HTTP/1.1 200")
    assert server_socket_count(server.port) > baseline  # the measure sees the server's accepted connections
    try:
        closed = await asyncio.gather(*(wait_closed_by_server(s, timeout=20 * timeout_s + 10) for s in socks))
        assert all(closed), f"{closed.count(False)} of {len(socks)} connections still open"
        assert all(await asyncio.gather(*(wait_closed_by_server(s, 20 * timeout_s + 10) for s in drippers)))
        assert await wait_closed_by_server(idle, timeout=20 * server.config.keepalive_timeout_s + 10)
    finally:
        for t in drip_tasks:
            t.cancel()
        for s in [*socks, *drippers, idle]:
            s.close()
    await wait_for(
        lambda: server_socket_count(server.port) <= baseline, timeout=10, what="the server's sockets to close"
    )


# ---- 7: connections that never authenticate -----------------------------------------------------------------------


async def hold_pending(url: str, count: int, stop: asyncio.Event, host: str = "127.0.0.1") -> int:
    """Keep ``count`` token-less connections open that never send a config; reconnect each one the server closes."""
    opened = 0

    async def one() -> None:
        nonlocal opened
        while not stop.is_set():
            try:
                ws = await connect(url, token=None, local_addr=(host, 0), open_timeout=5)
            except Exception:  # noqa: BLE001 - refused or timed out: try again
                await asyncio.sleep(0.05)
                continue
            opened += 1
            closed = asyncio.create_task(ws.wait_closed())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait({closed, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            closed.cancel()
            await ws.close()

    await asyncio.gather(*(one() for _ in range(count)))
    return opened


async def test_token_less_connections_cannot_lock_out_config_authenticating_clients(
    engine: NemotronEngine,
) -> None:
    async with own_server(engine, tokens=(TOKEN,), max_sessions=2, max_pending_auth=4) as srv:
        cap = srv.service.max_pending_auth
        stop = asyncio.Event()
        attacker = asyncio.create_task(hold_pending(srv.url, cap, stop))
        try:
            await wait_for(
                lambda: srv.service.pending_auth == cap, timeout=20, what="the pending cap to fill"
            )
            for name in ("demo_weather.wav", "demo_math.wav"):
                texts = await transcribe_over(
                    srv.url,
                    [name],
                    config=ConfigMessage(token=TOKEN),
                    token=None,
                    local_addr=("127.0.0.2", 0),
                )
                assert texts == [EXPECTED[name]]
                assert srv.service.pending_auth <= cap
        finally:
            stop.set()
            opened = await attacker
        assert opened > cap  # the attacker was evicted and came back
        assert counter(srv.service.metrics.refused, "unauthorized") == 0


# ---- 8: a client that leaves gives its slot back at once ------------------------------------------------------------


async def test_quick_reconnects_never_see_4013(engine: NemotronEngine) -> None:
    pcm = clip("two_turns.wav")
    async with own_server(engine, insecure=True, max_sessions=1) as srv:
        for i in range(20):
            ws, first = await open_session(srv.url, token=None)
            assert isinstance(first, ReadyMessage), (i, first)
            await ws.send(pcm[:64000])  # 2 s: the engine is busy decoding when the client leaves
            if i % 2:
                await ws.close()
            else:
                rst_abort(ws)
        assert counter(srv.service.metrics.refused, "capacity") == 0
    # The engine side: a stream being closed frees its slot at once, not at the next model step.
    streams = [engine.open_stream() for _ in range(engine.config.max_streams - engine.open_streams)]
    closing = asyncio.ensure_future(streams[0].close())
    await asyncio.sleep(0)  # the close has started; the model step that zeroes its cache slot has not run
    streams.append(engine.open_stream())
    await closing
    for s in streams:
        await s.close()
    assert engine.open_streams == 0


async def test_client_gone_while_paused_stops_decoding_and_frees_the_slot(
    engine: NemotronEngine, captured_log: list[str]
) -> None:
    start = len(captured_log)
    pcm = clip("two_turns.wav")
    burst = (pcm * 25)[: 120 * 32000]  # 120 s of speech in one message
    async with own_server(
        engine, insecure=True, max_message_bytes=4 * 1024 * 1024, burst_ms=600_000.0, max_backlog_ms=500.0
    ) as srv:
        ws, ready = await open_session(srv.url, token=None)
        assert isinstance(ready, ReadyMessage)
        await ws.send(burst)
        await ws.send(burst[: 32000 * 30])  # more audio the server will not read while paused
        await wait_for(
            lambda: any(s.backlog_ms > 10_000 for s in srv.service.sessions.values()),
            timeout=30,
            what="the backlog to build up",
        )
        session = next(iter(srv.service.sessions.values()))
        stream_ = session.stream
        assert stream_ is not None
        rst_abort(ws)
        await wait_for(
            lambda: srv.service.active_sessions == 0 and engine.open_streams == 0,
            timeout=60,
            what="the session to end and its stream to close",
        )
        assert stream_.closed
        sent_s = len(burst) / 32000
        assert stream_.audio_seconds < 0.5 * sent_s, (stream_.audio_seconds, sent_s)
        assert counter(srv.service.metrics.audio_dropped_seconds) > 0.4 * sent_s
    assert re.search(r"dropped [0-9.]+ s of undecoded audio", log_since(captured_log, start))


# ---- 9: control-message floods -------------------------------------------------------------------------------------


async def test_control_flood_is_paced_and_honest_transcripts_stay_exact(server: ASRServer) -> None:
    cfg = server.config
    opened_at = time.monotonic()  # before the server's session (and its control allowance) exists
    flooder, ready = await open_session(server.url, token=TOKEN)
    assert isinstance(ready, ReadyMessage)
    assert ready.limits["max_control_rate"] == cfg.max_control_rate
    flood_session = server.service.sessions[ready.session_id]
    replies = 0

    async def read_replies() -> None:
        nonlocal replies
        with contextlib.suppress(Exception):
            async for _ in flooder:
                replies += 1

    async def flood(seconds: float) -> int:
        sent = 0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                while True:
                    await flooder.send(
                        FINALIZE if sent % 2 else SetLatencyMessage(80 + 80 * (sent % 4 == 0)).to_json()
                    )
                    sent += 1
                    if sent % 20 == 0:
                        await asyncio.sleep(0)  # let the loop (and the server in it) run
        return sent

    reader = asyncio.create_task(read_replies())
    flooding = asyncio.create_task(flood(4.0))
    texts = await transcribe_over(server.url, ["demo_weather.wav", "demo_timer.wav"], token=TOKEN)
    sent = await flooding
    rst_abort(flooder)
    await wait_for(
        lambda: ready.session_id not in server.service.sessions, timeout=30, what="the flooder to end"
    )
    elapsed = time.monotonic() - opened_at
    reader.cancel()
    assert texts == [EXPECTED["demo_weather.wav"], EXPECTED["demo_timer.wav"]]
    allowed = cfg.control_burst + cfg.max_control_rate * elapsed
    assert replies <= allowed, (replies, sent, elapsed)
    assert flood_session.control_messages <= allowed, (flood_session.control_messages, sent, elapsed)
    assert sent > allowed  # it did flood


# ---- 10: log injection ----------------------------------------------------------------------------------------------


async def test_client_name_cannot_forge_log_lines(server: ASRServer, captured_log: list[str]) -> None:
    start = len(captured_log)
    forged = "x\nFORGED line\r\x1b[31mred\u2028FORGED too"
    ws, ready = await open_session(server.url, ConfigMessage(client=forged), token=TOKEN)
    assert isinstance(ready, ReadyMessage)
    await ws.send(CLOSE)
    await expect_close(ws, CloseCode.NORMAL)
    text = log_since(captured_log, start)
    assert "FORGED line" in text  # logged, escaped
    assert not [
        line
        for line in re.split(r"[\r\n\u2028\u2029\x0b\x0c\x1c-\x1e\x85]", text)
        if line.startswith("FORGED")
    ]
    assert "\x1b" not in text


# ---- 11: metrics and info need a token ------------------------------------------------------------------------------


async def http_status(url: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        async with http.get(url, headers=headers) as r:
            await r.read()
            return r.status


async def test_metrics_and_info_need_a_token_unless_public(server: ASRServer, engine: NemotronEngine) -> None:
    base = server.http_url
    for path in ("/metrics", "/v1/info"):
        assert await http_status(base + path) == 401
        assert await http_status(base + path, WRONG_TOKEN) == 401
        assert await http_status(base + path, TOKEN) == 401  # a metrics token is set: only it works
        assert await http_status(base + path, METRICS_TOKEN) == 200
    for path in ("/healthz", "/readyz"):
        assert await http_status(base + path) == 200
    async with aiohttp.ClientSession() as http:
        async with http.get(base + "/healthz") as r:
            assert str(server.engine.config.model) not in await r.text()
    async with own_server(engine, tokens=(TOKEN,)) as srv:  # no metrics token: the session tokens work
        assert await http_status(srv.http_url + "/metrics") == 401
        assert await http_status(srv.http_url + "/metrics", TOKEN) == 200
    async with own_server(engine, tokens=(TOKEN,), public_metrics=True) as srv:
        assert await http_status(srv.http_url + "/metrics") == 200
        assert await http_status(srv.http_url + "/v1/info") == 200


# ---- 12: failed authentication backs off per peer --------------------------------------------------------------------


def retry_after_s(message: str) -> float:
    match = re.search(r"retry after ([0-9.]+) s", message)
    assert match, message
    return float(match.group(1))


async def test_failed_auth_locks_out_the_peer_not_others(engine: NemotronEngine) -> None:
    async with own_server(
        engine, tokens=(TOKEN,), auth_max_failures=3, auth_failure_window_s=60.0, auth_backoff_s=0.5
    ) as srv:
        metrics = srv.service.metrics
        for _ in range(3):
            ws = await connect(srv.url, token=WRONG_TOKEN)
            await expect_close(ws, CloseCode.UNAUTHORIZED)
        # Locked out: even the right token is refused, before the server reads anything.
        ws = await connect(srv.url, token=TOKEN)
        messages = await expect_close(ws, CloseCode.BACKLOG)
        assert messages[-1].reason == "auth_backoff"
        first_backoff = retry_after_s(messages[-1].message)
        ws = await connect(srv.url, token=None)  # sends nothing: refused without waiting for a config
        await expect_close(ws, CloseCode.BACKLOG, timeout=srv.config.config_timeout_s / 2)
        # Another loopback address is another peer: unaffected, with a header or a config token.
        other = ("127.0.0.2", 0)
        ws, ready = await open_session(srv.url, token=TOKEN, local_addr=other)
        assert isinstance(ready, ReadyMessage)
        await ws.close()
        ws, ready = await open_session(srv.url, ConfigMessage(token=TOKEN), token=None, local_addr=other)
        assert isinstance(ready, ReadyMessage)
        await ws.close()
        # After the lockout, one more failure locks the peer out again, for longer.
        await asyncio.sleep(first_backoff + 0.2)
        ws = await connect(srv.url, token=WRONG_TOKEN)
        await expect_close(ws, CloseCode.UNAUTHORIZED)
        ws = await connect(srv.url, token=TOKEN)
        messages = await expect_close(ws, CloseCode.BACKLOG)
        assert retry_after_s(messages[-1].message) > first_backoff
        assert counter(metrics.refused, "auth_backoff") >= 3


# ---- all at once: an honest client beside every attack ------------------------------------------------------------------


async def slowloris(port: int, stop: asyncio.Event, count: int = 30) -> None:
    loop = asyncio.get_running_loop()
    socks: list[socket.socket] = []
    try:
        while not stop.is_set():
            while len(socks) < count:
                sock = await raw_socket(port=port)
                await loop.sock_sendall(sock, b"GET /v1/asr HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                socks.append(sock)
            await asyncio.sleep(0.2)
            alive = []
            for sock in socks:
                try:
                    if sock.recv(1) == b"":
                        sock.close()
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    sock.close()
                    continue
                alive.append(sock)
            socks = alive
    finally:
        for sock in socks:
            sock.close()


async def until(stop: asyncio.Event, attack) -> None:
    """Repeat ``attack`` until ``stop`` (its failures are the server's doing, and expected)."""
    while not stop.is_set():
        with contextlib.suppress(Exception):
            await attack()
        await asyncio.sleep(0.05)


T = TypeVar("T")

#: Rounds of attacks after the first whose memory is compared: a leak grows the RSS in every one of them.
LEAK_ROUNDS = 4

#: Growth of the held RSS over one round that counts as growing, bytes.
ROUND_GROWTH_BYTES = 1024 * 1024


async def beside_every_attack(server: ASRServer, honest: Awaitable[T]) -> T:
    """Await ``honest`` while every attack of this module runs against ``server``; the attacks stop after it."""
    service = server.service
    stop = asyncio.Event()

    async def wrong_token() -> None:
        ws = await connect(server.url, token=WRONG_TOKEN, local_addr=("127.0.0.3", 0))
        await ws.wait_closed()

    async def junk() -> None:
        ws = await connect(server.url, token=None, local_addr=("127.0.0.4", 0))
        await ws.send("[" * 50_000 + "]" * 50_000)
        await ws.wait_closed()
        await raw_session(
            server.port, upgrade_request("/v1/asr", b"Authorization: Bearer \xff\xfe" + b"\x80" * 20)
        )

    async def set_latency_reset() -> None:
        ws, _ = await open_session(server.url, token=TOKEN)
        await ws.send(SetLatencyMessage(560).to_json())
        rst_abort(ws)

    async def control_flood() -> None:
        ws, _ = await open_session(server.url, token=TOKEN)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                for i in range(100_000):
                    await ws.send(FINALIZE)
                    if i % 20 == 0:
                        await asyncio.sleep(0)
        rst_abort(ws)

    async def burst_and_leave() -> None:
        ws, _ = await open_session(server.url, token=TOKEN)
        audio = clip("two_turns.wav") * 3
        for i in range(0, len(audio), 100_000):
            await ws.send(audio[i : i + 100_000])
        rst_abort(ws)

    attacks = [
        asyncio.create_task(slowloris(server.port, stop)),
        asyncio.create_task(hold_pending(server.url, service.max_pending_auth, stop)),
        *(asyncio.create_task(until(stop, a)) for a in (wrong_token, junk, set_latency_reset, control_flood)),
        asyncio.create_task(until(stop, burst_and_leave)),
    ]
    try:
        return await honest
    finally:
        stop.set()
        await asyncio.gather(*attacks, return_exceptions=True)


async def test_honest_client_stays_exact_beside_every_attack_and_resources_return(
    server: ASRServer, engine: NemotronEngine
) -> None:
    service = server.service
    names = ["demo_weather.wav", "demo_timer.wav", "demo_math.wav"]
    assert await transcribe_over(server.url, names[:1], token=TOKEN) == [EXPECTED[names[0]]]  # warm-up
    gc.collect()
    fds = fd_count()

    async def honest(clips: list[str]) -> list[str]:
        return await transcribe_over(server.url, clips, speed=2.0, token=TOKEN, local_addr=("127.0.0.2", 0))

    async def resources_returned() -> None:
        await wait_for(
            lambda: not service.sessions and service.pending_auth == 0 and engine.open_streams == 0,
            timeout=30,
            what="every session and pending connection to end",
        )
        await wait_for(lambda: fd_count() <= fds + 2, timeout=30, what="the file descriptors to be closed")

    texts = await beside_every_attack(server, honest(names))
    assert texts == [EXPECTED[n] for n in names]
    await resources_returned()
    # Memory: a leak grows what the process holds in every round of attacks, however fast the machine runs them
    # (a slower one runs fewer attacks a round, not none); allocator caches and warm-ups settle in the first.
    held = [held_rss_bytes()]
    for _ in range(LEAK_ROUNDS):
        assert await beside_every_attack(server, honest(names[:1])) == [EXPECTED[names[0]]]
        await resources_returned()
        held.append(held_rss_bytes())
    growth = [after - before for before, after in zip(held, held[1:], strict=False)]
    report = ", ".join(f"{g / 2**20:+.1f}" for g in growth)
    assert min(growth) < ROUND_GROWTH_BYTES, f"the held RSS grew in each of {LEAK_ROUNDS} rounds of attacks: {report} MiB"


# ---- 1: tokens never reach a log line, a traceback or a repr (runs last: it reads the whole module's log) ----------


def windows(secret: str, size: int = 8) -> set[str]:
    return {secret[i : i + size] for i in range(len(secret) - size + 1)}


async def test_tokens_never_reach_logs_tracebacks_or_reprs(
    server: ASRServer, captured_log: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args, **kwargs):
        raise RuntimeError("forced crash")

    with monkeypatch.context() as m:  # a crash in a session authenticated by its header
        m.setattr(Session, "_open_stream", boom)
        ws, first = await open_session(server.url, token=TOKEN)
        assert isinstance(first, ErrorMessage) and first.code == CloseCode.INTERNAL
        await expect_close(ws, CloseCode.INTERNAL)
    with monkeypatch.context() as m:  # a crash while reading a config that carries the token
        m.setattr(session_module, "parse_client_message", boom)
        ws = await connect(server.url, token=None)
        await ws.send(ConfigMessage(token=TOKEN, client="leak-test").to_json())
        await expect_close(ws, CloseCode.INTERNAL)
    text = "".join(captured_log)
    assert text.count("forced crash") >= 2 and "└" in text  # diagnosed tracebacks were logged
    stt = NemotronServerSTTService(url=server.url, token=TOKEN)
    config = server.config
    reprs = [repr(config), str(config), repr(server.service.__dict__), repr(stt), repr(vars(stt))]
    for secret in (TOKEN, METRICS_TOKEN):
        leaked = [w for w in windows(secret) if w in text]
        assert not leaked, f"token fragments in the log: {leaked}"
        assert not [w for r in reprs for w in windows(secret) if w in r]
    assert "2 tokens" not in repr(config) and "tokens=<1" in repr(config)
