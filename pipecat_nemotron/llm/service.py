"""Nemotron 3 Nano as the LLM of a voice agent, over an OpenAI-compatible endpoint.

Nothing here re-implements an LLM service: :func:`create_nemotron_llm` configures
Pipecat's :class:`~pipecat.services.nvidia.llm.NvidiaLLMService` (an
:class:`~pipecat.services.openai.llm.OpenAILLMService` subclass that also keeps any
reasoning the server streams out of the spoken text) with voice defaults, and
:class:`NemotronLLMSettings` validates what a bot passes in, normally read once from
the process environment with :meth:`NemotronLLMSettings.from_env`.

Thinking is switched off per request through the chat template, which is how vLLM,
NIM and llama.cpp all expose Nemotron's reasoning switch::

    extra_body={"chat_template_kwargs": {"enable_thinking": False}}

Pipecat 1.14's OpenAI services merge ``Settings.extra`` into the keyword arguments of
``AsyncOpenAI.chat.completions.create``, so the factory sets
``extra={"extra_body": {...}}`` and the OpenAI client copies ``extra_body`` into the
request JSON.

Example::

    import os
    from pipecat_nemotron.llm.env import load_env_file

    load_env_file()  # the .env of the current directory
    llm = create_nemotron_llm(NemotronLLMSettings.from_env(os.environ))
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from loguru import logger
from pipecat.services.nvidia.llm import NvidiaLLMService
from pipecat.services.openai.llm import OpenAILLMService

from pipecat_nemotron.llm.env import (
    ENV_API_KEY,
    ENV_BACKEND,
    ENV_BASE_URL,
    ENV_ENABLE_THINKING,
    ENV_MAX_TOKENS,
    ENV_MODEL,
    ENV_NVIDIA_API_KEY,
    ENV_PREFIX,
    ENV_STALL_TIMEOUT_S,
    ENV_SYSTEM_PROMPT,
    ENV_TEMPERATURE,
    ENV_TOP_P,
    env_text,
    settings_from_env,
)

__all__ = [
    "DEFAULT_LLAMA_CPP_BASE_URL",
    "DEFAULT_LOCAL_BASE_URL",
    "DEFAULT_STALL_TIMEOUT_S",
    "ENV_API_KEY",
    "ENV_BACKEND",
    "ENV_BASE_URL",
    "ENV_ENABLE_THINKING",
    "ENV_MAX_TOKENS",
    "ENV_MODEL",
    "ENV_NVIDIA_API_KEY",
    "ENV_PREFIX",
    "ENV_STALL_TIMEOUT_S",
    "ENV_SYSTEM_PROMPT",
    "ENV_TEMPERATURE",
    "ENV_TOP_P",
    "HOSTED_BASE_URL",
    "LLAMA_CPP_MODEL",
    "NIM_MODEL",
    "NO_API_KEY",
    "VLLM_MODEL_BF16",
    "VLLM_MODEL_FP8",
    "VLLM_MODEL_NVFP4",
    "VOICE_MAX_TOKENS",
    "VOICE_SYSTEM_PROMPT",
    "VOICE_TEMPERATURE",
    "NemotronLLMBackend",
    "NemotronLLMService",
    "NemotronLLMSettings",
    "create_nemotron_llm",
    "thinking_extra_body",
]

# --- Model names -------------------------------------------------------------------

VLLM_MODEL_BF16 = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
"""Hugging Face checkpoint served by vLLM (``vllm serve <this>``); ~60 GB of weights."""

VLLM_MODEL_FP8 = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8"
"""FP8 checkpoint for vLLM (Hopper/Ada/Blackwell); ~32 GB of weights."""

VLLM_MODEL_NVFP4 = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4"
"""NVFP4 checkpoint for vLLM (Blackwell only); ~18 GB of weights."""

NIM_MODEL = "nvidia/nemotron-3-nano-30b-a3b"
"""Model id on a Nemotron 3 Nano NIM container and on NVIDIA's hosted API."""

LLAMA_CPP_MODEL = "nemotron-3-nano"
"""Placeholder model name for ``llama-server``.

llama.cpp serves whichever GGUF it loaded and ignores the requested name; the name
it reports on ``GET /v1/models`` (the GGUF file name, or ``--alias``) is the one to
put in ``NEMOTRON_LLM_MODEL`` if a proxy in front of it routes by model.
"""

# --- Endpoints ---------------------------------------------------------------------

DEFAULT_LOCAL_BASE_URL = "http://localhost:8000/v1"
"""vLLM's and NIM's default OpenAI-compatible API root."""

