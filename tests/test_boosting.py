"""Per-stream phrase boosting (issue 24) on the bundled tiny model: what boosting fixes, what it must not touch.

How the misheard words were chosen (``scripts/pick_misheard_clips.py``, run again whenever the bundled model
changes): the tiny model was run over all 200 bundled held-out clips (``tests/assets/heldout``: sentences never
used in training). Where its final differed from the reference by one substituted word, the right word was boosted
alone, written as the model writes it; kept are the clips where a boost of 2.0 gives the reference's words and
changes no other word. The bundled cased model mishears few held-out words: two clips pass, both a digit heard for
"two" by a voice never trained on (West Midlands ``en-gb-x-gbcwmd``: "seven"; ``en-us+Andy``: "four"). The second is
boosted with a phrase ("for two minutes"), so that the tests have two different lists. Phrases are matched as the model
writes them: "Three minus two" fixes the first clip, "three minus two" does not. At the default weight (1.0) the
tiny model's confident errors stay; docs/BENCHMARKS.md section 15 gives recall and false insertions at both weights.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio
import soundfile as sf
import torch
from helpers import started_engine

from pipecat_nemotron.asr import EngineConfig, NemotronEngine
from pipecat_nemotron.asr.boosting import validate_boost_phrases
from pipecat_nemotron.asr.errors import BoostingUnavailableError, BoostPhraseError
from pipecat_nemotron.bench.wer import wer_percent
from pipecat_nemotron.models import TINY_MODEL_PATH

HELDOUT = Path(__file__).resolve().parent / "assets" / "heldout"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "transcribe_file.py"

#: Boost weight of these tests (the tiny model's errors are confident: 1.0 does not turn them).
ALPHA = 2.0

#: (clip, boosted phrase, text without the boost, text with it).
MISHEARD = [
    (
        "unseen_000039.flac",
        "two",
        "Three minus seven. What is the weather today?",
        "Three minus two. What is the weather today?",
    ),
    (
        "unseen_000255.flac",
        "for two minutes",
        "Hi. Set a timer for four minutes.",
        "Hi. Set a timer for two minutes.",
    ),
]


def heldout(name: str) -> np.ndarray:
    """A held-out clip, float32 16 kHz."""
    return sf.read(HELDOUT / name, dtype="float32")[0]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine():
    """The tiny model, 8 streams batched, torch on one thread; streams opened without a list boost "two"."""
    async with started_engine(
        TINY_MODEL_PATH,
        one_thread=True,
        max_streams=8,
        max_batch_size=8,
        default_boost_phrases=("two",),
        default_boost_alpha=ALPHA,
    ) as e:
        yield e


async def decode(engine: NemotronEngine, audio: np.ndarray, chunk_ms: float | None = None, **kw) -> tuple:
    """Stream ``audio`` (whole, or in chunks of ``chunk_ms``) and return the final's ``(text, tokens)``."""
    stream = engine.open_stream(**kw)
    try:
        step = audio.size if chunk_ms is None else int(16 * chunk_ms)
        for i in range(0, audio.size, step):
            await stream.push(audio[i : i + step])
            if chunk_ms is not None:
                await asyncio.sleep(0)
        final = await stream.finalize()
        return final.text, final.tokens
    finally:
        await stream.close()


pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_boosting_fixes_misheard_words_and_only_on_the_boosted_stream(engine: NemotronEngine) -> None:
    """Each clip alone, without and with its word boosted; then all of them at once in one batch, boosted and not
    interleaved, with different lists: every stream gives exactly the tokens it gives alone."""
    alone = {}
    for name, word, plain, fixed in MISHEARD:
        audio = heldout(name)
        unboosted = await decode(engine, audio, boost_phrases=[])
        boosted = await decode(engine, audio, boost_phrases=[word], boost_alpha=ALPHA)
        assert unboosted[0] == plain
        assert boosted[0] == fixed
        alone[name] = (unboosted, boosted)

    sizes: list[int] = []

    def listen(stats) -> None:
        sizes.append(stats.batch_size)

    engine.add_step_listener(listen)
    try:
        runs = []
        for name, word, _, _ in MISHEARD:
            audio = heldout(name)
            runs.append(decode(engine, audio, boost_phrases=[]))
            # Another stream's list in the same batch: the clip's word plus words it does not contain.
            runs.append(decode(engine, audio, boost_phrases=[word, f"cancel the timer {word}"], boost_alpha=ALPHA))
        results = await asyncio.gather(*runs)
    finally:
        engine.remove_step_listener(listen)
    assert max(sizes) == 2 * len(MISHEARD)  # all the streams shared steps
    for i, (name, _, _, _) in enumerate(MISHEARD):
        assert results[2 * i] == alone[name][0]
        assert results[2 * i + 1][0] == alone[name][1][0]
    assert engine.boost_trees[0] == 0  # every stream closed: no tree left in the decoder


