"""``eager``: voice-to-voice latency of the whole agent with the eager end of turn off and on.

Multi-turn sessions of held-out speech (``tests/assets/heldout``) run through the whole local agent in real time:
Silero VAD (200 ms stop) → the Nemotron STT (tiny trained model) → a loopback OpenAI-compatible server whose
first token comes a fixed time after each request (150 ms and 400 ms) → tiny Magpie → simulated playback. Some
turns carry a mid-sentence pause (silence inserted at a word gap, shorter than the VAD's stop): the eager end
of turn predicts the end there and must withdraw it.

Every configuration hears the same sessions. ``off`` is the same pipeline with no prediction ever made (the
STT still owns turn detection: Pipecat's external turn strategies, committed by the VAD stop), so the
difference is the speculation alone. Per configuration: voice-to-voice p50/p90 (speech end to the bot
speaking, :class:`~pipecat_nemotron.observers.metrics.VoiceLatencyObserver`), the gain over ``off``, the predictions
made and the share cancelled, and the LLM requests wasted per turn (requests the server received beyond one
per answered turn). At the first TTFT the eager runs again with each other pause signal of ``--signals``
(``asr``, ``both``: :mod:`pipecat_nemotron.stt.eager`), to compare what predicts better, and once without the check
that holds a prediction after a mid-sentence word (``eager_hold_words``).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import wave
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.bench import common, output
from pipecat_nemotron.bench.audio import load_clips
from pipecat_nemotron.observers.latency_stats import TurnLatency, percentile, summarize_eager
from pipecat_nemotron.stt.eager import DEFAULT_EAGER_SILENCE_MS, EagerSettings

NAME = "eager"
#: A pause threshold no pause reaches: the ``off`` configuration's STT never predicts.
_NEVER_MS = 600_000.0
#: Silence after each turn, s: the bot answers (LLM, TTS, ~0.2 s of tiny Magpie audio) before the next one.
_TURN_GAP_S = 2.5


@dataclass(frozen=True)
class Config:
    """One agent configuration: time to first token, eager on or off, pause signal and threshold."""

    ttft_ms: int
    eager: bool
    signal: str = "vad"
    silence_ms: float = DEFAULT_EAGER_SILENCE_MS
    hold_words: bool = True

    @property
    def label(self) -> str:
        """Short name for tables."""
        if not self.eager:
            return "off"
        notes = [f"{self.signal} signal"] if self.signal != "vad" else []
        notes += [] if self.hold_words else ["no hold words"]
        return "on" + (f" ({', '.join(notes)})" if notes else "")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of this benchmark."""
    common.add_common_args(parser, latency_default=160)
    parser.add_argument("--sessions", type=int, default=3, help="sessions per configuration (default: 3)")
    parser.add_argument("--turns", type=int, default=8, help="user turns per session (default: 8)")
    parser.add_argument(
        "--ttft-ms", type=int, nargs="+", default=[150, 400], help="LLM time to first token, ms"
    )
    parser.add_argument(
        "--pause-share",
        type=float,
        default=0.125,
        help="share of turns with a mid-sentence pause (default: %(default)s)",
    )
    parser.add_argument(
        "--pause-ms",
        type=float,
        default=150.0,
        help="mid-sentence pause at a word gap, ms (default: %(default)s)",
    )
    parser.add_argument(
        "--silence-ms", type=float, default=DEFAULT_EAGER_SILENCE_MS, help="eager pause threshold, ms"
    )
    parser.add_argument(
        "--signals",
        nargs="*",
        default=["asr", "both"],
        help="extra pause signals to compare at the first TTFT",
    )
    parser.add_argument(
        "--no-hold-words", action="store_true", help="skip the run without the mid-sentence word check"
    )
    parser.add_argument("--seed", type=int, default=0, help="session composition seed (default: 0)")


# ---- sessions -------------------------------------------------------------------------------------------------


