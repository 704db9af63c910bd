"""``pipecat-nemotron``: command-line entry point.

Subcommands:

* ``serve`` - run the Nemotron ASR WebSocket server (protocol ``nemotron-asr.v1``, ``docs/PROTOCOL.md``) on one
  device: ``pipecat-nemotron serve --model nvidia/nemotron-speech-streaming-en-0.6b --host 0.0.0.0``.
  Bearer tokens come from ``NEMOTRON_ASR_TOKENS`` (comma separated) or ``--token-file`` (one per line), never
  from the command line (it shows in ``ps``); so does the ``/metrics`` token (``NEMOTRON_ASR_METRICS_TOKEN`` or
  ``--metrics-token-file``). Logs go to stderr with loguru's ``diagnose`` off: a crash's traceback does not
  print variable values.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

#: Environment variable with the accepted bearer tokens (comma separated).
TOKENS_ENV = "NEMOTRON_ASR_TOKENS"

#: Environment variable with the bearer token of ``/metrics`` and ``/v1/info``.
METRICS_TOKEN_ENV = "NEMOTRON_ASR_METRICS_TOKEN"


def _serve_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from pipecat_nemotron.engine.config import DEFAULT_MODEL

    p = sub.add_parser(
        "serve",
        help="run the ASR WebSocket server",
        description="Serve Nemotron streaming ASR to many clients over WebSockets (nemotron-asr.v1).",
    )
    m = p.add_argument_group("model")
    m.add_argument(
        "--model", default=os.environ.get("NEMOTRON_ASR_MODEL", DEFAULT_MODEL), help="model id or .nemo path"
    )
    m.add_argument("--model-revision", default=None, help="pinned revision of a model id")
    m.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    m.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    m.add_argument("--max-sessions", type=int, default=64, help="concurrent sessions (= engine stream slots)")
    m.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        help="stream chunks per model step (default: max sessions)",
    )
    m.add_argument("--default-latency-ms", type=int, default=160, choices=(80, 160, 560, 1120))
    m.add_argument("--finalize-mode", choices=("soft", "hard"), default="soft")
    m.add_argument(
        "--cpu-threads",
        type=int,
        default=None,
        help="torch intra-op threads (CPU serving; 1 is best on a busy or shared CPU)",
    )
    n = p.add_argument_group("network and security")
    n.add_argument("--host", default="127.0.0.1", help="bind address (0.0.0.0 for all interfaces)")
    n.add_argument("--port", type=int, default=8765)
    n.add_argument("--path", default="/v1/asr", help="WebSocket path of a session")
    n.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help=f"file of bearer tokens, one per line (or env {TOKENS_ENV})",
    )
    n.add_argument(
        "--insecure", action="store_true", help="no token required (only allowed on a loopback host)"
    )
    n.add_argument(
        "--allowed-origin", action="append", default=[], help="browser Origin allowed (repeatable; '*' = any)"
    )
    n.add_argument(
        "--metrics-token-file",
        type=Path,
        default=None,
        help=f"file holding the one bearer token that /metrics and /v1/info accept (or env {METRICS_TOKEN_ENV}); "
        "without it they accept the session tokens",
    )
    n.add_argument(
        "--public-metrics",
        action="store_true",
        help="serve /metrics and /v1/info without a token (they show the model, device and host:pid); "
        "/healthz and /readyz are always open",
    )
    n.add_argument(
        "--max-pending-auth",
        type=int,
        default=None,
        help="connections without an Authorization header that may wait for their config (token) at once; "
        "when full, the address holding the most loses its oldest (default: max sessions, at least 16)",
    )
    n.add_argument(
        "--auth-max-failures",
        type=int,
        default=5,
        help="failed authentications from one IP (IPv6: /64) within 60 s that lock it out (4029); 0 disables "
        "(use 0 behind a proxy that hides client addresses)",
    )
    n.add_argument(
        "--auth-backoff-s",
        type=float,
        default=10.0,
        help="first lockout, s; doubles with each repeat (max 600)",
    )
    lim = p.add_argument_group("limits")
    lim.add_argument("--max-message-bytes", type=int, default=128 * 1024)
    lim.add_argument("--idle-timeout-s", type=float, default=30.0)
    lim.add_argument(
        "--handshake-timeout-s",
        type=float,
        default=10.0,
        help="close a connection that has not completed its HTTP request (WebSocket upgrade) in this time, s",
    )
    lim.add_argument(
        "--keepalive-timeout-s", type=float, default=15.0, help="close an idle HTTP keep-alive connection, s"
    )
    lim.add_argument(
        "--burst-ms", type=float, default=10_000.0, help="audio a client may send ahead of real time, ms"
    )
    lim.add_argument(
        "--max-control-rate",
        type=float,
        default=20.0,
        help="control messages (finalize, set_latency, keepalive) per second per session before reads pause",
    )
    lim.add_argument("--control-burst", type=int, default=100, help="control messages allowed at once")
    lim.add_argument("--max-backlog-ms", type=float, default=5_000.0)
    lim.add_argument("--backlog-timeout-s", type=float, default=30.0)
    lim.add_argument(
        "--drain-timeout-s", type=float, default=30.0, help="on SIGTERM, let sessions finish this long"
    )
    lim.add_argument(
        "--unready-when-full", action="store_true", help="/readyz answers 503 while all slots are taken"
    )
    p.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"))
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from loguru import logger

    from pipecat_nemotron.engine import EngineConfig
    from pipecat_nemotron.server.config import ServerConfig, tokens_from
    from pipecat_nemotron.server.run import run_server

    logger.remove()
    # diagnose=False: loguru would otherwise print the values of the variables on every line of a crash's
    # traceback (a config, a request, a message), which is how secrets and client data leak into logs.
    logger.add(sys.stderr, level=args.log_level.upper(), diagnose=False)
    sources = [os.environ.get(TOKENS_ENV, "")]
    if args.token_file is not None:
        sources.append(args.token_file.read_text())
    metrics_sources = [os.environ.get(METRICS_TOKEN_ENV, "")]
    if args.metrics_token_file is not None:
        metrics_sources.append(args.metrics_token_file.read_text())
    metrics_tokens = tokens_from(metrics_sources)
    if len(metrics_tokens) > 1:
        print(
            f"pipecat-nemotron serve: give one metrics token ({METRICS_TOKEN_ENV} or the file), not several",
            file=sys.stderr,
        )
        return 2
    try:
        config = ServerConfig(
            host=args.host,
            port=args.port,
            path=args.path,
            tokens=tokens_from(sources),
            insecure=args.insecure,
            metrics_token=metrics_tokens[0] if metrics_tokens else None,
            public_metrics=args.public_metrics,
            allowed_origins=tuple(args.allowed_origin),
            max_sessions=args.max_sessions,
            max_pending_auth=args.max_pending_auth,
            max_message_bytes=args.max_message_bytes,
            idle_timeout_s=args.idle_timeout_s,
            handshake_timeout_s=args.handshake_timeout_s,
            keepalive_timeout_s=args.keepalive_timeout_s,
            max_control_rate=args.max_control_rate,
            control_burst=args.control_burst,
            auth_max_failures=args.auth_max_failures,
            auth_backoff_s=args.auth_backoff_s,
            burst_ms=args.burst_ms,
            max_backlog_ms=args.max_backlog_ms,
            backlog_timeout_s=args.backlog_timeout_s,
            drain_timeout_s=args.drain_timeout_s,
            unready_when_full=args.unready_when_full,
        )
        engine_config = EngineConfig(
            model=args.model,
            model_revision=args.model_revision,
            device=args.device,
            dtype=args.dtype,
            max_streams=args.max_sessions,
            max_batch_size=args.max_batch_size or args.max_sessions,
            default_latency_ms=args.default_latency_ms,
            finalize_mode=args.finalize_mode,
        )
    except ValueError as e:
        print(f"pipecat-nemotron serve: {e}", file=sys.stderr)
        return 2
    if args.cpu_threads:
        import torch

        torch.set_num_threads(args.cpu_threads)
    return asyncio.run(run_server(engine_config, config))


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``pipecat-nemotron``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="pipecat-nemotron", description="Nemotron speech tools for Pipecat."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _serve_parser(sub)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
