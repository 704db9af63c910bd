"""``eager=EagerSettings(...)`` on both STT services, and 0.1's eager keyword arguments (deprecated)."""

from __future__ import annotations

import pytest

from pipecat_nemotron.models import TINY_MODEL_PATH
from pipecat_nemotron.stt import EagerSettings, NemotronServerSTTService, NemotronSTTService


def test_eager_settings_reach_the_pause_detector_and_the_hold_words() -> None:
    stt = NemotronSTTService(model=str(TINY_MODEL_PATH), eager=EagerSettings(silence_ms=96, hold_words={"and"}))
    assert stt._eager is not None and stt._eager.pauses.silence_ms == 96.0
    assert stt._eager.hold_words == frozenset({"and"})
    assert NemotronSTTService(model=str(TINY_MODEL_PATH))._eager is None  # off by default
    remote = NemotronServerSTTService(url="ws://127.0.0.1:9/v1/asr", token="t", eager=EagerSettings(signal="asr"))
    assert remote._eager is not None and remote._eager.pauses.signal == "asr"


def test_bad_eager_settings_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="eager_silence_ms must be > 0"):
        NemotronSTTService(model=str(TINY_MODEL_PATH), eager=EagerSettings(silence_ms=0))
    with pytest.raises(ValueError, match="eager_signal must be one of"):
        NemotronSTTService(model=str(TINY_MODEL_PATH), eager=EagerSettings(signal="both-ish"))  # type: ignore[arg-type]


def test_old_eager_keywords_still_work_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"eager=EagerSettings"):
        stt = NemotronSTTService(model=str(TINY_MODEL_PATH), enable_eager_end_of_turn=True, eager_silence_ms=80)
    assert stt._eager is not None and stt._eager.pauses.silence_ms == 80.0
    with pytest.warns(DeprecationWarning):
        off = NemotronSTTService(model=str(TINY_MODEL_PATH), enable_eager_end_of_turn=False)
    assert off._eager is None
    with pytest.raises(ValueError, match="not both"):
        NemotronSTTService(model=str(TINY_MODEL_PATH), eager=EagerSettings(), eager_silence_ms=80)


def test_stateful_parts_of_eager_settings_are_not_shared_between_live_services() -> None:
    from pipecat_nemotron.stt.eager import TurnCommit

    settings = EagerSettings(turn_commit=TurnCommit())
    first = NemotronSTTService(model=str(TINY_MODEL_PATH), eager=settings)
    with pytest.raises(ValueError, match="give each STT service its own"):
        NemotronSTTService(model=str(TINY_MODEL_PATH), eager=settings)
    del first  # a service that is gone no longer holds them
    import gc

    gc.collect()
    assert NemotronSTTService(model=str(TINY_MODEL_PATH), eager=settings).turn_commit is settings.turn_commit
