"""Exceptions raised by the Magpie TTS engine."""

from __future__ import annotations


class MagpieSynthesisError(RuntimeError):
    """A synthesis request failed inside the engine (the engine itself keeps serving)."""


class MagpieEngineError(RuntimeError):
    """The engine could not load its model, or was closed."""
