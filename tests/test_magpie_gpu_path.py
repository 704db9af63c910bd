"""The fast Magpie step's GPU path: batch buckets, the padded static-shape step CUDA graphs replay, bf16.

On a CPU the graphed step runs its padded, static-shape computation eagerly (``capture=False``): everything but the
capture itself. The CUDA tests (marked ``gpu``) capture for real.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import MAGPIE_SAMPLES_PER_FRAME, magpie_options_for, one_torch_thread

from pipecat_nemotron.tts.magpie import MagpieEngine
from pipecat_nemotron.tts.magpie.fast_step import FastMagpieStep, RowSampling
from pipecat_nemotron.tts.magpie.graphs import GraphedMagpieStep, bucket_for, slot_buckets
from pipecat_nemotron.tts.magpie.loading import load_magpie_model

TEXTS = ["Hello there, this is a test.", "Short one.", "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    with one_torch_thread():
        yield


def tokens(model: Any, text: str) -> torch.Tensor:
    from nemo.collections.tts.parts.utils.tts_dataset_utils import (
        chunk_text_for_inference,
        get_tokenizer_for_language,
    )

    name = get_tokenizer_for_language("en", list(model.tokenizer.tokenizers.keys()))
    chunks, lens, _ = chunk_text_for_inference(
        text=text, language="en", tokenizer_name=name, text_tokenizer=model.tokenizer, eos_token_id=model.eos_id
    )
    return chunks[0][: int(lens[0])]


def run_rows(step: FastMagpieStep, model: Any, frames: int, device: str = "cpu") -> tuple[list, list]:
    """Three rows (CFG and not, greedy and seeded), the third joining at frame 5: codes and per-step logits."""
    samplings = [
        RowSampling(0.7, 1, True),
        RowSampling(0.7, 80, False, torch.Generator(device=device).manual_seed(1)),
        RowSampling(0.7, 80, True, torch.Generator(device=device).manual_seed(2)),
    ]
    texts = [tokens(model, t).to(device) for t in TEXTS]
    with torch.inference_mode():
        rows = step.add_rows([(texts[i], 2, samplings[i]) for i in range(2)])
        logits = []
        for frame in range(frames):
            if frame == 5:
                rows.append(step.add_row(texts[2], 1, samplings[2]))
            out = step.forward()
            logits.append(out.logits.float().clone())
            step.advance(out)
    return [torch.stack(r.codes, -1) for r in rows], logits


def test_slot_buckets_and_bucket_choice() -> None:
    assert slot_buckets(1) == (1,)
    assert slot_buckets(8) == (1, 2, 4, 8)
    assert slot_buckets(12) == (1, 2, 4, 8, 12)
    assert [bucket_for(n, slot_buckets(12)) for n in (1, 2, 3, 5, 8, 9, 12, 13)] == [1, 2, 4, 8, 8, 12, 12, None]


def test_padded_static_step_equals_the_eager_step(tiny_magpie: tuple[Path, Path]) -> None:
    """The computation CUDA graphs replay (slots padded to a bucket, the whole cache capacity read under a mask,
    the local transformer without its cache) gives the eager step's codes, and its logits to float rounding, as
    rows join (3, then 5 slots: buckets 4 and 8) and the cache grows (past 128 positions: the graphs are dropped
    and made again)."""
    magpie, codec = tiny_magpie
    model = load_magpie_model(str(magpie), "cpu", str(codec))
    frames = 125
    model.inference_parameters.max_decoder_steps = 500
    eager_codes, eager_logits = run_rows(FastMagpieStep(model, max_slots=8), model, frames)
    graphed = GraphedMagpieStep(model, max_slots=8, capture=False)
    codes, logits = run_rows(graphed, model, frames)
    for a, b in zip(codes, eager_codes, strict=True):
        assert torch.equal(a, b)
    assert max(float((a - b).abs().max()) for a, b in zip(logits, eager_logits, strict=True)) < 1e-4
    keys = list(graphed._graphs)
    assert {k[0] for k in keys} == {"decoder", "local transformer"}
    assert {k[1:3] for k in keys if k[0] == "decoder"} == {(8, 256)}  # 5 slots; 11 + 125 positions.
    assert graphed.describe()["captures"] == 0 and graphed.describe()["failed"] == []


def test_bf16_engine_synthesises_on_cpu(tiny_magpie: tuple[Path, Path]) -> None:
    """bf16 weights (codec left in fp32): the engine streams the requested audio; the first frame's logits stay
    close to fp32's."""
    magpie, codec = tiny_magpie
    engine = MagpieEngine(str(magpie), device="cpu", codec_model_path=str(codec), dtype="bfloat16", warmup=False)
    try:
        engine.wait_until_ready(timeout=300)
        model = engine.model
        assert model.decoder.layers[0].self_attention.qkv_net.weight.dtype == torch.bfloat16
        assert next(model._codec_model.parameters()).dtype == torch.float32
        audio = [c.audio for c in engine.submit("Speak in bf16.", options=magpie_options_for(12, seed=3))]
        assert sum(len(a) for a in audio) == 12 * MAGPIE_SAMPLES_PER_FRAME
        assert all(a.dtype == np.int16 for a in audio)
    finally:
        engine.close()
    reference = load_magpie_model(str(magpie), "cpu", str(codec))
    firsts = []
    for m in (reference, model):
        step = FastMagpieStep(m)
        with torch.inference_mode():
            step.add_row(tokens(m, TEXTS[0]), 2, RowSampling(0.7, 1, True))
            firsts.append(step.forward().logits[0])
    assert firsts[1].dtype == torch.float32  # Sampling runs in fp32.
    finite = torch.isfinite(firsts[0])
    error = (firsts[1][finite] - firsts[0][finite]).abs().max()
    assert float(error) < 0.05 * float(firsts[0][finite].abs().max())


