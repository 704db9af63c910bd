"""The whole local agent on CPU: bundled speech → our STT → a real OpenAI-compatible server on loopback → Magpie."""

from __future__ import annotations

import json

import pytest
from helpers import FrameRecorder
from openai_server import FakeOpenAIServer
from pipecat.frames.frames import TranscriptionFrame

from pipecat_nemotron.agent.assembly import AgentSettings, SimulatedPlayback, build_voice_agent
from pipecat_nemotron.agent.wav_input import read_wav, run_worker_on_wav
from pipecat_nemotron.asr import EngineConfig, NemotronEngine
from pipecat_nemotron.llm.env import ENV_BASE_URL
from pipecat_nemotron.llm.service import create_nemotron_llm
from pipecat_nemotron.models import DEMO_AUDIO_DIR, TINY_MODEL_PATH
from pipecat_nemotron.stt import NemotronSTTService
from pipecat_nemotron.tts.magpie import MagpieSynthesisOptions
from pipecat_nemotron.tts.service import MagpieTTSService

LLM_DELAY_S = 0.4


def single_utterance_wav():
    """A bundled one-utterance demo WAV (two_turns.wav has two)."""
    multi = set(json.loads((DEMO_AUDIO_DIR / "turns.json").read_text()))
    return sorted(w for w in DEMO_AUDIO_DIR.glob("*.wav") if w.name not in multi)[0]


async def test_full_local_agent_pipeline(openai_server: FakeOpenAIServer, magpie_engine, tmp_path) -> None:
    wav = single_utterance_wav()
    openai_server.first_token_delay_s = LLM_DELAY_S
    openai_server.reply = "It is ten past nine."
    turns_path = tmp_path / "turns.jsonl"
    async with NemotronEngine(EngineConfig(model=str(TINY_MODEL_PATH), device="cpu", max_streams=2)) as asr:
        pcm, rate, _ = read_wav(wav)
        expected_text = (await asr.transcribe(pcm, latency_ms=160, sample_rate=rate)).text
        assert expected_text  # the bundled model hears the bundled speech
        stt = NemotronSTTService(engine=asr, latency_ms=160)
        tts = MagpieTTSService(engine=magpie_engine, options=MagpieSynthesisOptions(max_duration_s=0.3))
        finals = FrameRecorder((TranscriptionFrame,))
        playback = SimulatedPlayback()
        agent = build_voice_agent(
            stt=stt,
            llm=create_nemotron_llm(base_url=openai_server.base_url),
            tts=tts,
            output_processor=playback,
            after_stt=[finals],
            turns_jsonl=turns_path,
            idle_timeout_secs=None,
        )
        await run_worker_on_wav(agent.worker, stt, wav, trailing_silence_s=4.0, timeout_s=120)

    # The LLM heard what the user said.
    assert [f.text for f in finals.frames] == [expected_text]
    assert expected_text in openai_server.last_user_text()
    assert openai_server.last_request["chat_template_kwargs"] == {"enable_thinking": False}
    # The bot spoke.
    assert playback.audio_seconds > 0
    # One turn, whose parts add up.
    assert len(agent.observer.turns) == 1
    turn = agent.observer.turns[0]
    assert turn.ttfs_ms is not None and turn.v2v_ms is not None
    assert 0 < turn.ttfs_ms <= turn.v2v_ms
    assert turn.asr_finalize_ms is not None and 0 < turn.asr_finalize_ms <= turn.ttfs_ms
    assert (
        turn.llm_ttfb_ms is not None and turn.llm_ttfb_ms >= LLM_DELAY_S * 1000
    )  # the server delay is the floor
    assert turn.tts_ttfb_ms is not None and turn.tts_ttfb_ms > 0
    assert turn.llm_ttfb_ms + turn.tts_ttfb_ms <= turn.v2v_ms
    assert len(turns_path.read_text().splitlines()) == 1


def test_agent_settings_from_env_and_validation() -> None:
    settings = AgentSettings.from_env(
        {
            "NEMOTRON_ASR_LATENCY_MS": "560",
            ENV_BASE_URL: "http://127.0.0.1:9/v1",
            "MAGPIE_NIM_SERVER": "",
        }
    )
    assert settings.asr_latency_ms == 560 and settings.llm_configured and settings.tts_nim_server is None
    # No TTS configured: the embedded Magpie (the AgentProcess provides it); MAGPIE_TTS_EMBEDDED=0 turns it off.
    assert settings.tts_embedded and settings.llm_embedded is None
    assert any("TTS: embedded Magpie" in line for line in settings.describe())
    quiet = AgentSettings.from_env({ENV_BASE_URL: "http://127.0.0.1:9/v1", "MAGPIE_TTS_EMBEDDED": "0"})
    assert not quiet.tts_embedded and any("TTS: not configured" in line for line in quiet.describe())
    # Nothing configured: the embedded LLM and Magpie, started by the AgentProcess (no LLM service before).
    bare = AgentSettings.from_env({})
    assert bare.llm_embedded is not None and bare.tts_embedded and not bare.llm_configured
    assert any("LLM: embedded llama.cpp server" in line for line in bare.describe())
    started = bare.with_llm_server("http://127.0.0.1:1234/v1", "m")
    assert started.create_llm() is not None and "at http://127.0.0.1:1234/v1" in started.describe()[1]
    keyed = AgentSettings.from_env({ENV_BASE_URL: "http://127.0.0.1:9/v1", "NEMOTRON_LLM_API_KEY": "sk-secret-1"})
    assert "sk-secret-1" not in repr(keyed)
    transcribe_only = AgentSettings.from_env({"NEMOTRON_LLM_EMBEDDED": "0"})
    assert transcribe_only.llm_embedded is None and not transcribe_only.tts_embedded
    with pytest.raises(ValueError, match="MAGPIE_TTS_EMBEDDED"):
        AgentSettings.from_env({"MAGPIE_TTS_EMBEDDED": "maybe"})
    spanish = AgentSettings.from_env({"NEMOTRON_ASR_LATENCY_MS": "320", "NEMOTRON_ASR_LANGUAGE": "es-ES"})
    assert spanish.asr_latency_ms == 320 and spanish.create_stt().language == "es-ES"
    assert "language es-ES" in spanish.describe()[0]
    boosted = AgentSettings.from_env({"NEMOTRON_ASR_BOOST_PHRASES": " okafor ,zyrtec,, dr  mbeki "})
    assert boosted.asr_boost_phrases == ("okafor", "zyrtec", "dr  mbeki")
    assert boosted.create_stt().boost_phrases == ("okafor", "zyrtec", "dr mbeki")  # the service normalises spaces
    assert "3 boosted phrase(s)" in boosted.describe()[0] and AgentSettings.from_env({}).asr_boost_phrases == ()
    assert AgentSettings.from_env({}).create_llm() is None
    with pytest.raises(ValueError, match="NEMOTRON_ASR_LATENCY_MS"):
        AgentSettings.from_env({"NEMOTRON_ASR_LATENCY_MS": "fast"})
    with pytest.raises(ValueError, match="latency_ms must be a multiple of 80"):
        AgentSettings.from_env({"NEMOTRON_ASR_LATENCY_MS": "100"})
    with pytest.raises(ValueError, match="tts needs an llm"):
        build_voice_agent(stt=NemotronSTTService(model="/nonexistent.nemo"), tts=object())  # type: ignore[arg-type]