DEFAULT_LLAMA_CPP_BASE_URL = "http://localhost:8080/v1"
"""``llama-server``'s default OpenAI-compatible API root."""

HOSTED_BASE_URL = "https://integrate.api.nvidia.com/v1"
"""NVIDIA's hosted OpenAI-compatible API (build.nvidia.com); needs an API key."""

NO_API_KEY = "none"
"""API key sent to local servers that check none (the OpenAI client needs a value)."""

# --- Voice defaults ----------------------------------------------------------------

VOICE_SYSTEM_PROMPT = (
    "You are a helpful voice assistant. Your replies are converted to speech, so answer "
    "in one to three short, plain sentences. Never use markdown, lists, headings, "
    "code, emoji or special characters. Spell out numbers, units, dates and symbols as "
    "words (say 'twenty three degrees', not '23°'). If a request is unclear, ask one "
    "brief question."
)
"""System prompt for spoken replies: short, no markdown or emoji, numbers spelled out."""

VOICE_TEMPERATURE = 0.6
"""Sampling temperature for conversational voice replies with thinking off."""

VOICE_MAX_TOKENS = 256
"""Completion cap (tokens); a few spoken sentences, and a bound on runaway replies."""

DEFAULT_STALL_TIMEOUT_S = 60.0
"""Longest silence of the LLM server within a completion, s: far past any first token of a voice reply (vLLM and
llama.cpp stream within a second on a GPU), and a bound on a server that never answers."""

class NemotronLLMBackend(str, Enum):
    """Kinds of OpenAI-compatible server that serve Nemotron 3 Nano.

    Each one selects a default API root and model name (see
    :meth:`NemotronLLMSettings.preset`); both can still be overridden.
    """

    VLLM = "vllm"
    """``vllm serve nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16`` on port 8000."""
    NIM = "nim"
    """A local Nemotron 3 Nano NIM container on port 8000."""
    HOSTED = "hosted"
    """NVIDIA's hosted API at integrate.api.nvidia.com (API key required)."""
    LLAMA_CPP = "llama.cpp"
    """``llama-server`` with a Nemotron 3 Nano GGUF on port 8080."""


_PRESETS: dict[NemotronLLMBackend, tuple[str, str]] = {
    NemotronLLMBackend.VLLM: (DEFAULT_LOCAL_BASE_URL, VLLM_MODEL_BF16),
    NemotronLLMBackend.NIM: (DEFAULT_LOCAL_BASE_URL, NIM_MODEL),
    NemotronLLMBackend.HOSTED: (HOSTED_BASE_URL, NIM_MODEL),
    NemotronLLMBackend.LLAMA_CPP: (DEFAULT_LLAMA_CPP_BASE_URL, LLAMA_CPP_MODEL),
}

_BACKEND_ALIASES = {
    "vllm": NemotronLLMBackend.VLLM,
    "nim": NemotronLLMBackend.NIM,
    "hosted": NemotronLLMBackend.HOSTED,
    "nvidia": NemotronLLMBackend.HOSTED,
    "build.nvidia.com": NemotronLLMBackend.HOSTED,
    "llama.cpp": NemotronLLMBackend.LLAMA_CPP,
    "llamacpp": NemotronLLMBackend.LLAMA_CPP,
    "llama_cpp": NemotronLLMBackend.LLAMA_CPP,
    "llama-cpp": NemotronLLMBackend.LLAMA_CPP,
    "llama-server": NemotronLLMBackend.LLAMA_CPP,
}


def _parse_backend(value: str | NemotronLLMBackend) -> NemotronLLMBackend:
    if isinstance(value, NemotronLLMBackend):
        return value
    backend = _BACKEND_ALIASES.get(value.strip().lower())
    if backend is None:
        choices = ", ".join(b.value for b in NemotronLLMBackend)
        raise ValueError(f"Unknown Nemotron LLM backend {value!r}: set {ENV_BACKEND} to one of {choices}.")
    return backend


