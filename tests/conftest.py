"""Shared fixtures: tiny models of the Nemotron streaming family, built once per test session."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pytest
import pytest_asyncio

# Tests run on CPU with two cores; keep torch from oversubscribing them: one thread per pytest-xdist worker
# (`make test` runs two), two when the suite runs in one process.
os.environ.setdefault("OMP_NUM_THREADS", "1" if os.environ.get("PYTEST_XDIST_WORKER") else "2")

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
    from pipecat_nemotron.asr.architectures import build_random_model

    return build_random_model(tmp_path_factory.mktemp("models") / "tiny_random.nemo", size="tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_quiet_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Like ``tiny_random_model`` with the joint biased towards blank, so decoding costs what a trained model's does."""
    from pipecat_nemotron.asr.architectures import build_random_model

    return build_random_model(
        tmp_path_factory.mktemp("models") / "tiny_quiet.nemo", size="tiny", seed=1, blank_bias=6.0
    )


@pytest.fixture(scope="session")
def tiny_eou_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight tiny model whose vocabulary has ``<EOU>`` (as ``nvidia/parakeet_realtime_eou_120m-v1``'s),
    its joint biased so the greedy decoder emits it between ordinary tokens."""
    from pipecat_nemotron.asr.architectures import build_random_model

    return build_random_model(
        tmp_path_factory.mktemp("models") / "tiny_eou.nemo", size="tiny", seed=3, markers=("<EOU>",), marker_bias=0.3
    )


@pytest.fixture(scope="session")
def tiny_multilingual_random_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight tiny model of the multilingual prompt class (en-US, es-ES, de-DE, auto; five modes)."""
    from pipecat_nemotron.asr.architectures import build_random_model

    return build_random_model(
        tmp_path_factory.mktemp("models") / "tiny_multilingual_random.nemo",
        size="tiny",
        seed=2,
        languages=["en-US", "es-ES", "de-DE"],
    )


@pytest.fixture(scope="session")
def tiny_magpie(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(magpie .nemo, codec .nemo); the codec is moved away from the path stored in the checkpoint."""
    from pipecat_nemotron.tts.magpie.tiny import build_tiny_magpie

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
    from pipecat_nemotron.tts.magpie.tiny import build_tiny_magpie

    magpie, _codec = build_tiny_magpie(tmp_path_factory.mktemp("bot_magpie"), end_of_speech_bias=30.0)
    return magpie


@pytest.fixture(scope="module")
def asr_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled trained tiny model (or, where it is absent, a random one biased to emit a few tokens)."""
    if TRAINED_MODEL.exists():
        return TRAINED_MODEL
    from pipecat_nemotron.asr.architectures import build_random_model

    return build_random_model(
        tmp_path_factory.mktemp("server_models") / "tiny_b08.nemo", size="tiny", seed=1, blank_bias=0.8
    )


@pytest.fixture(scope="module")
def magpie_engine(tiny_magpie):
    """A started tiny Magpie engine shared by a test module."""
    from pipecat_nemotron.tts.magpie import MagpieEngine

    magpie, codec = tiny_magpie
    engine = MagpieEngine(str(magpie), device="cpu", codec_model_path=str(codec))
    engine.wait_until_ready(timeout=300)
    yield engine
    engine.close()


@pytest.fixture
async def engine_factory():
    """``make(model=TINY_MODEL_PATH, **overrides)``: a started engine (CPU, 4 streams unless overridden),
    stopped when the test ends. Module-scoped engines use :func:`helpers.started_engine`, the same factory."""
    from helpers import started_engine

    async with contextlib.AsyncExitStack() as stack:

        async def make(model: Path | str = TRAINED_MODEL, **overrides: object):
            return await stack.enter_async_context(started_engine(model, **overrides))

        yield make


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(asr_model: Path):
    """The server tests' engine (10 streams, torch on one thread), shared by a test module. Modules that need
    another engine define their own ``engine`` fixture (with :func:`engine_factory` or
    :func:`helpers.started_engine`)."""
    from helpers import started_engine

    async with started_engine(asr_model, one_thread=True, max_streams=10, max_batch_size=10) as eng:
        yield eng


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(engine):
    """A started server on the module's ``engine``: token :data:`helpers.TOKEN`, 4 sessions, 32 KiB messages."""
    from helpers import TOKEN, own_server

    async with own_server(
        engine,
        tokens=(TOKEN,),
        allowed_origins=("https://bots.example",),
        max_sessions=4,
        max_message_bytes=32 * 1024,
        idle_timeout_s=5.0,
        config_timeout_s=5.0,
    ) as srv:
        yield srv