def test_constructor_rejects_bf16_on_nemos_step(tiny_magpie: tuple[Path, Path]) -> None:
    magpie, codec = tiny_magpie
    with pytest.raises(ValueError, match="dtype"):
        MagpieEngine(str(magpie), codec_model_path=str(codec), dtype="float16")
    with pytest.raises(ValueError, match='step="fast"'):
        MagpieEngine(str(magpie), codec_model_path=str(codec), step="nemo", dtype="bfloat16")


@pytest.mark.gpu
def test_cuda_graphs_give_the_eager_steps_codes(tiny_magpie: tuple[Path, Path]) -> None:
    """On CUDA (fp32): captured graphs replay to the eager step's greedy and seeded codes; captures are counted."""
    magpie, codec = tiny_magpie
    model = load_magpie_model(str(magpie), "cuda", str(codec))
    model.inference_parameters.max_decoder_steps = 500
    eager_codes, _ = run_rows(FastMagpieStep(model, max_slots=8), model, 40, device="cuda")
    graphed = GraphedMagpieStep(model, max_slots=8)
    codes, _ = run_rows(graphed, model, 40, device="cuda")
    assert graphed.capture and graphed.describe()["captures"] > 0 and graphed.describe()["failed"] == []
    # Captures go to the graphs' own memory pool, which starts empty, so the first one reserves new memory; the
    # count is growth only, so it stays within what the allocator holds now (nothing here empties its cache).
    assert 0 < graphed.describe()["captured_bytes"] <= torch.cuda.memory_reserved()
    for a, b in zip(codes, eager_codes, strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_bf16_graphed_engine_on_cuda(tiny_magpie: tuple[Path, Path]) -> None:
    """The GPU configuration end to end: bf16, CUDA graphs, 4 requests batched."""
    magpie, codec = tiny_magpie
    engine = MagpieEngine(str(magpie), device="cuda", codec_model_path=str(codec), dtype="bfloat16", max_batch=4)
    try:
        engine.wait_until_ready(timeout=300)
        streams = [engine.submit(f"Request {i}.", options=magpie_options_for(20, seed=i)) for i in range(4)]
        lengths = [sum(len(c.audio) for c in s) for s in streams]
        assert lengths == [20 * MAGPIE_SAMPLES_PER_FRAME] * 4
        assert engine.graphs["captures"] > 0 and engine.graphs["failed"] == []
    finally:
        engine.close()
