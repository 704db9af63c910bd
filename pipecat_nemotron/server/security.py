"""Security building blocks of the ASR server: credentials that never print, per-peer limits, log-safe text.

* :class:`Secret`, :class:`HiddenTokens`, :class:`MaskedHeaders` and :class:`TokenSet` keep bearer tokens
  out of every ``repr``, log
  line and traceback. loguru's ``diagnose=True`` (its default) prints the value of each name and attribute on
  the lines of a crash's traceback, so the rule is structural: a raw token lives only in the caller's
  configuration and, for the length of one comparison, inside :meth:`TokenSet.matches`.
* :class:`AuthThrottle` counts failed authentications per peer and locks a peer out for a growing time.
* :class:`PendingAuth` bounds the connections still waiting to authenticate, and when full evicts from the
  peer that holds the most of them, so one peer cannot lock out the others.
* :func:`log_safe` makes client-supplied text safe to put in a log line.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


class Secret:
    """A credential whose ``repr``/``str`` never show it (``__slots__``: loguru cannot read it statically either).

    Args:
        value: The secret text.

    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    @classmethod
    def of(cls, value: str | Secret | None) -> Secret | None:
        """Wrap ``value`` (None stays None; a Secret is returned as is)."""
        if value is None or isinstance(value, Secret):
            return value
        return cls(value)

    def reveal(self) -> str:
        """The secret text. Use it in an expression, never store it in a variable or attribute."""
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __repr__(self) -> str:
        return "Secret('<hidden>')"

    __str__ = __repr__


class HiddenTokens(tuple):  # type: ignore[type-arg]
    """A tuple of tokens whose ``repr``/``str`` give only their count (``ServerConfig.tokens``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<{len(self)} token{'' if len(self) == 1 else 's'}, hidden>"

    __str__ = __repr__


class MaskedHeaders(dict):  # type: ignore[type-arg]
    """HTTP headers whose ``repr``/``str`` hide the values of credentials (``Authorization``, ``Cookie``)."""

    _HIDDEN = frozenset({"authorization", "proxy-authorization", "cookie"})

    def __repr__(self) -> str:
        shown = {k: ("<hidden>" if str(k).lower() in self._HIDDEN else v) for k, v in self.items()}
        return f"MaskedHeaders({shown!r})"

    __str__ = __repr__


def _digest(token: str) -> bytes:
    # "surrogatepass": a header's undecodable bytes (kept by aiohttp as lone surrogates) and a JSON "\ud800"
    # hash to a digest that matches no configured token, instead of raising UnicodeEncodeError.
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class TokenSet:
    """Accepted bearer tokens, held only as SHA-256 digests and compared in constant time.

    Args:
        tokens: The accepted tokens (blank ones are ignored).

    """

    __slots__ = ("_digests",)

    def __init__(self, tokens: Iterable[str]) -> None:
        self._digests = tuple(_digest(t) for t in tokens if t)

    def __len__(self) -> int:
        return len(self._digests)

    def __repr__(self) -> str:
        return f"TokenSet(<{len(self._digests)} hidden>)"

    def matches(self, candidate: Secret | str | None) -> bool:
        """True if ``candidate`` is one of the tokens (any text, even with lone surrogates, is safe to pass)."""
        if candidate is None:
            return False
        digest = _digest(candidate.reveal() if isinstance(candidate, Secret) else candidate)
        ok = False
        for expected in self._digests:  # every digest is compared: the time does not tell which one matched
            ok |= hmac.compare_digest(digest, expected)
        return ok

    def matches_header(self, authorization: Secret | None) -> bool:
        """True if an ``Authorization`` header value is ``Bearer <one of the tokens>`` (scheme case-insensitive)."""
        if authorization is None:
            return False
        scheme, _, rest = authorization.reveal().strip().partition(" ")
        return scheme.lower() == "bearer" and bool(rest.strip()) and self.matches(Secret(rest.strip()))


def peer_key(host: str) -> str:
    """The unit of per-peer accounting for a client address: the IPv4 address, or the IPv6 /64 network.

    One IPv6 host usually holds a whole /64, so counting single IPv6 addresses would let it rotate through
    2**64 of them. Anything that is not an IP address (a Unix socket, ``"?"``) is its own key.
    """
    try:
        ip = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


@dataclass
class _PeerRecord:
    failures: deque[float] = field(default_factory=deque)
    strikes: int = 0
    locked_until: float = 0.0
    last_event: float = 0.0


class AuthThrottle:
    """Failed authentications per peer, and a lockout that doubles with each repeat.

    ``max_failures`` failures within ``window_s`` lock a peer out for ``backoff_s``; once it has been locked
    out, each further failure locks it out again for twice as long as the last time (at most ``backoff_max_s``).
    A peer is forgotten after a success, or after ``window_s`` without failures once its lockout ended.
    At most ``max_peers`` peers are remembered (least recently seen forgotten first), so the memory is bounded
    however many addresses an attacker uses.

    Args:
        max_failures: Failures in the window that lock a peer out (0: never lock out).
        window_s: Window over which failures count, s.
        backoff_s: First lockout, s.
        backoff_max_s: Longest lockout, s.
        max_peers: Most peers remembered.

    """

    def __init__(
        self,
        max_failures: int,
        window_s: float,
        backoff_s: float,
        backoff_max_s: float,
        max_peers: int = 10_000,
    ) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.max_peers = max_peers
        self._peers: OrderedDict[str, _PeerRecord] = OrderedDict()

    def __len__(self) -> int:
        return len(self._peers)

    def retry_after(self, peer: str, now: float | None = None) -> float:
        """Seconds ``peer`` stays locked out (0 if it may try)."""
        record = self._peers.get(peer)
        if record is None:
            return 0.0
        return max(0.0, record.locked_until - (time.monotonic() if now is None else now))

    def failed(self, peer: str, now: float | None = None) -> float:
        """Record a failed authentication of ``peer``.

        Returns:
            The lockout this failure started, s (0 if none).

        """
        if self.max_failures <= 0:
            return 0.0
        now = time.monotonic() if now is None else now
        record = self._peers.pop(peer, None)
        if record is None or now - max(record.last_event, record.locked_until) > self.window_s:
            record = _PeerRecord()
        self._peers[peer] = record  # most recently seen last
        while len(self._peers) > self.max_peers:
            self._peers.popitem(last=False)
        while record.failures and now - record.failures[0] > self.window_s:
            record.failures.popleft()
        record.failures.append(now)
        record.last_event = now
        if len(record.failures) < (1 if record.strikes else self.max_failures):
            return 0.0
        lockout = min(self.backoff_max_s, self.backoff_s * 2**record.strikes)
        record.strikes += 1
        record.locked_until = now + lockout
        record.failures.clear()
        return lockout

    def succeeded(self, peer: str) -> None:
        """Forget ``peer``'s failures (it holds a valid token)."""
        self._peers.pop(peer, None)


