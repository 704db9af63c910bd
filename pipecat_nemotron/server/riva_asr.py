"""Riva's ``RivaSpeechRecognition`` service over the server's ASR engine (:class:`RivaASRServicer`).

``StreamingRecognize`` streams interim results (``is_final=false``, the utterance's text so far) and finals; the
server ends utterances itself (endpointing, :mod:`~pipecat_nemotron.server.recognition`). ``Recognize`` decodes
one clip whole. ``GetRivaSpeechRecognitionConfig`` names the model and its languages.

Honoured: ``encoding`` LINEAR_PCM (or unset), ``sample_rate_hertz`` (8 to 48 kHz, resampled),
``audio_channel_count`` (downmixed), ``language_code`` (the model's languages; an English-only model takes any
English code), ``speech_contexts`` (phrase boosting: one ``boost`` for all phrases, in (0, 10]; 0 or unset: the
server's default), ``enable_automatic_punctuation`` (false: punctuation and capitals removed),
``enable_word_time_offsets`` (words with times and confidence on finals), ``max_alternatives`` 0 or 1,
``interim_results``, ``endpointing_config.stop_history``, ``model`` (empty or the served model's name),
``custom_configuration`` key ``latency_ms``. Refused with a status naming the field (never ignored):
``profanity_filter``, ``verbatim_transcripts=false`` (inverse text normalisation), speaker diarization,
``enable_separate_recognition_per_channel``, more than one alternative, the other endpointing fields, other
encodings, ``runtime_config`` (UNIMPLEMENTED); bad values (INVALID_ARGUMENT).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence

import grpc
import riva.client.proto.riva_asr_pb2 as rasr
import riva.client.proto.riva_asr_pb2_grpc as rasr_grpc
import riva.client.proto.riva_audio_pb2 as raudio
from loguru import logger

from pipecat_nemotron.asr import Transcript
from pipecat_nemotron.asr.audio import SUPPORTED_SAMPLE_RATES
from pipecat_nemotron.asr.errors import CapacityError, InvalidAudioError, NemotronEngineError
from pipecat_nemotron.server.errors import RequestError, RequestStatus
from pipecat_nemotron.server.grpc_common import GrpcAccess, abort_with, write_unless
from pipecat_nemotron.server.recognition import (
    DEFAULT_STOP_HISTORY_MS,
    RecognitionSession,
    RecognitionSettings,
    plain_text,
)
from pipecat_nemotron.server.security import log_safe
from pipecat_nemotron.server.service import ASRService
from pipecat_nemotron.server.stream_settings import boost_limits

__all__ = ["RivaASRServicer", "recognition_settings"]

#: ``custom_configuration`` keys a recognition request may set.
CUSTOM_KEYS = ("latency_ms",)

_PCM = (raudio.AudioEncoding.ENCODING_UNSPECIFIED, raudio.AudioEncoding.LINEAR_PCM)
_ids = itertools.count(1)


def _unimplemented(message: str) -> RequestError:
    return RequestError(RequestStatus.UNIMPLEMENTED, message)


def _invalid(message: str) -> RequestError:
    return RequestError(RequestStatus.INVALID_ARGUMENT, message)


def _refuse_unsupported(config: rasr.RecognitionConfig) -> None:
    """Refuse the fields this server cannot honour (UNIMPLEMENTED), each named with its fix."""
    if config.encoding not in _PCM:
        name = raudio.AudioEncoding.Name(config.encoding)
        raise _unimplemented(f"encoding {name} is not supported; send LINEAR_PCM (16-bit little-endian)")
    if config.profanity_filter:
        raise _unimplemented("profanity_filter is not supported; set it to false")
    if not config.verbatim_transcripts:
        raise _unimplemented(
            "inverse text normalisation is not supported: set verbatim_transcripts=true (the model's own "
            "spelling of numbers is sent)"
        )
    if config.enable_separate_recognition_per_channel:
        raise _unimplemented("enable_separate_recognition_per_channel is not supported; channels are downmixed")
    if config.max_alternatives > 1:
        raise _unimplemented(f"one alternative is sent, not {config.max_alternatives}: set max_alternatives=1")
    if config.diarization_config.enable_speaker_diarization:
        raise _unimplemented("speaker diarization is not supported; set enable_speaker_diarization=false")
    ep = config.endpointing_config
    others = ("start_history", "start_threshold", "stop_threshold", "stop_history_eou", "stop_threshold_eou")
    set_fields = [name for name in others if getattr(ep, name) > 0]
    if set_fields:
        raise _unimplemented(
            f"endpointing_config {', '.join(set_fields)} are not supported; this server ends an utterance after "
            "stop_history ms of decoded audio without a new token (set only stop_history)"
        )


def _custom(config: rasr.RecognitionConfig) -> int | None:
    custom = dict(config.custom_configuration)
    unknown = sorted(set(custom) - set(CUSTOM_KEYS))
    if unknown:
        raise _invalid(
            f"custom_configuration keys {[log_safe(k, 40) for k in unknown]} are not supported; this server "
            f"takes {list(CUSTOM_KEYS)}"
        )
    if "latency_ms" not in custom:
        return None
    try:
        return int(custom["latency_ms"])
    except ValueError:
        raise _invalid(f"custom_configuration latency_ms must be an integer, got {custom['latency_ms']!r}") from None


def _boost(config: rasr.RecognitionConfig) -> tuple[tuple[str, ...], float | None]:
    phrases = [p for context in config.speech_contexts for p in context.phrases]
    boosts = {round(context.boost, 6) for context in config.speech_contexts if context.phrases}
    if len(boosts) > 1:
        raise _unimplemented(
            f"one boost for all speech_contexts is supported, got {sorted(boosts)}: give them the same boost"
        )
    boost = boosts.pop() if boosts else 0.0
    if boost < 0:
        raise _unimplemented("negative boosts (suppressing phrases) are not supported")
    if boost > 10:
        raise _invalid(f"speech_contexts boost must be in (0, 10] (0: the server's default), got {boost:g}")
    return tuple(phrases), (boost or None)


def recognition_settings(config: rasr.RecognitionConfig, interim_results: bool = False) -> RecognitionSettings:
    """What a Riva recognition config asks for, or its refusal (the model's own checks come when the stream opens).

    Raises:
        RequestError: UNIMPLEMENTED for a field the server cannot honour, INVALID_ARGUMENT for a bad value.

    """
    _refuse_unsupported(config)
    if config.sample_rate_hertz not in SUPPORTED_SAMPLE_RATES:
        raise _invalid(
            f"sample_rate_hertz must be one of {list(SUPPORTED_SAMPLE_RATES)}, got {config.sample_rate_hertz}"
        )
    channels = config.audio_channel_count or 1
    if not 1 <= channels <= 8:
        raise _invalid(f"audio_channel_count must be 1 to 8, got {config.audio_channel_count}")
    phrases, alpha = _boost(config)
    return RecognitionSettings(
        sample_rate=config.sample_rate_hertz,
        channels=channels,
        language=config.language_code or None,
        latency_ms=_custom(config),
        boost_phrases=phrases,
        boost_alpha=alpha,
        interim_results=interim_results,
        punctuation=config.enable_automatic_punctuation,
        word_times=config.enable_word_time_offsets,
        stop_history_ms=config.endpointing_config.stop_history or DEFAULT_STOP_HISTORY_MS,
    )


def _alternative(update: Transcript, settings: RecognitionSettings, language: str) -> rasr.SpeechRecognitionAlternative:
    text = update.text if settings.punctuation else plain_text(update.text)
    alternative = rasr.SpeechRecognitionAlternative(transcript=text, confidence=update.confidence or 0.0)
    if language:
        alternative.language_code.append(language)
    if update.is_final and settings.word_times:
        for word in update.words:
            alternative.words.add(
                word=word.text if settings.punctuation else plain_text(word.text),
                start_time=round(word.start_ms),
                end_time=round(word.end_ms),
                confidence=word.confidence,
                language_code=language,
            )
    return alternative


class RivaASRServicer(rasr_grpc.RivaSpeechRecognitionServicer):
    """``RivaSpeechRecognition`` on an :class:`ASRService`'s engine (its readiness, limits and metrics).

    Args:
        service: The ASR service (engine, limits, metrics; its WebSocket sessions share the engine's slots).
        access: Who may call.

    """

    def __init__(self, service: ASRService, access: GrpcAccess) -> None:
        self.service = service
        self.access = access
        self.draining = False
        self.open_calls = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def register(self, server: grpc.aio.Server) -> None:
        """Add this service to ``server``."""
        rasr_grpc.add_RivaSpeechRecognitionServicer_to_server(self, server)

    async def wait_idle(self) -> None:
        """Return once no recognition stream is open (at once if none is)."""
        await self._idle.wait()

    def _refused(self, error: RequestError) -> RequestError:
        self.service.metrics.refused.labels(f"grpc_{error.status.value}").inc()
        return error

    def _admit(self, context: grpc.aio.ServicerContext) -> None:
        """Token, readiness and capacity (engine slots, shared with the WebSocket sessions)."""
        self.access.check(context)
        service = self.service
        if not service.ready or self.draining:
            what = "draining for shutdown" if service.draining or self.draining else "still loading the model"
            raise RequestError(RequestStatus.UNAVAILABLE, f"the server is {what}; retry shortly or use another replica")
        if service.engine.open_streams >= service.max_sessions:
            raise RequestError(
                RequestStatus.RESOURCE_EXHAUSTED,
                f"all {service.max_sessions} ASR slots of this server are in use; retry later or elsewhere",
            )

    def _check_model(self, config: rasr.RecognitionConfig) -> None:
        if config.model and config.model != self.service.model_name:
            raise RequestError(
                RequestStatus.NOT_FOUND,
                f"model {log_safe(config.model, 80)!r} is not served here; leave model empty or name "
                f"{self.service.model_name!r}",
            )

    def _open(self, settings: RecognitionSettings):  # noqa: ANN202 - ASRStream
        engine = self.service.engine
        try:
            phrases = boost_limits(engine, self.service.config).check(settings.boost_phrases)
            return engine.open_stream(
                latency_ms=settings.latency_ms,
                language=settings.language,
                boost_phrases=phrases,
                boost_alpha=settings.boost_alpha,
            )
        except CapacityError as e:
            raise RequestError(RequestStatus.RESOURCE_EXHAUSTED, str(e)) from None
        except ValueError as e:  # language, latency mode, phrases: the message names the model's
            raise _invalid(str(e)) from None
        except NemotronEngineError as e:  # boosting unavailable, engine stopped
            raise RequestError(RequestStatus.UNAVAILABLE, str(e)) from None

    async def _start(
        self, request_iterator: AsyncIterator[rasr.StreamingRecognizeRequest], context: grpc.aio.ServicerContext
    ) -> RecognitionSession:
        try:
            self._admit(context)
            first = await anext(aiter(request_iterator), None)
            if first is None or not first.HasField("streaming_config"):
                raise _invalid("the first StreamingRecognizeRequest must carry streaming_config (then audio_content)")
            if first.runtime_config:
                raise _unimplemented("runtime_config is not supported")
            config = first.streaming_config.config
            self._check_model(config)
            settings = recognition_settings(config, first.streaming_config.interim_results)
            stream = self._open(settings)
        except RequestError as e:
            raise self._refused(e) from None
        name = f"Riva ASR call #{next(_ids)}"
        return RecognitionSession(stream, settings, self.service.config.max_backlog_ms, name)

    async def StreamingRecognize(  # noqa: N802 - the Riva proto's method name
        self,
        request_iterator: AsyncIterator[rasr.StreamingRecognizeRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        """Interim results and finals of the audio the call streams; utterances end by endpointing."""
        try:
            session = await self._start(request_iterator, context)
        except RequestError as e:
            await abort_with(context, e)
        metrics = self.service.metrics
        metrics.sessions.inc()
        metrics.grpc_streams.inc()
        self.open_calls += 1
        self._idle.clear()
        engine = self.service.engine
        engine.add_step_listener(session.on_step)
        loop = asyncio.get_running_loop()
        collector = loop.create_task(session.collect(), name=f"{session.name} results")
        reader = loop.create_task(self._read(request_iterator, session), name=f"{session.name} audio")
        how = "dropped"
        try:
            await self._send(context, session)
            await reader
            how = "client_close"
        except RequestError as e:
            logger.debug(f"{session.name} ended with {e.status.name}: {log_safe(e.message)}")
            await abort_with(context, e)
        except asyncio.CancelledError:
            how = "disconnect"
            raise
        finally:
            reader.cancel()
            collector.cancel()
            engine.remove_step_listener(session.on_step)
            await session.close()
            self.open_calls -= 1
            if not self.open_calls:
                self._idle.set()
            metrics.grpc_streams.dec()
            metrics.ended.labels(how).inc()
            metrics.audio_seconds.inc(session.audio_bytes / 2 / session.settings.channels / session.settings.sample_rate)

    async def _read(
        self, request_iterator: AsyncIterator[rasr.StreamingRecognizeRequest], session: RecognitionSession
    ) -> None:
        try:
            async for request in request_iterator:
                if request.HasField("streaming_config"):
                    raise _invalid("streaming_config may only be sent in the first request")
                await session.push(request.audio_content)
            await session.end_of_input()
        except RequestError as e:
            session.fail(e)

    async def _send(self, context: grpc.aio.ServicerContext, session: RecognitionSession) -> None:
        language = session.settings.language or ""
        finalize = self.service.metrics.finalize_seconds
        async for update in session.results():
            if update.is_final and update.ttf_ms is not None:
                finalize.observe(update.ttf_ms / 1000.0)
            if not update.text:
                continue
            result = rasr.StreamingRecognitionResult(
                alternatives=[_alternative(update, session.settings, language)],
                is_final=update.is_final,
                audio_processed=session.stream.audio_seconds,
            )
            response = rasr.StreamingRecognizeResponse(results=[result])
            if not await write_unless(context, response, session.abandoned):
                break
        if session.error is not None:
            raise session.error

    async def Recognize(  # noqa: N802 - the Riva proto's method name
        self, request: rasr.RecognizeRequest, context: grpc.aio.ServicerContext
    ) -> rasr.RecognizeResponse:
        """One clip, decoded whole (``engine.transcribe``)."""
        try:
            self._admit(context)
            self._check_model(request.config)
            settings = recognition_settings(request.config)
            if settings.boost_phrases:
                raise _unimplemented("speech_contexts are supported on StreamingRecognize only")
            if settings.channels != 1:
                raise _unimplemented("Recognize takes mono audio; use StreamingRecognize for several channels")
            try:
                final = await self.service.engine.transcribe(
                    request.audio, latency_ms=settings.latency_ms, sample_rate=settings.sample_rate,
                    language=settings.language,
                )
            except CapacityError as e:
                raise RequestError(RequestStatus.RESOURCE_EXHAUSTED, str(e)) from None
            except (InvalidAudioError, ValueError) as e:
                raise _invalid(str(e)) from None
        except RequestError as e:
            await abort_with(context, self._refused(e))
        result = rasr.SpeechRecognitionResult(audio_processed=len(request.audio) / 2 / settings.sample_rate)
        if final.text:
            result.alternatives.append(_alternative(final, settings, settings.language or ""))
        return rasr.RecognizeResponse(results=[result])

    async def GetRivaSpeechRecognitionConfig(  # noqa: N802 - the Riva proto's method name
        self, request: rasr.RivaSpeechRecognitionConfigRequest, context: grpc.aio.ServicerContext
    ) -> rasr.RivaSpeechRecognitionConfigResponse:
        """The served model: its name, languages, latency modes; streaming and offline.

        Answered without a token, as ``GetRivaSynthesisConfig`` is (Pipecat's services send their ``api_key``
        only with recognition and synthesis calls on a plaintext channel).
        """
        response = rasr.RivaSpeechRecognitionConfigResponse()
        config = response.model_config.add()
        config.model_name = self.service.model_name
        engine = self.service.engine
        languages: Sequence[str] = engine.info.languages if engine.running else ()
        config.parameters["language_code"] = ",".join(languages) or "en-US"
        config.parameters["type"] = "online"
        config.parameters["streaming"] = "true"
        if engine.running:
            config.parameters["latency_modes_ms"] = ",".join(str(m) for m in engine.info.latency_modes)
        return response
