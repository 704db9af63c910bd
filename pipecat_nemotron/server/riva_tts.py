"""Riva's ``RivaSpeechSynthesis`` service over the server's Magpie engine (:class:`RivaTTSServicer`).

``SynthesizeOnline`` streams each request's audio as the engine makes it; a call may carry several requests
(Pipecat's stitched mode), spoken in order. ``Synthesize`` returns one request's audio whole.
``GetRivaSynthesisConfig`` lists the voices (Pipecat's ``NvidiaTTSService`` calls it at setup).
:class:`RivaTTSServicer` serves them on a ``grpc.aio`` server; :class:`ServeRivaTTS` is the same three methods as
Ray Serve's gRPC proxy calls a deployment's (:mod:`~pipecat_nemotron.server.ray_tts`). Both speak a call's
requests through :func:`reply_audio`.

Honoured per request: ``text``, ``language_code`` (en, es, de, fr, it, vi, zh; regional codes map to them),
``voice_name`` (``Magpie-Multilingual.EN-US.Aria`` or a bare ``aria``; the locale in the name is not checked
against ``language_code``: every Magpie voice speaks every language), ``sample_rate_hz`` (0: the codec's own
22,050 Hz; otherwise resampled), ``encoding`` LINEAR_PCM (or unset), ``custom_configuration`` key ``seed``.
Refused with a status naming the field: other encodings, ``zero_shot_data``, ``custom_dictionary``,
``enable_word_time_offsets`` (UNIMPLEMENTED); other ``custom_configuration`` keys, empty or over-long text,
unknown voices and languages (INVALID_ARGUMENT).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import riva.client.proto.riva_audio_pb2 as raudio
import riva.client.proto.riva_tts_pb2 as rtts
import riva.client.proto.riva_tts_pb2_grpc as rtts_grpc
from loguru import logger

from pipecat_nemotron.server.errors import RequestError, RequestStatus
from pipecat_nemotron.server.grpc_common import GrpcAccess, abort_with, set_status, write_unless
from pipecat_nemotron.server.security import log_safe
from pipecat_nemotron.server.tts_host import SynthesisCall, SynthesisRequest, TTSHost
from pipecat_nemotron.tts.magpie import LANGUAGES, VOICES

__all__ = ["RivaTTSServicer", "ServeRivaTTS", "reply_audio", "riva_voice_name", "synthesis_request"]

#: The family name NVIDIA's Magpie NIM gives its voices (``Magpie-Multilingual.EN-US.Aria``).
VOICE_FAMILY = "Magpie-Multilingual"

#: ``custom_configuration`` keys a synthesis request may set.
CUSTOM_KEYS = ("seed",)

_PCM = (raudio.AudioEncoding.ENCODING_UNSPECIFIED, raudio.AudioEncoding.LINEAR_PCM)


def riva_voice_name(voice: str, locale: str = "EN-US") -> str:
    """The Riva name of a Magpie voice (``aria`` → ``Magpie-Multilingual.EN-US.Aria``)."""
    return f"{VOICE_FAMILY}.{locale}.{voice.capitalize()}"


def _voice(name: str) -> str | None:
    """The Magpie voice a Riva ``voice_name`` names (None: the default)."""
    name = name.strip()
    if not name:
        return None
    parts = name.split(".")
    if len(parts) == 1:
        voice = parts[0]
    elif len(parts) == 3 and parts[0].lower() == VOICE_FAMILY.lower():
        voice = parts[2]
    else:
        voice = ""
    if voice.lower() not in VOICES:
        raise RequestError(
            RequestStatus.INVALID_ARGUMENT,
            f"unknown voice {log_safe(name, 80)!r}; this server's voices are "
            f"{', '.join(riva_voice_name(v) for v in VOICES)} (or just {', '.join(VOICES)})",
        )
    return voice.lower()


def _seed(request: rtts.SynthesizeSpeechRequest) -> int | None:
    custom = dict(request.custom_configuration)
    unknown = sorted(set(custom) - set(CUSTOM_KEYS))
    if unknown:
        raise RequestError(
            RequestStatus.INVALID_ARGUMENT,
            f"custom_configuration keys {[log_safe(k, 40) for k in unknown]} are not supported; this server "
            f"takes {list(CUSTOM_KEYS)}",
        )
    if "seed" not in custom:
        return None
    try:
        seed = int(custom["seed"])
    except ValueError:
        seed = -1
    if seed < 0:
        raise RequestError(
            RequestStatus.INVALID_ARGUMENT, f"custom_configuration seed must be an integer >= 0, got {custom['seed']!r}"
        )
    return seed


def synthesis_request(request: rtts.SynthesizeSpeechRequest) -> SynthesisRequest:
    """A Riva request as the host takes it; refuses what the server cannot honour.

    Raises:
        RequestError: UNIMPLEMENTED for a field the server cannot honour, INVALID_ARGUMENT for a bad value.

    """
    if request.encoding not in _PCM:
        name = raudio.AudioEncoding.Name(request.encoding)
        raise RequestError(
            RequestStatus.UNIMPLEMENTED, f"encoding {name} is not supported; this server sends LINEAR_PCM only"
        )
    if request.HasField("zero_shot_data"):
        raise RequestError(
            RequestStatus.UNIMPLEMENTED, "zero_shot_data (voice cloning) is not supported: use a baked Magpie voice"
        )
    if request.custom_dictionary:
        raise RequestError(RequestStatus.UNIMPLEMENTED, "custom_dictionary (IPA pronunciations) is not supported")
    if request.enable_word_time_offsets:
        raise RequestError(RequestStatus.UNIMPLEMENTED, "enable_word_time_offsets is not supported")
    return SynthesisRequest(
        text=request.text,
        voice=_voice(request.voice_name),
        language=request.language_code or None,
        sample_rate_hz=request.sample_rate_hz,
        seed=_seed(request),
    )


def counted_request(host: TTSHost, request: rtts.SynthesizeSpeechRequest) -> SynthesisRequest:
    """:func:`synthesis_request`, counting a refusal on ``host``'s metrics."""
    try:
        return synthesis_request(request)
    except RequestError as e:
        host.refused(e)
        raise


