"""Ray Serve deployment of the Magpie TTS: replicas behind Serve's gRPC proxy, speaking Riva's ``RivaSpeechSynthesis``.

Each replica loads one batched :class:`~pipecat_nemotron.tts.magpie.MagpieEngine` (a :class:`TTSHost`, as
``pipecat-nemotron serve --tts-model`` hosts) and answers ``SynthesizeOnline``, ``Synthesize`` and
``GetRivaSynthesisConfig`` (:class:`~pipecat_nemotron.server.riva_tts.ServeRivaTTS`): Pipecat's
``NvidiaTTSService`` and any ``nvidia-riva-client`` talk to Serve's gRPC proxy as to a Magpie NIM. It is an
application of its own beside the ASR one (:mod:`~pipecat_nemotron.server.ray_serve`), so the two scale apart.

What a client can count on (docs/DEPLOYMENT.md, ``tests/test_ray_serve_tts.py``):

* **Bursts are admitted.** Serve routes at most ``max_streams`` calls to a replica at once (its
  ``max_ongoing_requests``); the engine decodes ``max_batch`` of them per step and queues the rest. A call counts
  against Serve's ``max_queued_requests`` from its arrival until a replica takes it (while the router places it,
  and while every replica is full); default: twice the streams of all replicas, so a burst of that many calls at
  once is admitted: they fill every slot and the rest wait for one. Beyond it Serve refuses at once with
  RESOURCE_EXHAUSTED (``Request dropped due to backpressure``).
* **A drain drains.** On a redeploy or downscale Serve routes new calls to the other replicas and waits for the
  ongoing ones; the replica reads Serve's shutdown flag (:func:`drain_tts`): replies already running finish (all
  their sentences) for up to ``drain_timeout_s``, then end with UNAVAILABLE, inside Serve's
  ``graceful_shutdown_timeout_s``. A call that a router sends before it hears of the shutdown is served, not
  refused.
* **A replica fault costs a reply, never the session.** A replica that dies ends its running calls with an error
  status (Serve's proxy: INTERNAL, naming the dead actor); the client's next call is routed to a live replica.

Example (a TTS-only cluster, so a Riva client needs no routing metadata)::

    import ray
    from ray import serve
    from pipecat_nemotron.server.config import ServerConfig
    from pipecat_nemotron.server.ray_tts import build_tts_app, grpc_options
    from pipecat_nemotron.server.tts_config import TTSHostConfig

    ray.init()
    serve.start(http_options={"host": "0.0.0.0"}, grpc_options=grpc_options(50051))
    serve.run(build_tts_app(TTSHostConfig(max_streams=32), ServerConfig(tokens=(token,)), num_replicas=4))

Or ``serve run pipecat_nemotron.server.ray_tts:app_builder ...`` with a config file that sets ``grpc_options``.
Requires ``pip install "pipecat-nemotron[ray,riva,tts]"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import TYPE_CHECKING, Any

from pipecat_nemotron.server.config import ServerConfig, tokens_from
from pipecat_nemotron.server.grpc_common import GrpcAccess
from pipecat_nemotron.server.ray_serve import (
    DEFAULT_DRAIN_TIMEOUT_S,
    deployment_args,
    replica_id,
    replica_options,
    replica_threads,
    resolve_gpus_per_replica,
    start_drain_watcher,
    stop_replica,
)
from pipecat_nemotron.server.riva_serve import RIVA_TTS_SERVICER
from pipecat_nemotron.server.riva_tts import ServeRivaTTS
from pipecat_nemotron.server.tts_config import TTSHostConfig
from pipecat_nemotron.server.tts_host import TTSHost

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from ray.serve import Application

__all__ = ["RIVA_TTS_SERVICER", "app_builder", "build_tts_app", "drain_tts", "grpc_options"]

def grpc_options(port: int = 50051) -> dict[str, Any]:
    """``serve.start(grpc_options=...)`` for a cluster that serves the TTS: Riva's servicer on ``port``."""
    return {"port": port, "grpc_servicer_functions": [RIVA_TTS_SERVICER]}


