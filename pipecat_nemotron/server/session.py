"""One ASR session: a WebSocket connection bound to one engine stream, independent of the web framework.

The aiohttp server (:mod:`pipecat_nemotron.server.aiohttp_server`) and the Ray Serve deployment
(:mod:`pipecat_nemotron.server.ray_serve`) both adapt their WebSocket object to :class:`Transport` and run a
:class:`Session` on it. The session enforces the per-connection limits: config timeout, idle timeout, pacing
(audio no faster than real time plus a burst, control messages no faster than a rate plus a burst),
engine-backlog guard, send timeout, and the protocol itself. A session whose client has gone ends at once,
even while its reads are paused, and its undecoded audio is dropped.

Its parts: :mod:`~pipecat_nemotron.server.transport` (the connection it runs on),
:mod:`~pipecat_nemotron.server.pacing` (read pacing and the backlog guard),
:mod:`~pipecat_nemotron.server.positions` (exact audio positions of results),
:mod:`~pipecat_nemotron.server.stream_settings` (latency mode and language against the loaded model) and
:mod:`~pipecat_nemotron.server.errors` (the exceptions that end a session).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from loguru import logger

from pipecat_nemotron.asr import (
    ASRStream,
    CapacityError,
    EngineNotRunningError,
    InvalidAudioError,
    NemotronEngineError,
    StreamClosedError,
    StreamFailedError,
)
from pipecat_nemotron.asr.errors import BoostingUnavailableError, BoostPhraseError
from pipecat_nemotron.server.errors import ClientGone, SessionError
from pipecat_nemotron.server.pacing import BOOST_CONTROL_COST, PEEK_CONTROL_COST, Pacer
from pipecat_nemotron.server.peeks import PeekReplies
from pipecat_nemotron.server.positions import AudioPositions
from pipecat_nemotron.server.protocol import (
    CloseCode,
    CloseMessage,
    ConfigMessage,
    EouMessage,
    ErrorMessage,
    FinalizeMessage,
    GapMessage,
    KeepaliveMessage,
    PeekMessage,
    ProtocolError,
    ServerMessage,
    SetBoostPhrasesMessage,
    SetLanguageMessage,
    SetLatencyMessage,
    close_reason,
    dump_server_message,
    parse_client_message,
)
from pipecat_nemotron.server.security import log_safe
from pipecat_nemotron.server.stream_settings import (
    boost_limits,
    boost_reply,
    check_config,
    language_reply,
    latency_reply,
    partial_message,
    ready_message,
    with_language,
)
from pipecat_nemotron.server.transport import Incoming, Transport, peer_close_code, remote_of

if TYPE_CHECKING:
    from pipecat_nemotron.server.context import SessionContext

# Incoming, Transport, remote_of, SessionError: re-exported (their home was this module).
__all__ = ["Incoming", "Session", "SessionError", "Transport", "remote_of"]


class Session:
    """Runs one client session to its end. Create through :meth:`ASRService.serve`.

    Args:
        context: What the session may use of the server (limits, engine, metrics, token check).
        transport: The accepted connection.
        session_id: Server-assigned id.
        token_checked: True when the connection was already authenticated (or auth is off); otherwise the
            ``config`` message must carry a valid ``token``.
        remote: Client address, for logs.

    """

    def __init__(
        self,
        context: SessionContext,
        transport: Transport,
        session_id: str,
        token_checked: bool,
        remote: str = "?",
    ) -> None:
        self.context = context
        self.transport = transport
        self.session_id = session_id
        self.remote = remote
        self._token_checked = token_checked
        self.config: ConfigMessage | None = None
        self.stream: ASRStream | None = None
        self.opened_at = time.monotonic()
        self.audio_received_ms = 0.0
        #: Audio the client withheld (``gap`` messages): counted in positions, never decoded, ms.
        self.audio_skipped_ms = 0.0
        self._audio_bytes = 0
        self.finals_requested = 0
        self.finals_sent = 0
        self.end_how = "disconnect"
        self.close_code: int | None = None
        self._finals_event = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._pacer = Pacer(context, transport, lambda: self.backlog_ms)
        #: JSON messages after the config that this session handled (finalize, set_latency, keepalive, close).
        self.control_messages = 0
        self._released = False
        self._send_lock = asyncio.Lock()
        self._peeks = PeekReplies(session_id, self._send)
        self._positions = AudioPositions()
        self._boost_limits = boost_limits(context.engine, context.config)

    # ---- public -------------------------------------------------------------------------------------------

    @property
    def holds_slot(self) -> bool:
        """True while the session counts against capacity: until it releases its stream or its client is gone."""
        return not self._released and not self.transport.peer_gone()

    @property
    def backlog_ms(self) -> float:
        """Audio received but not yet decoded, ms (0 before the stream opens)."""
        stream = self.stream
        return stream.backlog_ms if stream is not None and not stream.closed else 0.0

    async def run(self) -> None:
        """Serve the session until the client closes, goes away, or breaks a rule; always frees the slot."""
        try:
            if self.config is None:
                self.config = await self._receive_config()
            self.stream = await self._open_stream(self.config)
            await self._send(ready_message(self.context, self.session_id, self.stream, self._boost_limits))
            logger.info(
                f"ASR session {self.session_id} opened from {self.remote}: {self.config.latency_ms} ms mode, "
                + (f"language {self.stream.language}, " if self.stream.language else "")
                + f"{self.config.sample_rate} Hz x{self.config.num_channels}"
                + (f", client {log_safe(self.config.client)}" if self.config.client else "")
            )
            self._writer = asyncio.get_running_loop().create_task(
                self._forward_results(self.stream), name=f"asr-session-{self.session_id}-results"
            )
            await self._read_loop()
        except ClientGone:
            if self.close_code is None:
                self.close_code = peer_close_code(self.transport)
        except SessionError as e:
            await self.fail(e.code, e.message)
        except asyncio.CancelledError:
            await self.fail(CloseCode.GOING_AWAY, "the server is shutting down")
            raise
        except Exception as e:
            logger.exception(f"ASR session {self.session_id} crashed: {e!r}")
            await self.fail(CloseCode.INTERNAL, f"internal server error: {type(e).__name__}")
        finally:
            await self._cleanup()

    async def authenticate(self) -> bool:
        """Read the ``config`` message of a connection without an ``Authorization`` header and check its token.

        Returns:
            True if the config is valid and carries a valid token (the session may then be admitted and
            :meth:`run`); False if the connection was refused or went away (already closed).

        """
        try:
            self.config = await self._receive_config()
            return True
        except ClientGone:
            if self.close_code is None:
                self.close_code = CloseCode.NORMAL
        except SessionError as e:
            await self.fail(e.code, e.message)
        except Exception as e:
            logger.exception(f"ASR connection {self.session_id} crashed while authenticating: {e!r}")
            await self.fail(CloseCode.INTERNAL, f"internal server error: {type(e).__name__}")
        return False

    async def fail(self, code: int, message: str) -> None:
        """Send an ``error`` message and close the connection with ``code`` (first failure wins)."""
        if self.close_code is not None:
            return
        self.close_code = int(code)
        reason = close_reason(code)
        if self.end_how != "refused":
            self.end_how = "dropped"
            self.context.metrics.dropped.labels(reason).inc()
        log = logger.warning if code != CloseCode.GOING_AWAY else logger.info
        log(f"ASR session {self.session_id} closed with {int(code)} ({reason}): {log_safe(message, 300)}")
        if not self.transport.closed:
            try:
                await asyncio.wait_for(
                    self._send(ErrorMessage(code=int(code), reason=reason, message=message, fatal=True)), 1.0
                )
            except Exception:
                pass  # the client is gone or not reading; closing is all that is left
        await self._close_transport(int(code), reason)

    async def evict(self, message: str) -> None:
        """Close a connection still waiting to authenticate, to make room for a newer one (4013, a refusal)."""
        if self.close_code is not None:
            return
        self.end_how = "refused"
        self.context.metrics.refused.labels("pending_evicted").inc()
        await self.fail(CloseCode.CAPACITY, message)

    # ---- opening ------------------------------------------------------------------------------------------

    async def _receive_config(self) -> ConfigMessage:
        cfg = self.context.config
        try:
            incoming = await self.transport.receive(timeout=cfg.config_timeout_s)
        except (asyncio.TimeoutError, TimeoutError):
            raise SessionError(
                CloseCode.IDLE_TIMEOUT, f"no config message within {cfg.config_timeout_s:g} s"
            ) from None
        if incoming.kind in ("closed", "error"):
            self._log_closed_by_transport(incoming)
            raise ClientGone()
        if incoming.kind == "too_big":
            raise SessionError(CloseCode.MESSAGE_TOO_BIG, self._too_big_message())
        if incoming.kind != "text":
            raise SessionError(CloseCode.PROTOCOL_ERROR, "the first message must be a JSON config message")
        try:
            msg = parse_client_message(incoming.data)
        except ProtocolError as e:
            raise SessionError(CloseCode.PROTOCOL_ERROR, str(e)) from None
        if not isinstance(msg, ConfigMessage):
            raise SessionError(
                CloseCode.PROTOCOL_ERROR, f"the first message must be 'config', got {msg.type!r}"
            )
        if not self._token_checked:
            if not self.context.check_token(msg.token):
                self.context.metrics.refused.labels("unauthorized").inc()
                self.end_how = "refused"
                raise SessionError(
                    CloseCode.UNAUTHORIZED,
                    "missing or invalid token: send 'Authorization: Bearer <token>' or a config 'token'",
                )
            self._token_checked = True
        return msg

    async def _open_stream(self, config: ConfigMessage) -> ASRStream:
        engine = self.context.engine
        check_config(engine, config, self._boost_limits)

        def open_stream() -> ASRStream:
            return engine.open_stream(
                latency_ms=config.latency_ms,
                language=config.language,
                boost_phrases=config.boost_phrases or None,
                boost_alpha=config.boost_alpha,
                eou=config.eou,
            )

        try:
            try:
                return open_stream()
            except CapacityError:
                # Admitted because a session whose client just left no longer counts: its stream closes
                # within a poll interval (pacing.GONE_POLL_S) of that. Wait for it, briefly, rather than refuse.
                if not await self.context.slot_freed(1.0):
                    raise
                return open_stream()
        except (BoostPhraseError, BoostingUnavailableError) as e:  # the model's characters, the weight, old NeMo
            raise SessionError(CloseCode.PROTOCOL_ERROR, str(e)) from None
        except CapacityError as e:
            self.context.metrics.refused.labels("capacity").inc()
            self.end_how = "refused"
            raise SessionError(CloseCode.CAPACITY, str(e)) from None
        except EngineNotRunningError as e:
            raise SessionError(CloseCode.NOT_READY, str(e)) from None

    # ---- reading ------------------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        cfg = self.context.config
        while True:
            await self._pacer.pace()
            try:
                incoming = await self.transport.receive(timeout=cfg.idle_timeout_s)
            except (asyncio.TimeoutError, TimeoutError):
                raise SessionError(
                    CloseCode.IDLE_TIMEOUT,
                    f"no message for {cfg.idle_timeout_s:g} s; send audio or a keepalive message",
                ) from None
            if incoming.kind == "closed":
                self._log_closed_by_transport(incoming)
                if self.close_code is None:
                    self.close_code = peer_close_code(self.transport)
                return
            if incoming.kind == "too_big":
                raise SessionError(CloseCode.MESSAGE_TOO_BIG, self._too_big_message())
            if incoming.kind == "error":
                if self.close_code is None:
                    logger.info(f"ASR session {self.session_id}: transport error: {log_safe(incoming.data)}")
                return
            if incoming.kind == "binary":
                await self._on_audio(incoming.data)  # type: ignore[arg-type]
            elif await self._on_control(incoming.data):
                return

    async def _on_control(self, data: str | bytes) -> bool:
        """Handle one JSON message after the config; return whether it ended the session (``close``).

        Raises:
            SessionError: A malformed message, or a second ``config`` (protocol error, 4002).

        """
        self.control_messages += 1
        self._pacer.control_credit -= 1.0
        try:
            msg = parse_client_message(data)
        except ProtocolError as e:
            raise SessionError(CloseCode.PROTOCOL_ERROR, str(e)) from None
        if isinstance(msg, FinalizeMessage):
            self._on_finalize()
        elif isinstance(msg, SetLatencyMessage):
            await self._send(await latency_reply(self.stream, msg.latency_ms))  # type: ignore[arg-type]
        elif isinstance(msg, SetLanguageMessage):
            await self._send(await language_reply(self.context.engine, self.stream, msg.language))  # type: ignore[arg-type]
        elif isinstance(msg, SetBoostPhrasesMessage):
            self._pacer.control_credit -= BOOST_CONTROL_COST - 1.0
            await self._send(await boost_reply(self.stream, msg, self._boost_limits))  # type: ignore[arg-type]
        elif isinstance(msg, GapMessage):
            self.audio_skipped_ms += msg.ms
            self._positions.gap(self.finals_requested, self.audio_received_ms, msg.ms)
        elif isinstance(msg, PeekMessage):
            self._pacer.control_credit -= PEEK_CONTROL_COST - 1.0
            self._peeks.request(self.stream, (self._audio_bytes, self.finals_requested))  # type: ignore[arg-type]
        elif isinstance(msg, CloseMessage):
            await self._close_gracefully()
            return True
        elif not isinstance(msg, KeepaliveMessage):
            raise SessionError(CloseCode.PROTOCOL_ERROR, "config was already received for this session")
        return False

    async def _on_audio(self, data: bytes) -> None:
        assert self.stream is not None and self.config is not None
        if not data:
            return
        ms = len(data) / self.config.bytes_per_ms
        self.audio_received_ms += ms
        self._audio_bytes += len(data)
        self._pacer.credit_ms -= ms
        self.context.metrics.audio_seconds.inc(ms / 1000.0)
        try:
            await self.stream.push(
                data, sample_rate=self.config.sample_rate, num_channels=self.config.num_channels
            )
        except InvalidAudioError as e:
            raise SessionError(CloseCode.PROTOCOL_ERROR, f"unusable audio: {e}") from None
        except StreamFailedError as e:
            raise SessionError(CloseCode.INTERNAL, f"ASR stream failed: {e}") from None
        except StreamClosedError:
            raise SessionError(CloseCode.INTERNAL, "the ASR stream was closed by the server") from None

    def _on_finalize(self) -> None:
        assert self.stream is not None
        self._peeks.before_finalize()  # peeks waiting to be issued are about the utterance ending here
        try:
            self.stream.request_final()  # the final arrives through the updates, in order with the partials
        except StreamFailedError as e:
            raise SessionError(CloseCode.INTERNAL, f"ASR stream failed: {e}") from None
        except StreamClosedError:
            raise SessionError(CloseCode.INTERNAL, "the ASR stream was closed by the server") from None
        self.finals_requested += 1

    async def _close_gracefully(self) -> None:
        """After a client ``close``: send the finals and peek answers still owed (bounded wait), then close with 1000."""
        timeout = self.context.config.close_timeout_s
        deadline = time.monotonic() + timeout
        if not await self._peeks.wait_answered(timeout):
            logger.warning(f"ASR session {self.session_id}: {self._peeks.owed} peek(s) unanswered {timeout:g} s after close")
        while self.finals_sent < self.finals_requested and self.close_code is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                logger.warning(
                    f"ASR session {self.session_id}: {self.finals_requested - self.finals_sent} final(s) not "
                    f"ready within {timeout:g} s of close"
                )
                break
            self._finals_event.clear()
            try:
                await asyncio.wait_for(self._finals_event.wait(), remaining)
            except (asyncio.TimeoutError, TimeoutError):
                pass
        self.end_how = "client_close"
        if self.close_code is None:
            self.close_code = CloseCode.NORMAL
            await self._close_transport(CloseCode.NORMAL, "normal")

    # ---- writing ------------------------------------------------------------------------------------------

    async def _forward_results(self, stream: ASRStream) -> None:
        assert self.config is not None
        metrics = self.context.metrics
        interim = self.config.interim_results
        try:
            async for update in stream.updates():
                if update.is_final:
                    final = self._positions.final_message(update, stream, self.config.word_timings)
                    await self._send(with_language(final, update))
                    if not update.forced:  # a forced final (max_utterance_s) answers no finalize
                        self.finals_sent += 1
                        self._finals_event.set()
                        metrics.finalize_seconds.observe((update.ttf_ms or 0.0) / 1000.0)
                    logger.debug(
                        f"ASR session {self.session_id} final {update.utterance} in {update.ttf_ms or 0:.1f} ms: "
                        f"{update.text!r}"
                    )
                elif update.kind == "eou":
                    await self._send(
                        EouMessage(
                            utterance=update.utterance,
                            text=update.text,
                            latency_ms=update.latency_ms,
                            eou_ms=self._positions.at_ms(update.eou_ms or 0.0),
                            session_audio_ms=self._positions.position_ms(stream),
                        )
                    )
                else:
                    metrics.partial_lag_seconds.observe(update.lag_ms / 1000.0)
                    if interim:
                        await self._send(partial_message(update, self._positions.position_ms(stream)))
        except ClientGone:
            pass  # the client went away; the reader (or its pacing) sees it too
        except SessionError as e:  # from _send: the client stopped reading
            await self.fail(e.code, e.message)
        except StreamFailedError as e:
            await self.fail(CloseCode.INTERNAL, f"ASR stream failed: {e}")
        except NemotronEngineError as e:
            await self.fail(CloseCode.INTERNAL, f"ASR engine error: {e}")
        except Exception as e:
            if not self.transport.closed:
                logger.exception(f"ASR session {self.session_id}: sending results failed: {e!r}")
                await self.fail(CloseCode.INTERNAL, f"internal server error: {type(e).__name__}")

    async def _send(self, msg: ServerMessage) -> None:
        """Send one message; every send of the session goes through here.

        Raises:
            SessionError: 4008, the send blocked ``send_timeout_s`` (the client stopped reading).
            ClientGone: The connection is closing or was reset (the client left; nothing to report).

        """
        text = dump_server_message(msg)
        timeout_s = self.context.config.send_timeout_s
        async with self._send_lock:
            try:
                await asyncio.wait_for(self.transport.send_text(text), timeout_s)
            except (asyncio.TimeoutError, TimeoutError):
                raise SessionError(
                    CloseCode.IDLE_TIMEOUT,
                    f"the client stopped reading results (a send blocked {timeout_s:g} s)",
                ) from None
            except ConnectionError:
                raise ClientGone() from None

    # ---- closing ------------------------------------------------------------------------------------------

    async def _close_transport(self, code: int, reason: str) -> None:
        try:
            await asyncio.wait_for(self.transport.close(code, reason), 2.0)
        except Exception as e:  # noqa: BLE001 - a broken connection cannot be closed more cleanly
            logger.debug(f"ASR session {self.session_id}: close failed: {e!r}")

    def _log_closed_by_transport(self, incoming: Incoming) -> None:
        """Log why the server's side of the connection closed it (a ``closed`` with a reason: its heartbeat)."""
        if incoming.kind == "closed" and incoming.data:
            logger.info(f"ASR session {self.session_id}: {log_safe(incoming.data)}")

    def _too_big_message(self) -> str:
        limit = self.context.config.max_message_bytes
        return f"a message exceeded {limit} bytes; send audio in frames of at most {limit} bytes (e.g. 20 ms)"

    async def _cleanup(self) -> None:
        self._released = True  # from here on the session no longer counts against capacity
        stream, self.stream = self.stream, None
        dropped_ms = 0.0
        if stream is not None:
            # Audio received but not yet in a model step is never decoded: closing the stream drops it (a
            # client that left while its reads were paused may have sent minutes of it).
            dropped_ms = stream.backlog_ms if not stream.closed else 0.0
            self.context.metrics.audio_dropped_seconds.inc(dropped_ms / 1000.0)
            try:
                await stream.close()
            except Exception as e:  # noqa: BLE001 - the engine may be stopping
                logger.debug(f"ASR session {self.session_id}: stream close failed: {e!r}")
        writer, self._writer = self._writer, None
        if writer is not None and not writer.done():
            # The updates iterator ends with the stream; give a blocked send a moment, then cancel.
            try:
                await asyncio.wait_for(asyncio.shield(writer), 0.5)
            except (asyncio.TimeoutError, TimeoutError):
                writer.cancel()
            except Exception:
                pass
        if self.close_code is None:
            self.close_code = CloseCode.NORMAL
            await self._close_transport(CloseCode.NORMAL, "normal")
        duration = time.monotonic() - self.opened_at
        logger.info(
            f"ASR session {self.session_id} ended ({self.end_how}, "
            + ("client's " if self.end_how == "disconnect" else "")
            + f"code {self.close_code}) after {duration:.1f} s, "
            f"{self.audio_received_ms / 1000.0:.1f} s of audio"
            + (f" (+{self.audio_skipped_ms / 1000.0:.1f} s withheld)" if self.audio_skipped_ms else "")
            + f", {self.finals_sent} final(s)"
            + (f", dropped {dropped_ms / 1000.0:.1f} s of undecoded audio" if dropped_ms >= 50.0 else "")
        )
