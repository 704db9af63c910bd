"""The engines lower Python's thread switch interval so their model threads are not starved behind the event loop.

With CPython's 5 ms default, each torch op of a model thread could wait up to 5 ms to take the GIL back while the
event loop ran Pipecat's pipelines: 8 sessions in one process saw ASR finalizes of seconds (docs/BENCHMARKS.md §12).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from pipecat_nemotron.asr import EngineConfig
from pipecat_nemotron.runtime.gil import DEFAULT_SWITCH_INTERVAL_MS, shorten_switch_interval


@pytest.fixture
def cpython_default_interval() -> Iterator[None]:
    """Start from CPython's default 5 ms; restore whatever was in force after the test."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


def test_the_documented_default_is_a_tenth_of_a_millisecond() -> None:
    """README, docs/TTS.md and docs/ARCHITECTURE.md give the interval the engines set: 0.1 ms (0.5 ms still starved
    the model threads at 8 sessions, BENCHMARKS §12)."""
    import inspect
    import re
    from pathlib import Path

    from pipecat_nemotron.tts.magpie import MagpieEngine

    repo = Path(__file__).resolve().parents[1]
    for doc in ("README.md", "docs/TTS.md", "docs/ARCHITECTURE.md"):
        text = (repo / doc).read_text()
        # "lowers Python's thread switch interval to 0.1 ms", "lower `sys.setswitchinterval` to 0.1 ms"
        stated = re.findall(r"(?:switch interval|setswitchinterval`?)\s+to\s+(\d+(?:\.\d+)?)\s+ms", text)
        assert stated and all(float(ms) == DEFAULT_SWITCH_INTERVAL_MS for ms in stated), (doc, stated)
    assert DEFAULT_SWITCH_INTERVAL_MS == 0.1
    assert EngineConfig().gil_switch_interval_ms == 0.1
    assert inspect.signature(MagpieEngine).parameters["gil_switch_interval_ms"].default == 0.1


@pytest.mark.parametrize("bad", [0, -1.0, True, "0.5"])
def test_config_rejects_a_bad_interval(bad: object) -> None:
    with pytest.raises(ValueError, match="gil_switch_interval_ms"):
        EngineConfig(gil_switch_interval_ms=bad)  # type: ignore[arg-type]


def test_interval_is_only_ever_lowered(cpython_default_interval: None) -> None:
    assert shorten_switch_interval(1.0) == pytest.approx(1.0)
    assert shorten_switch_interval(2.0) == pytest.approx(
        1.0
    )  # another engine asking for more changes nothing
    assert shorten_switch_interval(None) == pytest.approx(1.0)
    assert sys.getswitchinterval() == pytest.approx(0.001)


async def test_asr_engine_start_sets_its_configured_interval(
    cpython_default_interval: None, engine_factory
) -> None:
    await engine_factory(gil_switch_interval_ms=0.25, warmup=False)
    assert sys.getswitchinterval() == pytest.approx(0.00025)


async def test_asr_engine_leaves_the_interval_when_told(
    cpython_default_interval: None, engine_factory
) -> None:
    await engine_factory(gil_switch_interval_ms=None, warmup=False)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_magpie_engine_lowers_the_interval(cpython_default_interval: None, tiny_magpie) -> None:
    from pipecat_nemotron.tts.magpie import MagpieEngine

    magpie, codec = tiny_magpie
    engine = MagpieEngine(str(magpie), device="cpu", codec_model_path=str(codec), warmup=False)
    try:
        assert sys.getswitchinterval() == pytest.approx(DEFAULT_SWITCH_INTERVAL_MS / 1000)
    finally:
        engine.close()


def test_magpie_engine_leaves_the_interval_when_told(cpython_default_interval: None, tiny_magpie) -> None:
    from pipecat_nemotron.tts.magpie import MagpieEngine

    magpie, codec = tiny_magpie
    engine = MagpieEngine(
        str(magpie), device="cpu", codec_model_path=str(codec), warmup=False, gil_switch_interval_ms=None
    )
    try:
        assert sys.getswitchinterval() == pytest.approx(0.005)
    finally:
        engine.close()
