"""Nemotron LLM factory: settings validation, env parsing, and a real request to a loopback server."""

from __future__ import annotations

import dataclasses

import pytest
from openai_server import FakeOpenAIServer, openai_server  # noqa: F401  (fixture)
from pipecat.frames.frames import (
    ErrorFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMMessagesAppendFrame,
    LLMTextFrame,
    LLMThoughtTextFrame,
    MetricsFrame,
)
from pipecat.metrics.metrics import TTFBMetricsData
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.tests.utils import run_test

from pipecat_nemotron.llm import env as llm_env
from pipecat_nemotron.llm.service import (
    HOSTED_BASE_URL,
    LLAMA_CPP_MODEL,
    NIM_MODEL,
    VLLM_MODEL_BF16,
    VOICE_MAX_TOKENS,
    VOICE_SYSTEM_PROMPT,
    NemotronLLMBackend,
    NemotronLLMSettings,
    create_nemotron_llm,
)

# --- settings ---------------------------------------------------------------------


def test_defaults_are_voice_defaults() -> None:
    s = NemotronLLMSettings()
    assert s.model == VLLM_MODEL_BF16
    assert s.enable_thinking is False
    assert 0.5 <= s.temperature <= 0.7
    assert s.max_tokens == VOICE_MAX_TOKENS
    assert s.system_prompt == VOICE_SYSTEM_PROMPT
    assert s.stall_timeout_s == 60.0  # docs/LLM.md: the `.env` table's default
    assert s.extra_body() == {"chat_template_kwargs": {"enable_thinking": False}}
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.model = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value", "fix"),
    [
        ("base_url", "", llm_env.ENV_BASE_URL),
        ("base_url", "localhost:8000/v1", "http://"),
        ("base_url", "http://localhost:8000/v1/chat/completions", "'http://localhost:8000/v1'"),
        ("model", "  ", llm_env.ENV_MODEL),
        ("api_key", "", "'none'"),
        ("temperature", 3.0, "0..2"),
        ("temperature", float("nan"), "0..2"),
        ("top_p", 0.0, "(0, 1]"),
        ("max_tokens", 0, "at least 1"),
        ("max_tokens", 2.5, "integer"),
        ("enable_thinking", "no", "True or False"),
        ("stall_timeout_s", 0, "> 0"),
        ("stall_timeout_s", float("inf"), llm_env.ENV_STALL_TIMEOUT_S),
    ],
)
def test_validation_names_the_fix(field: str, value: object, fix: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        NemotronLLMSettings(**{field: value})
    assert fix in str(info.value)


def test_hosted_requires_key() -> None:
    with pytest.raises(ValueError, match=llm_env.ENV_NVIDIA_API_KEY):
        NemotronLLMSettings.preset("hosted")
    assert NemotronLLMSettings.preset("hosted", api_key="nvapi-abc").base_url == HOSTED_BASE_URL


def test_presets() -> None:
    assert NemotronLLMSettings.preset(NemotronLLMBackend.NIM).model == NIM_MODEL
    llama = NemotronLLMSettings.preset("llama.cpp")
    assert llama.model == LLAMA_CPP_MODEL and llama.base_url.endswith(":8080/v1")
    with pytest.raises(ValueError, match=llm_env.ENV_BACKEND):
        NemotronLLMSettings.preset("tensorrt")


def test_env_keys_are_the_documented_ones() -> None:
    """docs/LLM.md's ``.env`` table lists exactly the keys the code reads; README, docs and bots/.env.example name
    no other ``NEMOTRON_LLM_*`` key."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    code_keys = {
        value
        for name, value in vars(llm_env).items()
        if name.startswith("ENV_") and name not in ("ENV_PREFIX", "ENV_NVIDIA_API_KEY")
    }
    assert llm_env.ENV_BACKEND in code_keys and all(key.startswith(llm_env.ENV_PREFIX) for key in code_keys)
    table = (repo / "docs" / "LLM.md").read_text().split("## `.env` keys", 1)[1].split("\n\n")[1]
    rows = dict(re.findall(r"^\| `([A-Z_]+)` \|(.*)$", table, flags=re.MULTILINE))
    assert set(rows) == code_keys
    assert f"`{llm_env.ENV_NVIDIA_API_KEY}`" in rows[llm_env.ENV_API_KEY]  # the hosted API's fallback key
    # The embedded server's keys (pipecat_nemotron.llm.embedded) have their own table in its section.
    from pipecat_nemotron.llm import embedded

    embedded_keys = {embedded.ENV_EMBEDDED, embedded.ENV_EMBEDDED_GGUF, embedded.ENV_EMBEDDED_THREADS}
    section = (repo / "docs" / "LLM.md").read_text().split("## The embedded default", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"^\| `([A-Z_]+)` \|", section, flags=re.MULTILINE)) == embedded_keys
    docs = [repo / "README.md", repo / "bots" / ".env.example", *sorted((repo / "docs").glob("*.md"))]
    named = {key for doc in docs for key in re.findall(r"NEMOTRON_LLM_[A-Z_]*[A-Z]", doc.read_text())}
    assert named <= code_keys | embedded_keys, named - code_keys - embedded_keys


def test_from_env() -> None:
    env = {
        llm_env.ENV_BACKEND: "nim",
        llm_env.ENV_BASE_URL: "http://gpu-box:8000/v1/",
        llm_env.ENV_TEMPERATURE: "0.3",
        llm_env.ENV_MAX_TOKENS: "128",
        llm_env.ENV_ENABLE_THINKING: "false",
        llm_env.ENV_API_KEY: "",  # empty counts as unset
        "UNRELATED": "x",
    }
    s = NemotronLLMSettings.from_env(env)
    assert s.model == NIM_MODEL
    assert s.base_url == "http://gpu-box:8000/v1/"
    assert (s.temperature, s.max_tokens, s.enable_thinking, s.api_key) == (0.3, 128, False, "none")

    assert NemotronLLMSettings.from_env({}) == NemotronLLMSettings()
    hosted = NemotronLLMSettings.from_env(
        {llm_env.ENV_BACKEND: "hosted", llm_env.ENV_NVIDIA_API_KEY: "nvapi-k"}
    )
    assert hosted.api_key == "nvapi-k"
    with pytest.raises(ValueError, match=llm_env.ENV_MAX_TOKENS):
        NemotronLLMSettings.from_env({llm_env.ENV_MAX_TOKENS: "lots"})
    with pytest.raises(ValueError, match=llm_env.ENV_ENABLE_THINKING):
        NemotronLLMSettings.from_env({llm_env.ENV_ENABLE_THINKING: "maybe"})


def test_factory_configures_pipecat_service() -> None:
    llm = create_nemotron_llm(base_url="http://127.0.0.1:1/v1", max_tokens=64, top_p=0.9)
    assert isinstance(llm, OpenAILLMService)
    assert llm._settings.extra == {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
    assert llm._settings.max_tokens == 64
    assert llm._settings.top_p == 0.9
    assert llm._settings.model == VLLM_MODEL_BF16
    with pytest.raises(TypeError, match="unknown setting"):
        create_nemotron_llm(modle="typo")


# --- against the loopback server --------------------------------------------------


def _texts(frames) -> str:
    return "".join(
        f.text for f in frames if isinstance(f, LLMTextFrame) and not isinstance(f, LLMThoughtTextFrame)
    )


def _ttfb(frames) -> list[TTFBMetricsData]:
    return [
        d
        for f in frames
        if isinstance(f, MetricsFrame)
        for d in f.data
        if isinstance(d, TTFBMetricsData) and d.value > 0
    ]


async def test_streams_reply_through_pipeline(openai_server: FakeOpenAIServer) -> None:  # noqa: F811
    openai_server.first_token_delay_s = 0.3
    openai_server.reply = "Sure. It is twenty degrees outside."
    llm = create_nemotron_llm(base_url=openai_server.base_url)
    context = LLMContext(messages=[{"role": "user", "content": "What is the weather like?"}])

    down, _ = await run_test(
        llm,
        frames_to_send=[LLMContextFrame(context=context)],
        pipeline_params=PipelineParams(enable_metrics=True),
    )

    assert _texts(down) == openai_server.reply
    types = [type(f) for f in down]
    assert LLMFullResponseStartFrame in types and LLMFullResponseEndFrame in types

    body = openai_server.last_request
    assert body["stream"] is True
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["model"] == "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
    assert body["max_tokens"] == 256 and body["temperature"] == pytest.approx(0.6)
    assert body["messages"][0] == {"role": "system", "content": VOICE_SYSTEM_PROMPT}
    assert "What is the weather like?" in openai_server.last_user_text()
    assert openai_server.headers[-1]["Authorization"] == "Bearer none"

    ttfb = _ttfb(down)
    assert len(ttfb) == 1 and ttfb[0].processor == llm.name
    assert ttfb[0].value >= 0.3  # the server delay is the floor; a loaded machine only adds to it


async def test_a_server_that_never_answers_ends_the_turn_with_an_error(
    openai_server: FakeOpenAIServer,  # noqa: F811
) -> None:
    """A server that takes the request and sends nothing: after ``stall_timeout_s`` the turn fails with Pipecat's
    timeout error and the ``EndFrame`` behind it gets through (the OpenAI client alone would wait 600 s, and the
    pipeline with it). Only the timeout can end this run: the server never answers."""
    openai_server.first_token_delay_s = 3600.0
    llm = create_nemotron_llm(base_url=openai_server.base_url, stall_timeout_s=1.0)
    context = LLMContext(messages=[{"role": "user", "content": "Are you there?"}])

    down, up = await run_test(llm, frames_to_send=[LLMContextFrame(context=context)])

    assert openai_server.requests, "the request never reached the server"
    errors = [f.error for f in up if isinstance(f, ErrorFrame)]
    assert errors and "timed out" in errors[0], errors
    assert not _texts(down)


async def test_aggregator_pair_and_reasoning_kept_out(openai_server: FakeOpenAIServer) -> None:  # noqa: F811
    openai_server.reasoning = "The user wants a greeting."
    openai_server.reply = "Hello there."
    llm = create_nemotron_llm(
        base_url=openai_server.base_url, system_prompt="Be brief.", enable_thinking=True
    )
    context = LLMContext()
    pair = LLMContextAggregatorPair(context)
    pipeline = Pipeline([pair.user(), llm, pair.assistant()])

    await run_test(
        pipeline,
        frames_to_send=[
            LLMMessagesAppendFrame(messages=[{"role": "user", "content": "say hi"}], run_llm=True)
        ],
    )

    body = openai_server.last_request
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert body["messages"][-1]["content"] == "say hi"
    # The assistant aggregator stored only the visible answer, not the reasoning.
    assistant = [m for m in context.get_messages() if m.get("role") == "assistant"]
    assert assistant and assistant[-1]["content"] == "Hello there."


async def test_models_endpoint(openai_server: FakeOpenAIServer) -> None:  # noqa: F811
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=openai_server.base_url, api_key="none")
    models = await client.models.list()
    assert [m.id for m in models.data] == [openai_server.model]
    await client.close()
