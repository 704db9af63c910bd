"""What a newcomer meets (issue 22): failures that end the program, CPU threads, the last turn on a busy CPU,
``.env`` from the current directory, plain output in a file, the server command's help, the README's claims."""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
from helpers import noise_clip, to_pcm16, turn
from openai_server import openai_server  # noqa: F401  (fixture)
from pipecat.frames.frames import (
    ErrorFrame,
    InterimTranscriptionFrame,
    StartFrame,
    TranscriptionFrame,
    VADUserStartedSpeakingFrame,
)
from pipecat.observers.base_observer import FramePushed
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.tests.utils import run_test
from processes import clean_env, free_port

from pipecat_nemotron.agent.assembly import AgentSettings
from pipecat_nemotron.agent.wav_input import run_worker_on_wav
from pipecat_nemotron.asr import EngineConfig, ModelLoadError, NemotronEngine
from pipecat_nemotron.asr.config import default_cpu_threads
from pipecat_nemotron.asr.shared import SharedEngines
from pipecat_nemotron.models import DEMO_AUDIO_DIR, TINY_MODEL_PATH
from pipecat_nemotron.observers.transcripts import TranscriptCollector
from pipecat_nemotron.stt import NemotronSTTService
from pipecat_nemotron.stt.base import NemotronSTTUnavailableError

ROOT = Path(__file__).resolve().parents[1]
TWO_TURNS = DEMO_AUDIO_DIR / "two_turns.wav"


@pytest.fixture
async def engine(tiny_random_model):
    eng = NemotronEngine(EngineConfig(model=str(tiny_random_model), device="cpu", max_streams=8))
    await eng.start()
    yield eng
    await eng.stop()


def _stt_pipeline(stt: NemotronSTTService) -> PipelineWorker:
    return PipelineWorker(Pipeline([stt]), params=PipelineParams(), cancel_on_idle_timeout=False)


# ---- 1. a service that cannot start says so, and the programs end ----------------------------------------------


async def test_wait_until_ready_raises_when_the_session_cannot_open(engine: NemotronEngine) -> None:
    """A language the English model lacks: the stream never opens, and the waiter learns why instead of hanging."""
    stt = NemotronSTTService(engine=engine, language="fr")
    with pytest.raises(NemotronSTTUnavailableError, match="'fr'") as raised:
        await asyncio.wait_for(run_worker_on_wav(_stt_pipeline(stt), stt, TWO_TURNS, realtime=False), 60)
    assert isinstance(raised.value.__cause__, ValueError)
    assert engine.open_streams == 0


