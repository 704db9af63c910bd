"""The multilingual prompt class: modes from the model, a language per stream, mixed languages in one batch.

A random-weight tiny model of NeMo's ``EncDecRNNTBPEModelWithPrompt`` (built by the project, three locales and
``auto``, the five attention contexts of the ``nemotron-3.5-asr-streaming`` family) stands in for the real one.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from helpers import (
    engine_config,
    noise_clip,
    offline_decode,
    push_realtime_chunks,
    run_language_switches,
    stream_capturing_encoder_output,
    to_pcm16,
    wait_caught_up,
)

from pipecat_nemotron.asr import ModelLoadError, NemotronEngine

MODES = (80, 160, 320, 560, 1120)
LANGUAGES = ("en-US", "es-ES", "de-DE", "auto")


def _engine(model, **kwargs) -> NemotronEngine:
    config = {"max_streams": 8, "max_batch_size": 8, "finalize_mode": "hard", "warmup": False}
    return NemotronEngine(engine_config(model, **{**config, **kwargs}))


@pytest.fixture
async def engine(engine_factory, tiny_multilingual_random_model):
    return await engine_factory(
        tiny_multilingual_random_model, max_streams=8, max_batch_size=8, finalize_mode="hard", warmup=False
    )


async def test_modes_and_languages_come_from_the_model(engine: NemotronEngine, tiny_random_model) -> None:
    assert engine.info.latency_modes == MODES
    assert engine.info.languages == LANGUAGES
    with pytest.raises(ValueError, match=r"\[80, 160, 320, 560, 1120\]"):
        engine.open_stream(latency_ms=240)
    with pytest.raises(ValueError, match="en-US.*es-ES.*de-DE"):
        engine.open_stream(language="fr-FR")
    assert engine.open_stream(language="es").language == "es-ES"  # a bare language takes its locale
    assert engine.open_stream(language="DE_de").language == "de-DE"
    assert engine.open_stream().language == "auto"  # the default of a model that has auto

    english = _engine(tiny_random_model)
    await english.start()
    try:
        assert english.info.latency_modes == (80, 160, 560, 1120)
        assert english.info.languages == ()
        with pytest.raises(ValueError, match=r"\[80, 160, 560, 1120\]"):
            english.open_stream(latency_ms=320)
        with pytest.raises(ValueError, match="English only.*nemotron-3.5"):
            english.open_stream(language="es-ES")
        assert english.open_stream(language="en-GB").language is None
        assert english.open_stream(language="auto").language is None  # what an English model does anyway
    finally:
        await english.stop()


async def test_default_mode_or_language_the_model_lacks_fails_at_start(tiny_random_model) -> None:
    with pytest.raises(ModelLoadError, match=r"offers \[80, 160, 560, 1120\]"):
        await _engine(tiny_random_model, default_latency_ms=320).start()
    with pytest.raises(ModelLoadError, match="English only"):
        await _engine(tiny_random_model, default_language="es").start()


@pytest.mark.parametrize("encoder_step", ["fast", "nemo"])
@pytest.mark.parametrize("latency_ms", MODES)
async def test_streaming_equals_offline_with_the_prompt(
    tiny_multilingual_random_model, latency_ms: int, encoder_step: str
) -> None:
    engine = _engine(tiny_multilingual_random_model, encoder_step=encoder_step)
    await engine.start()
    try:
        audio = noise_clip(2.13, seed=latency_ms)
        audio16 = np.frombuffer(to_pcm16(audio), dtype="<i2").astype(np.float32) / 32768.0
        for language in ("es-ES", "auto"):
            final, streamed = await stream_capturing_encoder_output(engine, audio, latency_ms, language)
            tokens, offline = offline_decode(engine, audio16, latency_ms, language=language)
            assert final.language == language
            assert streamed.shape == offline.shape
            assert (streamed - offline).abs().max().item() < 1e-4
            assert list(final.tokens) == tokens
            assert len(tokens) > 10
    finally:
        await engine.stop()


async def test_streams_of_different_languages_batched_equal_each_alone(engine: NemotronEngine) -> None:
    clips = [noise_clip(1.2 + 0.3 * i, seed=40 + i) for i in range(6)]
    languages = ["en-US", "es-ES", "de-DE", "auto", "es-ES", "en-US"]
    modes = [160, 160, 160, 160, 320, 320]
    alone = []
    for clip, language, mode in zip(clips, languages, modes, strict=True):
        final = await engine.transcribe(to_pcm16(clip), latency_ms=mode, language=language)
        alone.append((list(final.tokens), final.language, final.detected_language))
    batch_sizes: list[int] = []
    engine.add_step_listener(lambda stats: batch_sizes.append(stats.batch_size))

    async def run(i: int) -> tuple[list[int], str | None, str | None]:
        stream = engine.open_stream(latency_ms=modes[i], language=languages[i])
        await push_realtime_chunks(stream, to_pcm16(clips[i]), chunk_bytes=1280, pause=0.002)
        final = await stream.finalize()
        await stream.close()
        return list(final.tokens), final.language, final.detected_language

    together = await asyncio.gather(*(run(i) for i in range(6)))
    assert together == alone
    assert max(batch_sizes) >= 3, "the streams were never batched together"
    # Only the auto stream says which language it heard; the others decoded the one they were given.
    assert [d is not None for _, _, d in alone] == [language == "auto" for language in languages]
    assert alone[3][2] in ("en-US", "es-ES", "de-DE")
    # The prompt is not decoration: one clip decoded under each language gives different encoder outputs.
    outputs = []
    for language in ("en-US", "es-ES"):
        _, enc = await stream_capturing_encoder_output(engine, clips[0], 160, language)
        outputs.append(enc)
    assert (outputs[0] - outputs[1]).abs().max().item() > 1e-3


async def test_language_changes_at_the_utterance_boundary(engine: NemotronEngine) -> None:
    stream = engine.open_stream(latency_ms=160, language="en-US")
    try:
        await stream.push(to_pcm16(noise_clip(0.8, seed=5)))
        await wait_caught_up(stream)  # words emitted (random weights): the change waits for the boundary
        assert stream.tokens
        stream.set_language("es")
        first = await stream.finalize()
        await stream.push(to_pcm16(noise_clip(0.8, seed=6)))
        second = await stream.finalize()
        with pytest.raises(ValueError, match="not one of this model's languages"):
            stream.set_language("xx")
    finally:
        await stream.close()
    assert (first.language, second.language) == ("en-US", "es-ES")
    assert stream.language == "es-ES"


async def test_switching_between_modes_of_different_left_context(engine: NemotronEngine) -> None:
    # 320 ms has a 56-frame left context, 160 ms 70: the slot's cache serves both across utterances.
    soft = _engine(engine.config.model, finalize_mode="soft")
    await soft.start()
    try:
        stream = soft.open_stream(latency_ms=320, language="de-DE")
        texts = []
        for i, mode in enumerate((320, 160, 320, 1120)):
            stream.set_latency(mode)
            await push_realtime_chunks(stream, to_pcm16(noise_clip(0.9, seed=60 + i)), chunk_bytes=3200)
            final = await stream.finalize()
            assert final.latency_ms == mode
            texts.append(final.tokens)
        await stream.close()
        assert all(len(t) > 3 for t in texts)
    finally:
        await soft.stop()


async def test_stt_service_language_and_settings_update(engine: NemotronEngine) -> None:
    from pipecat.transcriptions.language import Language

    from pipecat_nemotron.stt import NemotronSTTService

    await run_language_switches(NemotronSTTService(engine=engine, language=Language.ES), engine)


async def test_stt_service_rejects_a_language_the_model_lacks(tiny_random_model) -> None:
    from pipecat.frames.frames import ErrorFrame
    from pipecat.tests.utils import SleepFrame, run_test

    from pipecat_nemotron.stt import NemotronSTTService

    english = _engine(tiny_random_model)
    await english.start()
    try:
        stt = NemotronSTTService(engine=english, language="es")
        _, up = await run_test(stt, frames_to_send=[SleepFrame(sleep=0.3)], start_timeout=5.0)
    finally:
        await english.stop()
    errors = [f.error for f in up if isinstance(f, ErrorFrame)]
    assert errors and "English only" in errors[0], errors


def test_language_detection_scores_the_greedy_alignment(tiny_multilingual_random_model) -> None:
    """The detector's per-language score is the log-probability NeMo's own joint gives the greedy path."""
    from nemo.collections.asr.models import ASRModel

    from pipecat_nemotron.asr.language_id import UtteranceEvidence, alignment_scores

    model = ASRModel.restore_from(str(tiny_multilingual_random_model), map_location="cpu").eval()
    audio = torch.from_numpy(noise_clip(1.7, seed=90))[None]
    length = torch.tensor([audio.size(1)])
    prompts = model.cfg.model_defaults.prompt_dictionary
    with torch.inference_mode():
        enc, enc_len = model.forward(
            input_signal=audio, input_signal_length=length, prompt_indices=torch.tensor([prompts["auto"]])
        )
        hyp = model.decoding.rnnt_decoder_predictions_tensor(enc, enc_len, return_hypotheses=True)[0]
        tokens, frames = hyp.y_sequence.tolist(), hyp.timestamp.tolist()
        feats, feat_len = model.preprocessor(input_signal=audio, length=length)
        unprompted, _ = model.encoder(audio_signal=feats, length=feat_len)
        evidence = UtteranceEvidence()
        evidence = evidence.plus(unprompted[0], tokens, frames)
        languages = ["en-US", "es-ES", "de-DE"]
        scores = alignment_scores(model, evidence, [prompts[k] for k in languages], model.num_prompts)
        y = torch.tensor([tokens])
        decoded, _, _ = model.decoder(targets=y, target_length=torch.tensor([len(tokens)]))
        blank = model.joint.num_classes_with_blank - 1
        expected = []
        for language in languages:
            enc_l, _ = model.forward(
                input_signal=audio,
                input_signal_length=length,
                prompt_indices=torch.tensor([prompts[language]]),
            )
            lattice = model.joint(encoder_outputs=enc_l, decoder_outputs=decoded)[0]  # [T, U + 1, V + 1]
            total, u = 0.0, 0
            for t in range(lattice.size(0)):
                while u < len(tokens) and frames[u] <= t:
                    total += float(lattice[t, u, tokens[u]])
                    u += 1
                total += float(lattice[t, u, blank])
            expected.append(total)
    assert len(tokens) > 5
    assert torch.allclose(scores, torch.tensor(expected), atol=1e-3), (scores, expected)


@pytest.mark.gpu
async def test_gpu_bf16_graphs_mixed_languages_equal_each_alone(tiny_multilingual_random_model) -> None:
    """On CUDA (bf16, CUDA graphs per mode incl. 320 ms): the prompt path runs and batching changes nothing."""
    engine = _engine(tiny_multilingual_random_model, device="cuda", dtype="bfloat16", warmup=True)
    await engine.start()
    try:
        clips = [to_pcm16(noise_clip(1.5, seed=100 + i)) for i in range(4)]
        setup = [("es-ES", 320), ("auto", 320), ("de-DE", 160), ("en-US", 320)]
        alone = [
            await engine.transcribe(c, latency_ms=m, language=lang)
            for c, (lang, m) in zip(clips, setup, strict=True)
        ]
        together = await asyncio.gather(
            *(
                engine.transcribe(c, latency_ms=m, language=lang)
                for c, (lang, m) in zip(clips, setup, strict=True)
            )
        )
        assert [f.tokens for f in together] == [f.tokens for f in alone]
        assert [f.language for f in together] == [lang for lang, _ in setup]
        assert together[1].detected_language in ("en-US", "es-ES", "de-DE")
        assert engine.info.gpu_path["cuda_graphs"]["graphs"] > 0
    finally:
        await engine.stop()
