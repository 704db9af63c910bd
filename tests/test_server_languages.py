"""The ASR server and its Pipecat client on a multilingual model: languages and the model's own latency modes.

A random-weight tiny model of the multilingual prompt class (en-US, es-ES, de-DE and auto; the five modes of
the family, 320 ms included) is served on loopback, as in ``test_server.py``.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest
import pytest_asyncio
from helpers import noise_clip, run_language_switches, started_engine, to_pcm16
from pipecat.frames.frames import (
    InterimTranscriptionFrame,
)
from pipecat.transcriptions.language import Language
from websockets.exceptions import ConnectionClosed
from ws_client import open_session, raw_messages, stream

from pipecat_nemotron.asr import NemotronEngine
from pipecat_nemotron.server.app import ASRServer, ServerConfig
from pipecat_nemotron.server.protocol import (
    CloseCode,
    ConfigMessage,
    ErrorMessage,
    ReadyMessage,
    SetLanguageMessage,
    SetLatencyMessage,
)
from pipecat_nemotron.stt.remote.service import NemotronServerSTTService

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODES = (80, 160, 320, 560, 1120)
LANGUAGES = ("en-US", "es-ES", "de-DE", "auto")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tiny_multilingual_random_model):
    async with started_engine(tiny_multilingual_random_model, one_thread=True, finalize_mode="hard", warmup=False) as eng:
        yield eng


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(engine: NemotronEngine):
    srv = ASRServer(engine, ServerConfig(port=0, insecure=True, idle_timeout_s=10.0))
    await srv.start()
    yield srv
    await srv.stop(drain_timeout_s=0)


def clip(seed: int, seconds: float = 1.2) -> bytes:
    return to_pcm16(noise_clip(seconds, seed=seed))


async def test_session_in_spanish_then_german_from_the_next_utterance(
    server: ASRServer, engine: NemotronEngine
) -> None:
    a, b, c = clip(90), clip(91), clip(92)
    expected = [
        await engine.transcribe(a, latency_ms=320, language="es-ES"),
        await engine.transcribe(b, latency_ms=320, language="es-ES"),
        await engine.transcribe(c, latency_ms=320, language="de-DE"),
    ]
    ws, ready = await open_session(server.url, ConfigMessage(latency_ms=320, language="es"))
    assert isinstance(ready, ReadyMessage), ready
    assert ready.latency_modes == MODES and ready.languages == LANGUAGES
    assert (ready.latency_ms, ready.language) == (320, "es-ES") and "language" in ready.features
    for pcm in (a, b):
        await stream(ws, pcm)
        await ws.send('{"type": "finalize"}')
    await ws.send(SetLanguageMessage("de").to_json())  # a final is pending: from the next utterance
    await ws.send(SetLanguageMessage("fr").to_json())  # refused, the session goes on
    await ws.send(SetLatencyMessage(240).to_json())  # a multiple of 80 the model lacks: refused too
    await stream(ws, c)
    await ws.send('{"type": "finalize"}')
    await ws.send('{"type": "close"}')
    messages = await raw_messages(ws)
    assert ws.close_code == CloseCode.NORMAL, messages[-3:]
    finals = [m for m in messages if m["type"] == "final"]
    assert [f["text"] for f in finals] == [e.text for e in expected]
    assert [f["language"] for f in finals] == ["es-ES", "es-ES", "de-DE"]
    partials = [m for m in messages if m["type"] == "partial"]
    assert partials and all(p["language"] in ("es-ES", "de-DE") for p in partials)
    assert [m for m in messages if m["type"] == "language"] == [
        {"type": "language", "language": "de-DE", "applied": "next_utterance"}
    ]
    errors = [m for m in messages if m["type"] == "error"]
    assert len(errors) == 2 and not any(e["fatal"] for e in errors), errors
    assert "'fr'" in errors[0]["message"] and "['en-US', 'es-ES', 'de-DE']" in errors[0]["message"]
    assert "[80, 160, 320, 560, 1120]" in errors[1]["message"]


async def test_language_the_model_lacks_is_refused_with_the_models_list(server: ASRServer) -> None:
    ws, answer = await open_session(server.url, ConfigMessage(language="fr-FR"))
    assert isinstance(answer, ErrorMessage) and answer.code == CloseCode.PROTOCOL_ERROR and answer.fatal
    assert "'fr-FR'" in answer.message and "['en-US', 'es-ES', 'de-DE'] or auto" in answer.message
    with contextlib.suppress(ConnectionClosed):
        await asyncio.wait_for(ws.recv(), 5)
    assert ws.close_code == CloseCode.PROTOCOL_ERROR
    # A locale the model lacks is refused too, not mapped to another locale of its language (en-US here).
    ws, answer = await open_session(server.url, ConfigMessage(language="en-GB"))
    assert isinstance(answer, ErrorMessage) and answer.code == CloseCode.PROTOCOL_ERROR and answer.fatal
    assert "'en-GB'" in answer.message and "['en-US', 'es-ES', 'de-DE'] or auto" in answer.message
    with contextlib.suppress(ConnectionClosed):
        await asyncio.wait_for(ws.recv(), 5)
    ws, answer = await open_session(server.url, ConfigMessage(language="en-XX-\x1b]0;pwned\x07"))
    assert isinstance(answer, ErrorMessage) and answer.code == CloseCode.PROTOCOL_ERROR
    with contextlib.suppress(ConnectionClosed):
        await asyncio.wait_for(ws.recv(), 5)
    ws, ready = await open_session(server.url, ConfigMessage(language="en"))  # a bare language: its locale
    assert isinstance(ready, ReadyMessage) and ready.language == "en-US"
    await ws.close()
    ws, answer = await open_session(server.url, ConfigMessage(latency_ms=240))
    assert isinstance(answer, ErrorMessage) and "[80, 160, 320, 560, 1120]" in answer.message
    ws, ready = await open_session(server.url, ConfigMessage())  # no language: the server's default
    assert isinstance(ready, ReadyMessage) and ready.language == "auto"
    await stream(ws, clip(83, 1.2))
    await ws.send('{"type": "finalize"}')
    await ws.send('{"type": "close"}')
    finals = [m for m in await raw_messages(ws) if m["type"] == "final"]
    # An auto utterance says which of the model's locales it was in.
    assert len(finals) == 1 and finals[0]["language"] == "auto"
    assert finals[0]["detected_language"] in ("en-US", "es-ES", "de-DE"), finals


async def test_info_and_metrics_list_the_models_languages(server: ASRServer) -> None:
    """An operator sees what a server transcribes from /v1/info and from the Prometheus info metric."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{server.http_url}/v1/info") as r:
            info = await r.json()
        async with http.get(f"{server.http_url}/metrics") as r:
            metrics = await r.text()
    assert info["languages"] == list(LANGUAGES) and info["latency_modes"] == list(MODES)
    (line,) = [m for m in metrics.splitlines() if m.startswith("nemotron_asr_server_info{")]
    assert f'languages="{",".join(LANGUAGES)}"' in line and 'latency_modes="80,160,320,560,1120"' in line