@dataclass(frozen=True)
class NemotronLLMSettings:
    """Validated connection and sampling settings for Nemotron 3 Nano.

    Construction validates every field and raises :class:`ValueError` with a message
    that names the fix. Instances are immutable; derive variants with
    :func:`dataclasses.replace` (which re-validates) or ``create_nemotron_llm(s, **overrides)``.

    Attributes:
        base_url: OpenAI-compatible API root, ending in ``/v1`` (the client appends
            ``/chat/completions``).
        model: Model name sent with each request (see the module constants).
        api_key: Bearer token; :data:`NO_API_KEY` (``"none"``) for local servers
            that check none. Never empty.
        temperature: Sampling temperature, 0 to 2.
        max_tokens: Completion cap in tokens, at least 1.
        enable_thinking: Whether Nemotron reasons before answering. Off for voice:
            reasoning adds hundreds of milliseconds to seconds before the first
            spoken token.
        top_p: Nucleus sampling mass in (0, 1], or None for the server default.
        system_prompt: System instruction prepended to every request, or None to
            rely on the bot's own context messages. Defaults to
            :data:`VOICE_SYSTEM_PROMPT`.
        stall_timeout_s: Longest wait for the server's next bytes, the first token
            included, s. Past it the turn ends with an ``ErrorFrame`` ("Request timed
            out") and the pipeline goes on; without it (the OpenAI client waits 600 s)
            a server that takes a request and never answers holds every later frame,
            the ``EndFrame`` included.

    """

    base_url: str = DEFAULT_LOCAL_BASE_URL
    model: str = VLLM_MODEL_BF16
    api_key: str = NO_API_KEY
    temperature: float = VOICE_TEMPERATURE
    max_tokens: int = VOICE_MAX_TOKENS
    enable_thinking: bool = False
    top_p: float | None = None
    system_prompt: str | None = VOICE_SYSTEM_PROMPT
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S

    def __post_init__(self) -> None:
        """Validate every field.

        Raises:
            ValueError: If a field is out of range; the message names the fix.

        """
        url = self._check_base_url()
        self._check_model_and_key(url)
        self._check_sampling()
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise ValueError(
                f"Nemotron LLM system_prompt must be a string or None, got {type(self.system_prompt).__name__}."
            )

    def _check_base_url(self) -> str:
        """Validate ``base_url`` and store it stripped; return it."""
        if not isinstance(self.base_url, str) or not self.base_url.strip():
            raise ValueError(
                f"Nemotron LLM base_url is empty: set {ENV_BASE_URL}, e.g. {DEFAULT_LOCAL_BASE_URL}."
            )
        url = self.base_url.strip()
        if not url.startswith(("http://", "https://")):
            raise ValueError(
                f"Nemotron LLM base_url {url!r} must start with http:// or https:// "
                f"(e.g. {DEFAULT_LOCAL_BASE_URL})."
            )
        if url.rstrip("/").endswith(("/chat/completions", "/completions")):
            root = url.rstrip("/").rsplit("/chat/completions", 1)[0].rsplit("/completions", 1)[0]
            raise ValueError(
                f"Nemotron LLM base_url {url!r} is an endpoint, not the API root: use {root!r}; "
                "the client appends /chat/completions itself."
            )
        if url != self.base_url:
            object.__setattr__(self, "base_url", url)
        if not url.rstrip("/").endswith("/v1"):
            logger.warning(
                f"Nemotron LLM base_url {url!r} does not end in /v1; vLLM, NIM and llama.cpp "
                "serve the OpenAI API under /v1 (requests will 404 otherwise)."
            )
        return url

    def _check_model_and_key(self, url: str) -> None:
        """Validate ``model`` and ``api_key`` (the hosted API at ``url`` needs a real key)."""
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(
                f"Nemotron LLM model is empty: set {ENV_MODEL} (vLLM: {VLLM_MODEL_BF16}; NIM or hosted: "
                f"{NIM_MODEL}; llama.cpp: the name GET /v1/models reports)."
            )
        if not isinstance(self.api_key, str) or not self.api_key.strip():
            raise ValueError(
                f"Nemotron LLM api_key is empty: set {ENV_API_KEY}, or use {NO_API_KEY!r} for a "
                "local server that checks no key."
            )
        if "integrate.api.nvidia.com" in url and self.api_key.strip().lower() == NO_API_KEY:
            raise ValueError(
                f"NVIDIA's hosted API needs a key: set {ENV_API_KEY} (or {ENV_NVIDIA_API_KEY}) to an "
                "nvapi-... key from build.nvidia.com."
            )

    def _check_sampling(self) -> None:
        """Validate ``temperature``, ``top_p``, ``max_tokens`` and ``enable_thinking``."""
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise ValueError(f"Nemotron LLM temperature must be a number, got {self.temperature!r}.")
        if not math.isfinite(self.temperature) or not 0.0 <= self.temperature <= 2.0:
            raise ValueError(
                f"Nemotron LLM temperature {self.temperature} is outside 0..2: use about "
                f"{VOICE_TEMPERATURE} for voice."
            )
        if self.top_p is not None:
            if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)):
                raise ValueError(f"Nemotron LLM top_p must be a number or None, got {self.top_p!r}.")
            if not math.isfinite(self.top_p) or not 0.0 < self.top_p <= 1.0:
                raise ValueError(
                    f"Nemotron LLM top_p {self.top_p} is outside (0, 1]: use None for the server default."
                )
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise ValueError(f"Nemotron LLM max_tokens must be an integer, got {self.max_tokens!r}.")
        if self.max_tokens < 1:
            raise ValueError(
                f"Nemotron LLM max_tokens {self.max_tokens} must be at least 1: use about "
                f"{VOICE_MAX_TOKENS} for voice."
            )
        if not isinstance(self.enable_thinking, bool):
            raise ValueError(
                f"Nemotron LLM enable_thinking must be True or False, got {self.enable_thinking!r}."
            )
        stall = self.stall_timeout_s
        if isinstance(stall, bool) or not isinstance(stall, (int, float)) or not math.isfinite(stall) or stall <= 0:
            raise ValueError(
                f"Nemotron LLM stall_timeout_s must be a number of seconds > 0, got {stall!r}: use about "
                f"{DEFAULT_STALL_TIMEOUT_S:g} ({ENV_STALL_TIMEOUT_S})."
            )

    @classmethod
    def preset(cls, backend: str | NemotronLLMBackend, **overrides: Any) -> NemotronLLMSettings:
        """Build settings with the default API root and model name of a server kind.

        Args:
            backend: A :class:`NemotronLLMBackend` or its name (``"vllm"``, ``"nim"``,
                ``"hosted"``, ``"llama.cpp"``).
            **overrides: Field values that replace the preset's.

        Returns:
            The validated settings.

        Raises:
            ValueError: If the backend is unknown or a value is invalid.
            TypeError: If an override names no field.

        """
        base_url, model = _PRESETS[_parse_backend(backend)]
        values: dict[str, Any] = {"base_url": base_url, "model": model}
        values.update(overrides)
        return cls(**values)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> NemotronLLMSettings:
        """Read settings from an environment mapping (pass ``os.environ`` after ``load_env_file()``).

        Keys (all optional; empty values count as unset):

        - ``NEMOTRON_LLM_BACKEND``: ``vllm`` (default), ``nim``, ``hosted`` or
          ``llama.cpp``; picks the default base URL and model.
        - ``NEMOTRON_LLM_BASE_URL``, ``NEMOTRON_LLM_MODEL``: override the preset.
        - ``NEMOTRON_LLM_API_KEY``: bearer token; for the hosted backend
          ``NVIDIA_API_KEY`` is used when this is unset. Defaults to ``"none"``.
        - ``NEMOTRON_LLM_TEMPERATURE``, ``NEMOTRON_LLM_TOP_P``,
          ``NEMOTRON_LLM_MAX_TOKENS``: sampling.
        - ``NEMOTRON_LLM_ENABLE_THINKING``: ``true``/``false`` (default false).
        - ``NEMOTRON_LLM_SYSTEM_PROMPT``: replaces :data:`VOICE_SYSTEM_PROMPT`.

        Args:
            environ: The mapping to read; nothing else is consulted.

        Returns:
            The validated settings.

        Raises:
            ValueError: If a value does not parse or is out of range; the message
                names the key.

        """
        backend = _parse_backend(env_text(environ, ENV_BACKEND) or NemotronLLMBackend.VLLM.value)
        values = settings_from_env(environ)
        api_key = env_text(environ, ENV_API_KEY)
        if api_key is None and backend is NemotronLLMBackend.HOSTED:
            api_key = env_text(environ, ENV_NVIDIA_API_KEY)
        if api_key is not None:
            values["api_key"] = api_key
        return cls.preset(backend, **values)

    def extra_body(self) -> dict[str, Any]:
        """Return the provider-specific request body fields these settings send.

        Returns:
            ``{"chat_template_kwargs": {"enable_thinking": <bool>}}``.

        """
        return thinking_extra_body(self.enable_thinking)

    def redacted(self) -> dict[str, Any]:
        """Return the settings as a dict safe to log (API key masked, prompt shortened).

        Returns:
            Field names to values.

        """
        values = dataclasses.asdict(self)
        key = self.api_key
        values["api_key"] = key if key.lower() == NO_API_KEY else f"{key[:4]}…({len(key)} chars)"
        if self.system_prompt and len(self.system_prompt) > 40:
            values["system_prompt"] = self.system_prompt[:40] + "…"
        return values