async def test_wait_until_ready_raises_when_the_model_cannot_load() -> None:
    """``--device cuda`` on a machine without a GPU: the load fails and the waiter gets the loader's error."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    stt = NemotronSTTService(model=str(TINY_MODEL_PATH), device="cuda", registry=SharedEngines())
    with pytest.raises(NemotronSTTUnavailableError, match="cuda") as raised:
        await asyncio.wait_for(run_worker_on_wav(_stt_pipeline(stt), stt, TWO_TURNS, realtime=False), 120)
    assert isinstance(raised.value.__cause__, ModelLoadError)


async def test_server_stt_wait_until_ready_raises_when_the_server_is_unreachable() -> None:
    from pipecat_nemotron.stt.remote.service import NemotronServerSTTService

    url = f"ws://127.0.0.1:{free_port()}/v1/asr"  # nothing listens there
    stt = NemotronServerSTTService(url=url, token="t" * 16, connect_timeout_s=2.0)
    outcome: list[BaseException] = []

    async def wait() -> None:
        try:
            await asyncio.wait_for(stt.wait_until_ready(), 30)
        except BaseException as e:  # noqa: BLE001 - the test looks at what it was
            outcome.append(e)

    waiter = asyncio.create_task(wait())
    await run_test(stt, frames_to_send=[], start_timeout=10.0)
    await waiter
    assert len(outcome) == 1 and isinstance(outcome[0], NemotronSTTUnavailableError), outcome
    assert url in str(outcome[0])


def test_transcribe_file_example_exits_non_zero_for_a_missing_model(tmp_path: Path) -> None:
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "transcribe_file.py"), str(TWO_TURNS), "--model", "/nope.nemo"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 1, run.stderr[-3000:]
    assert "/nope.nemo" in run.stderr.splitlines()[-1], run.stderr[-3000:]
    print(f"exited after {time.monotonic() - started:.1f} s")


# ---- wav_input: cancellation waits for the teardown -------------------------------------------------------------


async def test_cancelled_run_worker_on_wav_returns_after_the_session_is_torn_down(engine: NemotronEngine) -> None:
    stt = NemotronSTTService(engine=engine)
    worker = _stt_pipeline(stt)
    task = asyncio.create_task(run_worker_on_wav(worker, stt, TWO_TURNS, realtime=True))
    for _ in range(600):  # until the session streams audio (at most 30 s)
        if stt.stream is not None and stt.stream.audio_seconds > 0:
            break
        await asyncio.sleep(0.05)
    assert engine.open_streams == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Nothing left for orphaned tasks to finish: the slot is free and the pipeline has stopped.
    assert engine.open_streams == 0 and engine.free_slots == engine.config.max_streams
    assert worker.has_finished()


# ---- 2. CPU threads, and the last turn on a busy CPU ---------------------------------------------------------


async def _threads_seen_by_the_model(engine: NemotronEngine) -> int:
    seen: list[int] = []
    with engine.observe_encoder_output(lambda *_: seen.append(torch.get_num_threads())):
        await engine.transcribe(to_pcm16(noise_clip(0.5, seed=3)))
    assert seen
    return seen[-1]


async def test_cpu_threads_are_set_on_the_model_thread(tiny_random_model) -> None:
    config = EngineConfig(model=str(tiny_random_model), device="cpu", max_streams=1, warmup=False)
    async with NemotronEngine(config) as eng:
        assert await _threads_seen_by_the_model(eng) == default_cpu_threads()
    async with NemotronEngine(EngineConfig(**{**config.__dict__, "cpu_threads": 3})) as eng:
        assert await _threads_seen_by_the_model(eng) == 3


def test_cpu_threads_settings_and_their_errors() -> None:
    with pytest.raises(ValueError, match="cpu_threads"):
        EngineConfig(cpu_threads=0)
    assert NemotronSTTService(model=str(TINY_MODEL_PATH), cpu_threads=2)._lease.config.cpu_threads == 2
    with pytest.raises(ValueError, match="engine_config"):
        NemotronSTTService(engine_config=EngineConfig(), cpu_threads=2)
    settings = AgentSettings.from_env({"NEMOTRON_CPU_THREADS": "1", "NEMOTRON_ASR_FINAL_TIMEOUT_S": "90"})
    assert settings.asr_engine_config().cpu_threads == 1
    assert settings.create_stt()._final_timeout_s == 90.0
    with pytest.raises(ValueError, match="NEMOTRON_CPU_THREADS"):
        AgentSettings.from_env({"NEMOTRON_CPU_THREADS": "all"})


class _HeldModel:
    """An encoder hook that holds every model step until :meth:`release` (a CPU busy elsewhere, made exact).

    As a context manager it also releases the steps once a session gives up waiting for its finals (a closing
    stream waits for the step in progress).
    """

    def __init__(self) -> None:
        self._go = threading.Event()
        self._sink: int | None = None

    def __call__(self, *_: object) -> None:
        self._go.wait(60)

    def release(self, after_s: float = 0.0) -> None:
        threading.Timer(after_s, self._go.set).start()

    def __enter__(self) -> _HeldModel:
        from loguru import logger

        self._sink = logger.add(lambda _: self._go.set(), filter=lambda r: "the engine was still" in r["message"])
        return self

    def __exit__(self, *_: object) -> None:
        from loguru import logger

        self._go.set()
        if self._sink is not None:
            logger.remove(self._sink)


async def test_end_of_session_waits_for_finals_the_engine_is_still_decoding(engine: NemotronEngine) -> None:
    """The engine needs longer than 5 s for the last final (as a busy 2-core CPU did): the session waits for it."""
    pcm = to_pcm16(noise_clip(1.0, seed=11))
    expected = await engine.transcribe(pcm)
    stt = NemotronSTTService(engine=engine)
    held = _HeldModel()
    with engine.observe_encoder_output(held):
        held.release(after_s=6.0)
        # No VAD stop: the end of the session (run_test's EndFrame) finalizes the turn.
        down, up = await run_test(
            stt, frames_to_send=[VADUserStartedSpeakingFrame(), *turn(pcm)[1:-2]], start_timeout=5.0
        )
    assert [f.text for f in down if isinstance(f, TranscriptionFrame)] == [expected.text]
    assert not [f for f in up if isinstance(f, ErrorFrame)]


async def test_a_final_still_lost_is_reported_with_the_seconds_of_audio(engine: NemotronEngine) -> None:
    pcm = to_pcm16(noise_clip(1.2, seed=12))
    stt = NemotronSTTService(engine=engine, final_timeout_s=0.3)
    with _HeldModel() as held, engine.observe_encoder_output(held):
        down, up = await run_test(
            stt, frames_to_send=[VADUserStartedSpeakingFrame(), *turn(pcm)[1:-2]], start_timeout=5.0
        )
    assert not [f for f in down if isinstance(f, TranscriptionFrame)]
    errors = [f.error for f in up if isinstance(f, ErrorFrame)]
    assert len(errors) == 1 and "1.2 s of audio" in errors[0] and "final_timeout_s" in errors[0], errors
    assert engine.open_streams == 0


async def test_demo_exits_non_zero_when_the_last_final_is_lost(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipecat_nemotron import demo
    from pipecat_nemotron.asr.shared import shared_engines

    for key in [k for k in list(os.environ) if k.startswith(("NEMOTRON_", "MAGPIE_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("NEMOTRON_ASR_FINAL_TIMEOUT_S", "0.3")
    monkeypatch.setenv("NEMOTRON_LLM_EMBEDDED", "0")  # the ASR's lost final is the subject
    settings = AgentSettings(asr_model=str(TINY_MODEL_PATH), asr_device="cpu")
    engine = await shared_engines.preload(settings.asr_engine_config())
    try:
        with _HeldModel() as held, engine.observe_encoder_output(held):
            code = await demo.run_demo(
                TWO_TURNS, str(TINY_MODEL_PATH), 160, "cpu", realtime=False, out=tmp_path
            )
    finally:
        await shared_engines.close_all()
    out = capsys.readouterr().out
    assert code == 1, out
    assert re.search(r"\[error\] .*final transcript\(s\) lost .*: \d+\.\d s of audio", out), out


# ---- 3 and 7. .env from the current directory; an unreachable LLM is named --------------------------------------


def test_demo_reads_env_from_the_current_directory_and_names_an_unreachable_llm(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    (tmp_path / ".env").write_text(f"NEMOTRON_LLM_BASE_URL={url}\nNEMOTRON_ASR_FINAL_TIMEOUT_S=60\n")
    env = clean_env()
    del env["PYTHON_DOTENV_DISABLED"]
    run = subprocess.run(
        [sys.executable, "-m", "pipecat_nemotron.demo", "--fast", "--out", str(tmp_path / "runs")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert f"LLM: preset model at {url}" in run.stdout, run.stdout[-3000:]
    assert f"The LLM server at {url} cannot be reached" in run.stderr, run.stderr[-3000:]


async def test_llm_check_names_the_url(openai_server) -> None:  # noqa: F811
    from pipecat_nemotron.llm.check import check_llm_endpoint

    assert await check_llm_endpoint(openai_server.base_url, "none") is None
    dead = f"http://127.0.0.1:{free_port()}/v1"
    message = await check_llm_endpoint(dead, "none", timeout_s=2.0)
    assert message is not None and dead in message and "NEMOTRON_LLM_BASE_URL" in message


# ---- 5. a failed download names the network and the local model --------------------------------------------


async def test_failed_hub_download_names_the_network_and_the_local_alternative() -> None:
    engine = NemotronEngine(EngineConfig(model="nvidia/no-such-nemotron-model", device="cpu", warmup=False))
    with pytest.raises(ModelLoadError) as raised:
        await engine.start()
    message = str(raised.value)
    assert "network" in message and "TINY_MODEL_PATH" in message and "local .nemo" in message, message


def test_readme_snippet_for_the_bundled_tiny_model_runs_offline() -> None:
    readme = (ROOT / "README.md").read_text()
    snippet = re.search(r"```python\n(from pipecat_nemotron import [^`]*TINY_MODEL_PATH[^`]*)```", readme)
    assert snippet, "README shows how to run on the bundled tiny model"
    scope: dict = {}
    exec(snippet.group(1), scope)  # noqa: S102 - the README's own code
    stt = scope["stt"]
    assert stt._lease.config.model == str(TINY_MODEL_PATH) and stt._lease.config.device == "cpu"


def test_readme_serve_command_for_the_tiny_model_serves(tmp_path: Path) -> None:
    import urllib.request

    readme = (ROOT / "README.md").read_text()
    command = re.search(r"^pipecat-nemotron serve --model .*TINY_MODEL_PATH.*$", readme, re.M)
    assert command, "README shows `serve` on the tiny model"
    port = free_port()
    env = clean_env(PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # `python`, `pipecat-nemotron`
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {command.group(0)} --port {port}"], cwd=tmp_path, env=env, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            raise AssertionError(f"the README's serve command did not get ready: {proc.stderr.read().decode()[-3000:]}")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


# ---- 6. the server command and the README's server example ---------------------------------------------------


def test_readme_server_token_is_one_the_server_accepts() -> None:
    from pipecat_nemotron.server.config import ServerConfig

    readme = (ROOT / "README.md").read_text()
    served = re.search(r"NEMOTRON_ASR_TOKENS=(\S+) pipecat-nemotron serve", readme)
    assert served, "README's server example sets NEMOTRON_ASR_TOKENS"
    token = served.group(1)
    ServerConfig(tokens=(token,))  # raises for a token the server refuses (under 16 characters)
    assert f'token="{token}"' in readme  # the client snippet uses the same token


def test_serve_without_the_server_extra_names_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipecat_nemotron.cli import main

    monkeypatch.setitem(sys.modules, "aiohttp", None)  # as if the extra were not installed
    assert main(["serve", "--model", str(TINY_MODEL_PATH)]) == 2
    err = capsys.readouterr().err
    assert "pip install 'pipecat-nemotron[server]'" in err and "aiohttp" in err, err


def test_serve_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    from pipecat_nemotron.cli import main

    with pytest.raises(SystemExit) as done:
        main(["serve", "--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for flag, default in (("--port PORT", "8765"), ("--finalize-mode", "soft"), ("--max-sessions", "64")):
        assert re.search(re.escape(flag) + r".*?\(default: " + re.escape(default) + r"\)", out), (flag, out)


# ---- smaller: transcripts in a file, Pipecat's deprecated StartFrame fields -------------------------------------


async def test_transcripts_written_to_a_file_are_plain_lines() -> None:
    import pipecat.utils.deprecation as deprecation

    stt = FrameProcessor(name="stt")
    out = io.StringIO()  # not a terminal
    collector = TranscriptCollector(stt.name, out=out)

    async def push(frame, direction=FrameDirection.DOWNSTREAM) -> None:
        await collector.on_push_frame(FramePushed(stt, stt, frame, direction, 0))

    deprecation._warned_sites.clear()
    with warnings.catch_warnings(record=True) as caught:
        await push(StartFrame())
    assert not [w for w in caught if "StartFrame" in str(w.message)], [str(w.message) for w in caught]
    await push(InterimTranscriptionFrame("what is", "u", "t"))
    await push(TranscriptionFrame("what is two plus two", "u", "t"))
    await push(ErrorFrame("something was lost"), FrameDirection.UPSTREAM)
    text = out.getvalue()
    assert "\x1b" not in text and "\r" not in text, repr(text)
    assert text.splitlines()[0] == "[final] what is two plus two", repr(text)
    assert "[error] something was lost" in text and collector.errors == ["something was lost"]