async def test_pipecat_client_language_and_settings_update(server: ASRServer, engine: NemotronEngine) -> None:
    stt = NemotronServerSTTService(url=server.url, language=Language.ES)
    down, _ = await run_language_switches(stt, engine, start_sleep=0.3)
    interims = [f for f in down if isinstance(f, InterimTranscriptionFrame)]
    assert interims and interims[0].language == Language.ES_ES


@pytest.mark.filterwarnings("ignore:The test <Function:pytest.PytestWarning")
def test_language_codes_are_checked_for_shape_before_the_models_languages() -> None:
    """Every Pipecat ``Language`` is a code; text that is not one is refused, never mapped to a locale."""
    from pipecat_nemotron.asr.languages import LanguagePrompts, language_code

    assert all(language_code(language) for language in Language)
    for garbage in ("en-XX-\x1b[31m", "en US", "", "e", "en--us", "x" * 9, "fr-\n"):
        with pytest.raises(ValueError, match="a code such as"):
            language_code(garbage)
    prompts = LanguagePrompts.from_keys(list(LANGUAGES))
    assert prompts.resolve("ES") == "es-ES" and prompts.resolve(Language.EN) == "en-US"
    for lacking in ("en-GB", Language.ES_MX, "fr"):
        with pytest.raises(ValueError, match="not one of this model's languages"):
            prompts.resolve(lacking)