def thinking_extra_body(enable_thinking: bool) -> dict[str, Any]:
    """Request-body fields that switch Nemotron's reasoning on or off.

    Args:
        enable_thinking: Whether the chat template should let the model reason first.

    Returns:
        ``{"chat_template_kwargs": {"enable_thinking": enable_thinking}}``.

    """
    return {"chat_template_kwargs": {"enable_thinking": bool(enable_thinking)}}


class NemotronLLMService(NvidiaLLMService):
    """Pipecat's ``NvidiaLLMService`` whose OpenAI client gives up on a server that goes silent.

    Pipecat's OpenAI client keeps the OpenAI library's 600 s timeout. While a completion waits, the LLM's frames
    queue behind it, the ``EndFrame`` too, and a ``CancelFrame`` queued after that ``EndFrame`` never runs: a
    server that accepts a request and never answers holds the whole pipeline for ten minutes. Here the client's
    read timeout is ``stall_timeout_s``, so such a turn ends with an ``ErrorFrame`` ("Request timed out").

    Args:
        stall_timeout_s: Longest wait for the server's next bytes, s (connecting: at most 10 s).
        **kwargs: ``NvidiaLLMService`` arguments.

    """

    def __init__(self, *, stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S, **kwargs: Any) -> None:
        # Read by create_client, which the base constructor calls.
        self.stall_timeout_s = stall_timeout_s
        super().__init__(**kwargs)

    def create_client(self, api_key: Any = None, base_url: Any = None, **kwargs: Any) -> Any:
        """Pipecat's client, with ``stall_timeout_s`` as its read timeout."""
        import httpx

        client = super().create_client(api_key=api_key, base_url=base_url, **kwargs)
        return client.with_options(timeout=httpx.Timeout(self.stall_timeout_s, connect=min(10.0, self.stall_timeout_s)))


