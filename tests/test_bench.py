"""Smoke tests of ``python -m pipecat_nemotron.bench``: every benchmark runs at tiny size and writes sane JSON.

These check structure and sanity (keys, counts, units, ratios > 0), never timings: CI machines are noisy.
"""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from pipecat_nemotron.bench import common, stats, wer

REPO = Path(__file__).resolve().parents[1]


def _run(module: str, model: str, out: Path, options: str) -> dict:
    """Run ``pipecat_nemotron.bench.<module>`` on ``model`` with one torch thread; return its JSON result."""
    bench = importlib.import_module(f"pipecat_nemotron.bench.{module}")
    bench.main(["--model", model, *options.split(), "--out", str(out), "--threads", "1"])
    return _load(out, bench.NAME)


def _load(out: Path, name: str) -> dict:
    data = json.loads((out / f"{name}.json").read_text())
    assert (out / f"{name}.png").stat().st_size > 1000
    for key in ("benchmark", "machine", "commit", "args", "duration_s"):
        assert key in data, key
    for key in ("cpu_model", "cpu_cores", "torch", "gpu"):
        assert key in data["machine"], key
    return data


def _positive(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def model(tiny_quiet_model: Path) -> str:
    return str(tiny_quiet_model)


def test_cli_lists_benchmarks() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pipecat_nemotron.bench", "--help"], capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 0
    for name in ("buffered-vs-cache-aware", "concurrency", "time-to-final", "soak", "agent-load"):
        assert name in proc.stdout


def test_importing_the_package_is_cheap() -> None:
    code = "import sys, pipecat_nemotron.bench.__main__; print('nemo' in sys.modules, 'torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.stdout.split() == ["False", "False"]


def test_buffered_vs_cache_aware(model: str, tmp_path: Path) -> None:
    data = _run("buffered_vs_cache_aware", model, tmp_path, "--latency 160 --streams 1 2 --max-audio-s 2")
    assert "BufferedRNNTPipeline" in data["baseline"]["implementation"]
    (m,) = data["models"]
    assert m["model"]["random_weights"] is False  # a user-given path: WER is reported
    assert [(r["latency_ms"], r["streams"]) for r in m["rows"]] == [(160, 1), (160, 2)]
    for row in m["rows"]:
        assert row["audio_s"] >= 2 and row["buffered_processed_audio_s"] > row["audio_s"]  # + flush silence
        assert row["buffered_geometry"] == {"left_s": 1.6, "chunk_s": 0.08, "right_s": 0.08, "window_s": 1.76}
        for side in ("cache_aware", "buffered"):
            for key in ("wall_s_per_audio_s", "cpu_s_per_audio_s", "step_s_per_audio_s"):
                assert _positive(row[side][key]), (side, key)
            assert row[side]["wer_percent"] is not None and row[side]["wer_percent"] >= 0
        assert _positive(row["ratio_cpu"]) and _positive(row["ratio_wall"])


def test_concurrency(model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipecat_nemotron.asr.runner import ModelRunner

    runners: list[ModelRunner] = []  # the engine's runner, whose slot pool is the memory the summary reports
    init = ModelRunner.__init__

    def recording_init(self: ModelRunner, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        runners.append(self)

    monkeypatch.setattr(ModelRunner, "__init__", recording_init)
    options = "--streams 1 2 --seconds 1.5 --step-batches 1 4 --step-modes 160 --step-seconds 1 --keep-going"
    data = _run("concurrency", model, tmp_path, options)
    assert [r["streams"] for r in data["realtime"]] == [1, 2]
    for r in data["realtime"]:
        assert r["steps"] > 0 and r["chunk_ms"] == 160
        assert 1 <= r["batch_size"]["max"] <= r["streams"]
        assert _positive(r["step_ms"]["p50"]) and r["chunk_lag_ms"]["p99"] >= r["step_ms"]["p50"] * 0.5
        assert isinstance(r["realtime"], bool)
    assert {(r["latency_ms"], r["batch"]) for r in data["batched_steps"]} == {(160, 1), (160, 4)}
    assert all(_positive(r["step_ms_p50"]) and r["steps"] > 0 for r in data["batched_steps"])
    s = data["summary"]
    # The slot pool as allocated: the encoder's two caches (NeMo's slot manager) and the pre-encode mel cache.
    (runner,) = runners
    pool = (runner.slots.cache_last_channel, runner.slots.cache_last_time, runner.pre_encode_cache)
    assert runner.slots.num_slots == s["max_streams"] == 4  # the largest of --streams and --step-batches
    assert s["slot_pool_bytes"] == sum(t.nbytes for t in pool)
    assert s["cache_bytes_per_stream"] * s["max_streams"] == s["slot_pool_bytes"]
    assert 0 <= s["largest_realtime_n"] <= 2 and s["limit"]


def test_time_to_final(model: str, tmp_path: Path) -> None:
    data = _run("time_to_final", model, tmp_path, "--lengths 1 3 --repeats 2 --short-repeats 2")
    assert [m["finalize_mode"] for m in data["modes"]] == ["soft", "hard"]
    for m in data["modes"]:
        assert [r["seconds"] for r in m["rows"]] == [1, 3]
        for r in m["rows"]:
            assert r["ttf_ms"]["n"] == 2 and _positive(r["ttf_ms"]["p50"])
            assert r["ttf_ms"]["p50"] <= r["ttf_ms"]["p99"]
        assert _positive(m["ratio_long_short_p50"])


def test_soak(model: str, tmp_path: Path) -> None:
    data = _run("soak", model, tmp_path, "--streams 2 --minutes 0.1 --utterance-s 1.2 --sample-s 0.5")
    assert data["streams"] == 2 and data["steps"] > 5 and data["finals"] >= 4
    assert len(data["series"]["memory"]) >= 8
    assert data["lag_slope_ms_per_min"] is not None and data["rss_slope_mb_per_min"] is not None
    assert isinstance(data["no_growth"], bool)
    assert _positive(data["ttf_ms"]["p50"])


def test_cold_start(model: str, tmp_path: Path) -> None:
    from pipecat_nemotron.bench import cold_start as bench

    bench.main(["--model", model, "--repeats", "1", "--trials", "cold-warm", "--out", str(tmp_path)])
    data = json.loads((tmp_path / f"{bench.NAME}.json").read_text())
    assert data["benchmark"] == "cold-start" and "machine" in data and "duration_s" in data
    stats = data["cold_warm"]
    assert set(stats) == {"import_s", "first_start_s", "warm_start_s"}
    assert all(v["n"] == 1 and _positive(v["p50"]) for v in stats.values())


def test_resolve_model_prefers_the_trained_tiny_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "trained.nemo"
    fake.write_bytes(b"x")
    monkeypatch.setattr(common, "TRAINED_TINY_MODEL", fake)
    spec = common.resolve_model("tiny", tmp_path)
    assert spec.path == fake and not spec.random_weights
    with pytest.raises(FileNotFoundError):
        common.resolve_model(str(tmp_path / "missing.nemo"), tmp_path)


def test_scoring_and_stats() -> None:
    assert wer.word_errors("The code is two.", "the code is to") == 1
    assert wer.wer_percent(["a b c d", None], ["a b x d", "whatever"]) == 25.0
    assert wer.wer_percent([None], ["x"]) is None
    assert stats.linear_slope([0, 1, 2, 3], [1, 3, 5, 7]) == pytest.approx(2.0)
    s = stats.summarize([1.0, 2.0, 3.0])
    assert s["n"] == 3 and s["p50"] == 2.0 and s["max"] == 3.0
    assert stats.summarize([])["p50"] is None


def test_multilingual(tmp_path: Path) -> None:
    data = _run("multilingual", "tiny", tmp_path, f"--models-dir {tmp_path} --batches 1 2 --repeats 2")
    assert data["languages"] == ["en-US", "es-ES", "de-DE"] and data["num_prompts"] == 128
    assert [r["batch"] for r in data["steps"]] == [1, 2]
    for r in data["steps"]:
        assert r["frames_per_row"] == 2  # the 160 ms mode
        assert all(_positive(r[k]) for k in ("encoder_ms", "prompt_ms", "decode_ms"))
        assert 0 < r["prompt_percent_of_step"] < r["prompt_percent_of_encoder"]
    assert [r["locales"] for r in data["detection"]] == [3, 2]  # 40 capped at the model's 3
    for r in data["detection"]:
        assert (r["frames"], r["tokens"], r["encoder_steps"]) == (125, 40, 62.5)
        assert _positive(r["detect_ms"]) and _positive(r["detect_over_encoder"])
    assert _positive(data["flops"]["prompt_per_frame_per_locale"])


def test_boost(model: str, tmp_path: Path) -> None:
    """Both parts at toy size: the step cost on a tiny random model, recall on a few held-out clips."""
    from pipecat_nemotron.bench import boost

    boost.main(
        ["--model", model, "--out", str(tmp_path), "--threads", "1", "--batches", "1", "2", "--phrases", "3", "20",
         "--repeats", "1", "--encoder-repeats", "1", "--words", "two", "--alphas", "2", "--others", "2",
         "--clips", "12"]
    )  # fmt: skip
    data = json.loads((tmp_path / "boost.json").read_text())
    assert [r["batch"] for r in data["cost"]] == [1, 2]
    for row in data["cost"]:
        assert _positive(row["encoder_ms"]) and _positive(row["decode_off_ms"])
        assert all(_positive(row[f"decode_{k}_ms"]) for k in ("none", "3", "20"))
        assert row["trees"] == 2 * row["batch"]  # every stream of both boosted variants has a list of its own
    (recall,) = data["recall"]
    assert recall["word"] == "two" and recall["occurrences"] > 0 and recall["other_clips"] == 2
    assert 0 <= recall["recall_before"] <= recall["recall_after"] <= 1


async def test_agent_load_asr_server_is_ready_then_stopped_or_says_why_it_failed(tmp_path: Path) -> None:
    """``agent-load --asr server``: the ASR server process answers /readyz before sessions start and is stopped
    after them; a server that cannot start fails the benchmark with its log, instead of sessions hanging."""
    import argparse
    import asyncio
    import urllib.request

    from pipecat_nemotron import TINY_MODEL_PATH
    from pipecat_nemotron.bench.agent_load import model_server

    def status(url: str) -> int:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status

    args = argparse.Namespace(device="cpu", sessions=[1, 2], threads=1)
    async with model_server(Path(TINY_MODEL_PATH), args) as server:
        url = server.asr_url
        assert url.startswith("ws://127.0.0.1:") and url.endswith("/v1/asr")
        ready = url.replace("ws://", "http://").replace("/v1/asr", "/readyz")
        assert await asyncio.to_thread(status, ready) == 200
    with pytest.raises(OSError):
        await asyncio.to_thread(status, ready)

    missing = tmp_path / "missing.nemo"
    with pytest.raises(RuntimeError, match="exited") as failed:
        async with model_server(missing, args, ready_timeout_s=120):
            pass
    assert "missing.nemo" in str(failed.value)


def test_embedded_llm(tmp_path: Path) -> None:
    from pipecat_nemotron.bench import embedded_llm

    embedded_llm.main(["--out", str(tmp_path)])
    data = _load(tmp_path, embedded_llm.NAME)
    [model] = data["ggufs"]
    assert model["gguf"].endswith(".gguf") and len(model["answers"]) == len(embedded_llm.QUESTIONS)
    assert all(a["answer"].strip() and a["ttft_ms"] > 0 for a in model["answers"]), model["answers"]
    assert model["ttft_p50_ms"] > 0 and model["tokens_per_s_p50"] > 0

def test_agent_load_bot_processes_spread_sessions_and_read_cpu_time() -> None:
    """``agent-load --bots processes``: sessions spread evenly, one process per session up to the cores, a
    process's CPU seconds read from /proc (what the report divides by the conversation-minutes), and a bad
    ``--bot-processes`` refused before anything starts."""
    import os

    from pipecat_nemotron.bench import agent_load
    from pipecat_nemotron.bench.agent_procs import available_cores, cpu_seconds, default_bot_processes, spread

    assert spread(5, 2) == [[0, 2, 4], [1, 3]]
    assert spread(1, 4) == [[0]]  # never an empty process
    assert default_bot_processes(1) == 1
    assert default_bot_processes(10_000) == available_cores()
    assert cpu_seconds(os.getpid()) > 0
    for wrong in (["--bot-processes", "0", "--bots", "processes"], ["--bot-processes", "2"]):
        with pytest.raises(SystemExit, match="--bot-processes"):
            agent_load.main(["--sessions", "2", *wrong])
    with pytest.raises(OSError):
        cpu_seconds(2**22 + 1)  # above Linux's largest pid


@pytest.mark.slow
@pytest.mark.serial
def test_agent_load_measures_in_process_and_bot_processes_alike(tmp_path: Path) -> None:
    """One run, both modes, the same sessions and statistics: every owed turn answered, each leg reported, and
    CPU seconds per conversation-minute split between the model server and the bots."""
    from pipecat_nemotron import TINY_MODEL_PATH
    from pipecat_nemotron.bench import agent_load

    options = "--sessions 1 --turns 1 --steps fast --bots in-process processes --device cpu"
    data = _run("agent_load", str(TINY_MODEL_PATH), tmp_path, options)
    inproc, procs = data["runs"]
    assert (inproc["bots"], procs["bots"], procs["bot_processes"]) == ("in-process", "processes", 1)
    for run in (inproc, procs):
        assert (run["answered"], run["owed"]) == (1, 1)
        for stat in ("legs_p50", "legs_p90"):
            assert all(_positive(run[stat][leg]) for leg in ("ttfs_ms", "llm_ttfb_ms", "tts_ttfb_ms", "v2v_ms"))
        assert _positive(run["cpu_s_per_conversation_minute"]["bots"])
    assert inproc["cpu_s"]["server"] is None  # the ASR ran in this process
    assert _positive(procs["cpu_s_per_conversation_minute"]["server"])
    (bot,) = procs["bot_reports"]
    assert (bot["returncode"], bot["failure"], bot["session_errors"], procs["bots_failed"]) == (0, None, [], 0)
    assert "bot processes, ASR + TTS server" in agent_load.table(data["runs"])


@pytest.mark.slow
@pytest.mark.serial
async def test_a_killed_bot_process_costs_only_its_own_sessions(tmp_path: Path) -> None:
    """Two bot processes on one model server; one is killed once the sessions start: it is reported with its
    exit status, and the other bot's session still gets its turn answered."""
    import argparse
    import os
    import signal

    from pipecat_nemotron import TINY_MODEL_PATH
    from pipecat_nemotron.bench import agent_load, agent_procs
    from pipecat_nemotron.tts.magpie.tiny import build_tiny_magpie

    parser = argparse.ArgumentParser()
    agent_load.add_arguments(parser)
    args = parser.parse_args(["--sessions", "2", "--turns", "1", "--device", "cpu"])
    wavs, _ = agent_load.write_sessions(args, tmp_path)
    magpie = build_tiny_magpie(tmp_path / "magpie")
    killed: list[int] = []

    def kill_first(bots: list[agent_procs.BotProcess]) -> None:
        killed.append(bots[0].pid)
        os.kill(bots[0].pid, signal.SIGKILL)

    async with agent_load.model_server(Path(TINY_MODEL_PATH), args, magpie=magpie) as server:
        spec = {"asr_url": server.asr_url, "tts_address": server.tts_address, "latency_ms": 160, "ttft_ms": 150}
        outcome = await agent_procs.run_bots(wavs, 2, spec, tmp_path, server_pid=server.pid, on_go=kill_first)
    dead, alive = outcome.bots
    assert dead["pid"] == killed[0] and dead["returncode"] == -signal.SIGKILL
    assert "exited with -9" in dead["failure"] and dead["cpu_s"] is None
    assert (alive["failure"], alive["session_errors"], alive["returncode"]) == (None, [], 0)
    assert outcome.failed == [dead]
    assert len(outcome.records) == 1 and _positive(outcome.records[0].v2v_ms)
    assert outcome.bots_cpu_s == alive["cpu_s"] and _positive(outcome.server_cpu_s)