async def test_streaming_equals_offline_with_boosting(engine: NemotronEngine) -> None:
    """Streamed in 100 ms pushes, a boosted stream's final equals NeMo's own whole-clip decode with the same tree
    (``BiasingRequestItemConfig`` built and added to the decoder's multi-model by NeMo), in two modes."""
    from nemo.collections.asr.parts.context_biasing.biasing_multi_model import BiasingRequestItemConfig
    from nemo.collections.asr.parts.context_biasing.boosting_graph_batched import BoostingTreeModelConfig
    from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis

    from pipecat_nemotron.asr.boost_models import biasing_multi_model
    from pipecat_nemotron.asr.modes import model_latency_modes

    name, word, _, fixed = MISHEARD[0]
    audio = heldout(name)
    model = engine.model
    for latency in (160, 560):
        streamed = await decode(engine, audio, chunk_ms=100, latency_ms=latency, boost_phrases=[word])
        request = BiasingRequestItemConfig(
            boosting_model_cfg=BoostingTreeModelConfig(key_phrases_list=[word]), boosting_model_alpha=ALPHA
        )
        multi = biasing_multi_model(model)
        previous = list(model.encoder.att_context_size)
        with torch.inference_mode(False):
            request.add_to_multi_model(tokenizer=model.tokenizer, biasing_multi_model=multi)
        try:
            with torch.inference_mode():
                model.encoder.set_default_att_context_size(list(model_latency_modes(model.encoder)[latency]))
                signal, length = torch.from_numpy(audio)[None], torch.tensor([audio.size])
                feats, feat_len = model.preprocessor(input_signal=signal, length=length)
                enc, enc_len = model.encoder(audio_signal=feats, length=feat_len)
                hyp = model.decoding.rnnt_decoder_predictions_tensor(
                    encoder_output=enc,
                    encoded_lengths=enc_len,
                    return_hypotheses=True,
                    partial_hypotheses=[Hypothesis.empty_with_biasing_cfg(request)],
                )[0]
        finally:
            model.encoder.set_default_att_context_size(previous)
            with torch.inference_mode(False):
                request.remove_from_multi_model(biasing_multi_model=multi)
        assert streamed[0] == fixed
        assert list(streamed[1]) == [int(t) for t in hyp.y_sequence]


async def test_a_change_applies_at_the_next_utterance_and_lists_are_built_once(engine: NemotronEngine) -> None:
    """The config's default list applies to streams opened without one; ``set_boost_phrases`` made after the
    utterance's first word waits for the next utterance; equal lists share one tree, freed when unused."""
    name, word, plain, fixed = MISHEARD[0]
    audio = heldout(name)
    assert (await decode(engine, audio))[0] == fixed  # default_boost_phrases=("two",)

    builds = engine.boost_trees[1]
    stream = engine.open_stream(boost_phrases=[])
    twin = engine.open_stream(boost_phrases=[MISHEARD[1][1]], boost_alpha=ALPHA)
    try:
        await stream.push(audio)
        await twin.push(heldout(MISHEARD[1][0]))
        async for update in stream.updates():
            if update.text:
                break
        stream.set_boost_phrases([MISHEARD[1][1]], alpha=ALPHA)  # a word is out: applies to the next utterance
        assert stream.boost_phrases == ()
        assert (await stream.finalize()).text == plain
        assert stream.boost_phrases == (MISHEARD[1][1],) and stream.boost_alpha == ALPHA
        await stream.push(heldout(MISHEARD[1][0]))
        assert (await stream.finalize()).text == MISHEARD[1][3]
        assert (await twin.finalize()).text == MISHEARD[1][3]
        assert engine.boost_trees == (1, builds + 1)  # both streams' "for two minutes" share one tree
        stream.set_boost_phrases(None)  # no word in the new utterance yet: applies now
        assert stream.boost_phrases == () and stream.boost_alpha is None
    finally:
        await stream.close()
        await twin.close()
    await decode(engine, audio, boost_phrases=[])  # a step after the closes removes the unused tree
    assert engine.boost_trees[0] == 0