async def drain_tts(host: TTSHost, drain_timeout_s: float) -> None:
    """Serve's drain of a TTS replica: let running calls end for up to ``drain_timeout_s``, end the rest, stop.

    Unlike the ASR replica's drain (4503 to new sessions: a client reconnects), nothing is refused meanwhile: Serve
    routes new calls elsewhere, and one sent by a router that has not heard of the shutdown yet is served
    rather than costing its client a reply. Calls still running at the end get UNAVAILABLE ("shutting down")
    before Serve's ``graceful_shutdown_timeout_s`` would sever them.
    """
    with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
        await asyncio.wait_for(host.wait_idle(), drain_timeout_s)
    await host.stop(0.0)


def build_tts_app(
    tts_config: TTSHostConfig,
    server_config: ServerConfig,
    *,
    num_replicas: int = 1,
    gpus_per_replica: float | None = None,
    cpus_per_replica: float = 1.0,
    cpu_threads: int | None = None,
    max_queued_requests: int | None = None,
    name: str = "nemotron-tts",
) -> Application:
    """Build the Serve application of the TTS (one Magpie engine per replica).

    Run it on a Serve instance started with :func:`grpc_options` (Serve's gRPC proxy needs Riva's servicer).

    Args:
        tts_config: Engine and limits of every replica: ``max_streams`` calls per replica (Serve routes no more
            to it), ``max_batch`` of them decoded per step, ``device="auto"`` uses the GPU Ray assigned.
        server_config: Tokens and the per-address lockout (``tokens``, ``insecure``, ``auth_*``);
            ``drain_timeout_s`` is the drain on redeploy and downscale (the longest reply it lets finish).
        num_replicas: Replicas (one per GPU).
        gpus_per_replica: GPUs Ray reserves per replica; None: 1 where the cluster has a GPU, 0 for
            ``device="cpu"``, else a ``ValueError`` naming the fix.
        cpus_per_replica: CPUs Ray reserves per replica.
        cpu_threads: torch intra-op threads (and ``OMP_NUM_THREADS``) of each replica; None: ``cpus_per_replica``
            rounded down, at least 1.
        max_queued_requests: Calls Serve's router holds at once, from their arrival until a replica takes them
            (placing them, or waiting for a free slot); None: twice the streams of all replicas; -1: unlimited.
            Beyond it Serve refuses with RESOURCE_EXHAUSTED.
        name: Deployment name.

    Returns:
        The application to pass to ``serve.run`` (``name=`` there is the application's name: the ``application``
        metadata a client sends on a cluster with other applications).

    Raises:
        ValueError: No GPU in the cluster and ``gpus_per_replica`` not given, or a value out of range.
        RuntimeError: This Ray Serve cannot stream requests into a deployment (``SynthesizeOnline``).

    """
    from ray import serve

    try:
        from ray.serve.grpc_util import gRPCInputStream  # noqa: F401 - Serve's client/bidirectional gRPC streams
    except ImportError:
        raise RuntimeError(
            "this Ray Serve cannot stream gRPC requests into a deployment, which Riva's SynthesizeOnline needs: "
            'install ray[serve]>=2.60 (pip install -U "ray[serve]>=2.60")'
        ) from None
    gpus = resolve_gpus_per_replica(gpus_per_replica, tts_config.device)
    threads = replica_threads(cpu_threads, cpus_per_replica)
    streams = tts_config.max_streams
    options = replica_options(
        num_replicas=num_replicas,
        gpus=gpus,
        cpus=cpus_per_replica,
        threads=threads,
        # Exactly the host's slots: Serve never routes a call a replica would refuse for capacity; it queues it.
        max_ongoing=streams,
        max_queued=max_queued_requests if max_queued_requests is not None else 2 * num_replicas * streams,
        drain_timeout_s=server_config.drain_timeout_s,
    )

    @serve.deployment(name=name, **options)
    class NemotronTTSDeployment:
        """One replica: one Magpie engine on one device; Riva's ``RivaSpeechSynthesis`` through Serve's gRPC proxy."""

        async def __init__(self, tts_config: TTSHostConfig, server_config: ServerConfig) -> None:
            # Imported here: this class is pickled by value, and the driver's logger sinks may not pickle.
            import torch
            from loguru import logger

            torch.set_num_threads(threads)
            self.id = replica_id()
            self.host = TTSHost(tts_config)
            await self.host.start()
            self.drain_timeout_s = server_config.drain_timeout_s
            self.riva = ServeRivaTTS(self.host, GrpcAccess(server_config), self.id)
            self._drain = start_drain_watcher(
                lambda: drain_tts(self.host, self.drain_timeout_s),
                lambda: f"TTS replica {self.id} ({self.host.active_streams} synthesis request(s) running)",
            )
            logger.info(f"Nemotron TTS replica {self.id} ready ({streams} calls, {threads} CPU thread(s))")

        async def SynthesizeOnline(  # noqa: N802 - the Riva proto's method name
            self, request_iterator: AsyncIterator[Any], grpc_context: Any
        ) -> AsyncIterator[Any]:
            async for response in self.riva.synthesize_online(request_iterator, grpc_context):
                yield response

        async def Synthesize(self, request: Any, grpc_context: Any) -> Any:  # noqa: N802 - the proto's name
            return await self.riva.synthesize(request, grpc_context)

        async def GetRivaSynthesisConfig(self, request: Any, grpc_context: Any) -> Any:  # noqa: N802
            return self.riva.config()

        async def check_health(self) -> None:
            """Ray Serve's replica health check: fail (and get replaced) if the engine's worker stopped."""
            if not self.host.alive and not self.host.draining:  # a drained host has stopped its engine
                raise RuntimeError(f"TTS engine failed: {self.host.engine.load_error or 'worker stopped'}")

        async def __del__(self) -> None:
            await stop_replica(self._drain, self.host.draining, lambda: self.host.stop(0.0))

    return NemotronTTSDeployment.bind(tts_config, server_config)


