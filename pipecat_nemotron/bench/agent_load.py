"""``agent-load``: N concurrent sessions through the whole agent in one process, Magpie FIFO vs batched.

Each session is a WAV of held-out speech (``tests/assets/heldout``) fed in real time through the whole local agent
(:func:`~pipecat_nemotron.agent.assembly.build_voice_agent`, :func:`~pipecat_nemotron.agent.wav_input.run_worker_on_wav`): Silero
VAD (its stop commits the turn, no Smart Turn, as ``eager``'s ``off``) → the Nemotron STT on one shared :class:`~pipecat_nemotron.asr.NemotronEngine` (tiny model) → a loopback
OpenAI-compatible server (:mod:`pipecat_nemotron.llm.fake_server`) whose first token comes a fixed time after
each request and whose reply is one sentence of about 2 s of speech → Magpie TTS on one shared
:class:`~pipecat_nemotron.tts.magpie.MagpieEngine` (tiny random model, which never ends a sentence early, so each reply
is ``--reply-s`` of audio) → simulated playback.

For each Magpie step (``nemo``: NeMo's ``generate_speech``, one request at a time, first-in first-out; ``fast``: our
KV-cached step with continuous batching, ``max_batch`` = the largest N) and each N of ``--sessions``, N sessions
start together. Per (step, N): voice-to-voice p50/p90 (speech end to the bot speaking,
:class:`~pipecat_nemotron.observers.metrics.VoiceLatencyObserver`), TTS first audio p50 (the TTS TTFB metric), and the turns
answered out of those owed (a reply still queued when the user speaks again is interrupted and never answered).

``--asr server`` runs the ASR in a ``pipecat-nemotron serve`` process of its own on loopback instead, and each
session's STT is its client (:class:`~pipecat_nemotron.stt.NemotronServerSTTService`): the ASR's torch ops
then no longer wait for the GIL behind the sessions' pipelines (``docs/BENCHMARKS.md`` §12).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
import wave
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.bench import common, load_server, output
from pipecat_nemotron.bench.audio import load_clips
from pipecat_nemotron.bench.eager import _NEVER_MS as NEVER_MS
from pipecat_nemotron.observers.latency_stats import TurnLatency, percentile
from pipecat_nemotron.runtime.gil import DEFAULT_SWITCH_INTERVAL_MS

NAME = "agent-load"
#: One sentence the LLM replies with; the tiny Magpie speaks ``--reply-s`` of audio for it whatever its length.
REPLY = "Sure, the meeting is at ten tomorrow morning in room four."
#: User clips kept short so a run stays within minutes: seconds.
_CLIP_MIN_S, _CLIP_MAX_S = 1.0, 4.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of this benchmark."""
    common.add_common_args(parser, latency_default=160)
    # Every session's ASR, VAD and the Magpie worker share the cores: one torch thread each avoids oversubscription.
    parser.set_defaults(threads=1)
    parser.add_argument(
        "--sessions",
        type=int,
        nargs="+",
        default=[1, 4, 8, 16],
        help="concurrent session counts (default: 1 4 8 16)",
    )
    parser.add_argument("--turns", type=int, default=3, help="user turns per session (default: 3)")
    parser.add_argument(
        "--steps",
        nargs="+",
        choices=["nemo", "fast"],
        default=["nemo", "fast"],
        help="Magpie steps to compare",
    )
    parser.add_argument("--ttft-ms", type=int, default=150, help="LLM time to first token, ms (default: 150)")
    parser.add_argument("--reply-s", type=float, default=2.0, help="audio per reply, s (default: 2.0)")
    parser.add_argument(
        "--gap-s",
        type=float,
        default=5.0,
        help="silence after each user turn, s: room for the reply (default: 5)",
    )
    parser.add_argument("--seed", type=int, default=0, help="clip choice seed (default: 0)")
    parser.add_argument(
        "--asr",
        choices=["in-process", "server"],
        default="in-process",
        help="ASR engine in this process, or in a `pipecat-nemotron serve` process on loopback (default: in-process)",
    )
    parser.add_argument(
        "--gil-switch-ms",
        type=float,
        default=DEFAULT_SWITCH_INTERVAL_MS,
        help="Python thread switch interval the engines set, ms (default: %(default)s; 5 is CPython's own)",
    )


