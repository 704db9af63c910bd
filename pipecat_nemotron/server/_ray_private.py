"""The model server's one reach into Ray's internals: Serve's "graceful shutdown started" flag.

Kept apart (as the engines' ``_nemo_private`` modules are) so that a Ray release that moves it breaks one module,
which says so: :func:`serve_shutdown_probe` returns None and :func:`~pipecat_nemotron.server.ray_serve.drain_watcher`
logs that the replica cannot see a redeploy coming.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["serve_shutdown_probe"]


def serve_shutdown_probe() -> Callable[[], bool] | None:
    """A probe that turns True once Serve starts this replica's graceful shutdown (redeploy, downscale).

    Serve tells a replica nothing until every request has ended: it stops routing to it, waits for ongoing
    requests (our sessions, which last a call) up to ``graceful_shutdown_timeout_s``, then calls ``__del__``
    and kills it. So a replica reads Serve's own flag, ``ReplicaBase._shutting_down`` ("flipped to True once
    graceful shutdown is initiated; may be used by replica subclass implementations", Ray 2.60), through the
    worker's actor instance. Checked when the replica starts (:func:`drain_watcher` logs when it is missing).

    Returns:
        The probe, or None outside a Serve replica or where this Ray version lacks the flag.

    """
    try:
        from ray._private import worker as ray_worker

        actor = ray_worker.global_worker.actors.get(ray_worker.global_worker.actor_id)
        impl = getattr(actor, "_replica_impl", None)
    except Exception:  # noqa: BLE001 - another Ray layout: no probe
        return None
    if impl is None or not isinstance(getattr(impl, "_shutting_down", None), bool):
        return None
    return lambda: bool(impl._shutting_down)
