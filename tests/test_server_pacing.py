"""The ASR server's read pacing and its peeks: what a client that sends ahead of real time, or peeks often, gets.

Served on loopback with the tiny model on CPU, as in ``test_server.py``. Times are kept short with the server's
pacing knobs (``burst_ms``, ``max_speed``) instead of real-time streaming.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest
import websockets
from helpers import DEMO, FRAME_BYTES, clip, free_slots_restored, own_server, wait_for
from loguru import logger
from websockets.exceptions import ConnectionClosed
from ws_client import open_session, raw_messages

from pipecat_nemotron.asr import NemotronEngine, StepStats
from pipecat_nemotron.models import TINY_MODEL_PATH as TRAINED_MODEL
from pipecat_nemotron.server.protocol import PROTOCOL_VERSION, ConfigMessage, ReadyMessage

pytestmark = pytest.mark.asyncio(loop_scope="module")


PEEK = '{"type": "peek"}'
FINALIZE = '{"type": "finalize"}'
CLOSE = '{"type": "close"}'
EXPECTED = json.loads((DEMO / "transcripts.json").read_text())


async def send_all(ws, pcm: bytes) -> None:
    """Send ``pcm`` in 20 ms frames at once (as fast as the socket takes them)."""
    for i in range(0, len(pcm), FRAME_BYTES):
        await ws.send(pcm[i : i + FRAME_BYTES])


async def test_peek_then_close_still_gets_its_peek_result(engine: NemotronEngine) -> None:
    """PROTOCOL.md: every peek gets exactly one peek_result, in order, and close sends what is still owed."""
    async with own_server(engine, insecure=True) as srv:
        for _ in range(3):
            ws, ready = await open_session(srv.url)
            assert isinstance(ready, ReadyMessage)
            await send_all(ws, clip()[: 16000 * 2 * 1])
            await ws.send(PEEK)
            await ws.send(CLOSE)
            messages = await raw_messages(ws)
            assert ws.close_code == 1000
            peeks = [m for m in messages if m["type"] == "peek_result"]
            assert len(peeks) == 1 and peeks[0]["utterance"] == 0 and peeks[0]["utterance_audio_ms"] == 1000.0, messages
        await wait_for(free_slots_restored(srv, engine), what="the slots to be freed")


async def test_peeks_pending_together_cost_one_engine_peek_and_each_gets_its_answer(
    engine: NemotronEngine,
) -> None:
    """Five peeks sent at once, after the audio is decoded: one model step (a flood buys no engine time)."""
    steps: list[StepStats] = []
    async with own_server(engine, insecure=True) as srv:
        ws, _ = await open_session(srv.url)
        # 1.01 s: not a whole number of chunks, so a peek has a tail to flush (one model step).
        await send_all(ws, clip()[: 2 * 16160])
        last_step = [time.monotonic()]

        def stamp(_: StepStats) -> None:
            last_step[0] = time.monotonic()

        engine.add_step_listener(steps.append)
        engine.add_step_listener(stamp)
        try:
            # Every chunk of the audio is decoded: the engine has been idle for a while.
            session = next(iter(srv.service.sessions.values()))
            await wait_for(
                lambda: session.backlog_ms < 160 and time.monotonic() - last_step[0] > 0.5,
                what="the audio to be decoded",
            )
            steps.clear()
            for _ in range(5):
                await ws.send(PEEK)
            answers = []
            async with asyncio.timeout(20):
                while len(answers) < 5:
                    message = json.loads(await ws.recv())
                    if message["type"] == "peek_result":
                        answers.append(message)
        finally:
            engine.remove_step_listener(steps.append)
            engine.remove_step_listener(stamp)
        await ws.send(FINALIZE)
        await ws.send(CLOSE)
        finals = [m for m in await raw_messages(ws) if m["type"] == "final"]
    assert sum(s.batch_size for s in steps) == 1, steps
    assert len({(a["utterance"], a["text"], a["utterance_audio_ms"]) for a in answers}) == 1, answers
    assert answers[0]["utterance_audio_ms"] == 1010.0 and answers[0]["text"] == finals[0]["text"]


async def test_a_peek_costs_five_control_messages_of_the_pacing_budget(engine: NemotronEngine) -> None:
    """Keepalives within the burst are read at once; as many peeks exceed it (5 each) and are paced."""
    async with own_server(engine, insecure=True, control_burst=10, max_control_rate=100.0) as srv:
        throttled = srv.service.metrics.throttled_seconds
        ws, _ = await open_session(srv.url)
        seen: list[str] = []
        for kind in ("keepalive", "peek"):
            before = throttled._value.get()
            for _ in range(3):
                await ws.send(json.dumps({"type": kind}))
            await ws.send(json.dumps({"type": "set_latency", "latency_ms": 160}))  # answered once all are read
            async with asyncio.timeout(20):
                while not seen or seen[-1] != "latency":
                    seen.append(json.loads(await ws.recv())["type"])
            assert (throttled._value.get() > before) == (kind == "peek"), kind
            await asyncio.sleep(0.3)  # the budget refills
            seen.append("")
        await ws.send(CLOSE)
        seen += [m["type"] for m in await raw_messages(ws)]
    assert seen.count("peek_result") == 3


async def test_peeks_before_a_finalize_are_about_its_utterance(engine: NemotronEngine) -> None:
    """Peeks waiting behind one in flight are issued before a finalize: they still answer about utterance 0."""
    async with own_server(engine, insecure=True) as srv:
        ws, _ = await open_session(srv.url)
        pcm = clip()
        await send_all(ws, pcm[: 2 * 16000])
        for _ in range(3):
            await ws.send(PEEK)
        await ws.send(FINALIZE)
        await send_all(ws, pcm[2 * 16000 : 2 * 24000])
        await ws.send(PEEK)
        await ws.send(FINALIZE)
        await ws.send(CLOSE)
        messages = await raw_messages(ws)
    peeks = [m for m in messages if m["type"] == "peek_result"]
    finals = [m for m in messages if m["type"] == "final"]
    assert [p["utterance"] for p in peeks] == [0, 0, 0, 1] and len(finals) == 2
    assert all(p["text"] == finals[0]["text"] for p in peeks[:3]) and peeks[3]["text"] == finals[1]["text"]


@pytest.mark.filterwarnings("ignore:The test <Function:pytest.PytestWarning")
def test_engine_load_is_spare_below_half_busy() -> None:
    from pipecat_nemotron.server.engine_load import LOAD_WINDOW_S, EngineLoad

    load = EngineLoad()
    assert load.spare() and load.busy_fraction() == 0.0
    for _ in range(4):
        load.observe_step(StepStats(step_ms=100.0, batch_size=1, groups=1, queue_ms_max=0.0, open_streams=1, finals=0))
    assert load.spare() and load.busy_fraction() == pytest.approx(0.4)
    load.observe_step(StepStats(step_ms=200.0, batch_size=1, groups=1, queue_ms_max=0.0, open_streams=1, finals=0))
    assert not load.spare()
    assert LOAD_WINDOW_S == 1.0


@pytest.mark.serial
async def test_client_that_sent_audio_ahead_catches_up_when_the_engine_has_room(engine: NemotronEngine) -> None:
    """4 s sent at once with no burst allowance: the server reads it faster than real time while it has room.

    The server's default ``max_speed`` (4) reads a session that is ahead faster than real time while the engine
    is mostly idle (one session on a tiny model in its longest-chunk mode), and counts the audio it read so in
    ``caught_up_seconds``; a server that read at real time would count none. Serial: "room" is
    ``EngineLoad.spare()``, the share of the last second the engine spent in model steps, a measured time. The
    margin: more than 1 of the 3 s it can read ahead (2.5 s beside 3 CPU hogs on 2 cores, 2026-12-06).
    """
    seconds = 4.0
    async with own_server(engine, insecure=True, burst_ms=0.0) as srv:
        caught_up = srv.service.metrics.caught_up_seconds
        before = caught_up._value.get()
        ws, _ = await open_session(srv.url, ConfigMessage(interim_results=False, latency_ms=1120))
        pcm = (clip() * 4)[: int(seconds * 32000)]
        await send_all(ws, pcm)
        await ws.send(FINALIZE)
        async with asyncio.timeout(30):
            final = json.loads(await ws.recv())
        await ws.send(CLOSE)
        await raw_messages(ws)
        read_fast_s = caught_up._value.get() - before
    assert final["type"] == "final" and final["utterance_audio_ms"] == seconds * 1000
    # At 4x, 3 of every 4 seconds of the audio are read beyond the real-time rate.
    assert read_fast_s > 1.0, f"only {read_fast_s:.2f} s of {seconds} s read faster than real time"


async def test_keepalive_pings_behind_unread_audio_and_the_real_close_code(engine: NemotronEngine) -> None:
    """A client far ahead of real time: its pings wait behind its unread audio (TCP keeps order).

    With a ping timeout shorter than its lead the client's own library closes the connection; the server logs
    that the client left without a close frame it could read (1006), not a normal close. With the keepalive
    PROTOCOL.md documents (no ping timeout, or one above the lead) the same client gets its final.
    """
    lines: list[str] = []
    sink = logger.add(lines.append, level="INFO", format="{message}")
    try:
        async with own_server(engine, insecure=True, burst_ms=0.0, max_speed=1.0) as srv:
            pcm = (clip() * 3)[: 3 * 32000]
            ws = await websockets.connect(
                srv.url, subprotocols=[PROTOCOL_VERSION], ping_interval=0.2, ping_timeout=0.4, close_timeout=0.2
            )
            await ws.send(ConfigMessage(interim_results=False).to_json())
            await ws.recv()
            await send_all(ws, pcm)
            with pytest.raises(ConnectionClosed):
                async with asyncio.timeout(10):
                    while True:
                        await ws.recv()
            await wait_for(lambda: any(" ended (" in line for line in lines), what="the session's end")
            ended = [line for line in lines if " ended (disconnect" in line]
            assert len(ended) == 1 and "client's code 1006" in ended[0], [x for x in lines if " ended (" in x]

            ws = await websockets.connect(srv.url, subprotocols=[PROTOCOL_VERSION], ping_interval=0.2, ping_timeout=None)
            await ws.send(ConfigMessage(interim_results=False).to_json())
            await ws.recv()
            await send_all(ws, pcm[: 32000])
            await ws.send(FINALIZE)
            await ws.send(CLOSE)
            finals = [m for m in await raw_messages(ws) if m["type"] == "final"]
            assert len(finals) == 1 and ws.close_code == 1000
    finally:
        logger.remove(sink)


async def test_ready_names_the_model_not_its_install_path(engine: NemotronEngine) -> None:
    async with own_server(engine, insecure=True) as srv:
        ws, ready = await open_session(srv.url)
        await ws.close()
    assert isinstance(ready, ReadyMessage)
    # The engine loads the bundled model by its absolute install path; a client sees the file's name only.
    assert engine.config.model == str(TRAINED_MODEL) and TRAINED_MODEL.is_absolute()
    assert ready.model == "tiny_nemotron_asr.nemo"


# ---- the server's heartbeat while it holds a session's reads ------------------------------------------------------

#: The server's heartbeat in these tests, s: short, so that many periods pass while the server holds reads.
HEARTBEAT_S = 0.2

#: Peeks of this many characters (unknown fields are ignored): eight hold more than aiohttp buffers (2 x 256 KiB)
#: before it stops reading the socket, so the client's pongs wait in TCP behind the unread ones.
PADDED_PEEK_CHARS = 96 * 1024


def padded_peek() -> str:
    head = '{"type": "peek", "pad": "'
    return head + "x" * (PADDED_PEEK_CHARS - len(head) - 2) + '"}'


def sample(srv, name: str, **labels: str) -> float:
    """A sample of the server's own metrics registry (0 if absent)."""
    return srv.service.metrics.registry.get_sample_value(f"nemotron_asr_{name}", labels) or 0.0


