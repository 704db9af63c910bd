"""``turns``: how the end of a user turn is decided: Smart Turn, the VAD stop, or the transcript with Smart Turn.

Multi-turn sessions of held-out speech (``tests/assets/heldout``) run through the whole local agent in real time:
Silero VAD (200 ms stop) → the Nemotron STT (tiny trained model) → a loopback OpenAI-compatible server (fixed time
to first token) → tiny Magpie → simulated playback. Some turns carry a pause of 300-900 ms inside the sentence
(silence inserted at a word gap): longer than the VAD's stop, so the VAD stops mid-sentence and the turn-end
strategy must hold. Each utterance is followed by 4 s of silence (more than Smart Turn's 3 s fallback), so a turn
Smart Turn holds is still answered, late.

Every configuration hears the same sessions: ``turn_end`` ``smart`` (Pipecat's default Smart Turn v3), ``vad``
(every VAD stop), ``text`` (:mod:`pipecat_nemotron.agent.turn_end`), ``eou`` (the recogniser's own ``<EOU>``) and
``eou_smart`` (``<EOU>``, else Smart Turn), each with the eager end of turn off and on (with it on, the STT commits
the turn: :class:`~pipecat_nemotron.agent.turn_end.TextTurnCommit`; the EOU modes always let the STT commit,
:class:`~pipecat_nemotron.agent.turn_end.EouTurnCommit`). The EOU modes run on ``--eou-model`` (default: the
bundled ``tiny_nemotron_asr_eou.nemo``, the tiny model fine-tuned to emit ``<EOU>``), the others on ``--model``.
``--manifest tests/assets/heldout_eou/manifest.json`` plays held-out sentences in voices and at speeds (265-300
words per minute) the tiny models never heard in training. Per configuration:
voice-to-voice p50/p90 (speech end to the bot speaking, :class:`~pipecat_nemotron.observers.metrics.VoiceLatencyObserver`)
and its turn-detection share (Pipecat's v2v breakdown: the final transcript to the committed turn, the part the
strategy decides; the rest is ASR, LLM and TTS time, which a loaded machine stretches),
the share of utterances cut before the user finished (a committed user turn inside an utterance's speech:
premature), the eager predictions and the share cancelled, and what committed the turns (text, Smart Turn, VAD,
fallback silence).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import wave
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE
from pipecat_nemotron.bench import common, output
from pipecat_nemotron.bench.audio import load_clips
from pipecat_nemotron.bench.eager import insert_pause
from pipecat_nemotron.observers.latency_stats import TurnLatency, percentile, summarize_eager

NAME = "turns"
#: Silence before each utterance and after it, s (after: more than Smart Turn's 3 s fallback and the reply).
_LEAD_S, _GAP_S = 0.5, 4.0
#: A commit this close to an utterance's last sound is not premature (VAD frames, timing jitter), s.
_END_SLACK_S = 0.1
MODES = ("smart", "vad", "text", "eou", "eou_smart")
#: The modes that run on ``--eou-model``.
EOU_MODES = ("eou", "eou_smart")


@dataclass(frozen=True)
class Config:
    """One configuration: the turn-end mode and the eager end of turn off or on."""

    turn_end: str
    eager: bool

    @property
    def label(self) -> str:
        """Short name for tables."""
        return f"{self.turn_end}, eager {'on' if self.eager else 'off'}"


@dataclass(frozen=True)
class Utterance:
    """Where one utterance's speech lies in its session, s from the session's first sample."""

    start_s: float
    end_s: float
    paused: bool
    text: str | None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of this benchmark."""
    common.add_common_args(parser, latency_default=160)
    parser.add_argument("--sessions", type=int, default=2, help="sessions per configuration (default: 2)")
    parser.add_argument("--turns", type=int, default=8, help="user turns per session (default: 8)")
    parser.add_argument("--ttft-ms", type=int, default=150, help="LLM time to first token, ms (default: 150)")
    parser.add_argument(
        "--pause-share", type=float, default=0.375, help="share of turns with a pause (default: %(default)s)"
    )
    parser.add_argument(
        "--pause-ms", type=float, nargs=2, default=[300.0, 900.0], help="pause range inside a sentence, ms"
    )
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, help="turn-end modes")
    parser.add_argument(
        "--eou-model",
        default=None,
        help="model of the eou modes, one that emits <EOU> (default: the bundled tiny_nemotron_asr_eou.nemo)",
    )
    parser.add_argument("--seed", type=int, default=0, help="session composition seed (default: 0)")


# ---- sessions -------------------------------------------------------------------------------------------------


