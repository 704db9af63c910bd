"""The latency report CLI: table and PNG from a recorded JSONL, with missing stages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipecat_nemotron.observers.latency_stats import TurnLatency
from pipecat_nemotron.observers.report import WATERFALL_SEGMENTS, main, waterfall_segments

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REPO = Path(__file__).resolve().parents[1]


def write_turns(path: Path, n: int = 12) -> list[TurnLatency]:
    turns = []
    for i in range(1, n + 1):
        turn = TurnLatency(
            turn=i,
            speech_end_ts=1000.0 + 10 * i,
            vad_stop_ts=1000.2 + 10 * i,
            vad_stop_secs=0.2,
            bot_started_ts=1000.5 + 10 * i,
            ttfs_ms=230.0 + i,
            asr_finalize_ms=18.0 + (i % 4),
            llm_ttfb_ms=150.0 + 5 * i,
            tts_ttfb_ms=100.0 + (i % 3) * 10,
            v2v_ms=520.0 + 7 * i,
            breakdown_ms={
                "endpointing_wait": 200.0,
                "transcription": 30.0 + i,
                "llm_inference": 150.0 + 5 * i,
            },
            processors={
                "stt": "NemotronSTTService#0",
                "llm": "NvidiaLLMService#0",
                "tts": "MagpieTTSService#0",
            },
        )
        if i == 3:  # no ASR finalize metric, no TTS metric (e.g. a TTS that reports none)
            turn.asr_finalize_ms = None
            turn.tts_ttfb_ms = None
        turns.append(turn)
    with path.open("w") as f:
        for turn in turns:
            f.write(turn.to_json() + "\n")
        f.write("\n")  # blank lines are skipped
    return turns


def test_waterfall_segments_add_up() -> None:
    turn = TurnLatency(
        turn=1,
        vad_stop_secs=0.2,
        ttfs_ms=250,
        asr_finalize_ms=20,
        llm_ttfb_ms=160,
        tts_ttfb_ms=100,
        v2v_ms=560,
    )
    seg = waterfall_segments(turn)
    assert list(seg) == list(WATERFALL_SEGMENTS)
    assert seg["endpointing wait"] == pytest.approx(200)
    assert seg["STT (other)"] == pytest.approx(30)
    assert sum(seg.values()) == pytest.approx(560)
    empty = waterfall_segments(TurnLatency(turn=2))
    assert all(v == 0 for v in empty.values())


def test_main_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jsonl = tmp_path / "turns.jsonl"
    write_turns(jsonl)
    # A stage missing in every turn is listed with no data.
    lines = [json.loads(line) for line in jsonl.read_text().splitlines() if line]
    for record in lines:
        record["tts_ttfb_ms"] = None
    jsonl.write_text("\n".join(json.dumps(r) for r in lines) + "\n")

    out = tmp_path / "plots" / "latency.png"
    assert main([str(jsonl), "-o", str(out), "--breakdown", "--dpi", "60"]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC
    printed = capsys.readouterr().out
    assert "p50" in printed and "voice-to-voice" in printed and "12 turns" in printed

    assert main([str(tmp_path / "missing.jsonl"), "--no-plot"]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turn": 1}\nnot json\n')
    assert main([str(bad), "--no-plot"]) == 2
    assert "bad.jsonl:2" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main([str(empty), "--no-plot"]) == 1


def test_cli_module(tmp_path: Path) -> None:
    jsonl = tmp_path / "turns.jsonl"
    write_turns(jsonl)
    out = tmp_path / "latency.png"
    result = subprocess.run(
        [sys.executable, "-m", "pipecat_nemotron.observers.report", str(jsonl), "-o", str(out), "--dpi", "60"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == PNG_MAGIC
    table = result.stdout
    assert "LLM TTFB" in table and "p99" in table
    # ASR finalize and TTS TTFB have 11 values (turn 3 misses them); v2v has 12.
    rows = {line.split("  ")[0].strip(): line.split() for line in table.splitlines()}
    assert "11" in rows["ASR finalize"] and "11" in rows["TTS TTFB"]
    assert "12" in rows["voice-to-voice"]