def round_up(seconds: float) -> float:
    """``seconds`` rounded up to 0.1 s, for retry hints (never 0 while a lockout lasts)."""
    return max(0.1, math.ceil(seconds * 10.0) / 10.0)


class PendingAuth(Generic[T]):
    """Connections waiting to authenticate in their config message, bounded, and fair across peers.

    When full, a new connection evicts the oldest pending connection of the peer that holds the most pending
    connections (counting the newcomer, and preferring the newcomer's own peer on a tie). So a peer that
    keeps the table full only ever evicts itself, and a client from another address that sends its config
    promptly is never locked out. If every peer holds one pending connection, the oldest is evicted.

    Args:
        capacity: Most pending connections.

    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: dict[T, str] = {}  # insertion order: oldest first

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: T, peer: str) -> T | None:
        """Register ``item`` from ``peer``; return the connection it evicts (already removed), if any."""
        evicted = self._victim(peer) if len(self._items) >= self.capacity else None
        if evicted is not None:
            del self._items[evicted]
        self._items[item] = peer
        return evicted

    def remove(self, item: T) -> None:
        """Forget ``item`` (idempotent)."""
        self._items.pop(item, None)

    def _victim(self, peer: str) -> T | None:
        if not self._items:
            return None
        counts = Counter(self._items.values())
        counts[peer] += 1
        top = max(counts.values())
        heaviest = {p for p, n in counts.items() if n == top}
        if peer in heaviest and counts[peer] > 1:
            heaviest = {peer}
        for item, owner in self._items.items():
            if owner in heaviest:
                return item
        return next(iter(self._items))


def log_safe(value: object, limit: int = 200) -> str:
    """``value`` as text that stays on one log line: non-printable characters escaped, cut after ``limit`` chars.

    For anything a client controls (its name, an error built from its input): a newline, carriage return,
    Unicode line separator or terminal escape sequence in it could otherwise forge or hide log lines.
    """
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = f"{text[:limit]}...(+{len(text) - limit} chars)"
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class HttpAccess:
    """Who may read ``/metrics`` and ``/v1/info``: a bearer token, with the per-address lockout.

    Args:
        tokens: The accepted tokens (None: anyone).
        throttle: The lockout (shared with the sessions' authentication where there are sessions).
        on_failure: Called with the peer key after each failed authentication (else the throttle is told).

    """

    def __init__(
        self, tokens: TokenSet | None, throttle: AuthThrottle, on_failure: Callable[[str], None] | None = None
    ) -> None:
        self._tokens = tokens
        self._throttle = throttle
        self._on_failure = on_failure or throttle.failed

    def check(self, authorization: Secret | None, peer: str) -> tuple[int, str] | None:
        """Whether a request with this ``Authorization`` header from ``peer`` may be answered.

        Returns:
            None to answer, else ``(http_status, message)``: 401 without a valid bearer token, 429 while the
            peer is locked out after failed authentications.

        """
        if self._tokens is None:
            return None
        key = peer_key(peer)
        locked_s = self._throttle.retry_after(key)
        if locked_s > 0:
            return (
                429,
                f"too many failed authentications from this address; retry after {round_up(locked_s)} s",
            )
        if self._tokens.matches_header(authorization):
            self._throttle.succeeded(key)
            return None
        if authorization is not None:
            self._on_failure(key)
        return 401, "a bearer token is required (Authorization: Bearer <token>)"
