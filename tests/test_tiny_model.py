"""The bundled tiny trained model: real architecture family, loads like the real checkpoint, and transcribes."""

from __future__ import annotations

import json
import wave

import pytest

from pipecat_nemotron.bench.common import normalize_text, word_errors
from pipecat_nemotron.engine import EngineConfig, NemotronEngine
from pipecat_nemotron.models import TINY_MODEL_PATH

HELDOUT = TINY_MODEL_PATH.parents[2] / "tests" / "assets" / "heldout"


def test_committed_model_is_cache_aware_nemotron_family() -> None:
    import tarfile

    import yaml

    assert TINY_MODEL_PATH.stat().st_size <= 10 * 1024 * 1024
    with tarfile.open(TINY_MODEL_PATH) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("model_config.yaml"))
        cfg = yaml.safe_load(tar.extractfile(member))
    enc = cfg["encoder"]
    assert enc["subsampling"] == "dw_striding" and enc["subsampling_factor"] == 8
    assert enc["att_context_style"] == "chunked_limited" and enc["causal_downsampling"] is True
    assert sorted(map(list, enc["att_context_size"])) == [[70, 0], [70, 1], [70, 6], [70, 13]]
    assert enc["conv_context_size"] == "causal"
    assert cfg["preprocessor"]["normalize"] == "NA"


async def test_heldout_wer_streamed_at_160ms() -> None:
    manifest = json.loads((HELDOUT / "manifest.json").read_text())
    errors = {"seen_voice": [0, 0], "unseen_voice": [0, 0]}
    async with NemotronEngine(EngineConfig(model=str(TINY_MODEL_PATH), device="cpu", max_streams=8)) as engine:
        for entry in manifest:
            with wave.open(str(HELDOUT / entry["audio"]), "rb") as w:
                pcm = w.readframes(w.getnframes())
            final = await engine.transcribe(pcm, latency_ms=160)
            errors[entry["split"]][0] += word_errors(entry["text"], final.text)
            errors[entry["split"]][1] += len(normalize_text(entry["text"]).split())
    wer = {split: 100.0 * e / n for split, (e, n) in errors.items()}
    print(f"held-out WER at 160 ms: {wer}")
    # Bounds of the committed checkpoint (docs/TINY_MODEL.md has the full-set figures); a regression in the
    # engine's streaming path shows up here first.
    assert wer["seen_voice"] <= 15.0, wer
    assert wer["unseen_voice"] <= 25.0, wer


@pytest.mark.parametrize("name", ["demo_weather.wav", "demo_timer.wav", "demo_math.wav"])
async def test_demo_wavs_are_transcribed(name: str) -> None:
    demo = TINY_MODEL_PATH.parent / "demo"
    expected = json.loads((demo / "transcripts.json").read_text())[name]
    with wave.open(str(demo / name), "rb") as w:
        pcm = w.readframes(w.getnframes())
    async with NemotronEngine(EngineConfig(model=str(TINY_MODEL_PATH), device="cpu", max_streams=1)) as engine:
        final = await engine.transcribe(pcm, latency_ms=160)
    ref = normalize_text(expected)
    assert word_errors(ref, final.text) <= max(1, len(ref.split()) // 4), (expected, final.text)
