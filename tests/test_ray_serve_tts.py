"""Ray Serve's TTS application: a burst admitted up to its bound, a replica fault, a drain, with Riva gRPC clients.

Two CPU replicas of the tiny random Magpie behind Serve's gRPC proxy, 2 calls per replica (``max_streams``) and 1
decoded per step (``max_batch``), Serve's router holding up to 4 calls it has not placed (``max_queued_requests``). The tiny Magpie
never ends a sentence on its own, so each request speaks exactly ``FRAMES`` codec frames. Calls are Riva
``SynthesizeOnline`` streams the client keeps open between its requests, as Pipecat's ``NvidiaTTSService`` keeps a
reply's call open between sentences: a call holds its replica slot until the client closes it. Each response's
``id`` names the replica that spoke (``ServeRivaTTS``).

Every wait is on an event (first audio, a status, Serve's replica states), each bounded by a generous timeout
that names what never came. Most of the time is Ray starting replicas (five over the run: 86 s on the 2-core
development machine beside other jobs).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import helpers
import pytest
import riva.client.proto.riva_tts_pb2 as rtts
import riva.client.proto.riva_tts_pb2_grpc as rtts_grpc
from helpers import MAGPIE_CODEC_RATE, MAGPIE_SAMPLES_PER_FRAME, Then, Until, run_steps
from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
from pipecat.services.nvidia.tts import NvidiaTTSService
from pipecat.services.tts_service import TextAggregationMode
from processes import free_port

from pipecat_nemotron.server.config import ServerConfig
from pipecat_nemotron.server.tts_config import TTSHostConfig

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.serial]

#: Codec frames each request speaks (about 1.9 s of audio).
FRAMES = 40
#: Bytes of one request's audio at the codec's own rate (16-bit mono).
FULL = FRAMES * MAGPIE_SAMPLES_PER_FRAME * 2
#: The longest any one event may take (a replica start loads NeMo in a new process: minutes beside CPU hogs).
HANG_S = 600.0

APP = "default"
DEPLOYMENT = "nemotron-tts"

SYNC = pytest.mark.filterwarnings("ignore:The test <Function:pytest.PytestWarning")


def request(text: str = "Hello there, from a Serve replica.") -> rtts.SynthesizeSpeechRequest:
    return rtts.SynthesizeSpeechRequest(text=text, language_code="en-US", sample_rate_hz=0)


class Reply:
    """One ``SynthesizeOnline`` call whose client keeps it open between requests (a bot's reply)."""

    def __init__(self, stub: rtts_grpc.RivaSpeechSynthesisStub) -> None:
        self.call = stub.SynthesizeOnline()
        self.audio_bytes = 0
        self.replica: str | None = None

    async def say(self, text: str = "Hello there, from a Serve replica.") -> str:
        """Send a request and wait for the call's first (or next) audio; return the replica that spoke."""
        await self.call.write(request(text))
        response = await self.call.read()
        assert response is not grpc.aio.EOF, "the call ended without audio"
        self.audio_bytes += len(response.audio)
        self.replica = response.id.value.split("/")[0]
        return self.replica

    async def finish(self, text: str | None = None) -> grpc.StatusCode:
        """Send one more request (if ``text``), close the request side, read the rest; return the call's status."""
        if text is not None:
            await self.call.write(request(text))
        await self.call.done_writing()
        while (response := await self.call.read()) is not grpc.aio.EOF:
            self.audio_bytes += len(response.audio)
        return await self.call.code()

    def cancel(self) -> None:
        self.call.cancel()


async def bounded(awaitable: Any, what: str) -> Any:
    """``awaitable``'s result; ``TimeoutError`` naming ``what`` after :data:`HANG_S`."""
    try:
        return await asyncio.wait_for(awaitable, HANG_S)
    except TimeoutError:
        raise TimeoutError(f"timed out after {HANG_S:g} s waiting for {what}") from None


async def until(predicate: Callable[[], bool], what: str) -> None:
    """Poll ``predicate`` (run in a thread: it may call Ray) until it holds."""

    async def poll() -> None:
        while not await asyncio.to_thread(predicate):  # noqa: ASYNC110 - Serve's state is polled: no event to await
            await asyncio.sleep(0.2)

    await bounded(poll(), what)


def replica_states(serve: Any) -> dict[str, int]:
    """Serve's count of the TTS deployment's replicas by state (RUNNING, STARTING, STOPPING...)."""
    app = serve.status().applications.get(APP)
    if app is None or DEPLOYMENT not in app.deployments:
        return {}
    return {str(k): v for k, v in app.deployments[DEPLOYMENT].replica_states.items() if v}


def kill_replica(ray: Any, replica: str) -> None:
    """Kill the Serve replica actor whose name ends with ``replica`` (no restart: Serve replaces it)."""
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["name"].startswith("SERVE_REPLICA") and actor["name"].endswith(replica):
            ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
            return
    raise LookupError(f"no Serve replica {replica}")


def spoke_after(frames: list[Frame], starts: int) -> bool:
    """Whether the ``starts``-th reply (``TTSStartedFrame``) got audio and then its ``TTSStoppedFrame``."""
    started = [i for i, f in enumerate(frames) if isinstance(f, TTSStartedFrame)]
    if len(started) < starts:
        return False
    rest = frames[started[starts - 1] :]
    audio = next((i for i, f in enumerate(rest) if isinstance(f, TTSAudioRawFrame)), None)
    return audio is not None and any(isinstance(f, TTSStoppedFrame) for f in rest[audio:])


def app(tiny_magpie: tuple[Path, Path], replicas: int) -> Any:
    """The application as ``serve run``'s config file builds it (``app_builder`` with string arguments)."""
    from pipecat_nemotron.server.ray_tts import app_builder

    magpie, codec = tiny_magpie
    args = {
        "model": magpie, "codec": codec, "device": "cpu", "max_batch": 1, "max_streams": 2,
        "max_duration_s": (FRAMES - 0.5) * MAGPIE_SAMPLES_PER_FRAME / MAGPIE_CODEC_RATE, "num_replicas": replicas,
        "gpus_per_replica": 0, "cpus_per_replica": 0.5, "cpu_threads": 1, "max_queued_requests": 4,
        "drain_timeout_s": HANG_S, "insecure": "true",
    }  # fmt: skip
    return app_builder({key: str(value) for key, value in args.items()})


@SYNC
def test_build_tts_app_routes_no_more_than_a_replica_admits_and_drains_inside_serves_shutdown() -> None:
    pytest.importorskip("ray.serve", reason="ray[serve] is not installed (pip install 'pipecat-nemotron[ray]')")
    from pipecat_nemotron.server.ray_serve import DRAIN_MARGIN_S
    from pipecat_nemotron.server.ray_tts import RIVA_TTS_SERVICER, app_builder, build_tts_app, grpc_options

    deployment = build_tts_app(
        TTSHostConfig(device="cpu", max_streams=6, max_batch=4),
        ServerConfig(insecure=True, drain_timeout_s=7),
        num_replicas=3,
        cpus_per_replica=2,
    )._bound_deployment
    assert deployment.max_ongoing_requests == 6  # the host's slots: Serve queues a call a replica would refuse
    assert deployment.max_queued_requests == 36  # a burst of twice the deployment's slots: half wait for a slot
    assert deployment.ray_actor_options == {
        "num_gpus": 0.0,
        "num_cpus": 2,
        "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "2"}},
    }
    assert deployment._deployment_config.graceful_shutdown_timeout_s == 7 + DRAIN_MARGIN_S
    assert grpc_options(50051) == {"port": 50051, "grpc_servicer_functions": [RIVA_TTS_SERVICER]}
    with pytest.raises(ValueError, match="max_stream"):
        app_builder({"model": "m.nemo", "max_stream": "3"})
    with pytest.raises(ValueError, match="max_streams"):
        app_builder({"model": "m.nemo", "device": "cpu", "max_streams": "0"})
    built = app_builder(
        {"model": "m.nemo", "device": "cpu", "insecure": "true", "max_streams": "4", "max_queued_requests": "-1"}
    )._bound_deployment
    assert built.max_ongoing_requests == 4 and built.max_queued_requests == -1


@pytest.mark.slow
@pytest.mark.timeout(3600)  # three replica starts: minutes on a quiet 2-core machine, several times that beside CPU hogs
async def test_burst_fault_and_drain_of_tts_replicas(
    tiny_magpie: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    ray = pytest.importorskip("ray", reason="ray[serve] is not installed (pip install 'pipecat-nemotron[ray]')")
    serve = pytest.importorskip("ray.serve", reason="ray[serve] is not installed (pip install 'pipecat-nemotron[ray]')")
    from pipecat_nemotron.server.ray_tts import grpc_options

    # Read by the controller Ray starts below: a proxy slow to start on a loaded machine is not killed for it.
    os.environ["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"] = "60"
    os.environ["RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S"] = "30"
    os.environ["RAY_worker_niceness"] = "0"  # replicas at normal priority, as docs/DEPLOYMENT.md says (Ray: nice 15)
    monkeypatch.setattr(helpers, "STEP_HANG_S", HANG_S)  # run_steps' guard: a replica kill is slow beside CPU hogs
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    report: dict[str, Any] = {}
    calls: list[Reply] = []
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": free_port()}, grpc_options=grpc_options(port))
        await bounded(asyncio.to_thread(serve.run, app(tiny_magpie, 2), blocking=False), "2 TTS replicas")
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stub = rtts_grpc.RivaSpeechSynthesisStub(channel)

        def reply() -> Reply:
            calls.append(Reply(stub))
            return calls[-1]

        # 1. A burst: 4 calls at once, twice each replica's batch size, are all admitted (2 per replica); 5 more
        # come while those hold every slot: the router holds 4 (max_queued_requests) and refuses 1 at once.
        held = [reply() for _ in range(4)]
        spoke = await bounded(asyncio.gather(*(r.say() for r in held)), "first audio of the 4 burst calls")
        assert sorted(collections.Counter(spoke).values()) == [2, 2], spoke
        extra = [reply() for _ in range(5)]
        waiting = [asyncio.ensure_future(r.say()) for r in extra]
        done, _ = await bounded(asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED), "the refusal")
        refusals = [t.exception() for t in done]
        assert len(refusals) == 1 and isinstance(refusals[0], grpc.aio.AioRpcError), refusals
        report["refused"] = [refusals[0].code().name, refusals[0].details()]
        assert refusals[0].code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_queued_requests" in refusals[0].details()
        for r in held:
            r.cancel()  # their slots free: the 4 waiting calls are placed
        queued = [t for t in waiting if t not in done]
        report["queued_served_by"] = await bounded(asyncio.gather(*queued), "the queued calls' first audio")
        for r in extra:
            r.cancel()

        # 2. A replica dies mid-reply under Pipecat's NvidiaTTSService (each text frame spoken as it comes, one call
        # per reply): that reply ends with a non-fatal ErrorFrame, and the service's next reply is spoken. Riva
        # calls fill one replica first, so the service's reply goes to the other, which is killed.
        fill: dict[str, list[Reply]] = collections.defaultdict(list)
        while not any(len(calls_on) == 2 for calls_on in fill.values()):
            r = reply()
            fill[await bounded(r.say(), "a filling call's first audio")].append(r)
        full = next(replica for replica, calls_on in fill.items() if len(calls_on) == 2)
        (target,) = set(spoke) - {full}
        tts = NvidiaTTSService(
            server=f"127.0.0.1:{port}", use_ssl=False, text_aggregation_mode=TextAggregationMode.TOKEN
        )
        down, up = await run_steps(
            tts,
            [
                LLMFullResponseStartFrame(),
                LLMTextFrame("Hello there, this reply is cut short."),
                Until("the first reply's audio", lambda d, u: any(isinstance(f, TTSAudioRawFrame) for f in d)),
                Then(lambda: asyncio.to_thread(kill_replica, ray, target)),
                Until("the first reply's error", lambda d, u: any(isinstance(f, ErrorFrame) for f in u)),
                LLMFullResponseEndFrame(),
                Then(fill[full][0].cancel),  # a slot frees on the live replica
                LLMFullResponseStartFrame(),
                LLMTextFrame("This is the next reply."),
                LLMFullResponseEndFrame(),
                Until("the next reply's audio to its end", lambda d, u: spoke_after(d, 2)),
            ],
            start_timeout=HANG_S,
        )
        errors = [f for f in up if isinstance(f, ErrorFrame)]
        report["pipecat_reply_error"] = [e.error[:300] for e in errors]
        assert len(errors) == 1 and not errors[0].fatal and "INTERNAL" in errors[0].error, errors
        for calls_on in fill.values():
            for r in calls_on:
                r.cancel()
        await until(lambda: replica_states(serve) == {"RUNNING": 2}, "Serve to replace the killed replica")

        # 3. A replica dies mid-reply (a Riva client): that reply fails with an error status; the next one on the same channel is
        # spoken, whole, by the other replica.
        victim = reply()
        dead = await bounded(victim.say(), "the victim reply's first audio")
        await asyncio.to_thread(kill_replica, ray, dead)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await bounded(victim.finish(), "the killed reply to fail")
        report["killed_reply"] = [failed.value.code().name, failed.value.details()[:200]]
        assert failed.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE)
        assert failed.value.details()
        after = reply()
        assert await bounded(after.say(), "the next reply's first audio") != dead
        assert await bounded(after.finish(), "the next reply's end") == grpc.StatusCode.OK
        assert after.audio_bytes == FULL, "the next reply was spoken whole"

        # 4. A drain: with one reply open on each replica, deploy the application again with 1 replica (a new
        # build is a new version: Serve starts a new replica and drains both old ones). Both replies are spoken to
        # their ends (a sentence sent during the drain included), a call made meanwhile is spoken, and the drained
        # replicas leave once their replies have ended.
        await until(lambda: replica_states(serve) == {"RUNNING": 2}, "Serve to replace the killed replica")
        open_replies: dict[str, Reply] = {}
        while len(open_replies) < 2:  # at most 3 calls: a replica takes 2
            r = reply()
            replica = await bounded(r.say(), "an open reply's first audio")
            if replica in open_replies:
                r.cancel()
            else:
                open_replies[replica] = r
        redeploy = asyncio.ensure_future(asyncio.to_thread(serve.run, app(tiny_magpie, 1), blocking=False))
        await until(lambda: "STOPPING" in replica_states(serve), "Serve to start draining a replica")
        meanwhile = reply()
        report["during_drain_served_by"] = await bounded(meanwhile.say(), "a call made during the drain")
        ends = await bounded(
            asyncio.gather(*(r.finish("And my next sentence.") for r in open_replies.values()), meanwhile.finish()),
            "the open replies to end",
        )
        assert ends == [grpc.StatusCode.OK] * 3, ends
        assert [r.audio_bytes for r in open_replies.values()] == [2 * FULL, 2 * FULL]
        await bounded(redeploy, "the redeploy")
        await until(lambda: replica_states(serve) == {"RUNNING": 1}, "the drained replicas to leave")
        last = reply()
        report["after_drain_served_by"] = await bounded(last.say(), "a call after the drain")
        report["drained"] = sorted(open_replies)
        last.cancel()
        await channel.close()
    finally:
        for r in calls:
            r.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.to_thread(serve.shutdown), 60)
        ray.shutdown()
        print(json.dumps(report, indent=1))