def word_gap(audio: np.ndarray, window: int = 160) -> tuple[int, float]:
    """The quietest 10 ms of a clip's middle (30-75 % of its speech), a gap between words: sample, gap ms.

    The gap is the run of quiet 10 ms windows (under a tenth of the clip's loud level) around that point.
    """
    n = audio.size // window
    rms = np.sqrt((audio[: n * window].astype(np.float64) ** 2).reshape(n, window).mean(axis=1))
    quiet = rms < 0.1 * np.percentile(rms, 95)
    loud = np.flatnonzero(~quiet)
    first, last = (int(loud[0]), int(loud[-1])) if loud.size else (0, n - 1)
    lo, hi = first + (last - first) * 3 // 10, first + (last - first) * 3 // 4
    at = lo + int(np.argmin(rms[lo : max(hi, lo + 1)]))
    start, end = at, at + 1
    while start > 0 and quiet[start - 1]:
        start -= 1
    while end < n and quiet[end]:
        end += 1
    return at * window + window // 2, (end - start) * 10.0 if quiet[at] else 0.0


def insert_pause(audio: np.ndarray, pause_ms: float) -> np.ndarray:
    """``audio`` with a pause of ``pause_ms`` in all at its middle word gap (the gap's own silence counted)."""
    at, gap_ms = word_gap(audio)
    gap = np.zeros(int(max(pause_ms - gap_ms, 0.0) * MODEL_SAMPLE_RATE / 1000), dtype=audio.dtype)
    return np.concatenate([audio[:at], gap, audio[at:]])


def make_sessions(args: argparse.Namespace) -> tuple[list[list[tuple[np.ndarray, bool]]], str]:
    """``sessions`` x ``turns`` distinct held-out clips (int16), ``pause_share`` of them with a pause."""
    clips, source = load_clips(args.manifest)
    rng = random.Random(args.seed)
    picked = rng.sample(clips, min(len(clips), args.sessions * args.turns))
    sessions: list[list[tuple[np.ndarray, bool]]] = []
    paused = set(rng.sample(range(len(picked)), round(len(picked) * args.pause_share)))
    for i, clip in enumerate(picked):
        audio = (np.clip(clip.audio, -1, 1) * 32767).astype(np.int16)
        if i in paused:
            audio = insert_pause(audio, args.pause_ms)
        if i % args.turns == 0:
            sessions.append([])
        sessions[-1].append((audio, i in paused))
    return sessions, source