@pytest.mark.filterwarnings("ignore:The test <Function:pytest.PytestWarning")
def test_heartbeat_is_a_validated_setting_and_a_serve_flag() -> None:
    from pipecat_nemotron.cli import build_parser, serve_configs
    from pipecat_nemotron.server.config import ServerConfig

    assert ServerConfig(insecure=True).heartbeat_s == 20.0
    assert ServerConfig(insecure=True, heartbeat_s=None).heartbeat_s is None
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="heartbeat_s must be > 0"):
            ServerConfig(insecure=True, heartbeat_s=bad)
    base = ["serve", "--insecure", "--host", "127.0.0.1"]
    assert serve_configs(build_parser().parse_args(base))[1].heartbeat_s == 20.0
    assert serve_configs(build_parser().parse_args([*base, "--heartbeat-s", "5"]))[1].heartbeat_s == 5.0
    with pytest.raises(ValueError, match="heartbeat_s must be > 0"):
        serve_configs(build_parser().parse_args([*base, "--heartbeat-s", "0"]))


async def peek_faster_than_allowed(url: str, peeks: int = 8) -> tuple[list[dict], float]:
    """A session that sends an utterance, ``peeks`` padded peeks at once, a finalize and a close.

    Returns:
        What the server sent until it closed, and the seconds from the first peek to the close.

    """
    ws, ready = await open_session(url, ConfigMessage(interim_results=False))
    assert isinstance(ready, ReadyMessage)
    reading = asyncio.create_task(raw_messages(ws, timeout=120))  # the server's sends never wait on this client
    await send_all(ws, clip("demo_weather.wav"))
    started = time.monotonic()
    for _ in range(peeks):
        await ws.send(padded_peek())
    await ws.send(FINALIZE)
    await ws.send(CLOSE)
    messages = await reading
    assert ws.close_code == 1000, (ws.close_code, ws.close_reason, [m["type"] for m in messages])
    return messages, time.monotonic() - started


