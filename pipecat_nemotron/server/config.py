"""Settings of the ASR server: :class:`ServerConfig` (validated on construction) and its helpers.

No web framework and no engine here: the aiohttp server (:mod:`pipecat_nemotron.server.app`), the Ray Serve
deployment (:mod:`pipecat_nemotron.server.ray_serve`) and the CLI all build their settings from this module.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field, fields

from pipecat_nemotron.server.protocol import DEFAULT_PATH
from pipecat_nemotron.server.security import AuthThrottle, HiddenTokens, TokenSet


def is_loopback(host: str) -> bool:
    """True if ``host`` only accepts connections from this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def tokens_from(values: Iterable[str]) -> tuple[str, ...]:
    """Split comma/newline separated token lists, dropping blanks and comments (``#``)."""
    out: list[str] = []
    for value in values:
        for line in value.replace(",", "\n").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                out.append(line)
    return tuple(out)


@dataclass(frozen=True)
class ServerConfig:
    """Limits and security settings of the ASR server (validated on construction).

    ``repr`` never shows the tokens (only how many there are): configs end up in logs and in the variables
    that loguru prints with a crash's traceback.

    Attributes:
        host: Address to bind. ``--insecure`` (no tokens) is only allowed on a loopback address.
        port: TCP port of the WebSocket and HTTP endpoints (0 picks a free one; see :attr:`ASRServer.port`).
        grpc_port: TCP port of NVIDIA Riva's gRPC API (``RivaSpeechRecognition``, ``RivaSpeechSynthesis``;
            docs/RIVA.md) on the same ``host``; None: no gRPC; 0 picks a free one. Needs the ``[riva]`` extra.
        path: WebSocket path of a session.
        tokens: Accepted bearer tokens (several allow rotation). Required unless ``insecure``. Stored as a
            :class:`~pipecat_nemotron.server.security.HiddenTokens` tuple.
        insecure: Accept sessions without a token (loopback only: tests, local development).
        metrics_token: Bearer token for ``/metrics`` and ``/v1/info`` (then only it works there). None: the
            session tokens work there (a server without any token serves them openly).
        public_metrics: Serve ``/metrics`` and ``/v1/info`` without a token (they show the model, device and
            server id; only behind a network boundary you trust).
        allowed_origins: ``Origin`` values browsers may connect from; ``"*"`` allows any. Requests without an
            ``Origin`` header (non-browser clients) are always allowed.
        max_sessions: Concurrent sessions; default (None) the engine's ``max_streams``. The next connection
            is refused with 4013 while existing sessions keep running.
        max_pending_auth: Connections without an ``Authorization`` header that may wait for their config
            (and its token) at once; default (None) the session capacity, at least 16. When full, the oldest
            pending connection of the peer holding the most is evicted (4013), see
            :class:`~pipecat_nemotron.server.security.PendingAuth`.
        max_message_bytes: Largest WebSocket message, bytes, inclusive (larger: closed with 4009).
        idle_timeout_s: Close a session with 4008 after this long without a message from its client, s.
        config_timeout_s: Close a connection with 4008 that sends no ``config`` within this time, s.
        handshake_timeout_s: Close a TCP connection that has not completed its HTTP request (the WebSocket
            upgrade, or a request to an HTTP endpoint) within this time, s. Bytes trickling in do not extend it.
        keepalive_timeout_s: Close an HTTP keep-alive connection idle this long after a response, s.
        heartbeat_s: Silence after which the server pings a client to detect a dead peer, s (None: off). The
            client has half of it to answer, counted only while the server waits to read: a session whose reads
            the server holds paused (pacing, backlog) is never dropped by the heartbeat.
        burst_ms: Audio a client may send ahead of real time before its reads are paused, ms.
        max_speed: Audio rate allowed to a session that is ahead of real time (sent more than ``burst_ms`` at
            once) while the engine has spare capacity (its steps took less than half of the last second), x real
            time; a busy engine reads every session at real time at most. Above 1 a client that sent audio far
            ahead catches up (its finals stop lagging) instead of staying behind for the rest of its session.
        max_control_rate: Sustained rate of JSON control messages (finalize, set_latency, keepalive) allowed
            per session, messages per second (reads are paused beyond it). A ``peek`` counts as
            :data:`~pipecat_nemotron.server.pacing.PEEK_CONTROL_COST` messages.
        control_burst: Control messages a session may send at once before the rate applies.
        max_boost_phrases: Most phrases a session may boost (``config.boost_phrases``, ``set_boost_phrases``);
            None: the engine's ``EngineConfig.max_boost_phrases``, and never more than it. 0 turns the ``boost``
            feature off (not announced; a config asking for phrases is refused with 4400).
        max_boost_phrase_chars: Longest boosted phrase, characters; None: the engine's
            ``EngineConfig.max_boost_phrase_chars``, and never more than it.
        max_backlog_ms: Pause reading a session while the engine holds more of its audio than this, ms.
        backlog_timeout_s: Drop a session with 4029 after its backlog stayed above ``max_backlog_ms`` this long, s.
        send_timeout_s: Drop a session with 4008 when sending it a result blocks this long (it stopped reading), s.
        close_timeout_s: After a client ``close``, wait at most this long for the finals still owed, s.
        drain_timeout_s: On shutdown, let sessions finish for up to this long before closing them with 1001, s.
        unready_when_full: ``/readyz`` answers 503 while every session slot is taken, so a load balancer that
            honours readiness sends new sessions to other replicas.
        auth_max_failures: Failed authentications (wrong or missing token) from one peer (IPv4 address or
            IPv6 /64) within ``auth_failure_window_s`` that lock it out; 0 disables the lockout (e.g. behind a
            proxy that hides client addresses, where every client would share one peer).
        auth_failure_window_s: Window in which failures count, s.
        auth_backoff_s: First lockout, s; a locked-out peer's connections are refused with 4029
            (``auth_backoff``) before anything is read. Each failure after a lockout doubles it.
        auth_backoff_max_s: Longest lockout, s.

    """

    host: str = "127.0.0.1"
    port: int = 8765
    grpc_port: int | None = None
    path: str = DEFAULT_PATH
    tokens: tuple[str, ...] = field(default=(), repr=False)
    insecure: bool = False
    metrics_token: str | None = field(default=None, repr=False)
    public_metrics: bool = False
    allowed_origins: tuple[str, ...] = ()
    max_sessions: int | None = None
    max_pending_auth: int | None = None
    max_message_bytes: int = 128 * 1024
    idle_timeout_s: float = 30.0
    config_timeout_s: float = 10.0
    handshake_timeout_s: float = 10.0
    keepalive_timeout_s: float = 15.0
    heartbeat_s: float | None = 20.0
    burst_ms: float = 10_000.0
    max_speed: float = 4.0
    max_control_rate: float = 20.0
    control_burst: int = 100
    max_boost_phrases: int | None = None
    max_boost_phrase_chars: int | None = None
    max_backlog_ms: float = 5_000.0
    backlog_timeout_s: float = 30.0
    send_timeout_s: float = 10.0
    close_timeout_s: float = 5.0
    drain_timeout_s: float = 30.0
    unready_when_full: bool = False
    auth_max_failures: int = 5
    auth_failure_window_s: float = 60.0
    auth_backoff_s: float = 10.0
    auth_backoff_max_s: float = 600.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", HiddenTokens(self.tokens))
        self._check_security()
        self._check_limits()
        self._check_ports()
        if self.heartbeat_s is not None and not self.heartbeat_s > 0:  # NaN too
            raise ValueError(f"heartbeat_s must be > 0 (None: no heartbeat), got {self.heartbeat_s}")

    def _check_security(self) -> None:
        """Validate the bind address, tokens and metrics access."""
        if self.insecure and not is_loopback(self.host):
            raise ValueError(
                f"--insecure (no token) is only allowed when binding to loopback (127.0.0.1, ::1, localhost), "
                f"not {self.host!r}; set tokens instead (NEMOTRON_ASR_TOKENS or --token-file)"
            )
        if not self.insecure and not any(t for t in self.tokens):
            raise ValueError(
                "the server needs at least one bearer token (NEMOTRON_ASR_TOKENS or --token-file), or --insecure "
                "on a loopback address"
            )
        if any(len(t) < 16 for t in self.tokens):
            raise ValueError("bearer tokens must be at least 16 characters (e.g. `openssl rand -hex 32`)")
        if self.metrics_token is not None and len(self.metrics_token) < 16:
            raise ValueError("the metrics token must be at least 16 characters (e.g. `openssl rand -hex 32`)")
        if self.metrics_token is not None and self.public_metrics:
            raise ValueError("set either a metrics token or public metrics (--public-metrics), not both")

    def _check_limits(self) -> None:
        """Validate the limits, timeouts and path."""
        if self.max_sessions is not None and self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.max_pending_auth is not None and self.max_pending_auth < 1:
            raise ValueError(f"max_pending_auth must be >= 1, got {self.max_pending_auth}")
        if self.max_message_bytes < 1024:
            raise ValueError(f"max_message_bytes must be >= 1024, got {self.max_message_bytes}")
        for name in (
            "idle_timeout_s",
            "config_timeout_s",
            "handshake_timeout_s",
            "keepalive_timeout_s",
            "send_timeout_s",
            "close_timeout_s",
            "backlog_timeout_s",
            "max_control_rate",
            "auth_failure_window_s",
            "auth_backoff_s",
            "auth_backoff_max_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.control_burst < 1:
            raise ValueError(f"control_burst must be >= 1 (messages), got {self.control_burst}")
        if self.max_boost_phrases is not None and self.max_boost_phrases < 0:
            raise ValueError(f"max_boost_phrases must be >= 0 (0: no boosting), got {self.max_boost_phrases}")
        if self.max_boost_phrase_chars is not None and self.max_boost_phrase_chars < 1:
            raise ValueError(f"max_boost_phrase_chars must be >= 1, got {self.max_boost_phrase_chars}")
        if self.auth_max_failures < 0:
            raise ValueError(f"auth_max_failures must be >= 0 (0: no lockout), got {self.auth_max_failures}")
        if self.burst_ms < 0 or self.max_speed <= 0 or self.max_backlog_ms <= 0:
            raise ValueError("burst_ms must be >= 0, max_speed and max_backlog_ms > 0")
        if not self.path.startswith("/"):
            raise ValueError(f"path must start with '/', got {self.path!r}")

    def _check_ports(self) -> None:
        """Validate the gRPC port against the WebSocket port."""
        if self.grpc_port is not None and not 0 <= self.grpc_port <= 65535:
            raise ValueError(f"grpc_port must be a TCP port (0 to 65535; 0: any free one), got {self.grpc_port}")
        if self.grpc_port and self.grpc_port == self.port:
            raise ValueError(
                f"--grpc-port {self.grpc_port} is the WebSocket/HTTP --port too; give gRPC a port of its own (e.g. 50051)"
            )

    def announced_limits(self) -> dict[str, float]:
        """The limits a session's ``ready`` message announces to its client."""
        return {
            "max_message_bytes": self.max_message_bytes,
            "idle_timeout_s": self.idle_timeout_s,
            "burst_ms": self.burst_ms,
            "max_backlog_ms": self.max_backlog_ms,
            "max_control_rate": self.max_control_rate,
            "control_burst": self.control_burst,
        }

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
        metrics_token = "'<hidden>'" if self.metrics_token else None
        return f"ServerConfig({shown}, tokens={self.tokens!r}, metrics_token={metrics_token})"


def throttle_for(config: ServerConfig) -> AuthThrottle:
    """The failed-authentication lockout ``config`` asks for."""
    return AuthThrottle(
        config.auth_max_failures, config.auth_failure_window_s, config.auth_backoff_s, config.auth_backoff_max_s
    )


def metrics_tokens_for(config: ServerConfig, tokens: TokenSet) -> TokenSet | None:
    """The tokens ``/metrics`` and ``/v1/info`` accept: the metrics token, else the session tokens (None: open)."""
    if config.metrics_token is not None:
        return TokenSet([config.metrics_token])
    if config.public_metrics or not len(tokens):
        return None  # open: asked for, or a tokenless (loopback-only) server
    return tokens
