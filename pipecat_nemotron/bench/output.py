"""Benchmark results: the JSON every result starts with, Markdown tables, figures, and writing them all.

matplotlib is imported only when a figure is made (Agg backend, no display needed).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipecat_nemotron.bench.common import args_dict, git_commit, machine_info


def result_header(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The fields every result JSON starts with: benchmark, time, machine, commit, args."""
    machine = machine_info()
    if getattr(args, "threads", None):
        machine["torch_threads"] = args.threads
    return {
        "_t0": time.perf_counter(),
        "benchmark": name,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine,
        **git_commit(),
        "args": args_dict(args),
    }


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def write_json(out_dir: Path, name: str, result: dict[str, Any]) -> Path:
    """Write ``out_dir/<name>.json`` (pretty, NaN-free) and return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(result, indent=1, default=_json_default, allow_nan=False) + "\n")
    return path


def new_figure(rows: int = 1, cols: int = 1, size: tuple[float, float] = (10.0, 4.0)) -> tuple[Any, Any]:
    """A matplotlib figure on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt.subplots(rows, cols, figsize=size, squeeze=False)


def save_figure(fig: Any, out_dir: Path, name: str, subtitle: str = "") -> Path:
    """Save ``fig`` as ``out_dir/<name>.png`` (small: 90 dpi) and close it."""
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    if subtitle:
        fig.text(0.01, 0.005, subtitle, fontsize=7, color="0.4", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.03 if subtitle else 0, 1, 1))
    path = out_dir / f"{name}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_subtitle(result: dict[str, Any]) -> str:
    """A one-line footer for plots: machine, model, commit."""
    m = result["machine"]
    where = m.get("gpu") or f"{m['cpu_model']} x{m['cpu_cores']}"
    commit = (result.get("commit") or "no-git")[:8] + ("+dirty" if result.get("dirty") else "")
    names = [m["model"]["name"] for m in result.get("models", [])]
    if "model" in result:
        names.append(result["model"]["name"])
    models = ", ".join(dict.fromkeys(names))
    return f"{where} | torch {m['torch']} | {models} | {commit}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (numbers formatted compactly, None as '-')."""

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            if v == 0:
                return "0"
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def format_rows(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str | Callable[[Mapping[str, Any]], Any]]]
) -> str:
    """A Markdown table of result rows: one column per ``(header, key)``, or ``(header, row -> cell)``."""
    return format_table(
        [header for header, _ in columns],
        [[take(r) if callable(take) else r[take] for _, take in columns] for r in rows],
    )


def finish(out_dir: Path, name: str, result: dict[str, Any], fig: Any | None, summary: str) -> None:
    """Write JSON (+ PNG), store the wall time of the whole benchmark, and print the summary."""
    started = result.get("_t0")
    if started is not None:
        result["duration_s"] = round(time.perf_counter() - started, 1)
        del result["_t0"]
    json_path = write_json(out_dir, name, result)
    png = save_figure(fig, out_dir, name, plot_subtitle(result)) if fig is not None else None
    print(summary)
    print(f"[bench] wrote {json_path}" + (f" and {png}" if png else ""), flush=True)
