"""The ASR server's read pacing and its peeks: what a client that sends ahead of real time, or peeks often, gets.

Served on loopback with the tiny model on CPU, as in ``test_server.py``. Times are kept short with the server's
pacing knobs (``burst_ms``, ``max_speed``) instead of real-time streaming.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import websockets
from helpers import FRAME_BYTES, clip, free_slots_restored, own_server, wait_for
from loguru import logger
from websockets.exceptions import ConnectionClosed
from ws_client import open_session, raw_messages

from pipecat_nemotron.engine import NemotronEngine, StepStats
from pipecat_nemotron.models import TINY_MODEL_PATH as TRAINED_MODEL
from pipecat_nemotron.server.protocol import PROTOCOL_VERSION, ConfigMessage, ReadyMessage

pytestmark = pytest.mark.asyncio(loop_scope="module")


PEEK = '{"type": "peek"}'
FINALIZE = '{"type": "finalize"}'
CLOSE = '{"type": "close"}'


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
            assert len(peeks) == 1 and peeks[0]["utterance"] == 0 and peeks[0]["audio_ms"] == 1000.0, messages
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
    assert len({(a["utterance"], a["text"], a["audio_ms"]) for a in answers}) == 1, answers
    assert answers[0]["audio_ms"] == 1010.0 and answers[0]["text"] == finals[0]["text"]


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
    from pipecat_nemotron.server.pacing import LOAD_WINDOW_S, EngineLoad

    load = EngineLoad()
    assert load.spare() and load.busy_fraction() == 0.0
    for _ in range(4):
        load.observe_step(StepStats(step_ms=100.0, batch_size=1, groups=1, queue_ms_max=0.0, open_streams=1, finals=0))
    assert load.spare() and load.busy_fraction() == pytest.approx(0.4)
    load.observe_step(StepStats(step_ms=200.0, batch_size=1, groups=1, queue_ms_max=0.0, open_streams=1, finals=0))
    assert not load.spare()
    assert LOAD_WINDOW_S == 1.0


async def test_client_that_sent_audio_ahead_catches_up_when_the_engine_has_room(engine: NemotronEngine) -> None:
    """4 s sent at once with no burst allowance: the server reads it faster than real time while it has room.

    The server's default ``max_speed`` (4) reads a session that is ahead faster than real time while the engine
    is mostly idle (it is: one session on a tiny model in its longest-chunk mode), and counts the audio it read
    so in ``caught_up_seconds``; a server that read at real time would count none. No clock is asserted.
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
