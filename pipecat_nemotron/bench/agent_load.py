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

``--bots processes`` spreads the N sessions over bot processes instead (``--bot-processes K``; default: one per
session, up to the cores this process may use), with ONE ``pipecat-nemotron serve`` process hosting both models
(the tiny ASR, and the tiny Magpie batched for every session behind NVIDIA Riva's gRPC API). Each bot process
(:mod:`~pipecat_nemotron.bench.agent_bot`) runs the same pipeline (:func:`run_session`: Silero VAD, the STT owning
turn detection, its own loopback fake LLM) with :class:`~pipecat_nemotron.stt.NemotronServerSTTService` as STT
and Pipecat's ``NvidiaTTSService`` as TTS, and appends each turn's record to a JSONL file the parent reads
(:mod:`~pipecat_nemotron.bench.agent_procs`). ``--bots in-process processes`` measures both on the same sessions
in one run, with the same statistics (:func:`run_stats`). Every run also reports each leg's p50 and p90 (STT
TTFS, ASR finalize, LLM TTFB, TTS first audio) and CPU seconds per conversation-minute split by process: the
model server, and the bots (the sum of the bot processes; in-process: this process), read from
``/proc/<pid>/stat`` at the start and the end of the run. A bot process that dies costs only its own sessions:
the run reports it (``bot_reports``, ``bots_failed``), keeps the turns it answered, and the other bots go on;
its CPU time after the start cannot be read and is left out of the bots' sum.

    python -m pipecat_nemotron.bench agent-load --sessions 1 2 --turns 1 --bots in-process processes
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import tempfile
import wave
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.bench import common, load_server, output
from pipecat_nemotron.bench.audio import load_clips
from pipecat_nemotron.bench.eager import _NEVER_MS as NEVER_MS
from pipecat_nemotron.observers.latency_stats import STAGES, TurnLatency, summarize
from pipecat_nemotron.runtime.gil import DEFAULT_SWITCH_INTERVAL_MS

