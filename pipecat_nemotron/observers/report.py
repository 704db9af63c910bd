"""Plot and tabulate per-turn latency recorded by :class:`~pipecat_nemotron.observers.metrics.VoiceLatencyObserver`.

Usage::

    python -m pipecat_nemotron.observers.report turns.jsonl -o latency.png

prints the p50/p90/p99 table per stage and writes a PNG with two panels (three with eager turns):

- a per-turn waterfall: one stacked bar per turn, from speech end to the bot
  speaking. By default the segments are the measured stages (endpointing wait,
  ASR finalize, rest of STT TTFS, LLM TTFB, TTS TTFB, and the unattributed rest
  of voice-to-voice); ``--breakdown`` stacks Pipecat's named contributions
  (``breakdown_ms``) instead. A missing stage is drawn as zero.
- the distribution of each stage (box plot, whiskers at p1/p99, every turn as a
  dot); stages with no data are listed as such.
- with the eager end of turn on (any turn with a prediction), a third panel: each
  turn's eager lead time (prediction to committed final), green where the
  speculative reply was kept, red where it was cancelled, with the predictions
  cancelled in the turn (wasted LLM requests) written above.

matplotlib (the ``plot``/``dev`` extra) is imported only when plotting, with the
Agg backend, so ``--no-plot`` works without it.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipecat_nemotron.observers.latency_stats import (
    STAGE_LABELS,
    STAGES,
    StageStats,
    TurnLatency,
    format_eager,
    format_summary,
    load_turns,
    summarize,
    summarize_eager,
)

__all__ = ["main", "plot_turns", "waterfall_segments"]

WATERFALL_SEGMENTS: tuple[str, ...] = (
    "endpointing wait",
    "ASR finalize",
    "STT (other)",
    "LLM TTFB",
    "TTS TTFB",
    "other",
)
"""Segment names of the default waterfall, bottom to top."""

_COLORS = {
    "endpointing wait": "#b0b0b0",
    "ASR finalize": "#76b900",  # NVIDIA green
    "STT (other)": "#c5e38a",
    "LLM TTFB": "#1f77b4",
    "TTS TTFB": "#ff7f0e",
    "other": "#e0d7f0",
}


def waterfall_segments(turn: TurnLatency) -> dict[str, float]:
    """Split a turn's voice-to-voice time into stacked segments (ms, all >= 0).

    TTFS (speech end to final transcript) holds the VAD's endpointing wait and the
    ASR finalize; what TTFS leaves is "STT (other)". "other" is whatever of
    ``v2v_ms`` the measured stages do not cover (turn detection, sentence
    aggregation, output transport, frame hops). Missing stages count as zero.

    Args:
        turn: The record.

    Returns:
        :data:`WATERFALL_SEGMENTS` to milliseconds.

    """
    ttfs = turn.ttfs_ms or 0.0
    endpointing = (turn.vad_stop_secs or 0.0) * 1000.0
    if turn.ttfs_ms is not None:
        endpointing = min(endpointing, ttfs)
    elif turn.v2v_ms is not None:
        endpointing = min(endpointing, turn.v2v_ms)
    finalize = turn.asr_finalize_ms or 0.0
    if turn.ttfs_ms is not None:
        finalize = min(finalize, max(ttfs - endpointing, 0.0))
    stt_other = max(ttfs - endpointing - finalize, 0.0)
    llm = turn.llm_ttfb_ms or 0.0
    tts = turn.tts_ttfb_ms or 0.0
    covered = endpointing + finalize + stt_other + llm + tts
    other = max((turn.v2v_ms or covered) - covered, 0.0)
    return {
        "endpointing wait": endpointing,
        "ASR finalize": finalize,
        "STT (other)": stt_other,
        "LLM TTFB": llm,
        "TTS TTFB": tts,
        "other": other,
    }


def _breakdown_segments(turns: Sequence[TurnLatency]) -> tuple[list[str], list[dict[str, float]]]:
    names: list[str] = []
    for turn in turns:
        for key in turn.breakdown_ms:
            if key not in names:
                names.append(key)
    return names, [dict(turn.breakdown_ms) for turn in turns]


def _waterfall_rows(
    turns: Sequence[TurnLatency], use_breakdown: bool, cmap: Any
) -> tuple[list[str], list[dict[str, float]], dict[str, Any]]:
    """Segment names (bottom to top), each turn's segments (ms) and each segment's colour."""
    if use_breakdown and any(t.breakdown_ms for t in turns):
        names, rows = _breakdown_segments(turns)
        return names, rows, {name: cmap(i % 20) for i, name in enumerate(names)}
    return list(WATERFALL_SEGMENTS), [waterfall_segments(t) for t in turns], dict(_COLORS)


def _plot_waterfall(
    ax: Any, turns: Sequence[TurnLatency], stats: dict[str, StageStats], use_breakdown: bool, cmap: Any
) -> None:
    """One stacked bar per turn (its segments), voice-to-voice marks and the v2v p50 line."""
    x = [t.turn for t in turns]
    names, rows, colors = _waterfall_rows(turns, use_breakdown, cmap)
    bottom = [0.0] * len(turns)
    width = 0.8 if len(turns) > 1 else 0.5
    for name in names:
        heights = [row.get(name, 0.0) for row in rows]
        if not any(heights):
            continue
        ax.bar(x, heights, width, bottom=bottom, label=name, color=colors[name], edgecolor="none")
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    v2v = [(t.turn, t.v2v_ms) for t in turns if t.v2v_ms is not None]
    if v2v:
        ax.scatter(
            [p[0] for p in v2v],
            [p[1] for p in v2v],
            marker="_",
            s=200,
            color="black",
            label="voice-to-voice",
            zorder=3,
        )
        p50 = stats["v2v_ms"].p50
        if p50 is not None:
            ax.axhline(p50, color="black", linestyle="--", linewidth=0.8, label=f"v2v p50 {p50:.0f} ms")
    ax.set_xlabel("turn")
    ax.set_ylabel("ms from speech end")
    ax.set_title("Per-turn waterfall" + (" (Pipecat breakdown)" if use_breakdown else ""))
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    ax.set_xlim(min(x) - 1, max(x) + 1)
    ax.grid(axis="y", alpha=0.3)


def _plot_distribution(ax: Any, turns: Sequence[TurnLatency], stats: dict[str, StageStats]) -> None:
    """A horizontal box plot per stage with data (whiskers p1/p99, every turn a dot); stages without data named."""
    present = [s for s in STAGES if stats[s].count > 0]
    missing = [s for s in STAGES if stats[s].count == 0]
    if present:
        data = [[v for t in turns if (v := t.stage(s)) is not None] for s in present]
        positions = list(range(1, len(present) + 1))
        # matplotlib >= 3.10 spells vert=False as orientation="horizontal" (vert is deprecated).
        horizontal = (
            {"orientation": "horizontal"}
            if "orientation" in inspect.signature(ax.boxplot).parameters
            else {"vert": False}
        )
        ax.boxplot(data, positions=positions, whis=(1, 99), showfliers=False, widths=0.6, **horizontal)
        for pos, values in zip(positions, data, strict=True):
            jitter = [pos + 0.15 * (((i * 7919) % 13) / 12.0 - 0.5) for i in range(len(values))]
            ax.scatter(values, jitter, s=8, alpha=0.5, color="#333333", zorder=3)
        labels = []
        for s in present:
            st = stats[s]
            labels.append(f"{STAGE_LABELS[s]}\np50 {st.p50:.0f} / p90 {st.p90:.0f} / p99 {st.p99:.0f}")
        ax.set_yticks(positions, labels, fontsize="small")
        ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_xlim(left=0)
    ax.grid(axis="x", alpha=0.3)
    dist_title = "Distribution per stage (box p25-p75, whiskers p1-p99)"
    if missing:
        dist_title += "; no data: " + ", ".join(STAGE_LABELS[s] for s in missing)
    ax.set_title(dist_title, fontsize="medium")


_EAGER_COLORS = {"kept": "#76b900", "cancelled": "#d62728"}


def _plot_eager(ax: Any, turns: Sequence[TurnLatency]) -> None:
    """Eager lead time per turn, coloured by outcome, with each turn's cancelled predictions written above."""
    x = [t.turn for t in turns]
    for outcome, color in _EAGER_COLORS.items():
        chosen = [t for t in turns if t.eager_outcome == outcome]
        if chosen:
            ax.bar(
                [t.turn for t in chosen],
                [t.eager_lead_ms or 0.0 for t in chosen],
                0.8 if len(turns) > 1 else 0.5,
                color=color,
                label=f"{outcome} ({len(chosen)} turns)",
            )
    for t in turns:
        if t.eager_cancelled:
            ax.annotate(f"{t.eager_cancelled}x", (t.turn, t.eager_lead_ms or 0.0), ha="center", va="bottom")
    ax.set_xlim(min(x) - 1, max(x) + 1)
    ax.set_xlabel("turn")
    ax.set_ylabel("ms before the final")
    ax.set_title(format_eager(summarize_eager(turns)), fontsize="medium")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    ax.grid(axis="y", alpha=0.3)


