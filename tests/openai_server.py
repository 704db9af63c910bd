"""The loopback OpenAI-compatible server (:mod:`pipecat_nemotron.llm.fake_server`) and its fixture."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from pipecat_nemotron.llm.fake_server import DEFAULT_REPLY, FakeOpenAIServer

__all__ = ["DEFAULT_REPLY", "FakeOpenAIServer", "openai_server"]


@pytest_asyncio.fixture
async def openai_server() -> AsyncIterator[FakeOpenAIServer]:
    """A started :class:`FakeOpenAIServer` with default reply and no delay."""
    async with FakeOpenAIServer() as server:
        yield server
