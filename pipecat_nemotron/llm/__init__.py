"""The LLM leg: an OpenAI-compatible Nemotron Nano client for Pipecat, its ``.env`` settings and endpoint check.

``fake_server`` is a loopback OpenAI-compatible server with scripted replies, for tests and benchmarks.
Names load on first access.
"""

from __future__ import annotations

from pipecat_nemotron.runtime.lazy import lazy_exports

_EXPORTS = {
    "NemotronLLMBackend": "pipecat_nemotron.llm.service",
    "NemotronLLMSettings": "pipecat_nemotron.llm.service",
    "create_nemotron_llm": "pipecat_nemotron.llm.service",
    "check_llm_endpoint": "pipecat_nemotron.llm.check",
    "load_env_file": "pipecat_nemotron.llm.env",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
