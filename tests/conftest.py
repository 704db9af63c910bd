"""Shared fixtures: tiny models of the Nemotron streaming family, built once per test session."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# Tests run on CPU with two cores; keep torch from oversubscribing them.
os.environ.setdefault("OMP_NUM_THREADS", "2")

from openai_server import openai_server  # noqa: E402,F401  (fixture shared by all test files)

from pipecat_nemotron.models import TINY_MODEL_PATH as TRAINED_MODEL  # noqa: E402,F401  (test modules import it)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu``-marked tests where CUDA is absent (and say so)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; run scripts/gpu_check.sh on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_random_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight 4-layer FastConformer-RNNT (8x dw_striding, chunked_limited x4 lookaheads, causal)."""
    from pipecat_nemotron.engine.architectures import build_random_model

    return build_random_model(tmp_path_factory.mktemp("models") / "tiny_random.nemo", size="tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_quiet_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Like ``tiny_random_model`` with the joint biased towards blank, so decoding costs what a trained model's does."""
    from pipecat_nemotron.engine.architectures import build_random_model

    return build_random_model(
        tmp_path_factory.mktemp("models") / "tiny_quiet.nemo", size="tiny", seed=1, blank_bias=6.0
    )


@pytest.fixture(scope="session")
def tiny_multilingual_random_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight tiny model of the multilingual prompt class (en-US, es-ES, de-DE, auto; five modes)."""
    from pipecat_nemotron.engine.architectures import build_random_model

    return build_random_model(
        tmp_path_factory.mktemp("models") / "tiny_multilingual_random.nemo",
        size="tiny",
        seed=2,
        languages=["en-US", "es-ES", "de-DE"],
    )


@pytest.fixture(scope="session")
def tiny_magpie(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(magpie .nemo, codec .nemo); the codec is moved away from the path stored in the checkpoint."""
    from pipecat_nemotron.magpie.tiny import build_tiny_magpie

    root = tmp_path_factory.mktemp("magpie")
    magpie, codec = build_tiny_magpie(root / "build")
    moved = root / "codec" / "codec.nemo"
    moved.parent.mkdir()
    shutil.move(codec, moved)
    return magpie, moved


@pytest.fixture(scope="session")
def bot_magpie(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Magpie for a bot started as a user would (``MAGPIE_TTS_MODEL``): its codec stays at the path the
    checkpoint stores (the bot's settings take no codec path), and it ends every sentence at NeMo's 4-frame
    minimum (~0.19 s of audio), so replies are short and do not overlap the next turn."""
    from pipecat_nemotron.magpie.tiny import build_tiny_magpie

    magpie, _codec = build_tiny_magpie(tmp_path_factory.mktemp("bot_magpie"), end_of_speech_bias=30.0)
    return magpie
