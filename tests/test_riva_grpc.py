"""NVIDIA Riva's gRPC API on the model server: Pipecat's own NvidiaSTTService / NvidiaTTSService as real clients.

The server (tiny ASR + tiny random Magpie, CPU) runs on an event loop of its own in a thread, as it would in its own
process: Pipecat's ``NvidiaTTSService`` makes a blocking gRPC call at setup, which would otherwise hold the loop
the server answers on. Everything is loopback; nothing waits on the clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import riva.client.proto.riva_asr_pb2 as rasr
import riva.client.proto.riva_asr_pb2_grpc as rasr_grpc
import riva.client.proto.riva_tts_pb2 as rtts
import riva.client.proto.riva_tts_pb2_grpc as rtts_grpc
from helpers import (
    MAGPIE_CODEC_RATE,
    MAGPIE_SAMPLES_PER_FRAME,
    TOKEN,
    Until,
    audio_frames,
    clip,
    engine_config,
    one_torch_thread,
    run_steps,
    wait_for,
)
from pipecat.frames.frames import (
    ErrorFrame,
    InterimTranscriptionFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
)
from pipecat.services.nvidia.stt import NvidiaSTTService
from pipecat.services.nvidia.tts import NvidiaTTSService
from pipecat.tests.utils import run_test

from pipecat_nemotron.asr import NemotronEngine
from pipecat_nemotron.server.app import ASRServer, ServerConfig, TTSHost, TTSHostConfig
from pipecat_nemotron.tts.magpie import MagpieEngine

#: Codec frames the tiny Magpie (which never ends its speech) makes per request.
FRAMES = 12

#: 1 s of silence at 16 kHz: more than the endpointing's stop_history (320 ms, Pipecat's default) plus a chunk.
SILENCE = bytes(32000)


class ServerThread:
    """An :class:`ASRServer` with ASR, TTS and gRPC on an event loop of its own (a thread), as a process would."""

    def __init__(self, asr_model: Path, magpie: MagpieEngine, **config: Any) -> None:
        self._asr_model = asr_model
        self._magpie = magpie
        self._config = config
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="riva-test-server", daemon=True)
        self.server: ASRServer | None = None
        self.asr: NemotronEngine | None = None

    def call(self, coro: Any, timeout: float = 300.0) -> Any:
        """Run ``coro`` on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self) -> None:
        self.asr = NemotronEngine(engine_config(self._asr_model))
        await self.asr.start()
        tts = {"max_duration_s": (FRAMES - 0.5) * MAGPIE_SAMPLES_PER_FRAME / MAGPIE_CODEC_RATE}
        tts.update(self._config.pop("tts", {}))
        host = TTSHost(TTSHostConfig(**tts), engine=self._magpie)
        config = ServerConfig(port=0, grpc_port=0, tokens=(TOKEN,), **self._config)
        self.server = ASRServer(self.asr, config, tts=host)
        await self.server.start()

    async def _stop(self) -> None:
        assert self.server is not None and self.asr is not None
        await self.server.stop(drain_timeout_s=0)  # idempotent: a test may have stopped it
        await self.asr.stop()

    def __enter__(self) -> ServerThread:
        self._thread.start()
        self.call(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.call(self._stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    @property
    def address(self) -> str:
        assert self.server is not None and self.server.grpc_address is not None
        return self.server.grpc_address

    @property
    def tts(self) -> TTSHost:
        assert self.server is not None and self.server.tts is not None
        return self.server.tts


@pytest.fixture(scope="module")
def magpie(tiny_magpie: tuple[Path, Path]) -> Iterator[MagpieEngine]:
    magpie_path, codec = tiny_magpie
    with one_torch_thread():
        engine = MagpieEngine(str(magpie_path), device="cpu", codec_model_path=str(codec))
        engine.wait_until_ready(timeout=300)
        try:
            yield engine
        finally:
            engine.close()


@pytest.fixture(scope="module")
def served(asr_model: Path, magpie: MagpieEngine) -> Iterator[ServerThread]:
    with ServerThread(asr_model, magpie) as server:
        yield server


def _metadata(token: str | None = TOKEN) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")] if token else []


@contextlib.contextmanager
def channel(served: ServerThread, options: list[tuple[str, int]] | None = None) -> Iterator[grpc.Channel]:
    ch = grpc.insecure_channel(served.address, options=options)
    try:
        yield ch
    finally:
        ch.close()


def _tts_request(text: str = "Hello there.", **fields: Any) -> rtts.SynthesizeSpeechRequest:
    fields.setdefault("language_code", "en-US")
    fields.setdefault("sample_rate_hz", MAGPIE_CODEC_RATE)
    fields.setdefault("voice_name", "Magpie-Multilingual.EN-US.Aria")
    return rtts.SynthesizeSpeechRequest(text=text, **fields)


def _synthesize_online(ch: grpc.Channel, *requests: rtts.SynthesizeSpeechRequest, token: str | None = TOKEN) -> bytes:
    stub = rtts_grpc.RivaSpeechSynthesisStub(ch)
    return b"".join(r.audio for r in stub.SynthesizeOnline(iter(requests), metadata=_metadata(token)))


# ---- TTS ---------------------------------------------------------------------------------------------------


async def test_pipecat_tts_service_gets_streamed_audio(served: ServerThread) -> None:
    tts = NvidiaTTSService(server=served.address, api_key=TOKEN, use_ssl=False, sample_rate=16000)
    down, up = await run_test(tts, frames_to_send=[TTSSpeakFrame(text="Hello there, from the model server.")])
    assert not [f for f in up if isinstance(f, ErrorFrame)]
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    assert len(audio) > 1, "the audio arrives in several chunks, as it is made"
    total = sum(len(f.audio) for f in audio) // 2
    assert total == round(FRAMES * MAGPIE_SAMPLES_PER_FRAME * 16000 / MAGPIE_CODEC_RATE)


def test_two_concurrent_requests_give_the_audio_each_gives_alone(served: ServerThread) -> None:
    seeded = [
        _tts_request("The first seeded sentence.", custom_configuration={"seed": "11"}),
        _tts_request("A second one, seeded too.", custom_configuration={"seed": "12"}, voice_name="leo"),
    ]
    with channel(served) as ch:
        alone = [_synthesize_online(ch, r) for r in seeded]
        results: list[bytes] = [b"", b""]

        def run(i: int) -> None:
            results[i] = _synthesize_online(ch, seeded[i])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    for a, b in zip(alone, results, strict=True):
        x, y = np.frombuffer(a, np.int16), np.frombuffer(b, np.int16)
        assert len(x) == len(y) == FRAMES * MAGPIE_SAMPLES_PER_FRAME
        # test_magpie_batching's tolerance for a batched row against the same request alone: float rounding.
        assert np.abs(x.astype(np.int32) - y).max() <= 2


def test_tts_bad_input_gets_a_clear_status_and_the_server_goes_on(served: ServerThread) -> None:
    cases = [
        (_tts_request("   "), grpc.StatusCode.INVALID_ARGUMENT, "empty"),
        (_tts_request("word " * 1000), grpc.StatusCode.INVALID_ARGUMENT, "at most 2000"),
        (_tts_request(voice_name="Magpie-Multilingual.EN-US.Bob"), grpc.StatusCode.INVALID_ARGUMENT, "unknown voice"),
        (_tts_request(language_code="ja-JP"), grpc.StatusCode.INVALID_ARGUMENT, "does not speak"),
        (_tts_request(custom_dictionary="NVIDIA  ɛn"), grpc.StatusCode.UNIMPLEMENTED, "custom_dictionary"),
        (_tts_request(encoding=3), grpc.StatusCode.UNIMPLEMENTED, "LINEAR_PCM"),
    ]
    with channel(served) as ch:
        for request, code, words in cases:
            with pytest.raises(grpc.RpcError) as refused:
                _synthesize_online(ch, request)
            assert refused.value.code() == code and words in refused.value.details()
        assert len(_synthesize_online(ch, _tts_request())) == 2 * FRAMES * MAGPIE_SAMPLES_PER_FRAME


def test_auth_is_refused_without_a_token(served: ServerThread) -> None:
    with channel(served) as ch:
        for token in (None, "wrong-token-0123456789"):
            with pytest.raises(grpc.RpcError) as refused:
                _synthesize_online(ch, _tts_request(), token=token)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "Bearer" in refused.value.details() and TOKEN not in refused.value.details()
            stub = rasr_grpc.RivaSpeechRecognitionStub(ch)
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.StreamingRecognize(iter([]), metadata=_metadata(token)))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # The config RPCs answer without a token (Pipecat's NvidiaTTSService sends none with them).
        config = rtts_grpc.RivaSpeechSynthesisStub(ch).GetRivaSynthesisConfig(rtts.RivaSynthesisConfigRequest())
        assert "Magpie-Multilingual.EN-US.Aria" in [c.parameters["voice_name"] for c in config.model_config]


# ---- ASR ---------------------------------------------------------------------------------------------------


async def test_pipecat_stt_service_gets_interim_and_final_transcripts(served: ServerThread) -> None:
    pcm = clip()
    assert served.asr is not None
    expected = served.call(served.asr.transcribe(pcm)).text
    assert expected, "the bundled model hears the bundled demo WAV"
    stt = NvidiaSTTService(server=served.address, api_key=TOKEN, use_ssl=False, sample_rate=16000)
    down, up = await run_steps(
        stt,
        [
            *audio_frames(pcm + SILENCE),
            Until("the final", lambda down, _up: any(isinstance(f, TranscriptionFrame) for f in down)),
        ],
    )
    finals = [f for f in down if isinstance(f, TranscriptionFrame)]
    interims = [f for f in down if isinstance(f, InterimTranscriptionFrame)]
    assert [f.text for f in finals] == [expected] and finals[0].finalized
    assert interims and down.index(interims[0]) < down.index(finals[0])
    assert not [f for f in up if isinstance(f, ErrorFrame)]


def _recognize_stream(
    ch: grpc.Channel, config: rasr.RecognitionConfig, audio: bytes, interim: bool = True
) -> list[rasr.StreamingRecognizeResponse]:
    def requests() -> Iterator[rasr.StreamingRecognizeRequest]:
        yield rasr.StreamingRecognizeRequest(
            streaming_config=rasr.StreamingRecognitionConfig(config=config, interim_results=interim)
        )
        for i in range(0, len(audio), 3200):
            yield rasr.StreamingRecognizeRequest(audio_content=audio[i : i + 3200])

    stub = rasr_grpc.RivaSpeechRecognitionStub(ch)
    return list(stub.StreamingRecognize(requests(), metadata=_metadata()))


def _config(**fields: Any) -> rasr.RecognitionConfig:
    fields.setdefault("sample_rate_hertz", 16000)
    fields.setdefault("language_code", "en-US")
    fields.setdefault("verbatim_transcripts", True)
    fields.setdefault("enable_automatic_punctuation", True)
    return rasr.RecognitionConfig(**fields)


def test_half_close_ends_the_utterance_with_its_final_and_word_times(served: ServerThread) -> None:
    pcm = clip("demo_timer.wav", seed=66)
    assert served.asr is not None
    expected = served.call(served.asr.transcribe(pcm)).text
    with channel(served) as ch:
        responses = _recognize_stream(ch, _config(enable_word_time_offsets=True), pcm)
    finals = [r.results[0] for r in responses if r.results[0].is_final]
    assert [f.alternatives[0].transcript for f in finals] == [expected]
    words = finals[0].alternatives[0].words
    assert [w.word for w in words] == expected.split()
    assert all(0 <= w.start_time <= w.end_time for w in words)


def test_recognize_config_and_boosted_phrases(served: ServerThread) -> None:
    pcm = clip()
    assert served.asr is not None
    expected = served.call(served.asr.transcribe(pcm)).text
    with channel(served) as ch:
        stub = rasr_grpc.RivaSpeechRecognitionStub(ch)
        whole = stub.Recognize(rasr.RecognizeRequest(config=_config(), audio=pcm), metadata=_metadata())
        assert whole.results[0].alternatives[0].transcript == expected
        model = stub.GetRivaSpeechRecognitionConfig(rasr.RivaSpeechRecognitionConfigRequest()).model_config[0]
        assert model.parameters["streaming"] == "true" and "160" in model.parameters["latency_modes_ms"]
        boosted = _config(speech_contexts=[rasr.SpeechContext(phrases=["Friday"], boost=4.0)])
        finals = [r for r in _recognize_stream(ch, boosted, pcm) if r.results[0].is_final]
        assert len(finals) == 1 and finals[0].results[0].alternatives[0].transcript


def test_several_requests_on_one_call_are_spoken_in_order(served: ServerThread) -> None:
    with channel(served) as ch:
        one = [_synthesize_online(ch, _tts_request(t, custom_configuration={"seed": "5"})) for t in ("One.", "Two.")]
        both = _synthesize_online(
            ch, *(_tts_request(t, custom_configuration={"seed": "5"}) for t in ("One.", "Two."))
        )
    assert both == one[0] + one[1]


def test_asr_fields_it_cannot_honour_are_refused_by_name(served: ServerThread) -> None:
    cases = [
        (_config(profanity_filter=True), grpc.StatusCode.UNIMPLEMENTED, "profanity_filter"),
        (_config(verbatim_transcripts=False), grpc.StatusCode.UNIMPLEMENTED, "verbatim_transcripts=true"),
        (_config(max_alternatives=3), grpc.StatusCode.UNIMPLEMENTED, "max_alternatives=1"),
        (_config(sample_rate_hertz=0), grpc.StatusCode.INVALID_ARGUMENT, "sample_rate_hertz"),
        (_config(language_code="de-DE"), grpc.StatusCode.INVALID_ARGUMENT, "English only"),
        (_config(custom_configuration={"beam": "4"}), grpc.StatusCode.INVALID_ARGUMENT, "latency_ms"),
        (
            _config(endpointing_config=rasr.EndpointingConfig(start_history=200)),
            grpc.StatusCode.UNIMPLEMENTED,
            "start_history",
        ),
        (
            _config(speech_contexts=[rasr.SpeechContext(phrases=["Friday"], boost=50.0)]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "(0, 10]",
        ),
    ]
    with channel(served) as ch:
        for config, code, words in cases:
            with pytest.raises(grpc.RpcError) as refused:
                _recognize_stream(ch, config, clip()[:3200])
            assert refused.value.code() == code and words in refused.value.details(), refused.value.details()
    assert served.asr is not None
    assert served.call(_open_streams(served.asr)) == 0


async def _open_streams(engine: NemotronEngine) -> int:
    return engine.open_streams


def test_metrics_count_tts_and_grpc_calls(served: ServerThread) -> None:
    import urllib.request

    assert served.server is not None
    with channel(served) as ch:
        _synthesize_online(ch, _tts_request())
    request = urllib.request.Request(
        f"{served.server.http_url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
        text = response.read().decode()
    info = urllib.request.Request(f"{served.server.http_url}/v1/info", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(info, timeout=10) as response:  # noqa: S310 - loopback
        assert '"voices": ["john", "sofia", "aria", "jason", "leo"]' in response.read().decode()
    for name in (
        "nemotron_tts_first_audio_seconds_count",
        "nemotron_tts_real_time_factor_count",
        'nemotron_tts_requests_total{outcome="truncated"}',
        "nemotron_tts_active_streams",
        "nemotron_asr_grpc_streams",
    ):
        assert name in text, name



# ---- long requests: cancel, a client that stops reading, drain ------------------------------------------------


def _outcomes(server: ServerThread, outcome: str) -> float:
    return server.tts.metrics.registry.get_sample_value("nemotron_tts_requests_total", {"outcome": outcome}) or 0.0


@pytest.fixture(scope="module")
def long_tts(asr_model: Path, magpie: MagpieEngine) -> Iterator[ServerThread]:
    """A server whose (never-ending) tiny Magpie runs each request to 20 s of audio, with 0.5 s of it buffered: a
    client that takes nothing for ``stall_timeout_s`` (5 s) while its buffer is full has stopped reading."""
    with ServerThread(asr_model, magpie, tts={"max_duration_s": 20.0, "max_buffered_s": 0.5}) as server:
        yield server


def test_a_client_cancel_frees_the_engine_row(long_tts: ServerThread, magpie: MagpieEngine) -> None:
    with channel(long_tts) as ch:
        call = rtts_grpc.RivaSpeechSynthesisStub(ch).SynthesizeOnline(iter([_tts_request()]), metadata=_metadata())
        assert next(call).audio, "audio streams before the request is done"
        call.cancel()
        long_tts.call(wait_for(lambda: _outcomes(long_tts, "cancelled") >= 1, 60, "the cancel to reach the engine"))
    assert long_tts.tts.active_streams == 0
    long_tts.call(wait_for(lambda: not magpie.busy, 60, "the engine row to be freed"))


#: A client whose transport takes no more than HTTP/2's first 64 KiB window ahead of its reads (gRPC's default
#: probing would grow the window to take a whole request's audio, so the server would never see it stop reading).
SMALL_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 65536)]


def test_a_client_that_stops_reading_is_cancelled_alone(long_tts: ServerThread) -> None:
    with channel(long_tts, SMALL_WINDOW) as ch:
        stub = rtts_grpc.RivaSpeechSynthesisStub(ch)
        stalled = stub.SynthesizeOnline(iter([_tts_request("I will not be read.")]), metadata=_metadata())
        long_tts.call(wait_for(lambda: _outcomes(long_tts, "client_stalled") >= 1, 120, "the stalled call to end"))
        reader = stub.SynthesizeOnline(iter([_tts_request("I am read.")]), metadata=_metadata())
        heard = b"".join(r.audio for r in reader)
        with pytest.raises(grpc.RpcError) as ended:
            for _ in stalled:
                pass
    assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "stopped reading" in ended.value.details()
    assert len(heard) == 2 * round(20.0 * MAGPIE_CODEC_RATE / MAGPIE_SAMPLES_PER_FRAME + 0.5) * MAGPIE_SAMPLES_PER_FRAME


def test_a_client_that_reads_slowly_gets_all_its_audio(asr_model: Path, magpie: MagpieEngine) -> None:
    """A client that takes one message, then nothing until the engine has made the whole reply (its buffer far
    past ``max_buffered_s`` all along), is slow, not gone: it gets every sample."""
    tts = {"max_duration_s": 20.0, "max_buffered_s": 0.5, "stall_timeout_s": 600.0}
    with ServerThread(asr_model, magpie, tts=tts) as server, channel(server, SMALL_WINDOW) as ch:
        call = rtts_grpc.RivaSpeechSynthesisStub(ch).SynthesizeOnline(
            iter([_tts_request("I read slowly.")]), metadata=_metadata()
        )
        first = next(call).audio
        server.call(wait_for(lambda: not magpie.busy, 120, "the engine to make the whole reply"))
        rest = b"".join(r.audio for r in call)
        assert _outcomes(server, "client_stalled") == 0
    assert len(first + rest) == 2 * round(20.0 * MAGPIE_CODEC_RATE / MAGPIE_SAMPLES_PER_FRAME + 0.5) * MAGPIE_SAMPLES_PER_FRAME


def test_the_documented_synthesis_buffer_defaults() -> None:
    """docs/RIVA.md: a synthesis client is cancelled with 30 s of audio unsent and nothing taken for 5 s."""
    from pipecat_nemotron.server.tts_config import TTSHostConfig

    config = TTSHostConfig()
    assert (config.max_buffered_s, config.stall_timeout_s) == (30.0, 5.0)
    with pytest.raises(ValueError, match="stall_timeout_s"):
        TTSHostConfig(stall_timeout_s=0)


def test_drain_refuses_new_calls_and_lets_running_ones_finish(asr_model: Path, magpie: MagpieEngine) -> None:
    """A running reply is spoken to its end, its sentences sent after the drain began included (Pipecat sends a
    reply's sentences on one call as the LLM writes them); a new call is refused."""
    server = ServerThread(asr_model, magpie, tts={"max_duration_s": 3.0}).__enter__()
    next_sentence = threading.Event()

    def reply() -> Iterator[rtts.SynthesizeSpeechRequest]:
        yield _tts_request("Finish me.")
        next_sentence.wait(120)
        yield _tts_request("And my next sentence.")

    try:
        with channel(server) as ch:
            stub = rtts_grpc.RivaSpeechSynthesisStub(ch)
            running = stub.SynthesizeOnline(reply(), metadata=_metadata())
            first = next(running).audio
            assert server.server is not None
            stopping = asyncio.run_coroutine_threadsafe(server.server.stop(drain_timeout_s=60), server._loop)
            server.call(wait_for(lambda: server.tts.draining, 30, "the drain to begin"))
            with pytest.raises(grpc.RpcError) as refused:
                _synthesize_online(ch, _tts_request("Too late."))
            next_sentence.set()
            rest = b"".join(r.audio for r in running)
            stopping.result(120)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        frames = round(3.0 * MAGPIE_CODEC_RATE / MAGPIE_SAMPLES_PER_FRAME + 0.5)
        assert len(first + rest) == 2 * 2 * frames * MAGPIE_SAMPLES_PER_FRAME, "the running reply got all its audio"
    finally:
        server.__exit__()


def test_punctuation_off_is_riva_plain_text() -> None:
    from pipecat_nemotron.server.recognition import plain_text

    assert plain_text("Set a timer, please. Don't 'wait'!") == "set a timer please don't wait"


# ---- one process, either model --------------------------------------------------------------------------------


async def test_a_tts_only_server_serves_no_asr_and_is_ready(magpie: MagpieEngine) -> None:
    import aiohttp

    host = TTSHost(TTSHostConfig(max_duration_s=0.2), engine=magpie)
    server = ASRServer(None, ServerConfig(port=0, grpc_port=0, tokens=(TOKEN,)), tts=host)
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{server.http_url}/readyz") as ready:
                assert ready.status == 200
            async with http.get(f"{server.http_url}{server.config.path}") as ws:
                assert ws.status == 404
        async with grpc.aio.insecure_channel(server.grpc_address) as ch:
            stub = rasr_grpc.RivaSpeechRecognitionStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetRivaSpeechRecognitionConfig(rasr.RivaSpeechRecognitionConfigRequest())
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(drain_timeout_s=0)
    assert not magpie.closed, "the server leaves an engine it was given to its owner"


async def test_tts_capacity_and_the_auth_lockout(magpie: MagpieEngine) -> None:
    host = TTSHost(TTSHostConfig(max_duration_s=20.0, max_streams=1), engine=magpie)
    config = ServerConfig(port=0, grpc_port=0, tokens=(TOKEN,), auth_max_failures=2)
    server = ASRServer(None, config, tts=host)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.grpc_address) as ch:
            stub = rtts_grpc.RivaSpeechSynthesisStub(ch)
            running = stub.SynthesizeOnline(iter([_tts_request("Hold the only slot.")]), metadata=_metadata())
            assert (await running.read()).audio
            with pytest.raises(grpc.aio.AioRpcError) as full:
                await stub.Synthesize(_tts_request(), metadata=_metadata())
            assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "slots" in full.value.details()
            running.cancel()
            for _ in range(2):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Synthesize(_tts_request(), metadata=_metadata("wrong-token-0123456789"))
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as locked:
                await stub.Synthesize(_tts_request(), metadata=_metadata())
            assert locked.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "retry after" in locked.value.details()
    finally:
        await server.stop(drain_timeout_s=0)


def test_serve_flags_name_the_fix() -> None:
    from pipecat_nemotron.cli import build_parser, serve_configs, serve_tts_config

    def tts(*argv: str):
        return serve_tts_config(build_parser().parse_args(["serve", "--insecure", *argv]))

    with pytest.raises(ValueError, match="add --tts-model"):
        tts("--no-asr")
    with pytest.raises(ValueError, match="add --grpc-port"):
        tts("--tts-model", "m.nemo")
    with pytest.raises(ValueError, match="--tts-max-streams"):
        tts("--tts-model", "m.nemo", "--grpc-port", "50051", "--tts-max-streams", "0")
    with pytest.raises(ValueError, match="port of its own"):
        serve_configs(build_parser().parse_args(["serve", "--insecure", "--grpc-port", "8765"]))
    with pytest.raises(ValueError, match="--tts-max-duration-s"):
        tts("--tts-model", "m.nemo", "--grpc-port", "50051", "--tts-max-duration-s", "0")
    config = tts("--tts-model", "m.nemo", "--grpc-port", "50051", "--device", "cpu", "--tts-max-duration-s", "2.5")
    assert config is not None and (config.model, config.device, config.max_duration_s) == ("m.nemo", "cpu", 2.5)
    assert tts() is None