async def reply_audio(
    host: TTSHost, requests: AsyncIterator[rtts.SynthesizeSpeechRequest], server_id: str | None = None
) -> AsyncIterator[tuple[SynthesisCall, rtts.SynthesizeSpeechResponse]]:
    """The responses of one ``SynthesizeOnline`` call: each request's audio as it is made, requests in order.

    The call is one :meth:`TTSHost.reply`, so a drain lets it finish. Close the generator (``aclose``) to end the
    call early: the running request's engine row is freed at once. With ``server_id`` (a Serve replica's), each
    response's ``id`` names the replica and the request (``<server_id>/<request number>``): which replica spoke.

    Yields:
        ``(the request's call, a response)``: the call's :attr:`~SynthesisCall.abandoned` tells a writer when to
        stop waiting on its client.

    Raises:
        RequestError: A request was refused, or its synthesis failed or was abandoned.

    """
    async with host.reply() as reply:
        async for request in requests:
            async with host.synthesize(counted_request(host, request), reply=reply) as call:
                async for audio in call.audio():
                    response = rtts.SynthesizeSpeechResponse(audio=audio)
                    if server_id is not None:
                        response.id.value = f"{server_id}/{call.stream.id}"
                    yield call, response


def synthesis_config(host: TTSHost) -> rtts.RivaSynthesisConfigResponse:
    """``GetRivaSynthesisConfig``'s answer: one entry per voice, with the languages it speaks and the codec's rate."""
    response = rtts.RivaSynthesisConfigResponse()
    for voice in VOICES:
        config = response.model_config.add()
        config.model_name = host.model_name
        config.parameters["voice_name"] = riva_voice_name(voice)
        config.parameters["subvoices"] = voice
        config.parameters["language_code"] = ",".join(LANGUAGES)
        config.parameters["sample_rate"] = str(host.sample_rate)
    return response