def _default_title(turns: Sequence[TurnLatency], stats: dict[str, StageStats]) -> str:
    """The turn count and, where known, the p50 voice-to-voice time."""
    p50 = stats["v2v_ms"].p50
    return f"Voice latency, {len(turns)} turns" + (
        f", voice-to-voice p50 {p50:.0f} ms" if p50 is not None else ""
    )


def plot_turns(
    turns: Sequence[TurnLatency],
    output: str | Path,
    *,
    stats: dict[str, StageStats] | None = None,
    use_breakdown: bool = False,
    title: str | None = None,
    dpi: int = 120,
) -> Path:
    """Draw the waterfall and distribution panels to a PNG.

    Args:
        turns: Turn records (at least one).
        output: PNG path; parent folders are created.
        stats: Precomputed :func:`~pipecat_nemotron.observers.latency_stats.summarize` output.
        use_breakdown: Stack Pipecat's ``breakdown_ms`` contributions instead of
            the measured stages.
        title: Figure title; defaults to the turn count and p50 voice-to-voice.
        dpi: Output resolution, dots per inch.

    Returns:
        The written path.

    Raises:
        ValueError: If ``turns`` is empty.

    """
    if not turns:
        raise ValueError("no turns to plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stats = stats if stats is not None else summarize(turns)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)

    eager = any(t.eager for t in turns)
    fig, axes = plt.subplots(
        3 if eager else 2,
        1,
        figsize=(max(8.0, min(0.25 * len(turns) + 6.0, 24.0)), 12.0 if eager else 9.0),
        gridspec_kw={"height_ratios": [3, 2, 2] if eager else [3, 2]},
    )
    _plot_waterfall(axes[0], turns, stats, use_breakdown, plt.get_cmap("tab20"))
    _plot_distribution(axes[1], turns, stats)
    if eager:
        _plot_eager(axes[2], turns)
    fig.suptitle(title if title is not None else _default_title(turns, stats))
    fig.tight_layout()
    fig.savefig(output, dpi=dpi)
    plt.close(fig)
    return output


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point.

    Args:
        argv: Arguments (without the program name); defaults to ``sys.argv[1:]``.

    Returns:
        Process exit status: 0 on success, 1 when there are no turns, 2 on a bad file.

    """
    parser = argparse.ArgumentParser(
        prog="python -m pipecat_nemotron.observers.report",
        description="Per-turn latency waterfall, stage distributions and p50/p90/p99 table "
        "from a VoiceLatencyObserver JSONL file.",
    )
    parser.add_argument(
        "jsonl", type=Path, help="turns.jsonl written by VoiceLatencyObserver(jsonl_path=...)"
    )
    parser.add_argument(
        "-o", "--output", type=Path, default=Path("latency.png"), help="PNG to write (default: %(default)s)"
    )
    parser.add_argument(
        "--breakdown", action="store_true", help="stack Pipecat's named contributions in the waterfall"
    )
    parser.add_argument("--title", default=None, help="figure title")
    parser.add_argument("--dpi", type=int, default=120, help="PNG resolution (default: %(default)s)")
    parser.add_argument("--no-plot", action="store_true", help="only print the table")
    args = parser.parse_args(argv)

    try:
        turns = load_turns(args.jsonl)
    except FileNotFoundError:
        print(f"error: {args.jsonl} does not exist", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not turns:
        print(f"error: {args.jsonl} holds no turns", file=sys.stderr)
        return 1

    stats = summarize(turns)
    print(f"{len(turns)} turns from {args.jsonl}")
    print(format_summary(stats))
    if any(t.eager for t in turns):
        print(format_eager(summarize_eager(turns)))
    if not args.no_plot:
        path = plot_turns(
            turns, args.output, stats=stats, use_breakdown=args.breakdown, title=args.title, dpi=args.dpi
        )
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