# ---- sessions -------------------------------------------------------------------------------------------------


def write_sessions(args: argparse.Namespace, folder: Path) -> tuple[list[Path], str]:
    """``max(--sessions)`` session WAVs of ``--turns`` short held-out clips each (clips reused if too few)."""
    clips, source = load_clips(args.manifest)
    short = [c for c in clips if _CLIP_MIN_S <= c.audio.size / MODEL_SAMPLE_RATE <= _CLIP_MAX_S] or clips
    rng = random.Random(args.seed)
    count = max(args.sessions)
    picked = [short[i % len(short)] for i in rng.sample(range(count * args.turns), count * args.turns)]
    gap = np.zeros(int(args.gap_s * MODEL_SAMPLE_RATE), dtype=np.int16)
    lead = np.zeros(MODEL_SAMPLE_RATE // 2, dtype=np.int16)
    wavs = []
    for s in range(count):
        path = folder / f"session{s}.wav"
        with wave.open(str(path), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(MODEL_SAMPLE_RATE)
            for clip in picked[s * args.turns : (s + 1) * args.turns]:
                audio = (np.clip(clip.audio, -1, 1) * 32767).astype(np.int16)
                w.writeframes(np.concatenate([lead, audio, gap]).tobytes())
        wavs.append(path)
    return wavs, source


# ---- the agent --------------------------------------------------------------------------------------------------


async def run_session(
    asr: Any, magpie: Any, llm_url: str, wav: Path, args: argparse.Namespace
) -> list[TurnLatency]:
    """One session through the whole agent, fed in real time; returns its turn records.

    ``asr`` is the shared in-process engine, or the session URL of the ASR server (``--asr server``).
    """
    from pipecat_nemotron.agent.assembly import build_voice_agent
    from pipecat_nemotron.agent.wav_input import run_worker_on_wav
    from pipecat_nemotron.llm.service import create_nemotron_llm
    from pipecat_nemotron.observers.metrics import VoiceLatencyObserver
    from pipecat_nemotron.stt.eager import EagerSettings
    from pipecat_nemotron.stt.local import NemotronSTTService
    from pipecat_nemotron.tts.magpie import MagpieSynthesisOptions
    from pipecat_nemotron.tts.service import MagpieTTSService

    # As the eager benchmark's ``off``: the STT owns turn detection (committed by the VAD stop) and never predicts,
    # so Smart Turn's wait on clips it judges unfinished (up to 3 s) does not hide the TTS's share of the latency.
    never = EagerSettings(silence_ms=NEVER_MS)
    if isinstance(asr, str):
        from pipecat_nemotron.stt.remote.service import NemotronServerSTTService

        stt: Any = NemotronServerSTTService(url=asr, token=None, latency_ms=args.latency, eager=never)
    else:
        stt = NemotronSTTService(engine=asr, latency_ms=args.latency, eager=never)
    observer = VoiceLatencyObserver(log_turns=False)
    agent = build_voice_agent(
        stt=stt,
        llm=create_nemotron_llm(base_url=llm_url),
        tts=MagpieTTSService(engine=magpie, options=MagpieSynthesisOptions(max_duration_s=args.reply_s)),
        observers=[observer],
        idle_timeout_secs=None,
    )
    await run_worker_on_wav(agent.worker, stt, wav, trailing_silence_s=1.0, timeout_s=900)
    return observer.turns


async def run_load(
    step: str, count: int, wavs: list[Path], asr: Any, magpie: Any, args: argparse.Namespace
) -> dict:
    """``count`` sessions started together on the shared engines; returns their statistics."""
    from pipecat_nemotron.llm.fake_server import FakeOpenAIServer

    async with FakeOpenAIServer(reply=REPLY, first_token_delay_s=args.ttft_ms / 1000) as server:
        per_session = await asyncio.gather(
            *(run_session(asr, magpie, server.base_url, wav, args) for wav in wavs[:count])
        )
    records = [t for turns in per_session for t in turns]
    v2v = [t.v2v_ms for t in records if t.v2v_ms is not None]
    tts = [t.tts_ttfb_ms for t in records if t.tts_ttfb_ms is not None]
    asr = [t.asr_finalize_ms for t in records if t.asr_finalize_ms is not None]
    return {
        "step": step,
        "sessions": count,
        "owed": count * args.turns,
        "answered": len(v2v),
        "v2v_p50": percentile(v2v, 50) if v2v else None,
        "v2v_p90": percentile(v2v, 90) if v2v else None,
        "tts_first_audio_p50": percentile(tts, 50) if tts else None,
        "asr_finalize_p50": percentile(asr, 50) if asr else None,
        "turns": [t.to_dict() for t in records],
    }


async def bench(args: argparse.Namespace, result: dict[str, Any]) -> list[dict[str, Any]]:
    """Every step at every session count, on one shared ASR engine and one Magpie engine per step."""
    from pipecat_nemotron.asr import EngineConfig, NemotronEngine
    from pipecat_nemotron.tts.magpie.tiny import build_tiny_magpie

    spec = common.resolve_model(args.model, args.models_dir)
    result["model"] = spec.as_dict()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        wavs, result["audio"] = write_sessions(args, Path(tmp))
        magpie_path, _ = build_tiny_magpie(Path(tmp) / "magpie", end_of_speech_bias=-30.0)
        config = EngineConfig(
            model=str(spec.path),
            device=args.device,
            max_streams=max(args.sessions),
            gil_switch_interval_ms=args.gil_switch_ms,
        )
        if args.asr == "server":
            async with asr_server(spec.path, args) as url:
                await run_steps(args, wavs, magpie_path, url, runs)
        else:
            async with NemotronEngine(config) as asr:
                await run_steps(args, wavs, magpie_path, asr, runs)
    return runs


async def run_steps(
    args: argparse.Namespace, wavs: list[Path], magpie_path: Path, asr: Any, runs: list[dict[str, Any]]
) -> None:
    """Every Magpie step at every session count on ``asr`` (engine or server URL); appends to ``runs``."""
    from pipecat_nemotron.tts.magpie import MagpieEngine

    for step in args.steps:
        magpie = MagpieEngine(
            str(magpie_path),
            device="cpu",
            step=step,
            max_batch=max(args.sessions),
            gil_switch_interval_ms=args.gil_switch_ms,
        )
        try:
            await magpie.wait_ready()
            for count in args.sessions:
                print(f"[bench] agent-load: {step} step, {count} sessions, ASR {args.asr} ...", flush=True)
                runs.append({"asr": args.asr, **await run_load(step, count, wavs, asr, magpie, args)})
        finally:
            magpie.close()


@contextlib.asynccontextmanager
async def asr_server(model: Path, args: argparse.Namespace, ready_timeout_s: float = 300.0) -> AsyncIterator[str]:
    """A ``pipecat-nemotron serve`` process on loopback (no token) for the run; yields its session URL.

    Started, awaited and stopped as the load test's local server is (:mod:`~pipecat_nemotron.bench.load_server`);
    its output goes to a file, whose tail a failure to start carries.

    Raises:
        RuntimeError: The server exited, or was not ready within ``ready_timeout_s`` (its log tail says why).

    """
    port = load_server.free_port()
    command = [
        "-m", "pipecat_nemotron.cli", "serve", "--model", str(model), "--device", args.device,
        "--insecure", "--host", "127.0.0.1", "--port", str(port), "--max-sessions", str(max(args.sessions)),
        "--log-level", "WARNING",
    ]  # fmt: skip
    if args.threads:
        command += ["--cpu-threads", str(args.threads)]
    with tempfile.TemporaryFile("w+") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *command, stdout=log, stderr=asyncio.subprocess.STDOUT
        )
        try:
            try:
                await load_server.wait_ready(f"http://127.0.0.1:{port}", proc, ready_timeout_s)
            except (RuntimeError, TimeoutError) as e:
                log.seek(0)
                raise RuntimeError(f"the ASR server: {e}; its log ends:\n{log.read()[-2000:]}") from None
            yield f"ws://127.0.0.1:{port}/v1/asr"
        finally:
            await load_server.stop_process(proc)


# ---- report -----------------------------------------------------------------------------------------------------


def table(runs: Sequence[dict[str, Any]]) -> str:
    """The Markdown table: per step and N, v2v p50/p90 (and p50 over N = 1's), TTS first audio, turns answered."""
    one = {r["step"]: r["v2v_p50"] for r in runs if r["sessions"] == 1}
    rows = []
    for r in runs:
        base = one.get(r["step"])
        ratio = f"{r['v2v_p50'] / base:.2f}x" if base and r["v2v_p50"] else None
        label = "nemo (FIFO)" if r["step"] == "nemo" else "fast (batched)"
        rows.append(
            [
                r.get("asr", "in-process"),
                label,
                r["sessions"],
                r["v2v_p50"],
                r["v2v_p90"],
                ratio,
                r["tts_first_audio_p50"],
                r.get("asr_finalize_p50"),
                f"{r['answered']}/{r['owed']}",
            ]
        )
    headers = [
        "ASR",
        "Magpie step",
        "sessions",
        "v2v p50 ms",
        "v2v p90 ms",
        "p50 vs N=1",
        "TTS first audio p50 ms",
        "ASR finalize p50 ms",
        "turns answered",
    ]
    return output.format_table(headers, rows)


def figure(runs: Sequence[dict[str, Any]]) -> Any:
    """Voice-to-voice p50 and p90 against the session count, one line per step."""
    fig, axes = output.new_figure(1, 1, size=(7.0, 4.0))
    ax = axes[0][0]
    for step, color in (("nemo", "#d62728"), ("fast", "#76b900")):
        rs = [r for r in runs if r["step"] == step and r["v2v_p50"] is not None]
        for stat, style in (("p50", "o-"), ("p90", "o--")):
            if rs:
                sessions, v2v = [r["sessions"] for r in rs], [r[f"v2v_{stat}"] for r in rs]
                ax.plot(sessions, v2v, style, color=color, label=f"{step} {stat}")
    ax.set_xlabel("concurrent sessions")
    ax.set_ylabel("voice-to-voice, ms")
    ax.set_title("Whole agent under load: Magpie FIFO (nemo) vs batched (fast)")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark and write ``agent-load.json`` / ``agent-load.png``."""
    from loguru import logger

    result = output.result_header(NAME, args)
    logger.remove()  # Pipecat logs every frame decision at DEBUG: only warnings
    logger.add(sys.stderr, level="INFO" if args.verbose else "WARNING")
    with common.bench_context(args):
        runs = asyncio.run(bench(args, result))
    result["runs"] = runs
    result["table"] = table(runs)
    summary = (
        f"agent load, {args.turns} turns per session, LLM first token {args.ttft_ms} ms, "
        f"GIL switch interval {args.gil_switch_ms:g} ms, "
        f"{args.reply_s:g} s replies\n{result['table']}"
    )
    output.finish(args.out, NAME, result, figure(runs), summary)
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point: ``python -m pipecat_nemotron.bench agent-load [options]``."""
    return common.bench_main(NAME, __doc__, add_arguments, run, argv)