async def test_heartbeat_never_drops_a_client_whose_reads_the_server_holds(engine: NemotronEngine) -> None:
    """PROTOCOL.md: a client that sends control messages faster than its allowance only waits, however long.

    Eight peeks against a budget of one peek per half second: the server reads them over at least 3.5 s (the
    control allowance sets that floor; load only lengthens it), 17 of its heartbeat periods, while more than aiohttp
    buffers waits unread. The heartbeat counts none of that time: the client gets every peek_result, its final
    and a normal close; no session is dropped. (aiohttp's own heartbeat, counting that time, closed it with 1006.)
    """
    lines: list[str] = []
    sink = logger.add(lines.append, level="INFO", format="{message}")
    try:
        async with own_server(
            engine, insecure=True, heartbeat_s=HEARTBEAT_S, control_burst=5, max_control_rate=10.0
        ) as srv:
            messages, held_s = await peek_faster_than_allowed(srv.url)
            await wait_for(lambda: sample(srv, "sessions_ended_total", how="client_close") == 1, what="the session's end")
            assert b"sessions_dropped_total{" not in srv.service.metrics.render()
    finally:
        logger.remove(sink)
    assert held_s >= 15 * HEARTBEAT_S  # the premise: reads were held for many heartbeat periods
    assert [m["type"] for m in messages] == ["peek_result"] * 8 + ["final"]
    assert messages[-1]["text"] == EXPECTED["demo_weather.wav"]
    assert not [line for line in lines if "heartbeat" in line], lines