async def test_bad_lists_are_refused_with_clear_messages_and_take_no_slot(engine: NemotronEngine) -> None:
    """Too many phrases, too long, empty, not a list, characters the model cannot write, a bad weight: refused at
    ``open_stream`` (no stream, no slot) and at ``set_boost_phrases`` (the stream keeps its list and works)."""
    cases = [
        ([f"phrase {i}" for i in range(1001)], "more than 1000 boost phrases"),
        (["a" * 65], "65 characters, more than the limit of 64"),
        (["  "], "boost phrase 0 is empty"),
        ("tuesday", "must be a list of strings"),
        (["Doctor"], "cannot write: 'D' (this model writes 'd' in lower case only"),
        (["jazz"], "cannot write: 'j'"),
    ]
    open_before = engine.open_streams
    for phrases, message in cases:
        with pytest.raises(BoostPhraseError, match=message.replace("(", r"\(")):
            engine.open_stream(boost_phrases=phrases)
    with pytest.raises(BoostPhraseError, match=r"boost_alpha must be in \(0, 10\]"):
        engine.open_stream(boost_phrases=["two"], boost_alpha=0.0)
    assert engine.open_streams == open_before

    name, word, _, fixed = MISHEARD[0]
    stream = engine.open_stream(boost_phrases=[word], boost_alpha=ALPHA)
    try:
        for phrases, message in cases:
            with pytest.raises(BoostPhraseError, match=message.replace("(", r"\(")):
                stream.set_boost_phrases(phrases)
        assert stream.boost_phrases == (word,)
        await stream.push(heldout(name))
        assert (await stream.finalize()).text == fixed
    finally:
        await stream.close()


async def test_the_model_free_check_normalises_and_names_its_limits() -> None:
    """What a server runs before a list reaches the engine: counts distinct phrases after normalising them."""
    assert validate_boost_phrases(["  doctor   okafor ", "doctor okafor", "nemotron"], max_phrases=2, max_chars=13) == (
        "doctor okafor",
        "nemotron",
    )
    assert validate_boost_phrases(None, max_phrases=1, max_chars=1) == ()
    with pytest.raises(BoostPhraseError, match="more than 1 boost phrases"):
        validate_boost_phrases(["a", "b"], max_phrases=1, max_chars=5)
    with pytest.raises(BoostPhraseError, match="boost phrase 1 must be a string"):
        validate_boost_phrases(["a", 3], max_phrases=5, max_chars=5)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="max_boost_phrases must be an int from 0 to 100000"):
        EngineConfig(max_boost_phrases=-1)
    with pytest.raises(ValueError, match="more than the limit of 4"):
        EngineConfig(default_boost_phrases=("hello",), max_boost_phrase_chars=4)
    assert EngineConfig(default_boost_phrases=["a  b"]).default_boost_phrases == ("a b",)  # type: ignore[arg-type]


async def test_heldout_wer_of_unrelated_speech_moves_at_most_half_a_point(engine: NemotronEngine) -> None:
    """Held-out clips that contain none of the boosted phrases, every stream boosted (different lists of names
    and words of the vocabulary): the WER stays within 0.5 points of the unboosted decode (here: no word changes).
    The full held-out set is ``python -m pipecat_nemotron.bench boost``'s insertion count."""
    lists = [["Tuesday", "doctor okafor"], ["cancel the timer", "nemotron"], ["thirty", "pipecat"]]
    boosted_words = {w.lower() for phrases in lists for p in phrases for w in p.split()}
    rows = [
        r
        for r in json.loads((HELDOUT / "manifest.json").read_text())
        if not boosted_words & set(r["text"].split())
    ][:8]
    audio = [heldout(r["audio"]) for r in rows]
    plain = await asyncio.gather(*(decode(engine, a, boost_phrases=[]) for a in audio))
    boosted = await asyncio.gather(
        *(decode(engine, a, boost_phrases=lists[i % 3], boost_alpha=ALPHA) for i, a in enumerate(audio))
    )
    refs = [r["text"] for r in rows]
    before = wer_percent(refs, [t for t, _ in plain])
    after = wer_percent(refs, [t for t, _ in boosted])
    assert before is not None and after is not None
    assert abs(after - before) <= 0.5


