"""End-of-utterance events from a model's ``<EOU>`` token (:mod:`pipecat_nemotron.asr.eou`).

The EOU model here is a random-weight tiny model of our architecture whose tokenizer has ``<EOU>`` and whose
joint is biased towards it (``tiny_eou_model``), so the greedy decoder emits it between ordinary tokens: the
engine must report it as ``eou`` records with their time, keep it out of every text, and decode exactly what
the model decodes offline once the marker is taken out.
"""

from __future__ import annotations

import asyncio

import pytest
from helpers import noise_clip, offline_decode, started_engine

from pipecat_nemotron.asr import ASRStream, EngineConfig, ModelLoadError, NemotronEngine, Transcript
from pipecat_nemotron.asr.eou import EOU_PIECE, MarkerTokens
from pipecat_nemotron.asr.errors import EndOfUtteranceUnavailableError
from pipecat_nemotron.asr.stream import UpdateQueue

#: Frame of an encoder step, ms (8x subsampling of 10 ms mel frames).
ENCODER_FRAME_MS = 80.0


async def _updates_to_final(stream: ASRStream) -> list[Transcript]:
    """Every update of the stream's current utterance, up to and including its final."""
    updates: list[Transcript] = []
    async for update in stream.updates():
        updates.append(update)
        if update.is_final:
            break
    return updates


def _assert_no_marker(update: Transcript, eou_id: int) -> None:
    assert EOU_PIECE not in update.text and "<EOB>" not in update.text, update
    assert all(EOU_PIECE not in w.text for w in update.words), update.words
    assert eou_id not in update.tokens, update.tokens


async def test_eou_events_have_their_time_and_the_token_is_never_text(tiny_eou_model) -> None:
    audio = noise_clip(3.0, seed=1)
    async with started_engine(tiny_eou_model, one_thread=True, warmup=False, eou=True) as engine:
        assert engine.info.eou
        tokenizer = engine.model.tokenizer
        eou_id = MarkerTokens.from_tokenizer(tokenizer).eou
        assert eou_id is not None and tokenizer.ids_to_tokens([eou_id]) == [EOU_PIECE]
        expected, _ = offline_decode(engine, audio, 160)
        assert eou_id in expected and any(t != eou_id for t in expected), "the fixture must emit both kinds"
        model = engine.model
        with_events = engine.open_stream(latency_ms=160)  # the config's default: eou=True
        without = engine.open_stream(latency_ms=160, eou=False)
        assert with_events.eou and not without.eou
        half = audio.size // 2
        for stream in (with_events, without):
            await stream.push(audio[:half])
        peek = await with_events.peek()
        for stream in (with_events, without):
            await stream.push(audio[half:])
            stream.request_final()
        got, plain = await asyncio.gather(_updates_to_final(with_events), _updates_to_final(without))
        for stream in (with_events, without):
            await stream.close()

    text_tokens = [t for t in expected if t != eou_id]
    final = got[-1]
    assert final.tokens == tuple(text_tokens), "streaming decodes what the model decodes offline, less <EOU>"
    assert final.text == tokenizer.ids_to_text(text_tokens)
    assert plain[-1].tokens == final.tokens and plain[-1].text == final.text
    for update in (*got, *plain, peek):
        _assert_no_marker(update, eou_id)
    assert not any(u.kind == "eou" for u in plain), "a stream that did not ask gets no eou records"

    events = [u for u in got if u.kind == "eou"]
    assert events, "the <EOU> the model emitted arrives as eou records"
    times = [e.eou_ms for e in events]
    assert all(t is not None for t in times)
    assert times == sorted(times) and 0.0 <= times[0] and times[-1] <= final.utterance_audio_ms
    assert all(e.utterance == 0 and e.start_ms == 0.0 and e.latency_ms == 160 for e in events)
    assert got.index(events[-1]) < len(got) - 1, "eou records come before the final"
    first_frame = _first_eou_frame(model, audio, eou_id)
    assert times[0] == pytest.approx(first_frame * ENCODER_FRAME_MS), (first_frame, times[:3])


