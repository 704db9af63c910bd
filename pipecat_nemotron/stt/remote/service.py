"""``NemotronServerSTTService``: a Pipecat STT that streams to a remote Nemotron ASR server (``pipecat-nemotron serve``).

The client side of the scale-out deployment (protocol ``nemotron-asr.v1``, ``docs/PROTOCOL.md``): the same frames
and settings as the in-process :class:`~pipecat_nemotron.stt.NemotronSTTService`. Reconnection
(:mod:`~pipecat_nemotron.stt.remote.reconnect`) never loses a finalized turn: the audio of every utterance whose
final has not arrived yet is kept (bounded) and replayed, with its ``finalize``, on the new session.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from loguru import logger
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    ErrorFrame,
    Frame,
    StartFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.stt_service import WebsocketSTTService
from pipecat.transcriptions.language import Language
from websockets.protocol import State

from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.server.protocol import (
    BOOST_FEATURE,
    EOU_FEATURE,
    GAP_FEATURE,
    LANGUAGE_FEATURE,
    BoostMessage,
    CloseCode,
    EouMessage,
    ErrorMessage,
    FinalizeMessage,
    FinalMessage,
    GapMessage,
    KeepaliveMessage,
    LanguageMessage,
    LatencyMessage,
    PartialMessage,
    PeekResultMessage,
    ReadyMessage,
    SetBoostPhrasesMessage,
    SetLanguageMessage,
    SetLatencyMessage,
    is_permanent,
)
from pipecat_nemotron.server.protocol_server import transcript_from_final
from pipecat_nemotron.server.security import MaskedHeaders, Secret
from pipecat_nemotron.stt.base import NemotronSTTBase, NemotronSTTSettings
from pipecat_nemotron.stt.eager import EagerSettings
from pipecat_nemotron.stt.remote.boost import BoostRequests, BoostSetting, boost_problem
from pipecat_nemotron.stt.remote.finals import OwedServerFinals
from pipecat_nemotron.stt.remote.gate import SilenceGate
from pipecat_nemotron.stt.remote.handshake import (
    DEFAULT_URL,
    MAX_AUDIO_MESSAGE_BYTES,
    TOKEN_ENV,
    ServerAddress,
    ServerRefusedError,
    audio_message_bytes,
    language_problem,
    receive_ready,
    server_messages,
    session_config,
)
from pipecat_nemotron.stt.remote.peeks import PeekRequests
from pipecat_nemotron.stt.remote.reconnect import ReconnectPolicy, ReconnectRecord, SessionKeeper, session_end
from pipecat_nemotron.stt.remote.replay import pieces

#: With ``skip_silence``, a long silence is reported in ``gap`` messages about this often, s (they keep the session
#: alive: the server closes one without a message for its idle timeout, 30 s by default).
_GAP_REPORT_S = 5.0

__all__ = [
    "DEFAULT_URL",
    "MAX_AUDIO_MESSAGE_BYTES",
    "TOKEN_ENV",
    "NemotronServerSTTService",
    "ReconnectPolicy",
    "ServerRefusedError",
]


class NemotronServerSTTService(NemotronSTTBase, WebsocketSTTService):
    """Remote NVIDIA Nemotron Speech streaming ASR: a Pipecat STT client of a ``pipecat-nemotron serve`` server.

    Use it instead of the in-process :class:`~pipecat_nemotron.stt.NemotronSTTService` when bots run on
    machines without a GPU (or to pack every bot's audio into one GPU's batches). Same frames, same settings.

    Example::

        stt = NemotronServerSTTService(url="wss://asr.internal/v1/asr", token=os.environ["NEMOTRON_ASR_TOKEN"])

    On a dropped connection it reconnects under its :class:`ReconnectPolicy` (jittered backoff, for as long
    as the pipeline runs by default; not after a permanent refusal such as a wrong token, 4001) and replays the
    audio of every utterance whose final has not arrived, so no finalized text is lost. Between turns (user
    not speaking) only the last ``replay_preroll_s`` of audio is kept; audio the bound drops is reported.

    With ``skip_silence`` (the default) the server encodes only speech: while the VAD says the user is not
    speaking (and the model's ``<EOU>`` can no longer end the turn: :mod:`~pipecat_nemotron.stt.eou_wait`),
    audio is held back (:mod:`~pipecat_nemotron.stt.remote.gate`); at the speech start the service
    sends a ``gap`` message for the audio it withheld, then the last ``silence_preroll_s`` of it, then live
    audio. Transcripts and every timestamp (``session_audio_ms``, word times) stay those of the whole audio; a
    server without the ``gap`` feature gets every sample, as with ``skip_silence=False``, and so does any
    server until the first VAD frame reaches the service (a pipeline without a VAD before the STT).

    Args:
        url: Session WebSocket URL of the server (``ws://`` or ``wss://``, path ``/v1/asr``).
        token: Bearer token (default: the ``NEMOTRON_ASR_TOKEN`` environment variable; None for a server
            run with ``--insecure``).
        latency_ms: Initial latency mode: one of the server model's (80, 160, 560 or 1120 ms; a multilingual
            model adds 320).
        language: Language of a multilingual server model (Pipecat's ``Language``, ``"es-ES"``, ``"es"`` or
            ``"auto"``); None: the server's default. Sent in every session's ``config``; one the model lacks
            is a permanent error.
        extra_headers: More headers for the WebSocket handshake.
        connect_timeout_s: Time allowed to connect and get ``ready``, s.
        replay_max_s: Most audio kept for replay after a reconnect, s (older audio is dropped, with a
            warning, if utterances go unconfirmed for longer).
        replay_preroll_s: Audio kept for replay while the user is not speaking, s (covers the VAD's
            start delay).
        final_timeout_s: At ``EndFrame``, wait this long for the finals still owed, s.
        reconnect: How to reconnect after losing the session (default: ``ReconnectPolicy()``, which
            keeps trying while the pipeline runs).
        reconnect_backoff_min_wait: Overrides ``reconnect.min_wait_s``, s.
        reconnect_backoff_max_wait: Overrides ``reconnect.max_wait_s``, s.
        keepalive_timeout: Send a keepalive message after this long without audio (muted user), s; None
            disables it (the server closes idle sessions after its idle timeout, 30 s by default).
        keepalive_interval: How often to check for keepalive, s.
        ttfs_p99_latency: P99 speech-end-to-final time, s. Default: 0.2 s (VAD stop) plus 1.5x the
            measured finalize round trip once measured, or ``NEMOTRON_TTFS_P99`` before that.
        settings: Runtime settings (``latency_ms``, ``language``, ``boost_phrases``); override the arguments above.
        eager: The eager end of turn (:class:`~pipecat_nemotron.stt.eager.EagerSettings`); None: off.
        boost_phrases: Phrases to boost, cased as the server's model writes them; None: none. Updatable like
            ``language``. A server without the ``boost`` feature: an ``ErrorFrame`` says they are not boosted.
        skip_silence: Send no audio while the VAD says the user is not speaking, only a ``gap`` message
            for it (the server then encodes only speech and its preroll); False: send every sample.
        silence_preroll_s: With ``skip_silence``, audio sent before the speech start, s (covers the VAD's
            start delay, 0.2 s with Pipecat's defaults, and gives the encoder context before the first word).
        **kwargs: ``boost_alpha`` (weight in (0, 10]; None: the server's default), then Pipecat's
            :class:`~pipecat.services.stt_service.WebsocketSTTService`'s.

    Raises:
        ValueError: Unsupported latency, a URL that is not ``ws://`` / ``wss://``, or a bad reconnect value
            (or the removed ``max_reconnect_attempts``).

    """

    def __init__(
        self,
        *,
        url: str = DEFAULT_URL,
        token: str | None = None,
        latency_ms: int = 160,
        language: Language | str | None = None,
        extra_headers: dict[str, str] | None = None,
        connect_timeout_s: float = 10.0,
        replay_max_s: float = 60.0,
        replay_preroll_s: float = 1.0,
        final_timeout_s: float = 5.0,
        reconnect: ReconnectPolicy | None = None,
        reconnect_backoff_min_wait: float | None = None,
        reconnect_backoff_max_wait: float | None = None,
        keepalive_timeout: float | None = 10.0,
        keepalive_interval: float = 5.0,
        ttfs_p99_latency: float | None = None,
        settings: NemotronSTTSettings | None = None,
        eager: EagerSettings | None = None,
        boost_phrases: Sequence[str] | None = None,
        skip_silence: bool = True,
        silence_preroll_s: float = 0.5,
        **kwargs: Any,
    ) -> None:
        """Create the service. It connects at ``StartFrame``. Arguments: see the class."""
        if "max_reconnect_attempts" in kwargs:
            raise ValueError("max_reconnect_attempts is gone: pass reconnect=ReconnectPolicy(timeout_s=...)")
        if not 0 <= silence_preroll_s <= replay_preroll_s:
            raise ValueError(
                f"silence_preroll_s must be in [0, replay_preroll_s = {replay_preroll_s:g}] s (the audio held for "
                f"a reconnect covers it), got {silence_preroll_s}"
            )
        policy = (reconnect or ReconnectPolicy()).with_waits(reconnect_backoff_min_wait, reconnect_backoff_max_wait)
        super().__init__(
            latency_ms=latency_ms,
            model=None,
            language=language,
            ttfs_p99_latency=ttfs_p99_latency,
            settings=settings,
            eager=eager,
            boost_phrases=boost_phrases,
            keepalive_timeout=keepalive_timeout,
            keepalive_interval=keepalive_interval,
            reconnect_backoff_min_wait=policy.min_wait_s,
            reconnect_backoff_max_wait=policy.max_wait_s,
            **kwargs,
        )
        self._address = ServerAddress(
            url,
            Secret.of(token if token is not None else os.environ.get(TOKEN_ENV)),
            MaskedHeaders(extra_headers or {}),
            connect_timeout_s,
        )
        #: The audio kept until its final arrives (replayed after a reconnect), and the finalize round trips.
        self._owed = OwedServerFinals(
            replay_max_s=replay_max_s, replay_preroll_s=replay_preroll_s, final_timeout_s=final_timeout_s
        )
        self._replay = self._owed.replay
        #: Receives and reconnects; its ``reconnects`` and ``failed_attempts`` record the outages.
        self.keeper = SessionKeeper(
            policy,
            name=str(self),
            receive=self._receive_messages,
            connect=self._reopen,
            stopped=lambda: self._disconnecting or not self.is_usable,
            report=self._report_error,
            reconnected=self._on_reconnected,
        )
        self._replayed_ms = self._dropped_ms = 0.0
        self._receive_task: asyncio.Task[None] | None = None
        self._send_lock = asyncio.Lock()
        self._ready: ReadyMessage | None = None
        self._fatal_error: ErrorMessage | None = None
        self._max_send_bytes = MAX_AUDIO_MESSAGE_BYTES
        self._peeks = PeekRequests()
        self._boosts = BoostRequests()
        self.sessions_opened = 0
        self._skip_silence = skip_silence
        self._silence_preroll_s = silence_preroll_s
        self._gate: SilenceGate | None = None  # made at the first audio (the sample rate is known then)
        self._vad_seen = False  # a VAD frame reached the service: its speaking state is known

    # ---- properties ---------------------------------------------------------------------------------------

    @property
    def ready(self) -> ReadyMessage | None:
        """The current session's ``ready`` message (None while disconnected)."""
        return self._ready

    @property
    def pending_replay_ms(self) -> float:
        """Audio held for replay (utterances not yet confirmed by a final), ms."""
        return self._replay.nbytes / self._bytes_per_ms

    @property
    def _bytes_per_ms(self) -> float:
        return 2 * (self.sample_rate or MODEL_SAMPLE_RATE) / 1000.0

    def _finalize_p99_ms(self) -> float | None:
        """p99 of the finalize round trips measured (finalize sent to final received), ms; None before any."""
        return self._owed.finalize_p99_ms()

    # ---- lifecycle ----------------------------------------------------------------------------------------

    async def start(self, frame: StartFrame) -> None:
        """Connect to the server (a failure is reported and retried in the background)."""
        await super().start(frame)
        await self._connect()

    async def stop(self, frame: EndFrame) -> None:
        """Finalize what the user said last (if anything), wait for the finals still owed, then disconnect."""
        await self._stop_eou_wait()
        await self._flush_finals()
        await super().stop(frame)

    async def cancel(self, frame: CancelFrame) -> None:
        """Disconnect at once (the server frees the session's slot)."""
        await self._stop_eou_wait()
        await super().cancel(frame)
        self._replay.clear()

    async def _connect(self) -> None:
        await super()._connect()
        try:
            await self._connect_websocket()
        except Exception as e:
            await self.keeper.connect_failed(e)
            self._readiness.fail(
                f"{self}: could not connect to the Nemotron ASR server at {self._address.url}: {e}", e
            )
        if self._receive_task is None:
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))

    async def _disconnect(self) -> None:
        await super()._disconnect()
        if self._receive_task is not None:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _receive_task_handler(self, report_error: Any) -> None:
        """Receive, and reconnect under the :class:`ReconnectPolicy` (in place of Pipecat's attempt count)."""
        await self.keeper.run()

    async def _reopen(self) -> tuple[float, float]:
        """A new session for a lost one; returns the audio replayed and the audio the bound had dropped, s."""
        await self._disconnect_websocket()
        await self._connect_websocket()
        return self._replayed_ms / 1000, self._dropped_ms / 1000

    async def _on_reconnected(self, record: ReconnectRecord) -> None:
        await self.push_frame(record.metrics_frame(self.name))
        error = record.dropped_error(self._owed.replay_max_s)
        if error is not None:
            await self.push_error_frame(error)

    async def _connect_websocket(self) -> None:
        """Open a session: connect, send ``config``, wait for ``ready``, replay unconfirmed audio.

        Raises:
            ServerRefusedError: The server refused the session (a permanent refusal is also reported as a
                permanent error, which stops reconnection).
            OSError / TimeoutError: The server is unreachable.

        """
        if self._websocket is not None and self._websocket.state is State.OPEN and self._ready is not None:
            return
        logger.debug(f"{self}: connecting to {self._address.url}")
        ws = await self._address.connect(self._websocket_connect)
        self._websocket = ws
        boost = BoostSetting(self.boost_phrases, self.boost_alpha)  # a reconnect keeps the session's settings
        config = session_config(self.latency_ms, self.sample_rate, self.language, boost, eou=self.wants_eou)
        try:
            msg = await receive_ready(ws, config, self._address.timeout_s)
        except ServerRefusedError as e:
            await self._on_refused(e)
            raise
        except BaseException:
            self._websocket = None
            await ws.close()
            raise
        await self._on_ready(ws, msg)

    async def _on_refused(self, error: ServerRefusedError) -> None:
        self._websocket = None
        if is_permanent(error.code):
            msg = f"the Nemotron ASR server refused the session ({error.code}): {error}"
            logger.error(f"{self}: {msg}")
            self._readiness.fail(f"{self}: {msg}", error)
            await self._report_error(ErrorFrame(msg, exception=error), force_treat_as_permanent=True)
        else:
            logger.warning(f"{self}: the Nemotron ASR server refused the session ({error.code}): {error}")

    async def _on_ready(self, ws: Any, ready: ReadyMessage) -> None:
        """Replay unconfirmed audio (and finalizes), then let live audio through.

        A service whose turn commit reads ``<EOU>`` refuses a server without the ``eou`` feature (an older one,
        or a model without the token): its turns would never end on the model's word.

        No message exceeds the server's announced ``max_message_bytes`` (inclusive; larger closes with 4009):
        replayed chunks are packed up to it and split where one alone is larger, and so is live audio.
        """
        if self.wants_eou and EOU_FEATURE not in ready.features:
            refusal = ServerRefusedError(
                CloseCode.PROTOCOL_ERROR,
                f"the STT's turn commit ends turns on the model's end-of-utterance token, and the ASR server "
                f"({ready.model}) offers no 'eou' feature: serve a model that emits <EOU> "
                "(pipecat-nemotron serve --model .../tiny_nemotron_asr_eou.nemo) or choose a turn end that "
                "does not read it",
            )
            await self._on_refused(refusal)
            await ws.close()
            raise refusal
        max_bytes = audio_message_bytes(ready, MAX_AUDIO_MESSAGE_BYTES)
        async with self._send_lock:
            self._max_send_bytes = max_bytes
            self._replayed_ms = self.pending_replay_ms
            self._dropped_ms = self._replay.take_dropped() / self._bytes_per_ms
            await self._replay.replay(ws.send, max_bytes, FinalizeMessage().to_json())
            if self._gate is not None:  # the replay sent the audio it held
                self._gate.clear()
            self._ready = ready
            self._settings.model = ready.model
            self._fatal_error = None
            ignored = self._boosts.opened(ready, BoostSetting(self.boost_phrases, self.boost_alpha))
        self._readiness.ready()
        if ignored is not None:
            await self.push_error(error_msg=ignored)
        self.sessions_opened += 1
        logger.info(
            f"{self}: connected to the Nemotron ASR server (session {ready.session_id}, {ready.model})"
        )
        await self._call_event_handler("on_connected")

    async def _disconnect_websocket(self) -> None:
        ws, self._websocket = self._websocket, None
        self._ready = None
        self._peeks.clear()
        if ws is None:
            return
        try:
            if ws.state is State.OPEN:
                await ws.close()
        except Exception as e:
            logger.debug(f"{self}: error closing the websocket: {e!r}")
        finally:
            await self._call_event_handler("on_disconnected")

    async def _receive_messages(self) -> None:
        ws = self._websocket
        if ws is None or self._ready is None:
            raise ConnectionError("not connected")
        async for msg in server_messages(ws, str(self)):
            await self._handle_message(msg)
        self._ready = None
        if self._disconnecting:
            return
        # A permanent close is reported; any other raises SessionLost: the keeper reconnects.
        msg = session_end(ws.close_code, self._fatal_error.message if self._fatal_error else (ws.close_reason or ""))
        logger.error(f"{self}: {msg}")
        await self._report_error(ErrorFrame(msg), force_treat_as_permanent=True)

    async def _handle_message(self, msg: Any) -> None:
        if isinstance(msg, PartialMessage):
            self._decoded_language = msg.language
            await self._push_interim(msg.text)
        elif isinstance(msg, FinalMessage):
            await self._on_final(msg)
        elif isinstance(msg, PeekResultMessage):
            self._peeks.answer(msg.text)
        elif isinstance(msg, EouMessage):
            await self._on_eou(msg.utterance, msg.eou_ms, msg.text)
        elif isinstance(msg, (LatencyMessage, LanguageMessage, BoostMessage)):
            self._boosts.answered(msg)
            logger.debug(f"{self}: {msg}")
        elif isinstance(msg, ErrorMessage) and msg.fatal:
            self._fatal_error = msg
            logger.warning(f"{self}: server error {msg.code} ({msg.reason}): {msg.message}")
        elif isinstance(msg, ErrorMessage):
            if (kept := self._boosts.answered(msg)) is not None:  # a list refused: the server's list stays
                self._settings.boost_phrases, self._settings.boost_alpha = kept
            await self.push_error(error_msg=f"Nemotron ASR server: {msg.message}")

    # ---- audio in -----------------------------------------------------------------------------------------

    async def run_stt(self, audio: bytes) -> AsyncGenerator[Frame | None, None]:
        """Keep the audio for replay and send it if a session is open (else it is sent after reconnecting)."""
        async with self._send_lock:
            self._replay.append(audio)
            if self._owed.trim(self._bytes_per_ms, user_speaking=self._user_speaking) and self._ready is None:
                logger.debug(f"{self}: replay buffer full ({self._owed.replay_max_s:g} s) while disconnected")
            if self._ready is not None and self._websocket is not None:
                try:
                    if self._skips_silence() and not self._user_speaking and not self.listening_for_eou:
                        withheld = self._silence_gate().hold(audio)
                        if withheld:
                            await self._websocket.send(GapMessage(ms=withheld / self._bytes_per_ms).to_json())
                    else:
                        await self._send_held(audio)
                except Exception as e:  # the receive loop notices the drop and reconnects
                    logger.debug(f"{self}: audio send failed: {e!r}")
        yield None

    @property
    def audio_withheld_s(self) -> float:
        """Audio held back from the server while the user was silent (``skip_silence``), s."""
        return self._gate.withheld_total / self._bytes_per_ms / 1000 if self._gate is not None else 0.0

    def _skips_silence(self) -> bool:
        """Whether silence is held back: asked for, a VAD tells speech from silence, and the server counts gaps.

        Until a VAD frame arrives the service cannot tell silence from speech (a pipeline without a VAD
        before the STT never sends one), so it sends every sample.
        """
        return (
            self._skip_silence
            and self._vad_seen
            and self._ready is not None
            and GAP_FEATURE in self._ready.features
        )

    def _silence_gate(self) -> SilenceGate:
        """The gate, counting withheld audio in whole chunks of the current latency mode."""
        quantum = 2 * max(1, round(self.latency_ms * self._bytes_per_ms / 2))
        report_every = quantum * max(1, round(_GAP_REPORT_S * 1000 / self.latency_ms))
        if self._gate is None:
            preroll = 2 * round(self._silence_preroll_s * 1000 * self._bytes_per_ms / 2)
            self._gate = SilenceGate(preroll_bytes=preroll, quantum_bytes=quantum, report_every=report_every)
        else:  # a new latency mode counts in its own chunks from here on
            self._gate.set_quantum(quantum, report_every)
        return self._gate

    async def _send_held(self, audio: bytes = b"") -> None:
        """Send the gap and the held preroll (if any), then ``audio``; call holding the send lock."""
        ws = self._websocket
        withheld, held = self._gate.release() if self._gate is not None else (0, [])
        if ws is None:
            return
        if withheld:
            await ws.send(GapMessage(ms=withheld / self._bytes_per_ms).to_json())
        data = b"".join([*held, audio]) if held else audio
        if data:
            for piece in pieces(data, self._max_send_bytes):
                await ws.send(piece)

    async def _send_keepalive(self, silence: bytes) -> None:
        """Keep a session alive while no audio flows (muted user) with a keepalive message, not silence."""
        if self._ready is not None and self._websocket is not None:
            await self._websocket.send(KeepaliveMessage().to_json())

    def _is_keepalive_ready(self) -> bool:
        return self._ready is not None and self._websocket is not None and self._websocket.state is State.OPEN

    # ---- end of turn --------------------------------------------------------------------------------------

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Handle frames (a VAD stop finalizes the utterance: :class:`~pipecat_nemotron.stt.base.NemotronSTTBase`)."""
        if isinstance(frame, (VADUserStartedSpeakingFrame, VADUserStoppedSpeakingFrame)):
            self._vad_seen = True
        await super().process_frame(frame, direction)

    async def _end_utterance(self) -> None:
        """Finalize the utterance (at a VAD stop; an EOU commit's on the ``<EOU>``)."""
        self.request_finalize()
        await self._finalize()

    async def _finalize(self) -> None:
        async with self._send_lock:
            seg = self._replay.finalize()
            if self._ready is not None and self._websocket is not None:
                seg.finalize_sent_at = time.monotonic()
                try:
                    await self._send_held()  # audio held back belongs to the utterance this ends
                    await self._websocket.send(FinalizeMessage().to_json())
                except Exception as e:  # replayed after the reconnect
                    logger.debug(f"{self}: finalize send failed: {e!r}")

    async def _peek_text(self) -> str:
        """A ``peek`` round trip: the open utterance's text as its final would be now ("" if the server lacks it)."""
        return await self._peeks.round_trip(self._websocket, self._ready, self._send_lock, self._owed.final_timeout_s)

    async def _on_final(self, msg: FinalMessage) -> None:
        rtt_ms = self._owed.confirm(msg, self._bytes_per_ms)
        result = transcript_from_final(msg)
        if msg.forced:  # split at the server's longest utterance: the turn goes on, no finalize is answered
            await self._push_forced_final(result)
        elif await self._push_final(result, msg.ttf_ms, self._settings.model):
            rtt = f", round trip {rtt_ms:.1f} ms" if rtt_ms is not None else ""
            logger.info(
                f"{self}: final for utterance {msg.utterance} in {msg.ttf_ms:.1f} ms on the server{rtt} "
                f"({msg.latency_ms} ms mode)"
            )

    async def _flush_finals(self) -> None:
        """At the end of the session: finalize an unfinished utterance and wait for every final owed.

        After a permanent refusal (already reported) nothing is owed any more: no session will deliver it.
        """
        if not self.is_usable:
            return
        if self._replay.open_segment.nbytes > 0 and self._ready is not None:
            await self._finalize()
        lost = await self._owed.wait_owed(self._bytes_per_ms, connected=self._ready is not None)
        if lost:
            await self.push_error(lost)

    def _model_change_refusal(self) -> str:
        """The model is the server's."""
        return "the model is chosen by the ASR server and cannot change here"

    def _latency_modes(self) -> tuple[int, ...] | None:
        """The server model's modes, from the session's ``ready`` (None while disconnected)."""
        return self._ready.latency_modes if self._ready is not None else None

    def _language_problem(self, language: Any) -> str | None:
        """Why the server's model cannot decode ``language``, from the ``ready`` (None while disconnected)."""
        return language_problem(self._ready, language)

    async def _apply_latency(self) -> None:
        """Tell the server the new mode (a reconnect's ``config`` carries it anyway)."""
        await self._send_setting(SetLatencyMessage(latency_ms=self.latency_ms))

    async def _apply_language(self) -> None:
        """Tell the server the new language (a reconnect's ``config`` carries it anyway)."""
        await self._send_setting(SetLanguageMessage(language=self.language), LANGUAGE_FEATURE)

    def _check_boost(self, phrases: tuple[str, ...]) -> None:
        """The server's feature and limits, from the session's ``ready`` (nothing while disconnected)."""
        boost_problem(self._ready, phrases)

    async def _apply_boost(self) -> None:
        """Tell the server the new phrases (a reconnect's ``config`` carries them anyway)."""
        await self._send_setting(SetBoostPhrasesMessage(self.boost_phrases, self.boost_alpha), BOOST_FEATURE)

    async def _send_setting(self, msg: Any, feature: str | None = None) -> None:
        """Send a ``set_*`` message if the server has its ``feature``."""
        if feature is not None and self._ready is not None and feature not in self._ready.features:
            logger.warning(f"{self}: the ASR server has no {feature!r} feature (an older server); {msg.type} not sent")
            return
        async with self._send_lock:
            if self._ready is not None and self._websocket is not None:
                self._boosts.sending(msg)
                try:
                    await self._websocket.send(msg.to_json())
                except Exception as e:  # the reconnect's config carries the new setting
                    logger.debug(f"{self}: {msg.type} send failed: {e!r}")
