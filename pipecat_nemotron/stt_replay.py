"""Deprecated import path: this module moved to :mod:`pipecat_nemotron.stt.remote.replay`."""

from pipecat_nemotron._moved import alias

alias(__name__)