def _speech_span(audio: np.ndarray, window: int = 160) -> tuple[float, float]:
    """First and last loud 10 ms of a clip (a tenth of its loud level), s."""
    n = audio.size // window
    rms = np.sqrt((audio[: n * window].astype(np.float64) ** 2).reshape(n, window).mean(axis=1))
    loud = np.flatnonzero(rms >= 0.1 * np.percentile(rms, 95))
    if not loud.size:
        return 0.0, audio.size / MODEL_SAMPLE_RATE
    return loud[0] * window / MODEL_SAMPLE_RATE, (loud[-1] + 1) * window / MODEL_SAMPLE_RATE


def make_sessions(args: argparse.Namespace, tmp: Path) -> tuple[list[tuple[Path, list[Utterance]]], str]:
    """``sessions`` WAVs of ``turns`` distinct held-out clips, ``pause_share`` of them with a pause."""
    clips, source = load_clips(args.manifest)
    rng = random.Random(args.seed)
    picked = rng.sample(clips, min(len(clips), args.sessions * args.turns))
    paused = set(rng.sample(range(len(picked)), round(len(picked) * args.pause_share)))
    lead = np.zeros(int(_LEAD_S * MODEL_SAMPLE_RATE), dtype=np.int16)
    gap = np.zeros(int(_GAP_S * MODEL_SAMPLE_RATE), dtype=np.int16)
    sessions: list[tuple[Path, list[Utterance]]] = []
    for s in range(0, len(picked), args.turns):
        pcm: list[np.ndarray] = []
        utterances: list[Utterance] = []
        at_s = 0.0
        for i in range(s, min(s + args.turns, len(picked))):
            audio = (np.clip(picked[i].audio, -1, 1) * 32767).astype(np.int16)
            if i in paused:
                audio = insert_pause(audio, rng.uniform(*args.pause_ms))
            first, last = _speech_span(audio)
            at_s += _LEAD_S
            utterances.append(Utterance(at_s + first, at_s + last, i in paused, picked[i].text))
            pcm += [lead, audio, gap]
            at_s += (audio.size + gap.size) / MODEL_SAMPLE_RATE
        path = tmp / f"session{len(sessions)}.wav"
        with wave.open(str(path), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(MODEL_SAMPLE_RATE)
            w.writeframes(np.concatenate(pcm).tobytes())
        sessions.append((path, utterances))
    return sessions, source


# ---- the agent ------------------------------------------------------------------------------------------------


def commit_clock() -> Any:
    """An observer of the committed user turns (``UserStoppedSpeakingFrame``): when the speech each one ends stopped.

    That is the latest VAD stop before the commit, less ``stop_secs``, in s from the first audio.

    The VAD stop, not the commit, places the cut: on a loaded machine the final and the commit come late, after
    the user went on, but the speech they end is where the VAD stopped.
    """
    from pipecat.frames.frames import (
        InputAudioRawFrame,
        UserStoppedSpeakingFrame,
        VADUserStoppedSpeakingFrame,
    )
    from pipecat.observers.base_observer import BaseObserver, FramePushed
    from pipecat.processors.frame_processor import FrameDirection

    class CommitClock(BaseObserver):
        def __init__(self) -> None:
            super().__init__()
            self.t0: float | None = None
            self.commits: list[float] = []
            self._seen: set[int] = set()
            self._speech_end: float | None = None

        async def on_push_frame(self, data: FramePushed) -> None:
            frame = data.frame
            now = asyncio.get_running_loop().time()
            if isinstance(frame, InputAudioRawFrame) and self.t0 is None:
                self.t0 = now
            elif isinstance(frame, VADUserStoppedSpeakingFrame) and self.t0 is not None:
                self._speech_end = now - self.t0 - frame.stop_secs
            elif (
                isinstance(frame, UserStoppedSpeakingFrame)
                and data.direction == FrameDirection.DOWNSTREAM
                and frame.id not in self._seen
                and self.t0 is not None
            ):
                self._seen.add(frame.id)
                self.commits.append(self._speech_end if self._speech_end is not None else now - self.t0)

    return CommitClock()


async def run_session(
    asr: Any, magpie: Any, llm_url: str, wav: Path, config: Config, latency_ms: int
) -> tuple[list[TurnLatency], list[float], list[str]]:
    """One session through the whole agent, fed in real time: turn records, commit times (s), committers."""
    from pipecat_nemotron.agent.assembly import build_voice_agent
    from pipecat_nemotron.agent.turn_end import turn_commit_for
    from pipecat_nemotron.agent.wav_input import run_worker_on_wav
    from pipecat_nemotron.llm.service import create_nemotron_llm
    from pipecat_nemotron.observers.metrics import VoiceLatencyObserver
    from pipecat_nemotron.stt import EagerSettings, NemotronSTTService
    from pipecat_nemotron.tts.magpie import MagpieSynthesisOptions
    from pipecat_nemotron.tts.service import MagpieTTSService

    commit = turn_commit_for(config.turn_end)  # type: ignore[arg-type]
    eager = EagerSettings(turn_commit=commit) if config.eager else None
    if eager is None and commit.wants_eou:  # the STT owns turn detection: its <EOU> ends the turn
        stt = NemotronSTTService(engine=asr, latency_ms=latency_ms, turn_commit=commit)
    else:
        stt = NemotronSTTService(engine=asr, latency_ms=latency_ms, eager=eager)
    observer = VoiceLatencyObserver(record_text=True, log_turns=False)
    clock = commit_clock()
    agent = build_voice_agent(
        stt=stt,
        llm=create_nemotron_llm(base_url=llm_url),
        tts=MagpieTTSService(engine=magpie, options=MagpieSynthesisOptions(max_duration_s=0.3)),
        observers=[observer, clock],
        idle_timeout_secs=None,
        turn_end=config.turn_end,  # type: ignore[arg-type]
    )
    await run_worker_on_wav(agent.worker, stt, wav, trailing_silence_s=1.0, timeout_s=900)
    log = agent.turn_end_log
    committers = [d.by for _, d in log.decisions if d.commit] if log is not None else []
    return observer.turns, clock.commits, committers


def premature(utterances: Sequence[Utterance], commits: Sequence[float]) -> list[bool]:
    """Per utterance: whether a committed user turn ended at a VAD stop inside its speech (before its last sound)."""
    return [any(u.start_s < t < u.end_s - _END_SLACK_S for t in commits) for u in utterances]


async def run_config(
    config: Config, sessions: Sequence[tuple[Path, list[Utterance]]], asr: Any, magpie: Any, args: argparse.Namespace
) -> dict[str, Any]:
    """Every session in one configuration; returns its turn records and statistics."""
    from pipecat_nemotron.llm.fake_server import FakeOpenAIServer

    records: list[TurnLatency] = []
    cuts: list[bool] = []
    paused_cuts: list[bool] = []
    committers: Counter[str] = Counter()
    requests = 0
    for wav, utterances in sessions:
        async with FakeOpenAIServer(reply="Sure, here it is.", first_token_delay_s=args.ttft_ms / 1000) as server:
            turns, commits, by = await run_session(asr, magpie, server.base_url, wav, config, args.latency)
            requests += len(server.requests)
        records += turns
        cut = premature(utterances, commits)
        cuts += cut
        paused_cuts += [c for c, u in zip(cut, utterances, strict=True) if u.paused]
        committers.update(by)
    eager = summarize_eager(records)
    v2v = [t.v2v_ms for t in records if t.v2v_ms is not None]
    detection = [t.breakdown_ms["turn_detection"] for t in records if "turn_detection" in (t.breakdown_ms or {})]
    return {
        "config": asdict(config) | {"label": config.label},
        "utterances": len(cuts),
        "answered": len(records),
        "v2v_p50": percentile(v2v, 50) if v2v else None,
        "v2v_p90": percentile(v2v, 90) if v2v else None,
        "turn_detection_p50": percentile(detection, 50) if detection else None,
        "turn_detection_p90": percentile(detection, 90) if detection else None,
        "premature": sum(cuts),
        "premature_share": sum(cuts) / max(len(cuts), 1),
        "premature_paused": sum(paused_cuts),
        "paused": len(paused_cuts),
        "llm_requests": requests,
        "predictions": eager.predictions,
        "cancelled": eager.cancelled,
        "cancelled_share": eager.cancelled_share,
        "lead_p50": eager.lead.p50,
        "committed_by": dict(committers),
        "turns": [t.to_dict() for t in records],
    }


# ---- report ---------------------------------------------------------------------------------------------------


def table(runs: Sequence[dict[str, Any]]) -> str:
    """The Markdown table: one row per configuration."""
    rows = []
    for r in runs:
        share = r["cancelled_share"]
        by = ", ".join(f"{k} {v}" for k, v in sorted(r["committed_by"].items()))
        rows.append(
            [
                r["config"]["turn_end"],
                "on" if r["config"]["eager"] else "off",
                f"{r['answered']}/{r['utterances']}",
                r["v2v_p50"],
                r["v2v_p90"],
                r["turn_detection_p50"],
                r["turn_detection_p90"],
                f"{100 * r['premature_share']:.0f}% ({r['premature']}; {r['premature_paused']}/{r['paused']} paused)",
                r["predictions"] if r["config"]["eager"] else None,
                f"{100 * share:.0f}%" if share is not None and r["config"]["eager"] else None,
                r["lead_p50"],
                by or None,
            ]
        )
    headers = [
        "turn end",
        "eager",
        "turns answered",
        "v2v p50 ms",
        "v2v p90 ms",
        "turn detection p50 ms",
        "turn detection p90 ms",
        "premature (cut; of paused)",
        "predictions",
        "cancelled",
        "lead p50 ms",
        "committed by",
    ]
    return output.format_table(headers, rows)


def figure(runs: Sequence[dict[str, Any]]) -> Any:
    """Voice-to-voice distribution per configuration (box, every turn a dot)."""
    fig, axes = output.new_figure(1, 1, size=(10.0, 0.55 * len(runs) + 1.8))
    ax = axes[0][0]
    for i, r in enumerate(runs):
        v2v = [t["v2v_ms"] for t in r["turns"] if t.get("v2v_ms") is not None]
        ax.boxplot([v2v], positions=[i], widths=0.5, vert=False, showfliers=False)
        ax.scatter(v2v, [i + 0.25 * ((j * 7919 % 13) / 12.0 - 0.5) for j in range(len(v2v))], s=9, alpha=0.6)
    ax.set_yticks(range(len(runs)), [r["config"]["label"] for r in runs])
    ax.invert_yaxis()
    ax.set_xlabel("voice-to-voice, ms")
    ax.set_title("End of turn: voice-to-voice per configuration")
    ax.grid(axis="x", alpha=0.3)
    return fig


async def bench(args: argparse.Namespace, result: dict[str, Any]) -> list[dict[str, Any]]:
    """Run every configuration over the same sessions."""
    from pipecat_nemotron.asr import EngineConfig, NemotronEngine
    from pipecat_nemotron.models import TINY_EOU_MODEL_PATH
    from pipecat_nemotron.tts.magpie import MagpieEngine
    from pipecat_nemotron.tts.magpie.tiny import build_tiny_magpie

    spec = common.resolve_model(args.model, args.models_dir)
    result["model"] = spec.as_dict()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        sessions, result["audio"] = make_sessions(args, Path(tmp))
        result["utterances"] = [asdict(u) for _, us in sessions for u in us]
        magpie_path, _ = build_tiny_magpie(Path(tmp) / "magpie", end_of_speech_bias=30.0)
        magpie = MagpieEngine(str(magpie_path), device="cpu")
        magpie.wait_until_ready(timeout=600)
        models = {"plain": str(spec.path), "eou": str(args.eou_model or TINY_EOU_MODEL_PATH)}
        result["eou_model"] = models["eou"]
        configs = [Config(m, e) for e in (False, True) for m in args.modes]
        try:
            for kind, model in models.items():
                todo = [c for c in configs if (c.turn_end in EOU_MODES) == (kind == "eou")]
                if not todo:
                    continue
                async with NemotronEngine(EngineConfig(model=model, device=args.device, max_streams=2)) as asr:
                    for cfg in todo:
                        print(f"[bench] turns: {cfg.label} ...", flush=True)
                        runs.append(await run_config(cfg, sessions, asr, magpie, args))
        finally:
            magpie.close()
        order = {c.label: i for i, c in enumerate(configs)}
        runs.sort(key=lambda r: order[r["config"]["label"]])
    return runs


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark and write ``turns.json`` / ``turns.png``."""
    from loguru import logger

    result = output.result_header(NAME, args)
    logger.remove()  # Pipecat logs every frame decision at DEBUG: only warnings (and more with --verbose)
    logger.add(sys.stderr, level="INFO" if args.verbose else "WARNING")
    with common.bench_context(args):
        runs = asyncio.run(bench(args, result))
    result["runs"] = runs
    result["table"] = table(runs)
    low, high = args.pause_ms
    summary = (
        f"end of turn, {args.sessions} sessions x {args.turns} turns ({args.pause_share:.0%} with a {low:g}-{high:g} "
        f"ms pause inside the sentence), {args.ttft_ms} ms TTFT\n{result['table']}"
    )
    output.finish(args.out, NAME, result, figure(runs), summary)
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point: ``python -m pipecat_nemotron.bench turns [options]``."""
    return common.bench_main(NAME, __doc__, add_arguments, run, argv)
