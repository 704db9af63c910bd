"""A real OpenAI-compatible chat server on loopback, for tests and benchmarks.

It speaks HTTP on ``127.0.0.1`` (ephemeral port) with aiohttp, so the OpenAI client,
httpx and Pipecat's LLM service run unmodified against it:

- ``POST /v1/chat/completions``: with ``"stream": true`` it answers Server-Sent Events
  in OpenAI's format (a role chunk, one content chunk per word, a finish chunk, a
  usage chunk when ``stream_options.include_usage`` is set, then ``data: [DONE]``);
  otherwise a single ``chat.completion`` JSON object.
- ``GET /v1/models``: a model list with :attr:`FakeOpenAIServer.model`.

Every request body is recorded in :attr:`FakeOpenAIServer.requests` (and headers in
:attr:`FakeOpenAIServer.headers`), so tests can assert what the client sent.

Usage::

    async with FakeOpenAIServer(reply="Hi there.", first_token_delay_s=0.1) as server:
        llm = create_nemotron_llm(base_url=server.base_url)
        ...
        assert server.requests[-1]["chat_template_kwargs"]["enable_thinking"] is False

The tests' ``openai_server`` fixture (``tests/openai_server.py``) wraps it; this module needs no pytest.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

DEFAULT_REPLY = "Hello! I am a test server. How can I help you today?"
DEFAULT_MODEL = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"


def split_reply(text: str) -> list[str]:
    """Split a reply into word chunks the way a tokenizer streams it (spaces kept)."""
    return re.findall(r"\s*\S+", text) or [text]


@dataclass(frozen=True)
class _Reply:
    """What every chunk of one answer repeats (id, time, model), the words it streams, and its usage."""

    id: str
    created: int
    model: str
    words: list[str]
    usage: dict[str, int]

    def envelope(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, **fields}

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        return self.envelope("chat.completion.chunk", choices=[choice])


class FakeOpenAIServer:
    """OpenAI-compatible chat completions server on an ephemeral loopback port.

    Attributes are read per request, so a test may change them between requests.

    Attributes:
        reply: Text streamed back as content.
        reasoning: Optional text streamed first as ``delta.reasoning_content`` (what
            vLLM's reasoning parser emits when thinking is on).
        first_token_delay_s: Seconds between receiving a request and sending the
            first chunk (the role chunk carries no token; the first content or
            reasoning chunk follows it immediately).
        chunk_delay_s: Seconds between later chunks.
        model: Model id reported by ``/v1/models`` and echoed in chunks.
        status: HTTP status for chat requests; anything but 200 returns an OpenAI
            style error body.
        requests: Parsed JSON bodies of every chat request received, in order.
        headers: Request headers of every chat request, in order.

    """

    def __init__(
        self,
        *,
        reply: str = DEFAULT_REPLY,
        reasoning: str | None = None,
        first_token_delay_s: float = 0.0,
        chunk_delay_s: float = 0.0,
        model: str = DEFAULT_MODEL,
        host: str = "127.0.0.1",
    ) -> None:
        self.reply = reply
        self.reasoning = reasoning
        self.first_token_delay_s = first_token_delay_s
        self.chunk_delay_s = chunk_delay_s
        self.model = model
        self.status = 200
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._host = host
        self._port: int | None = None
        self._runner: web.AppRunner | None = None
        self._request_event = asyncio.Event()

    # --- lifecycle ---------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound TCP port (after :meth:`start`)."""
        if self._port is None:
            raise RuntimeError("FakeOpenAIServer is not started")
        return self._port

    @property
    def base_url(self) -> str:
        """The OpenAI API root to give a client, e.g. ``http://127.0.0.1:43210/v1``."""
        return f"http://{self._host}:{self.port}/v1"

    async def start(self) -> FakeOpenAIServer:
        """Bind an ephemeral port and start serving."""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, 0))
        self._port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        return self

    async def stop(self) -> None:
        """Stop serving and release the port."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeOpenAIServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_for_request(self, timeout: float = 5.0) -> dict[str, Any]:
        """Wait until at least one chat request arrived; return the latest body."""
        await asyncio.wait_for(self._request_event.wait(), timeout)
        return self.requests[-1]

    # --- helpers for assertions --------------------------------------------------

    @property
    def last_request(self) -> dict[str, Any]:
        """The most recent chat request body."""
        if not self.requests:
            raise AssertionError("FakeOpenAIServer received no chat request")
        return self.requests[-1]

    def last_user_text(self) -> str:
        """Concatenated text of the user messages of the most recent request."""
        parts: list[str] = []
        for message in self.last_request.get("messages", []):
            if message.get("role") != "user":
                continue
            content = message.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(p.get("text", "") for p in content if isinstance(p, dict))
        return " ".join(parts)

    # --- handlers ----------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "test"}],
            }
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        received = time.monotonic()
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response(
                {"error": {"message": "invalid JSON", "type": "invalid_request_error"}}, status=400
            )
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        self._request_event.set()
        if self.status != 200:
            return web.json_response(
                {"error": {"message": "test error", "type": "server_error", "code": self.status}},
                status=self.status,
            )
        words = split_reply(self.reply)
        reply = _Reply(
            id=f"chatcmpl-{uuid.uuid4().hex[:12]}",
            created=int(time.time()),
            model=body.get("model") or self.model,
            words=words,
            usage=self._usage(body, words),
        )
        first_token_at = received + self.first_token_delay_s
        if not body.get("stream"):
            await asyncio.sleep(max(0.0, first_token_at - time.monotonic()))
            return web.json_response(self._completion(reply))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return await self._stream(request, reply, first_token_at, include_usage)

    def _completion(self, reply: _Reply) -> dict[str, Any]:
        """A whole (non-streamed) ``chat.completion`` answer."""
        message: dict[str, Any] = {"role": "assistant", "content": self.reply}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return reply.envelope("chat.completion", choices=[choice], usage=reply.usage)

    async def _stream(
        self, request: web.Request, reply: _Reply, first_token_at: float, include_usage: bool
    ) -> web.StreamResponse:
        """Stream the reply as Server-Sent Events: role, reasoning, words, finish, usage, ``[DONE]``."""
        response = web.StreamResponse(
            status=200,
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        )
        await response.prepare(request)

        async def send(payload: dict[str, Any] | str) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            await response.write(f"data: {data}\n\n".encode())

        deltas = [{"reasoning_content": p} for p in split_reply(self.reasoning)] if self.reasoning else []
        deltas += [{"content": p} for p in reply.words]
        try:
            await asyncio.sleep(max(0.0, first_token_at - time.monotonic()))
            await send(reply.chunk({"role": "assistant", "content": ""}))
            for i, delta in enumerate(deltas):
                if i:
                    await asyncio.sleep(self.chunk_delay_s)
                await send(reply.chunk(delta))
            await send(reply.chunk({}, finish_reason="stop"))
            if include_usage:
                await send(reply.envelope("chat.completion.chunk", choices=[], usage=reply.usage))
            await send("[DONE]")
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            # The client went away (e.g. an interruption cancelled the stream).
            pass
        return response

    @staticmethod
    def _usage(body: dict[str, Any], words: list[str]) -> dict[str, int]:
        prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        return {"prompt_tokens": prompt, "completion_tokens": len(words), "total_tokens": prompt + len(words)}