NAME = "agent-load"
#: One sentence the LLM replies with; the tiny Magpie speaks ``--reply-s`` of audio for it whatever its length.
REPLY = "Sure, the meeting is at ten tomorrow morning in room four."
#: User clips kept short so a run stays within minutes: seconds.
_CLIP_MIN_S, _CLIP_MAX_S = 1.0, 4.0
#: Silence fed after a session's WAV, s.
TRAILING_SILENCE_S = 1.0


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
        "--bots",
        nargs="+",
        choices=["in-process", "processes"],
        default=["in-process"],
        help="where the sessions' pipelines run: all in this process (ASR per --asr, Magpie in this process), or "
        "spread over bot processes with ASR and TTS on one `pipecat-nemotron serve` process; several modes are "
        "measured in one run on the same sessions (default: in-process)",
    )
    parser.add_argument(
        "--bot-processes",
        type=int,
        default=None,
        help="bot processes with --bots processes (default: one per session, up to the cores this process may "
        "use: each process is a GIL of its own; more processes than cores only add memory and context switches)",
    )
    parser.add_argument(
        "--silence",
        nargs="+",
        choices=["skip", "send"],
        default=["skip"],
        help="with --bots processes: the bots' STT holds silence back between turns (skip: only speech and its "
        "preroll reach the ASR server, NemotronServerSTTService's default) or sends every sample (send); several "
        "are measured in one run (default: skip)",
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


def session_stt(asr: Any, latency_ms: int, skip_silence: bool = True) -> Any:
    """A session's STT: on the shared in-process engine, or a client of the ASR server at the URL ``asr``.

    As the eager benchmark's ``off``: the STT owns turn detection (committed by the VAD stop) and never predicts,
    so Smart Turn's wait on clips it judges unfinished (up to 3 s) does not hide the TTS's share of the latency.
    ``skip_silence``: the server client's (audio between turns held back, ``NemotronServerSTTService``).
    """
    from pipecat_nemotron.stt.eager import EagerSettings

    never = EagerSettings(silence_ms=NEVER_MS)
    if isinstance(asr, str):
        from pipecat_nemotron.stt.remote.service import NemotronServerSTTService

        return NemotronServerSTTService(
            url=asr, token=None, latency_ms=latency_ms, eager=never, skip_silence=skip_silence
        )
    from pipecat_nemotron.stt.local import NemotronSTTService

    return NemotronSTTService(engine=asr, latency_ms=latency_ms, eager=never)


async def run_session(stt: Any, tts: Any, llm_url: str, wav: Path, jsonl: Path | None = None) -> list[TurnLatency]:
    """One session through the whole agent, fed in real time; returns its turn records.

    The same pipeline in every mode (in this process, or in a bot process: :mod:`~pipecat_nemotron.bench.agent_bot`);
    only the STT (:func:`session_stt`) and the TTS differ. ``jsonl``: where each turn's record is appended as it
    is measured.
    """
    from pipecat_nemotron.agent.assembly import build_voice_agent
    from pipecat_nemotron.agent.wav_input import run_worker_on_wav
    from pipecat_nemotron.llm.service import create_nemotron_llm
    from pipecat_nemotron.observers.metrics import VoiceLatencyObserver

    observer = VoiceLatencyObserver(log_turns=False, jsonl_path=jsonl)
    agent = build_voice_agent(
        stt=stt,
        llm=create_nemotron_llm(base_url=llm_url),
        tts=tts,
        observers=[observer],
        idle_timeout_secs=None,
    )
    await run_worker_on_wav(agent.worker, stt, wav, trailing_silence_s=TRAILING_SILENCE_S, timeout_s=900)
    return observer.turns


def conversation_minutes(wavs: Sequence[Path]) -> float:
    """The sessions' length as fed (their WAVs and the trailing silence), minutes."""
    total = 0.0
    for path in wavs:
        with wave.open(str(path), "rb") as w:
            total += w.getnframes() / w.getframerate() + TRAILING_SILENCE_S
    return total / 60


def run_stats(
    records: Sequence[TurnLatency], wavs: Sequence[Path], args: argparse.Namespace, cpu: dict[str, float | None]
) -> dict[str, Any]:
    """One run's statistics, computed the same way for every mode.

    Turns answered of those owed, voice-to-voice p50/p90, each leg's p50 and p90, and CPU seconds per
    conversation-minute (``cpu``: seconds of the server and of the bots over the run, None where not measured).
    """
    stats = summarize(records)
    minutes = conversation_minutes(wavs)
    per_minute = {k: (round(v / minutes, 3) if v is not None else None) for k, v in cpu.items()}
    return {
        "sessions": len(wavs),
        "owed": len(wavs) * args.turns,
        "answered": stats["v2v_ms"].count,
        "v2v_p50": stats["v2v_ms"].p50,
        "v2v_p90": stats["v2v_ms"].p90,
        "tts_first_audio_p50": stats["tts_ttfb_ms"].p50,
        "asr_finalize_p50": stats["asr_finalize_ms"].p50,
        "legs_p50": {stage: stats[stage].p50 for stage in STAGES},
        "legs_p90": {stage: stats[stage].p90 for stage in STAGES},
        "conversation_minutes": minutes,
        "cpu_s": {k: (round(v, 3) if v is not None else None) for k, v in cpu.items()},
        "cpu_s_per_conversation_minute": per_minute,
        "turns": [t.to_dict() for t in records],
    }


async def run_load(
    step: str, count: int, wavs: list[Path], asr: Any, magpie: Any, args: argparse.Namespace, server_pid: int | None
) -> dict:
    """``count`` sessions started together in this process on the shared engines; returns their statistics.

    CPU: this process's (the bots', here with the Magpie engine), and the ASR server's with ``--asr server``.
    """
    from pipecat_nemotron.bench.agent_procs import cpu_seconds
    from pipecat_nemotron.llm.fake_server import FakeOpenAIServer
    from pipecat_nemotron.tts.magpie import MagpieSynthesisOptions
    from pipecat_nemotron.tts.service import MagpieTTSService

    options = MagpieSynthesisOptions(max_duration_s=args.reply_s)
    pids = {"server": server_pid, "bots": os.getpid()}
    async with FakeOpenAIServer(reply=REPLY, first_token_delay_s=args.ttft_ms / 1000) as server:
        before = {k: cpu_seconds(pid) for k, pid in pids.items() if pid is not None}
        per_session = await asyncio.gather(
            *(
                run_session(session_stt(asr, args.latency), MagpieTTSService(engine=magpie, options=options),
                            server.base_url, wav)
                for wav in wavs[:count]
            )
        )  # fmt: skip
        cpu = {k: (cpu_seconds(pid) - before[k] if pid is not None else None) for k, pid in pids.items()}
    records = [t for turns in per_session for t in turns]
    return {"step": step, **run_stats(records, wavs[:count], args, cpu)}


async def bench(args: argparse.Namespace, result: dict[str, Any]) -> list[dict[str, Any]]:
    """Every bots mode (``--bots``), step and session count on the same session WAVs, in one run."""
    from pipecat_nemotron.asr import EngineConfig, NemotronEngine
    from pipecat_nemotron.tts.magpie.tiny import build_tiny_magpie

    spec = common.resolve_model(args.model, args.models_dir)
    result["model"] = spec.as_dict()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        wavs, result["audio"] = write_sessions(args, Path(tmp))
        magpie = build_tiny_magpie(Path(tmp) / "magpie", end_of_speech_bias=-30.0)
        config = EngineConfig(
            model=str(spec.path),
            device=args.device,
            max_streams=max(args.sessions),
            gil_switch_interval_ms=args.gil_switch_ms,
        )
        for bots in args.bots:
            if bots == "processes":
                async with model_server(spec.path, args, magpie=magpie) as server:
                    await run_processes(args, wavs, server, Path(tmp), runs)
            elif args.asr == "server":
                async with model_server(spec.path, args) as server:
                    await run_steps(args, wavs, magpie[0], server.asr_url, runs, server.pid)
            else:
                async with NemotronEngine(config) as asr:
                    await run_steps(args, wavs, magpie[0], asr, runs, None)
    return runs


async def run_steps(
    args: argparse.Namespace,
    wavs: list[Path],
    magpie_path: Path,
    asr: Any,
    runs: list[dict[str, Any]],
    server_pid: int | None,
) -> None:
    """Every Magpie step at every session count in this process on ``asr`` (engine or URL); appends to ``runs``."""
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
                load = await run_load(step, count, wavs, asr, magpie, args, server_pid)
                runs.append({"bots": "in-process", "bot_processes": None, "asr": args.asr, **load})
        finally:
            magpie.close()


async def run_processes(
    args: argparse.Namespace, wavs: list[Path], server: ModelServer, tmp: Path, runs: list[dict[str, Any]]
) -> None:
    """Every session count with the sessions in bot processes, ASR and TTS on ``server``; appends to ``runs``."""
    for silence in args.silence:
        spec = {"asr_url": server.asr_url, "tts_address": server.tts_address, "latency_ms": args.latency,
                "ttft_ms": args.ttft_ms, "skip_silence": silence == "skip"}  # fmt: skip
        await _run_processes(args, wavs, server, tmp / f"silence-{silence}", runs, spec, silence)


async def _run_processes(
    args: argparse.Namespace,
    wavs: list[Path],
    server: ModelServer,
    tmp: Path,
    runs: list[dict[str, Any]],
    spec: dict[str, Any],
    silence: str,
) -> None:
    """Every session count with the bots' ``spec`` (``silence``: skip or send); appends to ``runs``."""
    from pipecat_nemotron.bench import agent_procs

    for count in args.sessions:
        processes = args.bot_processes or agent_procs.default_bot_processes(count)
        processes = min(processes, count)
        print(f"[bench] agent-load: {count} sessions in {processes} bot processes, ASR and TTS on one server, "
              f"silence {silence} ...", flush=True)  # fmt: skip
        folder = tmp / f"bots-{count}"
        folder.mkdir(parents=True)
        outcome = await agent_procs.run_bots(wavs[:count], processes, spec, folder, server_pid=server.pid)
        for bot in outcome.failed:
            print(f"[bench] agent-load: bot process {bot['bot']} (sessions {bot['sessions']}) failed: "
                  f"{bot['failure'] or bot['session_errors']}", file=sys.stderr, flush=True)  # fmt: skip
        cpu = {"server": outcome.server_cpu_s, "bots": outcome.bots_cpu_s}
        runs.append({
            "bots": "processes", "bot_processes": processes, "asr": "server", "step": "fast", "silence": silence,
            **run_stats(outcome.records, wavs[:count], args, cpu),
            "bot_reports": outcome.bots, "bots_failed": len(outcome.failed),
        })  # fmt: skip


@dataclass(frozen=True)
class ModelServer:
    """A ``pipecat-nemotron serve`` process of the run.

    Attributes:
        asr_url: Its ASR session URL (WebSocket).
        tts_address: Its Riva gRPC ``host:port`` where it hosts the TTS, else None.
        pid: Its process id.

    """

    asr_url: str
    tts_address: str | None
    pid: int


@contextlib.asynccontextmanager
async def model_server(
    model: Path,
    args: argparse.Namespace,
    *,
    magpie: tuple[Path, Path] | None = None,
    ready_timeout_s: float = 300.0,
) -> AsyncIterator[ModelServer]:
    """A ``pipecat-nemotron serve`` process on loopback (no token) for the run.

    It hosts the ASR, and with ``magpie`` (its ``.nemo`` and codec) the batched Magpie TTS over Riva gRPC, each
    reply ``--reply-s`` of audio.

    Started, awaited and stopped as the load test's local server is (:mod:`~pipecat_nemotron.bench.load_server`);
    its output goes to a file, whose tail a failure to start carries.

    Raises:
        RuntimeError: The server exited, or was not ready within ``ready_timeout_s`` (its log tail says why).

    """
    port, sessions = load_server.free_port(), max(args.sessions)
    command = [
        "-m", "pipecat_nemotron.cli", "serve", "--model", str(model), "--device", args.device,
        "--insecure", "--host", "127.0.0.1", "--port", str(port), "--max-sessions", str(sessions),
        "--log-level", "WARNING",
    ]  # fmt: skip
    grpc_port = load_server.free_port() if magpie is not None else None
    if magpie is not None:
        command += [
            "--grpc-port", str(grpc_port), "--tts-model", str(magpie[0]), "--tts-codec", str(magpie[1]),
            "--tts-max-batch", str(sessions), "--tts-max-streams", str(sessions),
            "--tts-max-duration-s", str(args.reply_s),
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
                raise RuntimeError(f"the model server: {e}; its log ends:\n{log.read()[-2000:]}") from None
            tts = f"127.0.0.1:{grpc_port}" if grpc_port is not None else None
            yield ModelServer(f"ws://127.0.0.1:{port}/v1/asr", tts, proc.pid)
        finally:
            await load_server.stop_process(proc)


# ---- report -----------------------------------------------------------------------------------------------------


def _mode(run: dict[str, Any]) -> str:
    """Where a run's sessions and models ran, for the table and the figure."""
    if run.get("bots") == "processes":
        return f"{run['bot_processes']} bot processes, ASR + TTS server, silence {run.get('silence', 'send')}"
    step = "nemo (FIFO)" if run["step"] == "nemo" else "fast (batched)"
    return f"in-process, ASR {run.get('asr', 'in-process')}, Magpie {step}"


def _per_minute(run: dict[str, Any], who: str) -> float | None:
    return run.get("cpu_s_per_conversation_minute", {}).get(who)


def table(runs: Sequence[dict[str, Any]]) -> str:
    """The Markdown table: per mode and N, v2v p50/p90 (and p50 over N = 1's), each leg's p50, turns answered.

    Also CPU seconds per conversation-minute of the server and of the bots.
    """
    def family(run: dict[str, Any]) -> tuple[Any, ...]:  # a mode whatever its process count
        return run.get("bots"), run.get("asr"), run["step"], run.get("silence")

    one = {family(r): r["v2v_p50"] for r in runs if r["sessions"] == 1}
    rows = []
    for r in runs:
        base = one.get(family(r))
        ratio = f"{r['v2v_p50'] / base:.2f}x" if base and r["v2v_p50"] else None
        legs = r.get("legs_p50", {})
        rows.append(
            [
                _mode(r),
                r["sessions"],
                r["v2v_p50"],
                r["v2v_p90"],
                ratio,
                legs.get("ttfs_ms"),
                r.get("asr_finalize_p50"),
                legs.get("llm_ttfb_ms"),
                r["tts_first_audio_p50"],
                f"{r['answered']}/{r['owed']}",
                _per_minute(r, "server"),
                _per_minute(r, "bots"),
            ]
        )
    headers = [
        "mode",
        "sessions",
        "v2v p50 ms",
        "v2v p90 ms",
        "p50 vs N=1",
        "STT TTFS p50 ms",
        "ASR finalize p50 ms",
        "LLM TTFB p50 ms",
        "TTS first audio p50 ms",
        "turns answered",
        "CPU s/conv-min server",
        "CPU s/conv-min bots",
    ]
    return output.format_table(headers, rows)


def figure(runs: Sequence[dict[str, Any]]) -> Any:
    """Voice-to-voice p50 and p90 against the session count, one line per mode."""
    fig, axes = output.new_figure(1, 1, size=(7.0, 4.0))
    ax = axes[0][0]
    colors = ("#d62728", "#76b900", "#1f77b4", "#ff7f0e", "#9467bd")
    modes = list(dict.fromkeys(_mode(r) for r in runs))
    for mode, color in zip(modes, colors * len(modes), strict=False):
        rs = [r for r in runs if _mode(r) == mode and r["v2v_p50"] is not None]
        for stat, style in (("p50", "o-"), ("p90", "o--")):
            if rs:
                sessions, v2v = [r["sessions"] for r in rs], [r[f"v2v_{stat}"] for r in rs]
                ax.plot(sessions, v2v, style, color=color, label=f"{mode} {stat}")
    ax.set_xlabel("concurrent sessions")
    ax.set_ylabel("voice-to-voice, ms")
    ax.set_title("Whole agent under load")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark and write ``agent-load.json`` / ``agent-load.png``."""
    from loguru import logger

    if args.bot_processes is not None and (args.bot_processes < 1 or "processes" not in args.bots):
        raise SystemExit(f"--bot-processes {args.bot_processes}: give a count >= 1, with --bots processes")
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