def app_builder(args: dict[str, Any]) -> Application:
    """Entry point for ``serve run pipecat_nemotron.server.ray_tts:app_builder key=value ...`` (or a config file).

    Keys: ``model`` (Magpie hub id or ``.nemo``), ``codec`` (its codec ``.nemo``, for a local checkpoint),
    ``device`` (default auto), ``max_streams`` (default 32), ``max_batch`` (default 8), ``max_duration_s`` (default
    20), ``num_replicas`` (default 1), ``gpus_per_replica`` (default: 1 where the cluster has a GPU; 0 for CPU),
    ``cpus_per_replica`` (default 1), ``cpu_threads`` (default: ``cpus_per_replica``), ``max_queued_requests``
    (default: twice the streams of all replicas), ``drain_timeout_s`` (default 30), ``insecure`` (no token). Tokens come
    from ``NEMOTRON_ASR_TOKENS`` (the ASR side's). Serve must run with :func:`grpc_options` (``grpc_options`` in
    the config file).
    """
    known = {
        "model", "codec", "device", "max_streams", "max_batch", "max_duration_s", "num_replicas",
        "gpus_per_replica", "cpus_per_replica", "cpu_threads", "max_queued_requests", "drain_timeout_s", "insecure",
    }  # fmt: skip
    unknown = sorted(set(args) - known)
    if unknown:
        raise ValueError(f"unknown app_builder argument(s) {unknown}; known: {sorted(known)}")
    defaults = TTSHostConfig()
    tts_config = TTSHostConfig(
        model=str(args.get("model", defaults.model)),
        codec_model_path=str(args["codec"]) if "codec" in args else None,
        device=str(args.get("device", "auto")),
        max_streams=int(args.get("max_streams", defaults.max_streams)),
        max_batch=int(args.get("max_batch", defaults.max_batch)),
        max_duration_s=float(args.get("max_duration_s", defaults.max_duration_s)),
    )
    insecure = str(args.get("insecure", "false")).lower() in ("1", "true", "yes")
    server_config = ServerConfig(
        host="127.0.0.1" if insecure else "0.0.0.0",
        tokens=tokens_from([os.environ.get("NEMOTRON_ASR_TOKENS", "")]),
        insecure=insecure,
        drain_timeout_s=float(args.get("drain_timeout_s", DEFAULT_DRAIN_TIMEOUT_S)),
    )

    return build_tts_app(tts_config, server_config, **deployment_args(args))
