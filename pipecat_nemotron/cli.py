"""``pipecat-nemotron``: command-line entry point.

Subcommands:

* ``serve`` - run the model server on one device: the Nemotron ASR over WebSockets (protocol ``nemotron-asr.v1``,
  ``docs/PROTOCOL.md``): ``pipecat-nemotron serve --model nvidia/nemotron-speech-streaming-en-0.6b --host 0.0.0.0``;
  with ``--grpc-port 50051`` also NVIDIA Riva's gRPC API (``docs/RIVA.md``), and with ``--tts-model`` the Magpie
  TTS beside the ASR (``--no-asr``: TTS only).
  Bearer tokens come from ``NEMOTRON_ASR_TOKENS`` (comma separated) or ``--token-file`` (one per line), never
  from the command line (it shows in ``ps``); so does the ``/metrics`` token (``NEMOTRON_ASR_METRICS_TOKEN`` or
  ``--metrics-token-file``). Logs go to stderr with loguru's ``diagnose`` off: a crash's traceback does not
  print variable values.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipecat_nemotron.asr import EngineConfig
    from pipecat_nemotron.server.config import ServerConfig
    from pipecat_nemotron.server.tts_config import TTSHostConfig

#: Environment variable with the accepted bearer tokens (comma separated).
TOKENS_ENV = "NEMOTRON_ASR_TOKENS"

#: Environment variable with the bearer token of ``/metrics`` and ``/v1/info``.
METRICS_TOKEN_ENV = "NEMOTRON_ASR_METRICS_TOKEN"


class _DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help that ends each option's text with its default (unless it says it already, or there is none)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            not action.option_strings
            or action.default in (None, argparse.SUPPRESS)
            or isinstance(action.default, bool)
            or "default" in text
        ):
            return text
        return f"{text} (default: %(default)s)".strip()


def _config_flags(group: argparse._ArgumentGroup, flags: dict[str, str | None]) -> None:
    """Add ``--<field>`` for each :class:`ServerConfig` field in ``flags`` (help text or None).

    Each flag's default and type are the field's own (a boolean field is a ``store_true`` switch), so the
    server's defaults are written once, in :class:`ServerConfig`.
    """
    from pipecat_nemotron.server.config import ServerConfig

    defaults = {f.name: f.default for f in dataclasses.fields(ServerConfig)}
    for name, help_text in flags.items():
        flag, default = "--" + name.replace("_", "-"), defaults[name]
        # A help text (even empty) lets ``serve --help`` print the default.
        if isinstance(default, bool):
            group.add_argument(flag, action="store_true", help=help_text or "")
        else:
            # A field defaulting to None (the engine decides) takes an integer.
            kind = int if default is None else type(default)
            group.add_argument(flag, type=kind, default=default, help=help_text or "")


def _seconds_or_none(value: str) -> float | None:
    """A ``--max-utterance-s`` value: seconds, or ``none`` for no limit (bounds checked by ``EngineConfig``)."""
    if value.strip().lower() == "none":
        return None
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds or 'none', got {value!r}") from None


def _model_options(group: argparse._ArgumentGroup) -> None:
    """The engine: model, device, dtype, capacity, latency and finalize defaults, longest utterance, CPU threads."""
    from pipecat_nemotron.asr.config import DEFAULT_MODEL, EngineConfig

    group.add_argument(
        "--model", default=os.environ.get("NEMOTRON_ASR_MODEL", DEFAULT_MODEL), help="model id or .nemo path"
    )
    group.add_argument("--model-revision", default=None, help="pinned revision of a model id")
    group.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    group.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    group.add_argument(
        "--max-sessions", type=int, default=64, help="concurrent sessions (= engine stream slots)"
    )
    group.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        help="stream chunks per model step (default: max sessions)",
    )
    group.add_argument(
        "--default-latency-ms",
        type=int,
        default=160,
        help="latency mode of sessions that ask for none, one of the model's (80, 160, 560, 1120; the "
        "multilingual model adds 320)",
    )
    group.add_argument(
        "--default-language",
        default=None,
        help="multilingual model: language of sessions that ask for none (es-ES, es or auto; default auto)",
    )
    group.add_argument(
        "--finalize-mode",
        choices=("soft", "hard"),
        default="soft",
        help="soft: context carries over between utterances; hard: each decoded as a clip of its own",
    )
    group.add_argument(
        "--max-utterance-s",
        type=_seconds_or_none,
        default=EngineConfig.max_utterance_s,
        help="longest utterance without a finalize, s: longer speech is split between two words into a forced "
        "final (final.forced, ready.limits.max_utterance_s); 'none' for no limit",
    )
    group.add_argument(
        "--cpu-threads",
        type=int,
        default=None,
        help="torch intra-op threads of the model on CPU (default: half the cores; 1 on a busy 2-core machine)",
    )


def _tts_options(group: argparse._ArgumentGroup) -> None:
    """The Magpie TTS hosted beside the ASR, and Riva gRPC (which serves it)."""
    from pipecat_nemotron.server.tts_config import TTSHostConfig

    group.add_argument(
        "--grpc-port",
        type=int,
        default=None,
        help="serve NVIDIA Riva's gRPC API (StreamingRecognize, SynthesizeOnline) on this port of --host, for "
        "Pipecat's NvidiaSTTService / NvidiaTTSService (docs/RIVA.md; needs the [riva] extra)",
    )
    group.add_argument(
        "--tts-model",
        default=None,
        help="host this Magpie TTS model (hub id such as nvidia/magpie_tts_multilingual_357m, or a .nemo) beside "
        "the ASR, over Riva gRPC (--grpc-port; needs the [tts] extra)",
    )
    group.add_argument("--tts-codec", default=None, help="codec .nemo overriding the one the Magpie checkpoint names")
    group.add_argument("--tts-device", default=None, help="device of the TTS model (default: --device)")
    group.add_argument("--tts-dtype", choices=("float32", "bfloat16"), default=TTSHostConfig.dtype, help="TTS step dtype")
    group.add_argument("--tts-max-batch", type=int, default=TTSHostConfig.max_batch, help="TTS requests decoded per step")
    group.add_argument(
        "--tts-max-streams",
        type=int,
        default=TTSHostConfig.max_streams,
        help="synthesis calls served at once (the next gets RESOURCE_EXHAUSTED)",
    )
    group.add_argument(
        "--tts-max-duration-s",
        type=float,
        default=TTSHostConfig.max_duration_s,
        help="most audio one synthesis request may produce, s (the engine stops there)",
    )
    group.add_argument(
        "--tts-max-text-chars",
        type=int,
        default=TTSHostConfig.max_text_chars,
        help="longest text of one synthesis request, characters (longer: INVALID_ARGUMENT)",
    )
    group.add_argument(
        "--no-asr", action="store_true", help="host no ASR model (TTS only: needs --tts-model and --grpc-port)"
    )


def _network_options(group: argparse._ArgumentGroup) -> None:
    """Where the server listens, and who may use it: tokens, origins, metrics access, authentication lockout."""
    _config_flags(
        group,
        {
            "host": "bind address (0.0.0.0 for all interfaces)",
            "port": "TCP port",
            "path": "WebSocket path of a session",
        },
    )
    group.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help=f"file of bearer tokens, one per line (or env {TOKENS_ENV})",
    )
    _config_flags(group, {"insecure": "no token required (only allowed on a loopback host)"})
    group.add_argument(
        "--allowed-origin", action="append", default=[], help="browser Origin allowed (repeatable; '*' = any)"
    )
    group.add_argument(
        "--metrics-token-file",
        type=Path,
        default=None,
        help=f"file holding the one bearer token that /metrics and /v1/info accept (or env {METRICS_TOKEN_ENV}); "
        "without it they accept the session tokens",
    )
    _config_flags(
        group,
        {
            "public_metrics": "serve /metrics and /v1/info without a token (they show the model, device and "
            "host:pid); /healthz and /readyz are always open",
        },
    )
    group.add_argument(
        "--max-pending-auth",
        type=int,
        default=None,
        help="connections without an Authorization header that may wait for their config (token) at once; "
        "when full, the address holding the most loses its oldest (default: max sessions, at least 16)",
    )
    _config_flags(
        group,
        {
            "auth_max_failures": "failed authentications from one IP (IPv6: /64) within 60 s that lock it out "
            "(4029); 0 disables (use 0 behind a proxy that hides client addresses)",
            "auth_backoff_s": "first lockout, s; doubles with each repeat (max 600)",
        },
    )


#: :class:`ServerConfig` limits that ``serve`` sets from a flag of the same name, with their help.
_LIMIT_FLAGS: dict[str, str | None] = {
    "max_message_bytes": "largest WebSocket message, bytes (larger: closed with 4009)",
    "idle_timeout_s": "close a session with 4008 after this long without a message from its client, s",
    "handshake_timeout_s": "close a connection that has not completed its HTTP request (WebSocket upgrade) "
    "in this time, s",
    "keepalive_timeout_s": "close an idle HTTP keep-alive connection, s",
    "heartbeat_s": "ping a client silent this long; one that answers nothing in half of it while the server "
    "waits to read is dropped as lost, s",
    "burst_ms": "audio a client may send ahead of real time, ms",
    "max_speed": "x real time a client ahead of real time is read at while the engine has spare capacity "
    "(it catches up); 1: never faster than real time",
    "max_control_rate": "control messages (finalize, set_latency, keepalive) per second per session before "
    "reads pause",
    "control_burst": "control messages allowed at once",
    "max_boost_phrases": "most phrases a session may boost (default: the engine's limit; 0: no boosting)",
    "max_boost_phrase_chars": "longest boosted phrase, characters (default: the engine's limit)",
    "max_backlog_ms": "pause reading a session while the engine holds more of its audio than this, ms",
    "backlog_timeout_s": "drop a session with 4029 after its backlog stayed above --max-backlog-ms this long, s",
    "drain_timeout_s": "on SIGTERM, let sessions finish this long",
    "unready_when_full": "/readyz answers 503 while all slots are taken",
}

#: Every :class:`ServerConfig` field set from its own flag (the others take more than copying a value).
_PLAIN_CONFIG_FLAGS = (
    "host",
    "port",
    "path",
    "insecure",
    "public_metrics",
    "max_pending_auth",
    "auth_max_failures",
    "auth_backoff_s",
    *_LIMIT_FLAGS,
)


def _serve_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "serve",
        help="run the model server (ASR over WebSockets; ASR and TTS over Riva gRPC)",
        description="Serve Nemotron streaming ASR to many clients over WebSockets (nemotron-asr.v1), and with "
        "--grpc-port the ASR and the Magpie TTS (--tts-model) over NVIDIA Riva's gRPC API. Needs the [server] extra "
        "(pip install 'pipecat-nemotron[server]'); gRPC the [riva] extra, TTS the [tts] extra.",
        formatter_class=_DefaultsHelpFormatter,
    )
    _model_options(p.add_argument_group("model"))
    _tts_options(p.add_argument_group("TTS and Riva gRPC"))
    _network_options(p.add_argument_group("network and security"))
    _config_flags(p.add_argument_group("limits"), _LIMIT_FLAGS)
    p.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"), help="loguru level (env LOG_LEVEL)")
    p.set_defaults(func=_serve)


#: The modules of the ``[server]`` extra, which ``pipecat-nemotron serve`` needs.
_SERVER_EXTRA_MODULES = ("aiohttp", "websockets", "prometheus_client")


#: The modules of the ``[riva]`` extra, which ``serve --grpc-port`` needs.
_RIVA_EXTRA_MODULES = ("grpc", "riva.client")


def _missing_server_extra(grpc: bool = False) -> str | None:
    """The message for a missing ``[server]`` (or, with ``grpc``, ``[riva]``) extra, or None when installed."""
    import importlib.util

    def absent(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is None
        except ModuleNotFoundError:  # a parent package is missing
            return True

    missing = [m for m in _SERVER_EXTRA_MODULES if absent(m)]
    if missing:
        return (
            f"pipecat-nemotron serve needs the [server] extra ({', '.join(missing)} missing): "
            "pip install 'pipecat-nemotron[server]'"
        )
    missing = [m for m in _RIVA_EXTRA_MODULES if grpc and absent(m)]
    if missing:
        return (
            f"pipecat-nemotron serve --grpc-port needs the [riva] extra ({', '.join(missing)} missing): "
            "pip install 'pipecat-nemotron[riva]'"
        )
    return None


def _serve(args: argparse.Namespace) -> int:
    if (missing := _missing_server_extra(grpc=args.grpc_port is not None)) is not None:
        print(missing, file=sys.stderr)
        return 2
    from loguru import logger

    from pipecat_nemotron.server.run import run_server

    logger.remove()
    # diagnose=False: loguru would otherwise print the values of the variables on every line of a crash's
    # traceback (a config, a request, a message), which is how secrets and client data leak into logs.
    logger.add(sys.stderr, level=args.log_level.upper(), diagnose=False)
    try:
        engine_config, config = serve_configs(args)
        tts_config = serve_tts_config(args)
    except ValueError as e:
        print(f"pipecat-nemotron serve: {e}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(run_server(None if args.no_asr else engine_config, config, tts_config=tts_config))
    except (ImportError, FileNotFoundError) as e:  # the [tts] extra, a model path: named by the message
        print(f"pipecat-nemotron serve: {e}", file=sys.stderr)
        return 2


def serve_configs(args: argparse.Namespace) -> tuple[EngineConfig, ServerConfig]:
    """The engine and server configs of parsed ``serve`` arguments (tokens read from the environment and files).

    Raises:
        ValueError: A value is out of range, or more than one metrics token was given (the message names it).

    """
    from pipecat_nemotron.asr import EngineConfig
    from pipecat_nemotron.server.config import ServerConfig, tokens_from

    sources = [os.environ.get(TOKENS_ENV, "")]
    if args.token_file is not None:
        sources.append(args.token_file.read_text())
    metrics_sources = [os.environ.get(METRICS_TOKEN_ENV, "")]
    if args.metrics_token_file is not None:
        metrics_sources.append(args.metrics_token_file.read_text())
    metrics_tokens = tokens_from(metrics_sources)
    if len(metrics_tokens) > 1:
        raise ValueError(f"give one metrics token ({METRICS_TOKEN_ENV} or the file), not several")
    config = ServerConfig(
        grpc_port=args.grpc_port,
        tokens=tokens_from(sources),
        metrics_token=metrics_tokens[0] if metrics_tokens else None,
        allowed_origins=tuple(args.allowed_origin),
        max_sessions=args.max_sessions,
        **{name: getattr(args, name) for name in _PLAIN_CONFIG_FLAGS},
    )
    engine_config = EngineConfig(
        model=args.model,
        model_revision=args.model_revision,
        device=args.device,
        dtype=args.dtype,
        max_streams=args.max_sessions,
        max_batch_size=args.max_batch_size or args.max_sessions,
        default_latency_ms=args.default_latency_ms,
        default_language=args.default_language,
        finalize_mode=args.finalize_mode,
        max_utterance_s=args.max_utterance_s,
        cpu_threads=args.cpu_threads,
    )
    return engine_config, config


def serve_tts_config(args: argparse.Namespace) -> TTSHostConfig | None:
    """The TTS of parsed ``serve`` arguments (None: no ``--tts-model``), checked against the other options.

    Raises:
        ValueError: Nothing to serve, TTS without gRPC, or a TTS limit out of range (the message names the flag).

    """
    from pipecat_nemotron.server.tts_config import TTSHostConfig

    if args.tts_model is None:
        if args.no_asr:
            raise ValueError("--no-asr leaves nothing to serve: add --tts-model (and --grpc-port) to serve TTS")
        return None
    if args.grpc_port is None:
        raise ValueError("TTS is served over Riva gRPC only: add --grpc-port (e.g. --grpc-port 50051)")
    return TTSHostConfig(
        model=args.tts_model,
        codec_model_path=args.tts_codec,
        device=args.tts_device or args.device,
        dtype=args.tts_dtype,
        max_batch=args.tts_max_batch,
        max_streams=args.tts_max_streams,
        max_text_chars=args.tts_max_text_chars,
        max_duration_s=args.tts_max_duration_s,
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``pipecat-nemotron`` argument parser (its ``serve`` subcommand)."""
    parser = argparse.ArgumentParser(
        prog="pipecat-nemotron", description="Nemotron speech tools for Pipecat."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _serve_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``pipecat-nemotron``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