async def test_a_reader_can_end_the_utterance_at_the_eou(tiny_eou_model) -> None:
    """The README's loop: finalize when the model says the utterance ended."""
    audio = noise_clip(2.0, seed=4)
    async with started_engine(tiny_eou_model, one_thread=True, warmup=False) as engine:
        stream = engine.open_stream(latency_ms=160, eou=True)
        await stream.push(audio)
        seen: list[Transcript] = []
        async for update in stream.updates():
            seen.append(update)
            if update.kind == "eou" and not any(u.kind == "eou" for u in seen[:-1]):
                stream.request_final()
            if update.is_final:
                break
        await stream.close()
    final = seen[-1]
    assert final.is_final and final.utterance == 0
    assert final.utterance_audio_ms == pytest.approx(audio.size / 16.0), "the final covers the audio pushed"
    assert [u.kind for u in seen].index("eou") < len(seen) - 1


def _first_eou_frame(model, audio, eou_id: int) -> int:
    """Encoder frame of the first ``<EOU>`` of the offline decode (NeMo's ``Hypothesis.timestamp``)."""
    import torch

    from pipecat_nemotron.asr.modes import model_latency_modes

    with torch.inference_mode():
        model.encoder.set_default_att_context_size(list(model_latency_modes(model.encoder)[160]))
        signal, length = torch.from_numpy(audio)[None], torch.tensor([audio.size])
        feats, feat_len = model.preprocessor(input_signal=signal, length=length)
        enc, enc_len = model.encoder(audio_signal=feats, length=feat_len)
        hyp = model.decoding.rnnt_decoder_predictions_tensor(
            encoder_output=enc, encoded_lengths=enc_len, return_hypotheses=True
        )[0]
    tokens, frames = hyp.y_sequence.tolist(), hyp.timestamp.tolist()
    return int(frames[tokens.index(eou_id)])


async def test_a_model_without_eou_refuses_the_request_and_is_unchanged_without_it(tiny_random_model) -> None:
    async with started_engine(tiny_random_model, one_thread=True, warmup=False) as engine:
        assert not engine.info.eou
        with pytest.raises(EndOfUtteranceUnavailableError, match="parakeet_realtime_eou_120m-v1"):
            engine.open_stream(eou=True)
        assert engine.open_streams == 0, "a refused request opens nothing"
        audio = noise_clip(1.0, seed=2)
        expected, _ = offline_decode(engine, audio, 160)
        stream = engine.open_stream(latency_ms=160)
        assert not stream.eou
        await stream.push(audio)
        stream.request_final()
        updates = await _updates_to_final(stream)
        await stream.close()
    assert {u.kind for u in updates} <= {"partial", "final"}
    assert updates[-1].tokens == tuple(expected)

    engine = NemotronEngine(EngineConfig(model=str(tiny_random_model), device="cpu", warmup=False, eou=True))
    with pytest.raises(ModelLoadError, match=r"EngineConfig\.eou: .*<EOU>.*parakeet_realtime_eou_120m-v1"):
        await engine.start()
    assert not engine.running


def test_eou_config_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="eou must be True or False"):
        EngineConfig(eou="yes")  # type: ignore[arg-type]


def test_markers_leave_the_tokens_and_only_eou_is_reported() -> None:
    markers = MarkerTokens.from_pieces(["<unk>", "\u2581a", "<EOB>", "\u2581b", "<EOU>"])
    assert markers.eou == 4 and markers.markers == {2, 4}
    tokens, frames, confidence, eou_frame = markers.split([1, 2, 3, 4, 4, 1], [0, 8, 8, 16, 24, 32], [0.5] * 6)
    assert (tokens, frames, confidence, eou_frame) == ([1, 3, 1], [0, 8, 32], [0.5] * 3, 16)
    assert markers.split([1, 3], [0, 8], [1.0, 1.0]) == ([1, 3], [0, 8], [1.0, 1.0], None)
    assert MarkerTokens.from_pieces(["<unk>", "\u2581a"]).split([1], [0], [1.0]) == ([1], [0], [1.0], None)


def test_an_unread_eou_record_is_never_replaced_by_a_partial() -> None:
    queue = UpdateQueue()
    queue.put(Transcript("a", "partial"))
    queue.put(Transcript("a b", "partial"))  # replaces the unread partial
    queue.put(Transcript("a b", "eou", eou_ms=880.0))
    queue.put(Transcript("a b c", "partial"))

    async def drain() -> list[Transcript | None]:
        queue.close()
        return [await queue.get() for _ in range(4)]

    kinds = [(u.kind, u.text) if u else None for u in asyncio.run(drain())]
    assert kinds == [("partial", "a b"), ("eou", "a b"), ("partial", "a b c"), None]
