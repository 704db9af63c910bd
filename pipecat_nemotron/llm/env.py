"""Where the Nemotron LLM settings come from in the environment: the keys and how their values parse.

Plain Python (no Pipecat, no OpenAI client), so a bot or the agent can name the keys without importing the
LLM service. :meth:`~pipecat_nemotron.llm.service.NemotronLLMSettings.from_env` is the reader; ``docs/LLM.md`` lists
the keys for users.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "ENV_BACKEND",
    "ENV_BASE_URL",
    "ENV_MODEL",
    "ENV_API_KEY",
    "ENV_TEMPERATURE",
    "ENV_TOP_P",
    "ENV_MAX_TOKENS",
    "ENV_ENABLE_THINKING",
    "ENV_SYSTEM_PROMPT",
    "ENV_STALL_TIMEOUT_S",
    "ENV_NVIDIA_API_KEY",
    "ENV_PREFIX",
    "env_text",
    "load_env_file",
    "settings_from_env",
]

ENV_BACKEND = "NEMOTRON_LLM_BACKEND"
ENV_BASE_URL = "NEMOTRON_LLM_BASE_URL"
ENV_MODEL = "NEMOTRON_LLM_MODEL"
ENV_API_KEY = "NEMOTRON_LLM_API_KEY"
ENV_TEMPERATURE = "NEMOTRON_LLM_TEMPERATURE"
ENV_TOP_P = "NEMOTRON_LLM_TOP_P"
ENV_MAX_TOKENS = "NEMOTRON_LLM_MAX_TOKENS"
ENV_ENABLE_THINKING = "NEMOTRON_LLM_ENABLE_THINKING"
ENV_SYSTEM_PROMPT = "NEMOTRON_LLM_SYSTEM_PROMPT"
ENV_STALL_TIMEOUT_S = "NEMOTRON_LLM_STALL_TIMEOUT_S"

ENV_NVIDIA_API_KEY = "NVIDIA_API_KEY"
"""The hosted API's key, read when ``NEMOTRON_LLM_API_KEY`` is unset."""
ENV_PREFIX = "NEMOTRON_LLM_"
"""Every ``ENV_*`` key above but :data:`ENV_NVIDIA_API_KEY` starts with it."""

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def load_env_file(override: bool = False) -> str | None:
    """Load the ``.env`` of the current directory (or the nearest one above it) into ``os.environ``.

    The demo, the bots and the LLM recipes call this: a ``.env`` belongs to where the user runs a program, not to
    where the package is installed (python-dotenv's bare ``load_dotenv()`` searches from the calling module's
    folder, which for an installed wheel is ``site-packages``). ``PYTHON_DOTENV_DISABLED=1`` turns it off.

    Args:
        override: Let the file's values replace variables already set in the environment.

    Returns:
        The path of the file loaded, or None when there is none (or loading is disabled).

    """
    from dotenv import find_dotenv, load_dotenv

    path = find_dotenv(usecwd=True)
    if not path or not load_dotenv(path, override=override):
        return None
    return path


def env_text(environ: Mapping[str, str], key: str) -> str | None:
    """``environ[key]`` stripped, or None when unset or blank."""
    value = environ.get(key)
    if value is None or not value.strip():
        return None
    return value.strip()


def _parse_text(key: str, text: str) -> str:
    return text


def _parse_float(key: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{key}={text!r} is not a number.") from None


def _parse_int(key: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{key}={text!r} is not an integer (e.g. 256).") from None


def _parse_bool(key: str, text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError(f"{key}={text!r}: use true or false.")


#: What :func:`settings_from_env` reads: (key, settings field, parser).
_ENV_FIELDS: tuple[tuple[str, str, Callable[[str, str], Any]], ...] = (
    (ENV_BASE_URL, "base_url", _parse_text),
    (ENV_MODEL, "model", _parse_text),
    (ENV_TEMPERATURE, "temperature", _parse_float),
    (ENV_TOP_P, "top_p", _parse_float),
    (ENV_MAX_TOKENS, "max_tokens", _parse_int),
    (ENV_ENABLE_THINKING, "enable_thinking", _parse_bool),
    (ENV_SYSTEM_PROMPT, "system_prompt", _parse_text),
    (ENV_STALL_TIMEOUT_S, "stall_timeout_s", _parse_float),
)


def settings_from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings fields ``environ`` sets, parsed (all but the backend and the API key, which need the backend).

    Args:
        environ: The mapping to read; blank values count as unset.

    Returns:
        Field name to value, for the keys that are set.

    Raises:
        ValueError: A value does not parse; the message names the key.

    """
    values: dict[str, Any] = {}
    for key, name, parse in _ENV_FIELDS:
        if (text := env_text(environ, key)) is not None:
            values[name] = parse(key, text)
    return values
