"""Engine behaviour users depend on: streaming equals offline, batching changes nothing, finals keep the tail."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch
from helpers import (
    noise_clip,
    offline_decode,
    stream_capturing_encoder_output,
    to_pcm16,
    wait_caught_up,
)

from pipecat_nemotron.agent.wav_input import read_float32
from pipecat_nemotron.asr import (
    CapacityError,
    EngineConfig,
    InvalidAudioError,
    NemotronEngine,
    StreamClosedError,
    StreamFailedError,
)
from pipecat_nemotron.models import DEMO_AUDIO_DIR
from pipecat_nemotron.models import TINY_MODEL_PATH as TRAINED_MODEL

MODES = (80, 160, 560, 1120)


@pytest.fixture
async def engine(engine_factory, tiny_random_model):
    return await engine_factory(tiny_random_model, max_streams=8, max_batch_size=8, finalize_mode="hard")


@pytest.mark.parametrize("latency_ms", MODES)
async def test_streaming_equals_offline(engine: NemotronEngine, latency_ms: int) -> None:
    audio = noise_clip(2.37, seed=latency_ms)
    offline_tokens, offline_enc = offline_decode(engine, audio, latency_ms)

    final, streamed = await stream_capturing_encoder_output(engine, audio, latency_ms)
    # The same int16 rounding as the pushed audio.
    audio16 = np.frombuffer(to_pcm16(audio), dtype="<i2").astype(np.float32) / 32768.0
    offline_tokens, offline_enc = offline_decode(engine, audio16, latency_ms)
    assert streamed.shape == offline_enc.shape
    assert (streamed - offline_enc).abs().max().item() < 1e-4
    assert list(final.tokens) == offline_tokens
    assert len(offline_tokens) > 10


async def test_batched_equals_alone_with_staggered_joins(engine: NemotronEngine) -> None:
    clips = [noise_clip(1.0 + 0.45 * i, seed=10 + i) for i in range(5)]
    modes = [160, 160, 80, 560, 160]
    alone = [
        list((await engine.transcribe(to_pcm16(c), latency_ms=m)).tokens)
        for c, m in zip(clips, modes, strict=True)
    ]
    max_batch = steps = 0
    stepped = asyncio.Event()

    def on_step(stats) -> None:
        nonlocal max_batch, steps
        max_batch, steps = max(max_batch, stats.batch_size), steps + 1
        stepped.set()

    engine.add_step_listener(on_step)

    async def after_steps(n: int) -> None:
        while steps < n:  # a guard against a hang (the engine went idle first), not a timing threshold
            stepped.clear()
            await asyncio.wait_for(stepped.wait(), timeout=60)

    async def run(i: int) -> list[int]:
        # Staggered joins, counted in model steps: each stream has 5 or more chunks, one per step, so the streams
        # opened 2 steps apart overlap; different lengths make staggered leaves.
        await after_steps(2 * i)
        stream = engine.open_stream(latency_ms=modes[i])
        await stream.push(to_pcm16(clips[i]))
        final = await stream.finalize()
        await stream.close()
        return list(final.tokens)

    together = await asyncio.gather(*(run(i) for i in range(5)))
    engine.remove_step_listener(on_step)
    assert together == alone
    assert max_batch >= 3, "the streams were never batched together"


async def test_final_keeps_the_tail(engine: NemotronEngine) -> None:
    # In the 1120 ms mode up to 1.12 s of audio is decoded only when the utterance is finalized.
    audio = noise_clip(1.9, seed=3)
    stream = engine.open_stream(latency_ms=1120)
    partials: list[str] = []

    async def read() -> None:
        async for update in stream:
            if not update.is_final:
                partials.append(update.text)

    reader = asyncio.create_task(read())
    await stream.push(to_pcm16(audio))
    await wait_caught_up(stream)
    last_partial_tokens = len(stream.tokens)
    final = await stream.finalize()
    await stream.close()
    await reader
    offline_tokens, _ = offline_decode(
        engine, np.frombuffer(to_pcm16(audio), "<i2").astype(np.float32) / 32768, 1120
    )
    assert list(final.tokens) == offline_tokens
    assert len(final.tokens) > last_partial_tokens > 0
    assert partials and final.text.startswith(partials[-1])


async def test_capacity_error_leaves_existing_streams_working(tiny_random_model) -> None:
    async with NemotronEngine(
        EngineConfig(model=str(tiny_random_model), device="cpu", max_streams=2, warmup=False)
    ) as eng:
        a, b = eng.open_stream(), eng.open_stream()
        with pytest.raises(CapacityError, match="2 ASR stream slots"):
            eng.open_stream()
        await a.push(to_pcm16(noise_clip(0.8, seed=1)))
        await b.push(to_pcm16(noise_clip(0.8, seed=2)))
        fa, fb = await asyncio.gather(a.finalize(), b.finalize())
        assert fa.tokens and fb.tokens
        await a.close()
        c = eng.open_stream()  # the freed slot is reusable
        assert eng.open_streams == 2
        await c.close()
        await b.close()
        assert eng.open_streams == 0


async def test_bad_input(engine: NemotronEngine) -> None:
    stream = engine.open_stream()
    await stream.push(b"")  # empty push: no-op
    with pytest.raises(InvalidAudioError, match="sample_rate"):
        await stream.push(b"\x00\x00", sample_rate=12345)
    assert stream.closed and engine.open_streams == 0  # bad input fails the stream and frees its slot
    with pytest.raises(StreamFailedError):
        await stream.push(b"\x00\x00")

    stream = engine.open_stream()
    bad = noise_clip(0.5)
    bad[100] = np.nan
    with pytest.raises(InvalidAudioError, match="NaN"):
        await stream.push(bad)
    assert engine.open_streams == 0

    stream = engine.open_stream()
    await stream.close()
    await stream.close()  # idempotent
    with pytest.raises(StreamClosedError):
        await stream.push(b"\x00\x00")


async def test_odd_bytes_stereo_and_resampling(engine: NemotronEngine) -> None:
    pcm = to_pcm16(noise_clip(1.3, seed=5))
    reference = (await engine.transcribe(pcm, latency_ms=160)).tokens

    stream = engine.open_stream(latency_ms=160)
    for i in range(0, len(pcm), 333):  # odd-sized pieces split samples in half
        await stream.push(pcm[i : i + 333])
    assert (await stream.finalize()).tokens == reference
    await stream.close()

    mono = np.frombuffer(pcm, "<i2")
    stereo = np.stack([mono, mono], axis=1).reshape(-1).astype("<i2").tobytes()
    stream = engine.open_stream(latency_ms=160)
    await stream.push(stereo, num_channels=2)
    assert (await stream.finalize()).tokens == reference
    await stream.close()

    import soxr

    audio48 = soxr.resample(mono.astype(np.float32) / 32768, 16000, 48000)
    final = await engine.transcribe(audio48, latency_ms=160, sample_rate=48000)
    assert abs(final.utterance_audio_ms - 1300) < 40
    assert final.tokens


async def test_no_slot_leak_over_many_open_close_cycles(tiny_random_model) -> None:
    async with NemotronEngine(
        EngineConfig(model=str(tiny_random_model), device="cpu", max_streams=4, warmup=False)
    ) as eng:
        chunk = to_pcm16(noise_clip(0.05))
        for i in range(10_000):
            stream = eng.open_stream()
            if i % 500 == 0:
                await stream.push(chunk)  # some streams close mid-utterance, holding audio
            await stream.close()
        assert eng.open_streams == 0
        assert eng.free_slots == 4


async def test_slot_freed_when_a_stream_closes_in_the_step_that_gives_it_a_new_slot(tiny_random_model) -> None:
    """A hard-finalized stream gets a new cache slot in the step that frees its old one; closing it during
    that step must still free the new slot (else the slot leaks and a later stream fails with NeMo's
    ``No free slots available`` while ``open_stream`` admitted it)."""
    async with NemotronEngine(
        EngineConfig(
            model=str(tiny_random_model), device="cpu", max_streams=2, finalize_mode="hard", warmup=False
        )
    ) as eng:
        loop = asyncio.get_running_loop()
        stream = eng.open_stream(latency_ms=160)
        armed = threading.Event()
        close_started = threading.Event()
        closing: list[asyncio.Task[None]] = []

        def start_close() -> None:
            closing.append(loop.create_task(stream.close()))
            loop.call_soon(close_started.set)  # after the close task's first (synchronous) part

        def hook(stream_ids: list[int], encoded: torch.Tensor, encoded_len: torch.Tensor) -> None:
            # Runs on the model thread: close the stream while the step that re-slotted it is in flight.
            if armed.is_set() and stream.stream_id in stream_ids and not close_started.is_set():
                loop.call_soon_threadsafe(start_close)
                close_started.wait(10)

        eng.add_step_listener(lambda stats: armed.set() if stats.finals else None)
        with eng.observe_encoder_output(hook):
            await stream.push(to_pcm16(noise_clip(1.0, seed=21)))
            final = asyncio.ensure_future(stream.finalize())
            await asyncio.sleep(0)  # the finalize has marked its boundary
            await stream.push(to_pcm16(noise_clip(1.0, seed=22)))  # the next utterance, ready at once
            await final
            await wait_for_closing(closing)
        assert eng.open_streams == 0
        assert eng.free_slots == 2
        # Every admitted stream decodes: none fails for want of a cache slot.
        streams = [eng.open_stream(latency_ms=160) for _ in range(2)]
        for s in streams:
            await s.push(to_pcm16(noise_clip(0.5, seed=23)))
        finals = await asyncio.gather(*(s.finalize() for s in streams))
        assert all(f.tokens for f in finals)
        for s in streams:
            await s.close()


async def wait_for_closing(closing: list[asyncio.Task[None]]) -> None:
    """Await the close task a hook started (it may not exist yet when the hook has not fired)."""
    for _ in range(1000):
        if closing:
            await asyncio.wait_for(closing[0], 10)
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the stream was never closed mid-step")


async def test_slot_taken_at_once_by_a_stream_opened_as_another_closes(tiny_random_model) -> None:
    """All slots held, one stream closing: a stream opened in the same event-loop turn decodes (its slot is
    the closed one's, freed before the next step's forwards), with no ``No free slots available``."""
    async with NemotronEngine(
        EngineConfig(model=str(tiny_random_model), device="cpu", max_streams=3, warmup=False)
    ) as eng:
        streams = [eng.open_stream(latency_ms=80) for _ in range(3)]
        for s in streams:
            await s.push(to_pcm16(noise_clip(0.5, seed=31)))
        await asyncio.gather(*(wait_caught_up(s) for s in streams))
        assert eng.free_slots == 0
        for round_ in range(6):
            old = streams.pop(0)
            pushing = [asyncio.ensure_future(s.push(to_pcm16(noise_clip(0.3, seed=round_)))) for s in streams]
            closing = asyncio.ensure_future(old.close())
            await asyncio.sleep(0)  # the close has begun; its slot is freed by the next step
            new = eng.open_stream(latency_ms=80)
            await new.push(to_pcm16(noise_clip(0.5, seed=40 + round_)))
            streams.append(new)
            await asyncio.gather(closing, *pushing)
        finals = await asyncio.gather(*(s.finalize() for s in streams))
        assert all(f.tokens for f in finals)
        for s in streams:
            await s.close()
        assert eng.free_slots == 3


async def test_latency_change_applies_at_utterance_boundary(engine: NemotronEngine) -> None:
    stream = engine.open_stream(latency_ms=160)
    stream.set_latency(560)  # nothing decoded yet: applies at once
    assert stream.latency_ms == 560 and stream.chunk_ms == 560
    await stream.push(to_pcm16(noise_clip(1.5, seed=8)))
    await wait_caught_up(stream)
    stream.set_latency(80)  # mid-utterance: applies after the final
    assert stream.latency_ms == 560
    first = await stream.finalize()
    assert first.latency_ms == 560 and stream.latency_ms == 80
    second_audio = noise_clip(1.0, seed=9)
    await stream.push(to_pcm16(second_audio))
    second = await stream.finalize()
    await stream.close()
    assert second.latency_ms == 80
    # Hard finalize: the second utterance decodes exactly as the clip alone does.
    alone = await engine.transcribe(to_pcm16(second_audio), latency_ms=80)
    assert second.tokens == alone.tokens
    with pytest.raises(ValueError, match="80, 160, 560, 1120"):
        stream2 = engine.open_stream()
        try:
            stream2.set_latency(200)
        finally:
            await stream2.close()


async def test_audio_after_finalize_belongs_to_next_utterance(engine: NemotronEngine) -> None:
    a, b = noise_clip(1.2, seed=21), noise_clip(0.9, seed=22)
    alone_a = (await engine.transcribe(to_pcm16(a), latency_ms=160)).tokens
    alone_b = (await engine.transcribe(to_pcm16(b), latency_ms=160)).tokens
    stream = engine.open_stream(latency_ms=160)
    await stream.push(to_pcm16(a))
    pending = asyncio.ensure_future(stream.finalize())
    await asyncio.sleep(0)
    await stream.push(to_pcm16(b))  # arrives while the finalize is in flight
    fa = await pending
    fb = await stream.finalize()
    await stream.close()
    assert (fa.tokens, fb.tokens) == (alone_a, alone_b)
    assert (fa.utterance, fb.utterance) == (0, 1)


async def test_failing_stream_fails_alone(engine: NemotronEngine) -> None:
    victim = engine.open_stream(latency_ms=160)
    others = [engine.open_stream(latency_ms=160) for _ in range(3)]

    def hook(ids, enc, enc_len) -> None:
        if victim.stream_id in ids:
            raise RuntimeError("simulated CUDA error")

    with engine.observe_encoder_output(hook):
        clip = to_pcm16(noise_clip(0.6, seed=30))
        for s in [victim, *others]:
            await s.push(clip)
        results = await asyncio.gather(
            victim.finalize(), *(s.finalize() for s in others), return_exceptions=True
        )
    assert isinstance(results[0], StreamFailedError)
    assert all(not isinstance(r, BaseException) and r.tokens for r in results[1:])
    assert victim.closed
    for s in others:
        await s.close()
    assert engine.open_streams == 0


async def test_finalize_encodes_only_the_tail_whatever_the_utterance_length(tiny_quiet_model) -> None:
    """Time-to-final is flat in utterance length because finalize encodes only the not-yet-encoded tail.

    The timing itself (ratio of 20 s to 2 s time-to-final) is a benchmark: ``python -m pipecat_nemotron.bench
    time-to-final`` (docs/BENCHMARKS.md). This checks the cause, with no clock: the finalize step's encoder
    output is the same few frames after 2 s and after 20 s of speech.
    """
    async with NemotronEngine(EngineConfig(model=str(tiny_quiet_model), device="cpu", max_streams=2)) as eng:

        async def finalize_frames(seconds: float, seed: int) -> list[int]:
            stream = eng.open_stream(latency_ms=160)
            await stream.push(to_pcm16(noise_clip(seconds, seed=seed)))
            await wait_caught_up(stream)
            frames: list[int] = []

            def hook(ids: list[int], enc: torch.Tensor, enc_len: torch.Tensor) -> None:
                frames.extend(int(enc_len[row]) for row, sid in enumerate(ids) if sid == stream.stream_id)

            try:
                with eng.observe_encoder_output(hook):
                    final = await stream.finalize()
            finally:
                await stream.close()
            assert final.utterance_audio_ms == pytest.approx(seconds * 1000)
            return frames

        # 17.92 s apart: a whole number of 160 ms chunks, so both leave the same tail to flush.
        short = await finalize_frames(2.08, 40)
        long = await finalize_frames(20.0, 50)
    assert short == long and 0 < sum(short) <= 4, (short, long)  # a 160 ms chunk is 2 encoder frames


async def test_model_load_errors(tmp_path) -> None:
    from pipecat_nemotron.asr import ModelLoadError

    with pytest.raises(ModelLoadError, match="does not exist"):
        await NemotronEngine(EngineConfig(model=str(tmp_path / "missing.nemo"), device="cpu")).start()
    corrupt = tmp_path / "corrupt.nemo"
    corrupt.write_bytes(b"not a tar archive" * 100)
    with pytest.raises(ModelLoadError, match="corrupt.nemo"):
        await NemotronEngine(EngineConfig(model=str(corrupt), device="cpu")).start()
    with pytest.raises(ValueError, match="latency_ms must be a multiple of 80 ms"):
        EngineConfig(default_latency_ms=100)
    with pytest.raises(ValueError, match="finalize_mode"):
        EngineConfig(finalize_mode="medium")  # type: ignore[arg-type]


async def test_two_models_loading_at_once_each_find_their_own_files(tiny_random_model, monkeypatch) -> None:
    """Two engines started together (a bot preloads its models on threads) both load.

    NeMo's restore records the extracted checkpoint's folder in a process-wide state that the model's constructor
    reads its tokenizer from. The first restore to reach its tokenizer waits (up to 3 s) for the other restore to
    reach its own; the loader's lock keeps the other out until the first is done, so the wait times out and both
    load. Without it, the first looked in the other's folder and failed: "Artifact not found".
    """
    import threading

    from nemo.collections.asr.parts.mixins.mixins import ASRBPEMixin

    setup = ASRBPEMixin._setup_tokenizer
    calls: list[int] = []
    second_in_setup = threading.Event()
    guard = threading.Lock()

    def setup_after_the_other(self, tokenizer_cfg):
        with guard:
            calls.append(threading.get_ident())
            first = len(calls) == 1
        if first:
            second_in_setup.wait(3.0)
        else:
            second_in_setup.set()
        return setup(self, tokenizer_cfg)

    monkeypatch.setattr(ASRBPEMixin, "_setup_tokenizer", setup_after_the_other)
    engines = [
        NemotronEngine(EngineConfig(model=str(model), device="cpu", max_streams=1, warmup=False))
        for model in (TRAINED_MODEL, tiny_random_model)
    ]
    try:
        await asyncio.gather(*(e.start() for e in engines))
        assert len(calls) == 2 and calls[0] != calls[1]  # the two restores ran on two threads
        speech = await engines[0].transcribe(read_float32(DEMO_AUDIO_DIR / "demo_weather.wav"))
        assert "weather" in speech.text
    finally:
        await asyncio.gather(*(e.stop() for e in engines))


async def test_non_streaming_model_is_rejected(tmp_path) -> None:
    from omegaconf import OmegaConf

    from pipecat_nemotron.asr import ModelLoadError
    from pipecat_nemotron.asr.architectures import TINY, asr_model_config, train_tokenizer
    from pipecat_nemotron.runtime.nemo_logs import quiet_nemo

    cfg = asr_model_config(str(train_tokenizer(tmp_path / "tok")), TINY)
    cfg["encoder"].update(att_context_style="regular", att_context_size=[-1, -1], conv_context_size=None)
    cfg["encoder"].pop("att_context_probs")
    cfg["preprocessor"]["normalize"] = "per_feature"
    with quiet_nemo():
        from nemo.collections.asr.models import EncDecRNNTBPEModel

        EncDecRNNTBPEModel(cfg=OmegaConf.create(cfg)).save_to(str(tmp_path / "offline.nemo"))
    with pytest.raises(
        ModelLoadError, match=r"offline\.nemo.*not a cache-aware streaming model.*chunked_limited"
    ):
        await NemotronEngine(EngineConfig(model=str(tmp_path / "offline.nemo"), device="cpu")).start()


async def test_engine_not_started_and_stop_fails_pending(tiny_random_model) -> None:
    from pipecat_nemotron.asr import EngineNotRunningError

    eng = NemotronEngine(EngineConfig(model=str(tiny_random_model), device="cpu", warmup=False))
    with pytest.raises(EngineNotRunningError, match="start"):
        eng.open_stream()
    await eng.start()
    stream = eng.open_stream()
    entered, go = threading.Event(), threading.Event()

    def hold(*_: object) -> None:  # the step in progress waits here, on the model's worker thread
        entered.set()
        go.wait(60)  # a liveness guard: the test sets it below

    with eng.observe_encoder_output(hold):
        await stream.push(to_pcm16(noise_clip(0.3)))
        assert await asyncio.to_thread(entered.wait, 60), "no step ran the pushed audio"
        # Asked while that step runs (after its plan): both wait for a next step that the stop never runs.
        final, peek = stream.finalize_nowait(), stream.peek_nowait()
        assert not final.done() and not peek.done()
        go.set()  # the held step ends on its thread; stop() cancels the scheduler before it resolves anything
        await eng.stop()
    for pending in (final, peek):
        with pytest.raises(StreamClosedError, match="engine"):
            await pending
    assert stream.closed
    with pytest.raises(StreamClosedError):
        await stream.push(b"\x00\x00")
    await asyncio.wait_for(eng.stop(), 60)  # idempotent (a hang, not a slow machine, would trip this)


async def test_stop_while_loading_waits_for_the_load_and_stops_cleanly(tiny_random_model, monkeypatch) -> None:
    """A server shut down while its model loads: the load ends, the engine stops, nothing is left failing."""
    from pipecat_nemotron.asr import loading

    engine = NemotronEngine(
        EngineConfig(model=str(tiny_random_model), device="cpu", max_streams=2, warmup=False)
    )
    entered, go = threading.Event(), threading.Event()
    load = loading.load_asr_model

    def held_load(*args: object, **kwargs: object) -> object:  # on the model thread: the load waits for the test
        entered.set()
        assert go.wait(60), "the test never let the load finish"
        return load(*args, **kwargs)

    monkeypatch.setattr(loading, "load_asr_model", held_load)
    start = asyncio.ensure_future(engine.start())
    assert await asyncio.to_thread(entered.wait, 60), "the load never started"
    assert not start.done()  # it waits for the load, which is held
    stopping = asyncio.ensure_future(engine.stop())
    for _ in range(10):  # loop passes, not time: stop() runs until it waits
        await asyncio.sleep(0)
    assert not stopping.done()  # it waits for the load too (held: nothing else can have let it return)
    go.set()
    await asyncio.wait_for(stopping, 60)  # a liveness guard
    assert start.done()
    await start  # the load finished and did not raise
    assert not engine.running
    with pytest.raises(Exception, match="not been started|not running"):
        engine.open_stream()


_ESCAPING_ERROR = """
import asyncio, sys
import numpy as np
from pipecat_nemotron.asr import EngineConfig, NemotronEngine

async def main():
    engine = NemotronEngine(EngineConfig(model=sys.argv[1], device="cpu", max_streams=2, warmup=False))
    await engine.start()  # never stopped: the error below leaves it running
    clip = (np.random.default_rng(0).standard_normal(16000) * 0.05).astype(np.float32)
    await asyncio.gather(*(engine.transcribe(clip) for _ in range(4)))  # two of them: CapacityError

asyncio.run(main())
"""


def test_an_error_escaping_asyncio_run_ends_the_process_with_its_traceback(tiny_random_model) -> None:
    # asyncio.run cancels every task, the scheduler's included; streams still closing must not wait forever
    # for a step that will never run (the process used to hang here, printing nothing).
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", _ESCAPING_ERROR, str(tiny_random_model)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 1, run.stderr[-2000:]
    assert "CapacityError: all 2 ASR stream slots are in use" in run.stderr