def write_session(turns: Sequence[tuple[np.ndarray, bool]], path: Path) -> Path:
    """One session's WAV: each turn followed by :data:`_TURN_GAP_S` of silence (16 kHz mono)."""
    gap = np.zeros(int(_TURN_GAP_S * MODEL_SAMPLE_RATE), dtype=np.int16)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(MODEL_SAMPLE_RATE)
        for audio, _ in turns:
            w.writeframes(np.concatenate([gap[: MODEL_SAMPLE_RATE // 2], audio, gap]).tobytes())
    return path


# ---- the agent --------------------------------------------------------------------------------------------------


async def run_session(
    asr: Any, magpie: Any, llm_url: str, wav: Path, config: Config, latency_ms: int
) -> list[TurnLatency]:
    """One session through the whole agent, fed in real time; returns its turn records."""
    from pipecat_nemotron.agent.assembly import build_voice_agent
    from pipecat_nemotron.agent.wav_input import run_worker_on_wav
    from pipecat_nemotron.llm.service import create_nemotron_llm
    from pipecat_nemotron.observers.metrics import VoiceLatencyObserver
    from pipecat_nemotron.stt.local import NemotronSTTService
    from pipecat_nemotron.tts.magpie import MagpieSynthesisOptions
    from pipecat_nemotron.tts.service import MagpieTTSService

    stt = NemotronSTTService(
        engine=asr,
        latency_ms=latency_ms,
        eager=EagerSettings(
            silence_ms=config.silence_ms if config.eager else _NEVER_MS,
            signal=config.signal,  # type: ignore[arg-type]
            **({} if config.hold_words else {"hold_words": frozenset()}),
        ),
    )
    observer = VoiceLatencyObserver(record_text=True, log_turns=False)
    agent = build_voice_agent(
        stt=stt,
        llm=create_nemotron_llm(base_url=llm_url),
        tts=MagpieTTSService(engine=magpie, options=MagpieSynthesisOptions(max_duration_s=0.3)),
        observers=[observer],
        idle_timeout_secs=None,
    )
    await run_worker_on_wav(agent.worker, stt, wav, trailing_silence_s=1.0, timeout_s=600)
    return observer.turns


async def run_config(
    config: Config, sessions: list[Path], asr: Any, magpie: Any, server_cls: Any, args: argparse.Namespace
) -> dict[str, Any]:
    """Every session in one configuration; returns its turn records, LLM requests and statistics."""
    records: list[TurnLatency] = []
    requests = 0
    for wav in sessions:
        async with server_cls(reply="Sure, here it is.", first_token_delay_s=config.ttft_ms / 1000) as server:
            records += await run_session(asr, magpie, server.base_url, wav, config, args.latency)
            requests += len(server.requests)
    eager = summarize_eager(records)
    v2v = [t.v2v_ms for t in records if t.v2v_ms is not None]
    user_turns = args.turns * len(sessions)
    return {
        "config": asdict(config) | {"label": config.label},
        "user_turns": user_turns,
        "answered": len(records),
        "v2v_p50": percentile(v2v, 50) if v2v else None,
        "v2v_p90": percentile(v2v, 90) if v2v else None,
        "llm_requests": requests,
        "wasted_per_turn": (requests - len(records)) / max(len(records), 1),
        "predictions": eager.predictions,
        "kept": eager.kept,
        "cancelled": eager.cancelled,
        "cancelled_share": eager.cancelled_share,
        "lead_p50": eager.lead.p50,
        "turns": [t.to_dict() for t in records],
    }


# ---- report -----------------------------------------------------------------------------------------------------


def table(runs: Sequence[dict[str, Any]]) -> str:
    """The Markdown table: v2v p50/p90 per configuration, the gain over ``off`` at the same TTFT, the cost."""
    off = {r["config"]["ttft_ms"]: r for r in runs if not r["config"]["eager"]}
    rows = []
    for r in runs:
        base = off.get(r["config"]["ttft_ms"])
        gain = base["v2v_p50"] - r["v2v_p50"] if base and r["config"]["eager"] and r["v2v_p50"] else None
        share = r["cancelled_share"]
        rows.append(
            [
                r["config"]["ttft_ms"],
                r["config"]["label"],
                f"{r['answered']}/{r['user_turns']}",
                r["v2v_p50"],
                r["v2v_p90"],
                gain,
                r["predictions"] if r["config"]["eager"] else None,
                f"{100 * share:.0f}%" if share is not None else None,
                round(r["wasted_per_turn"], 2),
                r["lead_p50"],
            ]
        )
    headers = [
        "TTFT ms",
        "eager",
        "turns answered",
        "v2v p50 ms",
        "v2v p90 ms",
        "p50 gain ms",
        "predictions",
        "cancelled",
        "wasted LLM req/turn",
        "lead p50 ms",
    ]
    return output.format_table(headers, rows)


def figure(runs: Sequence[dict[str, Any]]) -> Any:
    """Voice-to-voice distribution per configuration (box, every turn a dot), coloured by eager outcome."""
    fig, axes = output.new_figure(1, 1, size=(10.0, 0.55 * len(runs) + 1.8))
    ax = axes[0][0]
    colors = {"kept": "#76b900", "cancelled": "#d62728", None: "#555555"}
    for i, r in enumerate(runs):
        turns = [t for t in r["turns"] if t.get("v2v_ms") is not None]
        ax.boxplot([[t["v2v_ms"] for t in turns]], positions=[i], widths=0.5, vert=False, showfliers=False)
        for j, t in enumerate(turns):
            y = i + 0.25 * ((j * 7919 % 13) / 12.0 - 0.5)
            ax.scatter(t["v2v_ms"], y, s=9, color=colors[t.get("eager_outcome")], alpha=0.7, zorder=3)
    ax.set_yticks(
        range(len(runs)), [f"{r['config']['ttft_ms']} ms TTFT, {r['config']['label']}" for r in runs]
    )
    ax.invert_yaxis()
    ax.set_xlabel("voice-to-voice, ms (green: speculative reply kept, red: cancelled, grey: no prediction)")
    ax.set_title("Eager end of turn: voice-to-voice per configuration")
    ax.grid(axis="x", alpha=0.3)
    return fig


def configs(args: argparse.Namespace) -> list[Config]:
    """``off`` and ``on`` at each TTFT, then the extra pause signals at the first TTFT."""
    out = [Config(t, eager, silence_ms=args.silence_ms) for t in args.ttft_ms for eager in (False, True)]
    out += [Config(args.ttft_ms[0], True, s, args.silence_ms) for s in args.signals if s != "vad"]
    if not args.no_hold_words:
        out.append(Config(args.ttft_ms[0], True, silence_ms=args.silence_ms, hold_words=False))
    return out


async def bench(args: argparse.Namespace, result: dict[str, Any]) -> list[dict[str, Any]]:
    """Run every configuration over the same sessions."""
    from pipecat_nemotron.asr import EngineConfig, NemotronEngine
    from pipecat_nemotron.tts.magpie import MagpieEngine
    from pipecat_nemotron.tts.magpie.tiny import build_tiny_magpie

    spec = common.resolve_model(args.model, args.models_dir)
    result["model"] = spec.as_dict()
    sessions, result["audio"] = make_sessions(args)
    runs: list[dict[str, Any]] = []
    from pipecat_nemotron.llm.fake_server import FakeOpenAIServer

    with tempfile.TemporaryDirectory() as tmp:
        wavs = [write_session(s, Path(tmp) / f"session{i}.wav") for i, s in enumerate(sessions)]
        magpie_path, _ = build_tiny_magpie(Path(tmp) / "magpie", end_of_speech_bias=30.0)
        magpie = MagpieEngine(str(magpie_path), device="cpu")
        magpie.wait_until_ready(timeout=600)
        config = EngineConfig(model=str(spec.path), device=args.device, max_streams=2)
        try:
            async with NemotronEngine(config) as asr:
                for cfg in configs(args):
                    print(f"[bench] eager: {cfg.ttft_ms} ms TTFT, {cfg.label} ...", flush=True)
                    runs.append(await run_config(cfg, wavs, asr, magpie, FakeOpenAIServer, args))
        finally:
            magpie.close()
    return runs


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark and write ``eager.json`` / ``eager.png``."""
    from loguru import logger

    result = output.result_header(NAME, args)
    logger.remove()  # Pipecat logs every frame decision at DEBUG: only warnings (and the turns with --verbose)
    logger.add(sys.stderr, level="INFO" if args.verbose else "WARNING")
    with common.bench_context(args):
        runs = asyncio.run(bench(args, result))
    result["runs"] = runs
    summary = (
        f"eager end of turn, {args.sessions} sessions x {args.turns} turns ({args.pause_share:.0%} with a "
        f"{args.pause_ms:g} ms mid-sentence pause), {args.silence_ms:g} ms pause threshold\n{table(runs)}"
    )
    result["table"] = table(runs)
    output.finish(args.out, NAME, result, figure(runs), summary)
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point: ``python -m pipecat_nemotron.bench eager [options]``."""
    return common.bench_main(NAME, __doc__, add_arguments, run, argv)