async def test_heartbeat_closes_a_client_that_answers_no_ping_while_the_server_waits(engine: NemotronEngine) -> None:
    """A dead peer (here: a client that stopped reading, so it sends no pong) is closed by the heartbeat (1006).

    The idle timeout (60 s) is far away: only the heartbeat ends this session. The log says it was the server's
    heartbeat that closed the connection, and the code is 1006 (no close frame).
    """
    lines: list[str] = []
    sink = logger.add(lines.append, level="INFO", format="{message}")
    try:
        async with own_server(engine, insecure=True, heartbeat_s=HEARTBEAT_S, idle_timeout_s=60.0) as srv:
            ws, ready = await open_session(srv.url)
            assert isinstance(ready, ReadyMessage)
            ws.transport.pause_reading()  # the client's library never sees the server's ping: no pong
            await wait_for(free_slots_restored(srv, engine), timeout=30, what="the heartbeat to end the session")
            ws.transport.abort()
    finally:
        logger.remove(sink)
    ended = [line for line in lines if " ended (" in line]
    assert len(ended) == 1 and "(disconnect, client's code 1006)" in ended[0], ended
    session_id = ended[0].split()[2]
    assert [line for line in lines if f"ASR session {session_id}: heartbeat: " in line and "not even a pong" in line], lines


async def test_serve_path_answers_pings_while_the_session_holds_reads(engine: NemotronEngine) -> None:
    """The Ray Serve path keeps its client's pings answered while a session's reads are held.

    Under Serve the client's WebSocket ends at Serve's proxy, a uvicorn server that reads every message and hands
    it to the replica whether or not the session reads (``MessageQueue``, unbounded), and the replica's transport
    reads them into its inbox likewise. Here the replica's app (:func:`starlette_app`) runs under uvicorn in this
    process with a short ping interval and timeout (Serve's proxy keeps uvicorn's 20 s and 20 s): the same flood
    of peeks gets every answer, its final and a normal close. (A transport that read only when the session reads
    stops uvicorn reading the socket after one message, and uvicorn's keepalive closes the connection, 1011.)
    No Ray cluster is started.
    """
    uvicorn = pytest.importorskip("uvicorn")
    pytest.importorskip("starlette")
    from pipecat_nemotron.server.config import ServerConfig
    from pipecat_nemotron.server.ray_serve import starlette_app
    from pipecat_nemotron.server.service import ASRService

    service = ASRService(ServerConfig(insecure=True, control_burst=5, max_control_rate=10.0), engine)
    await service.start()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(
            starlette_app(service),
            ws_ping_interval=HEARTBEAT_S,
            ws_ping_timeout=HEARTBEAT_S / 2,
            lifespan="off",
            log_config=None,
        )
    )
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_for(lambda: server.started, what="uvicorn to start")
        url = f"ws://127.0.0.1:{sock.getsockname()[1]}{service.config.path}"
        messages, held_s = await peek_faster_than_allowed(url)
    finally:
        server.should_exit = True
        await serving
        await service.stop(drain_timeout_s=0)
        sock.close()
    assert held_s >= 15 * HEARTBEAT_S
    assert [m["type"] for m in messages] == ["peek_result"] * 8 + ["final"]
    assert messages[-1]["text"] == EXPECTED["demo_weather.wav"]