def create_nemotron_llm(
    settings: NemotronLLMSettings | None = None,
    /,
    *,
    service_kwargs: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> OpenAILLMService:
    """Create a Pipecat LLM service for Nemotron 3 Nano with voice defaults.

    The service is Pipecat's :class:`~pipecat.services.nvidia.llm.NvidiaLLMService`
    (an :class:`~pipecat.services.openai.llm.OpenAILLMService`): if a server streams
    reasoning anyway (``reasoning_content`` or a leading ``<think>`` block), it becomes
    ``LLMThought*Frame`` s and is never spoken. Requests carry
    ``extra_body={"chat_template_kwargs": {"enable_thinking": ...}}`` through
    ``Settings.extra``, plus ``model``, ``temperature``, ``max_tokens``, ``top_p`` and
    the system prompt as Pipecat's ``system_instruction``.

    Args:
        settings: Connection and sampling settings; defaults to a local vLLM server.
        service_kwargs: Extra keyword arguments for the service constructor (e.g.
            ``name``, ``retry_on_timeout``, ``retry_timeout_secs``).
        **overrides: :class:`NemotronLLMSettings` field values that replace those in
            ``settings`` (validated the same way).

    Returns:
        The configured service; add it to a pipeline after the user context aggregator.

    Raises:
        TypeError: If an override names no settings field.
        ValueError: If a value is invalid.

    """
    base = settings if settings is not None else NemotronLLMSettings()
    if overrides:
        known = {f.name for f in dataclasses.fields(NemotronLLMSettings)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(
                f"create_nemotron_llm got unknown setting(s) {unknown}; valid: {sorted(known)}. "
                "Pass service constructor arguments in service_kwargs."
            )
        base = dataclasses.replace(base, **overrides)

    llm_settings = NvidiaLLMService.Settings(
        model=base.model,
        system_instruction=base.system_prompt,
        temperature=base.temperature,
        max_tokens=base.max_tokens,
        extra={"extra_body": base.extra_body()},
    )
    if base.top_p is not None:
        llm_settings.top_p = base.top_p

    logger.debug(f"Creating Nemotron LLM service: {base.redacted()}")
    service = NemotronLLMService(
        api_key=base.api_key,
        base_url=base.base_url,
        settings=llm_settings,
        stall_timeout_s=base.stall_timeout_s,
        **dict(service_kwargs or {}),
    )
    # Pipecat 1.14 adds a "developer" message after an interruption; llama.cpp's server refuses the role (HTTP 500,
    # the turn goes unanswered) and Nemotron's chat template knows only system/user/assistant/tool. Pipecat's
    # adapter then sends such messages as "user" messages, as it does for Ollama, Together and Mistral.
    service.supports_developer_role = False
    return service
