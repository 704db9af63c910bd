"""sherpa-onnx as a second opinion: the tiny model exported to its format gives our engine's transcripts.

sherpa-onnx (C++ on ONNX Runtime) streams the exported model with its own cache handling, feature extractor and
greedy search, none of it written here; equal transcripts check our cache-aware step against it. The full
held-out comparison (both modes, with the differences explained) is ``python -m pipecat_nemotron.bench peer
--agreement`` (docs/BENCHMARKS.md section 13).
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from pipecat_nemotron.agent.wav_input import read_float32
from pipecat_nemotron.asr import EngineConfig, NemotronEngine
from pipecat_nemotron.bench.audio import HELDOUT_MANIFEST, manifest_rows
from pipecat_nemotron.bench.sherpa_run import sherpa_missing
from pipecat_nemotron.bench.wer import normalize_text
from pipecat_nemotron.models import TINY_MODEL_PATH


def heldout_audio(names: tuple[str, ...]) -> list:
    rows = {r["audio"].rsplit("/", 1)[-1]: r for r in manifest_rows(HELDOUT_MANIFEST)}
    return [read_float32(rows[name]["audio"]) for name in names]


needs_sherpa = pytest.mark.skipif(sherpa_missing() is not None, reason=sherpa_missing() or "")

#: Three held-out clips (training voices, sentences never seen in training).
CLIPS = ("seen_000000.flac", "seen_000003.flac", "seen_000006.flac")


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory: pytest.TempPathFactory):
    from pipecat_nemotron.bench.sherpa_export import export_sherpa_onnx

    return export_sherpa_onnx(TINY_MODEL_PATH, tmp_path_factory.mktemp("sherpa") / "160", 160)


@needs_sherpa
def test_export_writes_what_sherpa_reads(tiny_export) -> None:
    from pipecat_nemotron.bench.sherpa_run import read_metadata

    assert tiny_export.exists() and dataclasses.replace(tiny_export, int8=True).exists()
    meta = read_metadata(tiny_export)
    # 160 ms mode: 16 mel frames per step plus the 9-frame pre-encode cache; 4 layers, 70 cached frames.
    assert (meta["window_size"], meta["chunk_shift"], meta["subsampling_factor"]) == ("25", "16", "8")
    assert (meta["cache_last_channel_dim1"], meta["cache_last_channel_dim2"]) == ("4", "70")
    tokens = tiny_export.tokens.read_text().splitlines()
    assert tokens[-1] == f"<blk> {len(tokens) - 1}" and int(meta["vocab_size"]) == len(tokens) - 1


@needs_sherpa
async def test_sherpa_onnx_gives_our_transcripts_at_160ms(tiny_export) -> None:
    from pipecat_nemotron.bench import sherpa_run

    audio = heldout_audio(CLIPS)
    config = EngineConfig(model=str(TINY_MODEL_PATH), device="cpu", max_streams=3, cpu_threads=1)
    async with NemotronEngine(config) as engine:
        ours = [f.text for f in await asyncio.gather(*(engine.transcribe(a, latency_ms=160) for a in audio))]
    recognizer = sherpa_run.make_recognizer(tiny_export, threads=1)
    theirs = sherpa_run.transcribe(recognizer, tiny_export, audio)
    # The same words. sherpa-onnx's greedy search emits at most one token per encoder frame (``sherpa_run``'s
    # docstring), so a mark the model emits in the frame of a word's last piece ("please.") can be missing there.
    assert [normalize_text(t) for t in theirs] == [normalize_text(t) for t in ours], (theirs, ours)
    assert all(t for t in ours), ours  # real sentences, not three empty strings


def test_exporter_refuses_a_model_outside_the_family(tmp_path) -> None:
    from omegaconf import OmegaConf

    from pipecat_nemotron.asr.architectures import TINY, asr_model_config, train_tokenizer
    from pipecat_nemotron.bench.sherpa_export import SherpaExportError, export_sherpa_onnx
    from pipecat_nemotron.runtime.nemo_logs import quiet_nemo

    # A cache-aware streaming model the engine runs, but with mel features sherpa-onnx does not compute.
    cfg = asr_model_config(str(train_tokenizer(tmp_path / "tok")), TINY)
    cfg["preprocessor"].update(window="hamming", n_fft=400)
    with quiet_nemo():
        from nemo.collections.asr.models import EncDecRNNTBPEModel

        EncDecRNNTBPEModel(cfg=OmegaConf.create(cfg)).save_to(str(tmp_path / "hamming.nemo"))
    with pytest.raises(
        SherpaExportError, match=r"hamming\.nemo is not a model of the Nemotron.*window='hann'"
    ):
        export_sherpa_onnx(tmp_path / "hamming.nemo", tmp_path / "out", 160)
    assert not list((tmp_path / "out").glob("*.onnx"))


async def test_int8_engine_quantises_the_feed_forward_and_transcribes() -> None:
    """``EngineConfig(dtype="int8")``: the CPU option added because sherpa-onnx int8 beat our fp32 (BENCHMARKS §13)."""
    import torch

    with pytest.raises(ValueError, match="int8.*CPU only.*device='cpu'"):
        EngineConfig(model=str(TINY_MODEL_PATH), device="cuda", dtype="int8")
    audio = heldout_audio(CLIPS)
    texts = {}
    for dtype in ("float32", "int8"):
        config = EngineConfig(
            model=str(TINY_MODEL_PATH), device="cpu", dtype=dtype, max_streams=3, cpu_threads=1
        )
        async with NemotronEngine(config) as engine:
            texts[dtype] = [
                f.text for f in await asyncio.gather(*(engine.transcribe(a, latency_ms=160) for a in audio))
            ]
            linear1 = engine.model.encoder.layers[0].feed_forward1.linear1
            assert isinstance(linear1, torch.nn.Linear) == (dtype == "float32"), type(linear1)
    assert texts["int8"] == texts["float32"]


def test_peer_benchmark_skips_with_a_message_without_sherpa_onnx(monkeypatch, capsys) -> None:
    from pipecat_nemotron.bench import peer, sherpa_run

    monkeypatch.setattr(sherpa_run, "sherpa_missing", lambda: sherpa_run.SHERPA_MISSING)
    assert peer.main(["--model", "tiny"]) == {"skipped": sherpa_run.SHERPA_MISSING}
    assert (
        "peer: skipped: sherpa-onnx is not installed: pip install 'pipecat-nemotron[bench]'"
        in capsys.readouterr().out
    )


@needs_sherpa
async def test_multilingual_model_exports_with_its_language_baked_in(tmp_path) -> None:
    """The tiny bilingual (prompt-class) model, exported for Spanish, transcribes as our engine does in es-ES."""
    from pipecat_nemotron.bench import sherpa_run
    from pipecat_nemotron.bench.sherpa_export import export_sherpa_onnx
    from pipecat_nemotron.models import TINY_MULTILINGUAL_MODEL_PATH

    heldout = HELDOUT_MANIFEST.parent.parent / "heldout_multilingual"
    audio = [read_float32(heldout / name) for name in ("es_00.wav", "es_02.wav", "en_00.wav")]
    files = export_sherpa_onnx(TINY_MULTILINGUAL_MODEL_PATH, tmp_path / "160", 160, int8=False, language="es")
    assert "language es (prompt" in sherpa_run.read_metadata(files)["comment"]
    config = EngineConfig(model=str(TINY_MULTILINGUAL_MODEL_PATH), device="cpu", max_streams=3, cpu_threads=1)
    async with NemotronEngine(config) as engine:
        ours = await asyncio.gather(*(engine.transcribe(a, latency_ms=160, language="es-ES") for a in audio))
    theirs = sherpa_run.transcribe(sherpa_run.make_recognizer(files, threads=1), files, audio)
    assert theirs == [f.text for f in ours]