class RivaTTSServicer(rtts_grpc.RivaSpeechSynthesisServicer):
    """``RivaSpeechSynthesis`` on a :class:`TTSHost`.

    Args:
        host: The TTS host (engine, limits, metrics).
        access: Who may call.

    """

    def __init__(self, host: TTSHost, access: GrpcAccess) -> None:
        self.host = host
        self.access = access

    def register(self, server: grpc.aio.Server) -> None:
        """Add this service to ``server``."""
        rtts_grpc.add_RivaSpeechSynthesisServicer_to_server(self, server)

    async def wait_idle(self) -> None:
        """Return once no synthesis request runs."""
        await self.host.wait_idle()

    async def _admit(self, context: grpc.aio.ServicerContext) -> None:
        try:
            self.access.check(context)
        except RequestError as e:
            self.host.refused(e)
            await abort_with(context, e)

    async def SynthesizeOnline(  # noqa: N802 - the Riva proto's method name
        self,
        request_iterator: AsyncIterator[rtts.SynthesizeSpeechRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        """Stream each request's audio as soon as it is made; requests of one call are spoken in order.

        Written with ``context.write`` (not as a generator): a cancelled call is cancelled inside this frame, so
        the request's engine row is freed at once; a client that stops reading ends its call alone.
        """
        await self._admit(context)
        responses = reply_audio(self.host, request_iterator)
        try:
            async for call, response in responses:
                if not await write_unless(context, response, call.abandoned):
                    raise call.error or RequestError(RequestStatus.UNAVAILABLE, "the call was abandoned")
        except RequestError as e:
            # The request ends (its row freed, its outcome counted) before the abort, which waits for a client
            # that stopped reading.
            await responses.aclose()
            logger.debug(f"Riva TTS call ended with {e.status.name}: {log_safe(e.message)}")
            await abort_with(context, e)
        finally:
            await responses.aclose()

    async def Synthesize(  # noqa: N802 - the Riva proto's method name
        self, request: rtts.SynthesizeSpeechRequest, context: grpc.aio.ServicerContext
    ) -> rtts.SynthesizeSpeechResponse:
        """One request's audio, whole."""
        await self._admit(context)
        try:
            async with self.host.synthesize(counted_request(self.host, request)) as call:
                audio = b"".join([piece async for piece in call.audio()])
        except RequestError as e:
            await abort_with(context, e)
        return rtts.SynthesizeSpeechResponse(audio=audio)

    async def GetRivaSynthesisConfig(  # noqa: N802 - the Riva proto's method name
        self, request: rtts.RivaSynthesisConfigRequest, context: grpc.aio.ServicerContext
    ) -> rtts.RivaSynthesisConfigResponse:
        """The voices: one entry per voice, with the languages it speaks and the codec's rate.

        Answered without a token: Pipecat's ``NvidiaTTSService`` calls it at setup without its call metadata (on a
        plaintext channel its ``api_key`` travels only with the synthesis calls). It shows the model's file name
        and the voices, nothing of the host.
        """
        return synthesis_config(self.host)


class ServeRivaTTS:
    """``RivaSpeechSynthesis`` as Ray Serve's gRPC proxy calls a deployment: the replica's methods delegate here.

    Serve hands each method the request (or, for ``SynthesizeOnline``, an async iterator of requests) and a
    ``RayServegRPCContext`` (metadata, peer; a status set on it before an exception reaches the client). A
    streaming method is an async generator; Serve closes it when the client goes away, which frees the running
    request's engine row. The client's own pace does not reach the replica (Serve reads every response into its
    queues), so a client that stops reading is not detected here, unlike on :class:`RivaTTSServicer`.

    Args:
        host: The replica's TTS host.
        access: Who may call.
        server_id: The replica's id, which each response's ``id`` carries (:func:`reply_audio`).

    """

    def __init__(self, host: TTSHost, access: GrpcAccess, server_id: str) -> None:
        self.host = host
        self.access = access
        self.server_id = server_id

    def _refuse(self, context: Any, error: RequestError) -> RequestError:
        set_status(context, error)
        return error

    def _admit(self, context: Any) -> None:
        try:
            self.access.check(context)
        except RequestError as e:
            self.host.refused(e)
            raise self._refuse(context, e) from None

    async def synthesize_online(
        self, requests: AsyncIterator[rtts.SynthesizeSpeechRequest], context: Any
    ) -> AsyncIterator[rtts.SynthesizeSpeechResponse]:
        """``SynthesizeOnline``: each request's audio as it is made; requests of one call in order.

        Raises:
            RequestError: Refused or failed (its status set on ``context``).

        """
        self._admit(context)
        responses = reply_audio(self.host, requests, self.server_id)
        try:
            async for _call, response in responses:
                yield response
        except RequestError as e:
            logger.debug(f"Riva TTS call ended with {e.status.name}: {log_safe(e.message)}")
            raise self._refuse(context, e) from None
        finally:
            await responses.aclose()

    async def synthesize(self, request: rtts.SynthesizeSpeechRequest, context: Any) -> rtts.SynthesizeSpeechResponse:
        """``Synthesize``: one request's audio, whole.

        Raises:
            RequestError: Refused or failed (its status set on ``context``).

        """
        self._admit(context)
        try:
            async with self.host.synthesize(counted_request(self.host, request)) as call:
                audio = b"".join([piece async for piece in call.audio()])
        except RequestError as e:
            raise self._refuse(context, e) from None
        return rtts.SynthesizeSpeechResponse(audio=audio)

    def config(self) -> rtts.RivaSynthesisConfigResponse:
        """``GetRivaSynthesisConfig``: the voices (answered without a token, as on :class:`RivaTTSServicer`)."""
        return synthesis_config(self.host)
