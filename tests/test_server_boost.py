"""Phrase boosting over the wire and in the Pipecat services: the ``boost`` feature of ``nemotron-asr.v1``.

The bundled trained tiny model, served on loopback as in ``test_server.py``. The clip is one of the engine tests'
misheard held-out clips (``tests/test_boosting.py`` says how they were chosen): "Three minus two. What is the
weather today?" comes out with "seven" for "two"; boosting "minus two" (weight 2) gives it right in a stream's first
utterance, and changes the second one's words. A phrase with a capital the tiny model never writes ("Doctor") is
refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest
import pytest_asyncio
import soundfile as sf
from helpers import own_server, turn
from pipecat.frames.frames import ErrorFrame, STTUpdateSettingsFrame, TranscriptionFrame
from pipecat.tests.utils import SleepFrame, run_test
from websockets.exceptions import ConnectionClosed
from ws_client import open_session, raw_messages, stream

from pipecat_nemotron.asr import NemotronEngine
from pipecat_nemotron.bench.wer import normalize_text
from pipecat_nemotron.server.app import ASRServer
from pipecat_nemotron.server.protocol import (
    CloseCode,
    ConfigMessage,
    ErrorMessage,
    ReadyMessage,
    SetBoostPhrasesMessage,
)
from pipecat_nemotron.stt import NemotronSTTService, NemotronSTTSettings
from pipecat_nemotron.stt.remote.boost import BoostRequests, BoostSetting
from pipecat_nemotron.stt.remote.service import NemotronServerSTTService

pytestmark = pytest.mark.asyncio(loop_scope="module")

HELDOUT = Path(__file__).parent / "assets" / "heldout"
BOOST = ["minus two"]
UNWRITABLE = "Doctor"  # the tiny model writes "d" in lower case only
ALPHA = 2.0
FINALIZE = '{"type": "finalize"}'
CLOSE = '{"type": "close"}'


@pytest.fixture(scope="module")
def code_clip() -> bytes:
    """'Three minus two. What is the weather today?' (16 kHz int16)."""
    audio, rate = sf.read(HELDOUT / "unseen_000039.flac", dtype="int16")
    assert rate == 16000
    return audio.tobytes()


async def engine_texts(engine: NemotronEngine, pcm: bytes, *lists: list[str]) -> list[str]:
    """The finals of one engine stream (160 ms mode) given ``pcm`` once per list, boosted with each list in turn
    (weight :data:`ALPHA`; the list changes after each finalize, as the services' updates do)."""
    s = engine.open_stream(latency_ms=160, boost_phrases=lists[0], boost_alpha=ALPHA)
    finals = []
    try:
        for i, phrases in enumerate(lists):
            if i:
                s.set_boost_phrases(phrases, alpha=ALPHA)
            await s.push(pcm)
            finals.append(s.finalize_nowait())
        return [(await f).text for f in finals]
    finally:
        await s.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def texts(engine: NemotronEngine, code_clip: bytes) -> dict[str, str]:
    """What the tests expect, from engine streams; and the test's premise: boosting changes these texts.

    ``plain`` / ``boosted``: the clip alone, without and with "minus two". ``kept`` / ``changed``: the clip twice
    in one stream boosted with it, the second time still with it or with no phrase.
    """
    (plain,), (boosted,) = await engine_texts(engine, code_clip, []), await engine_texts(engine, code_clip, BOOST)
    assert "two" not in normalize_text(plain).split() and "two" in normalize_text(boosted).split(), (plain, boosted)
    _, kept = await engine_texts(engine, code_clip, BOOST, BOOST)
    first, changed = await engine_texts(engine, code_clip, BOOST, [])
    assert first == boosted and changed != kept, (kept, changed)
    return {"plain": plain, "boosted": boosted, "kept": kept, "changed": changed}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def boost_server(engine: NemotronEngine):
    """A server allowing 3 phrases of at most 12 characters."""
    async with own_server(engine, insecure=True, max_boost_phrases=3, max_boost_phrase_chars=12) as srv:
        yield srv


async def refused_at_config(server: ASRServer, config: str) -> ErrorMessage:
    """Send a raw ``config``; the fatal error it gets (the session closes with 4400)."""
    ws, answer = await open_session(server.url, config=_Raw(config))
    assert isinstance(answer, ErrorMessage) and answer.fatal and answer.code == CloseCode.PROTOCOL_ERROR, answer
    with contextlib.suppress(ConnectionClosed):
        await asyncio.wait_for(ws.recv(), 5)
    assert ws.close_code == CloseCode.PROTOCOL_ERROR
    return answer


class _Raw:
    """A config sent as written (to send what ``ConfigMessage`` would refuse to build)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def to_json(self) -> str:
        return self.text


async def test_boosted_sessions_over_the_wire(boost_server: ASRServer, code_clip: bytes, texts: dict) -> None:
    """``config.boost_phrases``, and ``set_boost_phrases`` before any audio (it applies at once)."""
    sessions = [
        (ConfigMessage(boost_phrases=tuple(BOOST), boost_alpha=ALPHA), None, "boosted"),
        (ConfigMessage(), SetBoostPhrasesMessage(tuple(BOOST), ALPHA), "boosted"),
        (ConfigMessage(boost_phrases=tuple(BOOST), boost_alpha=ALPHA), SetBoostPhrasesMessage(()), "plain"),
    ]
    for config, update, expected in sessions:
        ws, ready = await open_session(boost_server.url, config)
        assert isinstance(ready, ReadyMessage) and "boost" in ready.features
        assert ready.limits["max_boost_phrases"] == 3 and ready.limits["max_boost_phrase_chars"] == 12
        if update is not None:
            await ws.send(update.to_json())
        await stream(ws, code_clip)
        await ws.send(FINALIZE)
        await ws.send(CLOSE)
        messages = await raw_messages(ws)
        assert ws.close_code == CloseCode.NORMAL, messages[-3:]
        assert [m["text"] for m in messages if m["type"] == "final"] == [texts[expected]]
        acks = [m for m in messages if m["type"] == "boost"]
        assert acks == ([] if update is None else [{"type": "boost", "count": len(update.phrases), "applied": "now"}])


async def test_refusals_name_the_limit_and_malformed_lists_close_with_4400(boost_server: ASRServer) -> None:
    too_many = await refused_at_config(boost_server, json.dumps({"type": "config", "boost_phrases": list("abcd")}))
    assert "more than 3 boost phrases" in too_many.message
    too_long = await refused_at_config(boost_server, json.dumps({"type": "config", "boost_phrases": ["x" * 13]}))
    assert "13 characters, more than the limit of 12" in too_long.message
    bare = await refused_at_config(boost_server, json.dumps({"type": "config", "boost_phrases": "four"}))
    assert "boost_phrases must be a list of strings" in bare.message
    weight = await refused_at_config(boost_server, json.dumps({"type": "config", "boost_phrases": BOOST, "boost_alpha": 0}))
    assert "boost_alpha must be in (0, 10]" in weight.message
    cased = await refused_at_config(boost_server, json.dumps({"type": "config", "boost_phrases": [UNWRITABLE]}))
    assert f"'{UNWRITABLE}'" in cased.message and "cased as the model writes them" in cased.message
    # In a session, a list over the limits or one the model cannot write is refused and the session goes on ...
    ws, ready = await open_session(boost_server.url)
    assert isinstance(ready, ReadyMessage)
    await ws.send(SetBoostPhrasesMessage(phrases=("a", "b", "c", "d")).to_json())
    await ws.send(SetBoostPhrasesMessage(phrases=(UNWRITABLE,)).to_json())
    await ws.send(SetBoostPhrasesMessage(phrases=("Tuesday",), alpha=11.0).to_json())
    await ws.send(SetBoostPhrasesMessage(phrases=("Tuesday",)).to_json())
    # ... a list that is not a list of strings is malformed: 4400, closed.
    await ws.send(json.dumps({"type": "set_boost_phrases", "phrases": [4]}))
    messages = await raw_messages(ws)
    assert ws.close_code == CloseCode.PROTOCOL_ERROR
    refusals = [m for m in messages if m["type"] == "error" and not m["fatal"]]
    assert [m["request"] for m in refusals] == ["set_boost_phrases"] * 3, messages
    assert "more than 3" in refusals[0]["message"] and f"'{UNWRITABLE}'" in refusals[1]["message"]
    assert "boost_alpha" in refusals[2]["message"]
    assert [m for m in messages if m["type"] == "boost"] == [{"type": "boost", "count": 1, "applied": "now"}]
    assert messages[-1]["fatal"] and "phrases must be a list of strings" in messages[-1]["message"]


async def test_a_server_that_boosts_nothing_does_not_announce_the_feature(engine: NemotronEngine) -> None:
    async with own_server(engine, insecure=True, max_boost_phrases=0) as srv:
        ws, ready = await open_session(srv.url)
        assert isinstance(ready, ReadyMessage) and "boost" not in ready.features and "peek" in ready.features
        assert "max_boost_phrases" not in ready.limits
        await ws.close()
        refusal = await refused_at_config(srv, ConfigMessage(boost_phrases=tuple(BOOST)).to_json())
        assert "more than 0 boost phrases" in refusal.message


async def test_set_boost_phrases_costs_ten_control_messages_of_the_pacing_budget(engine: NemotronEngine) -> None:
    """Keepalives within the burst are read at once; as many boost updates exceed it (10 each) and are paced."""
    async with own_server(engine, insecure=True, control_burst=10, max_control_rate=100.0) as srv:
        throttled = srv.service.metrics.throttled_seconds
        ws, _ = await open_session(srv.url)
        for kind in ("keepalive", "set_boost_phrases"):
            before = throttled._value.get()
            msg = {"type": kind, "phrases": BOOST} if kind != "keepalive" else {"type": kind}
            for _ in range(3):
                await ws.send(json.dumps(msg))
            await ws.send(json.dumps({"type": "set_latency", "latency_ms": 160}))  # answered once all are read
            seen: list[str] = []
            async with asyncio.timeout(20):
                while not seen or seen[-1] != "latency":
                    seen.append(json.loads(await ws.recv())["type"])
            assert (throttled._value.get() > before) == (kind != "keepalive"), kind
            assert seen.count("boost") == (3 if kind != "keepalive" else 0)
            await asyncio.sleep(0.3)  # the budget refills
        await ws.close()


async def test_a_client_that_does_not_boost_sees_what_it_saw_before(
    boost_server: ASRServer, code_clip: bytes, texts: dict
) -> None:
    """Nothing in its messages changes but the feature list (and the limits) of ``ready``: an old client's parser
    ignores those; its config carries no boost field and its results are the unboosted ones."""
    config = ConfigMessage(word_timings=True)
    assert "boost" not in config.to_json()
    ws, ready = await open_session(boost_server.url, config)
    assert isinstance(ready, ReadyMessage)
    await stream(ws, code_clip)
    await ws.send(FINALIZE)
    await ws.send(CLOSE)
    messages = await raw_messages(ws)
    assert {m["type"] for m in messages} == {"partial", "final"}
    final = next(m for m in messages if m["type"] == "final")
    assert final["text"] == texts["plain"]
    assert set(final) == {
        "type", "utterance", "text", "latency_ms", "session_audio_ms", "utterance_audio_ms", "ttf_ms", "step_ms", "words",
        "confidence",
    }
    assert all(set(m) == {"type", "utterance", "text", "latency_ms", "session_audio_ms", "queue_ms", "step_ms", "lag_ms"}
               for m in messages if m["type"] == "partial")


@pytest.mark.filterwarnings("ignore:The test <Function:pytest.PytestWarning")
def test_phrases_an_older_server_ignored_are_reported_and_a_refused_list_gives_way() -> None:
    """The client's bookkeeping of what the server boosts (no server of this version can be made old)."""
    boosts = BoostRequests()
    old = ReadyMessage(features=("peek", "word_timings", "language"))
    assert "not boosted" in (boosts.opened(old, BoostSetting(("tuesday",), None)) or "")
    assert boosts.opened(old, BoostSetting((), None)) is None
    new = ReadyMessage(features=("boost",))
    assert boosts.opened(new, BoostSetting(("tuesday",), None)) is None
    boosts.sending(SetBoostPhrasesMessage(("nine",)))
    boosts.sending(SetBoostPhrasesMessage(("Nine",)))
    refusal = ErrorMessage(code=4400, reason="protocol_error", fatal=False, request="set_boost_phrases")
    from pipecat_nemotron.server.protocol import BoostMessage

    assert boosts.answered(BoostMessage(count=1)) is None
    assert boosts.answered(refusal) == BoostSetting(("nine",), None)


def over(limit: int) -> list[str]:
    """``limit + 1`` distinct phrases of lower-case letters."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return [a + b + c for a in letters for b in letters for c in letters][: limit + 1]


def settings_frames(code_clip: bytes, limit: int) -> list:
    """Two turns: boosted with "minus two"; then after an update over the limit and one cased wrong (both refused),
    and one to no phrase."""
    return [
        SleepFrame(sleep=0.5),
        *turn(code_clip),
        STTUpdateSettingsFrame(delta=NemotronSTTSettings(boost_phrases=over(limit))),
        STTUpdateSettingsFrame(delta=NemotronSTTSettings(boost_phrases=[UNWRITABLE])),
        SleepFrame(sleep=0.3),
        STTUpdateSettingsFrame(delta=NemotronSTTSettings(boost_phrases=[])),
        SleepFrame(sleep=0.3),
        *turn(code_clip, wait=2.0),
    ]


def check_settings_run(stt, down: list, up: list, texts: dict, limit: int) -> None:
    """The refused updates said why in an ``ErrorFrame`` and changed nothing; the third one applied."""
    assert [f.text for f in down if isinstance(f, TranscriptionFrame)] == [texts["boosted"], texts["changed"]]
    errors = [f.error for f in up if isinstance(f, ErrorFrame)]
    assert len(errors) == 2, errors
    assert f"more than {limit} boost phrases" in errors[0] and f"'{UNWRITABLE}'" in errors[1]
    assert (stt.boost_phrases, stt.boost_alpha) == ((), ALPHA)


async def test_server_stt_boosts_and_takes_updates(
    boost_server: ASRServer, code_clip: bytes, texts: dict
) -> None:
    stt = NemotronServerSTTService(url=boost_server.url, boost_phrases=BOOST, boost_alpha=ALPHA)
    down, up = await run_test(stt, frames_to_send=settings_frames(code_clip, 3), start_timeout=5.0)
    check_settings_run(stt, down, up, texts, 3)


async def test_in_process_stt_boosts_and_takes_updates(
    engine: NemotronEngine, code_clip: bytes, texts: dict
) -> None:
    limit = engine.config.max_boost_phrases
    with pytest.raises(ValueError, match=f"more than {limit} boost phrases"):
        NemotronSTTService(engine=engine, boost_phrases=over(limit))
    with pytest.raises(ValueError, match="wrap a single phrase in a list"):
        NemotronSTTService(engine=engine, boost_phrases="tuesday")  # type: ignore[arg-type]
    stt = NemotronSTTService(engine=engine, boost_phrases=BOOST, boost_alpha=ALPHA)
    down, up = await run_test(stt, frames_to_send=settings_frames(code_clip, limit), start_timeout=5.0)
    check_settings_run(stt, down, up, texts, limit)


@pytest.mark.filterwarnings("ignore:The test <Function:pytest.PytestWarning")
def test_boost_messages_parse_and_malformed_ones_are_protocol_errors() -> None:
    from pipecat_nemotron.server.protocol import ProtocolError, parse_client_message

    msg = parse_client_message('{"type": "set_boost_phrases", "phrases": ["tuesday"], "alpha": 2}')
    assert msg == SetBoostPhrasesMessage(("tuesday",), 2.0) and parse_client_message(msg.to_json()) == msg
    config = parse_client_message(ConfigMessage(boost_phrases=("tuesday",), boost_alpha=2.0).to_json())
    assert isinstance(config, ConfigMessage) and config.boost_phrases == ("tuesday",)
    for bad, why in [
        ('{"type": "set_boost_phrases"}', "set_boost_phrases needs phrases"),
        ('{"type": "set_boost_phrases", "phrases": "tuesday"}', "phrases must be a list of strings"),
        ('{"type": "set_boost_phrases", "phrases": [], "alpha": "high"}', "alpha must be a number"),
        ('{"type": "config", "boost_phrases": [null]}', "boost_phrases must be a list of strings"),
    ]:
        with pytest.raises(ProtocolError, match=why):
            parse_client_message(bad)


@pytest.mark.filterwarnings("ignore:The test <Function:pytest.PytestWarning")
def test_serve_flags_set_the_servers_limits() -> None:
    from pipecat_nemotron.cli import build_parser, serve_configs

    base = ["serve", "--insecure", "--host", "127.0.0.1"]
    assert serve_configs(build_parser().parse_args(base))[1].max_boost_phrases is None  # the engine's
    _, config = serve_configs(build_parser().parse_args([*base, "--max-boost-phrases", "5", "--max-boost-phrase-chars", "20"]))
    assert (config.max_boost_phrases, config.max_boost_phrase_chars) == (5, 20)
    with pytest.raises(ValueError, match="max_boost_phrases must be >= 0"):
        serve_configs(build_parser().parse_args([*base, "--max-boost-phrases", "-1"]))


async def test_in_process_stt_with_phrases_its_model_cannot_write_fails_to_open(engine: NemotronEngine) -> None:
    stt = NemotronSTTService(engine=engine, boost_phrases=[UNWRITABLE])  # the limits pass; the characters do not
    _, up = await run_test(stt, frames_to_send=[SleepFrame(sleep=0.5)], start_timeout=5.0)
    errors = [f.error for f in up if isinstance(f, ErrorFrame)]
    assert len(errors) == 1 and "could not open its stream" in errors[0] and f"'{UNWRITABLE}'" in errors[0], errors