async def test_boosting_off_refuses_phrases_naming_the_fix() -> None:
    """``max_boost_phrases=0`` builds the decoder without per-stream biasing; phrases are refused, not ignored."""
    from pipecat_nemotron.asr.boost_models import biasing_multi_model, require_per_stream_biasing

    async with started_engine(TINY_MODEL_PATH, one_thread=True, max_boost_phrases=0, warmup=False) as off:
        with pytest.raises(BoostingUnavailableError, match="max_boost_phrases=0"):
            off.open_stream(boost_phrases=["two"])
        assert off.open_streams == 0
        assert off.boost_trees == (0, 0)
        text, _ = await decode(off, heldout(MISHEARD[0][0]))
        assert text == MISHEARD[0][2]
        # Its decoder is what an older NeMo builds (no multi-model): the feature check names the version needed.
        assert biasing_multi_model(off.model) is None
        with pytest.raises(BoostingUnavailableError, match=r"nemo-toolkit>=3\.0\.0"):
            require_per_stream_biasing(off.model)


async def test_a_new_list_is_built_off_the_model_thread_before_its_first_step(
    engine: NemotronEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``open_stream`` starts the build: the tree exists before the stream sends audio, and its step reuses it.

    The build (NeMo's ``GPUBoostingTreeModel.from_config``) runs on neither the model's step thread (the thread
    the encoder-output hook runs on) nor the event loop.
    """
    import threading

    from nemo.collections.asr.parts.context_biasing.boosting_graph_batched import GPUBoostingTreeModel

    build_threads: list[int] = []
    from_config = GPUBoostingTreeModel.from_config

    def recording_from_config(*args, **kwargs):
        build_threads.append(threading.get_ident())
        return from_config(*args, **kwargs)

    monkeypatch.setattr(GPUBoostingTreeModel, "from_config", recording_from_config)
    step_threads: set[int] = set()
    before_active, before_builds = engine.boost_trees
    stream = engine.open_stream(boost_phrases=["a timer for two minutes"], boost_alpha=ALPHA)
    try:
        for _ in range(200):  # at most 10 s
            if engine.boost_trees[1] > before_builds:
                break
            await asyncio.sleep(0.05)
        assert engine.boost_trees == (before_active, before_builds + 1)  # built, not yet in the decoder
        name, _, _, fixed = MISHEARD[1]
        with engine.observe_encoder_output(lambda *_: step_threads.add(threading.get_ident())):
            await stream.push(heldout(name))
            assert (await stream.finalize()).text == fixed
        assert engine.boost_trees == (before_active + 1, before_builds + 1)  # added, not built again
    finally:
        await stream.close()
    assert len(build_threads) == 1 and len(step_threads) == 1
    assert build_threads[0] not in step_threads and build_threads[0] != threading.get_ident()


async def test_transcribe_file_example_refuses_a_bad_boost_before_loading_the_model(tmp_path: Path) -> None:
    """``examples/transcribe_file.py --boost ... --boost-alpha 0`` exits 1 naming the limit (no model is loaded)."""
    import sys

    from pipecat_nemotron.models import DEMO_AUDIO_DIR

    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLE), str(DEMO_AUDIO_DIR / "two_turns.wav"), "--model", str(TINY_MODEL_PATH),
        "--device", "cpu", "--boost", "Tuesday", "--boost-alpha", "0",
        cwd=tmp_path,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(240):
        _, err = await proc.communicate()
    stderr = err.decode()
    assert proc.returncode == 1, stderr[-3000:]
    assert "boost_alpha must be in (0, 10]" in stderr.splitlines()[-1], stderr[-3000:]
