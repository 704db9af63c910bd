#!/usr/bin/env python
"""Where the Magpie worker's time goes, codec states vs left-context re-decode, on the tiny random Magpie.

Two parts, each printed as a table:

* ``--requests`` requests of ``--frames`` frames, submitted together to one ``MagpieEngine`` (fast step, batched),
  once with ``stateful_codec=False`` (each chunk re-decodes the codec's receptive field) and once with ``True``:
  wall time, time in the worker's steps, time in the batched codec decode (its share of the steps), audio seconds
  per wall second, and the top functions of a cProfile of the worker's steps;
* the cost of one batched codec call, by rows and new frames, with codec states and with 15 frames of context.

Example::

    .venv/bin/python scripts/profile_magpie_codec.py --threads 1
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

TEXT = "The quick brown fox jumps over the lazy dog."


def _worker_profile(magpie: Path, codec: Path, *, stateful: bool, requests: int, frames: int, top: int) -> None:
    from pipecat_nemotron.tts.magpie import MagpieEngine, MagpieSynthesisOptions

    engine = MagpieEngine(str(magpie), device="cpu", codec_model_path=str(codec), max_batch=requests,
                          stateful_codec=stateful)
    try:
        engine.wait_until_ready(timeout=300)
        batcher: Any = engine._batcher
        profile, spent = cProfile.Profile(), {"step": 0.0, "codec": 0.0}
        run_step, decode_due = batcher.run_step, batcher._decode_due

        def timed_step() -> None:  # Runs on the worker thread: cProfile follows that thread only while enabled.
            started = time.perf_counter()
            profile.enable()
            try:
                run_step()
            finally:
                profile.disable()
                spent["step"] += time.perf_counter() - started

        def timed_decode(items: list[Any]) -> None:
            started = time.perf_counter()
            try:
                decode_due(items)
            finally:
                spent["codec"] += time.perf_counter() - started

        batcher.run_step, batcher._decode_due = timed_step, timed_decode
        duration = frames * engine.samples_per_frame / engine.sample_rate
        started = time.perf_counter()
        streams = [
            engine.submit(TEXT, options=MagpieSynthesisOptions(max_duration_s=duration, seed=i))
            for i in range(requests)
        ]
        for stream in streams:
            if not stream.wait(timeout=600):
                raise TimeoutError("a request did not finish in 600 s")
        wall = time.perf_counter() - started
        audio_s = sum(s.stats.frames for s in streams) * engine.samples_per_frame / engine.sample_rate
        print(
            f"| {'states' if stateful else 'left context'} | {wall:.2f} | {spent['step']:.2f} | {spent['codec']:.2f} "
            f"({100 * spent['codec'] / spent['step']:.0f}%) | {audio_s / wall:.2f} |"
        )
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(top)
        print("\n".join("    " + line for line in out.getvalue().splitlines() if line.strip()))
    finally:
        engine.close()


def _mean_ms(call: Any, repeats: int) -> float:
    """Mean ms of ``call()`` over ``repeats`` runs, after one warm-up run."""
    call()
    started = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - started) / repeats * 1000


def _call_costs(magpie: Path, codec: Path, repeats: int = 10) -> None:
    from pipecat_nemotron.tts.magpie._nemo_private import codes_to_audio_batch
    from pipecat_nemotron.tts.magpie.codec_stream import CodecState, StreamingCodec
    from pipecat_nemotron.tts.magpie.loading import load_magpie_model

    model = load_magpie_model(str(magpie), "cpu", str(codec))
    streaming = StreamingCodec(model)
    generator = torch.Generator().manual_seed(0)
    shape = (model.num_audio_codebooks,)
    print("\n| rows | new frames | with codec states ms | with 15 frames of context ms |\n|---|---|---|---|")
    for rows in (1, 8):
        for new in (1, 2, 4, 8, 16):
            codes = torch.randint(0, model.codebook_size, (rows, *shape, new + 15), generator=generator)
            states = [CodecState() for _ in range(rows)]
            with torch.inference_mode():
                with_states = _mean_ms(
                    lambda c=codes, n=new, s=states: streaming.decode(c[..., :n], torch.full((len(s),), n), s),
                    repeats,
                )
                with_context = _mean_ms(
                    lambda c=codes: codes_to_audio_batch(model, c, torch.full((c.shape[0],), c.shape[-1])), repeats
                )
            timings = [with_states, with_context]
            print(f"| {rows} | {new} | {timings[0]:.1f} | {timings[1]:.1f} |")


def main() -> None:
    """Parse the arguments and print both tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    parser.add_argument("--requests", type=int, default=8, help="requests submitted together (default: 8)")
    parser.add_argument("--frames", type=int, default=43, help="frames per request, ~2 s (default: 43)")
    parser.add_argument("--top", type=int, default=8, help="profile lines per run (default: 8)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from pipecat_nemotron.tts.magpie.tiny import build_tiny_magpie

    with tempfile.TemporaryDirectory() as folder:
        magpie, codec = build_tiny_magpie(Path(folder))
        print("| codec decode | wall s | worker steps s | codec decode s (share) | audio s per wall s |")
        print("|---|---|---|---|---|")
        for stateful in (False, True):
            _worker_profile(magpie, codec, stateful=stateful, requests=args.requests, frames=args.frames, top=args.top)
        _call_costs(magpie, codec)


if __name__ == "__main__":
    main()
