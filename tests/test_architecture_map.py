"""docs/ARCHITECTURE.md's two paths are what a real chunk and a real reply pass through, file for file (traced).

The map names every file of the package a chunk of audio passes through, from the STT service's ``run_stt`` to
the ``TranscriptionFrame`` (on the event loop and the model's worker thread), and every file a reply passes
through, from the TTS service's ``run_tts`` to the audio frames. A refactor that adds or removes a file on a path
fails here until the map says so.
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

from helpers import finals_of, turn
from path_trace import PathTrace
from pipecat.frames.frames import TTSAudioRawFrame, TTSSpeakFrame
from pipecat.tests.utils import SleepFrame, run_test

from pipecat_nemotron.agent.wav_input import read_wav
from pipecat_nemotron.asr import EngineConfig, NemotronEngine
from pipecat_nemotron.models import DEMO_AUDIO_DIR, TINY_MODEL_PATH
from pipecat_nemotron.stt import NemotronSTTService
from pipecat_nemotron.tts.magpie import MagpieEngine
from pipecat_nemotron.tts.service import MagpieTTSService

DOC = Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md"
_BLOCK = re.compile(r"<!-- path: (\w+) -->\s*\n#+ [^\n]*?(\d+) files[^\n]*\n.*?```\n(.*?)```", re.S)


def documented(path: str) -> tuple[int, set[str]]:
    """The file count a path's heading states and the files its block lists."""
    for name, count, block in _BLOCK.findall(DOC.read_text()):
        if name == path:
            return int(count), set(re.findall(r"^\s*\d+\s+(\S+\.py)\b", block, re.M))
    raise AssertionError(f"docs/ARCHITECTURE.md has no '<!-- path: {path} -->' block")


def test_the_map_parses_both_paths() -> None:
    for path in ("chunk", "reply"):
        count, files = documented(path)
        assert count == len(files) > 0, (path, count, sorted(files))


async def test_a_chunk_passes_through_the_files_the_map_names() -> None:
    engine = NemotronEngine(EngineConfig(model=str(TINY_MODEL_PATH), device="cpu", max_streams=2))
    await engine.start()
    trace = PathTrace("run_stt", "stt/local.py", ("stop", "cancel"), "stt/local.py")
    loop = asyncio.get_running_loop()
    try:
        pcm, _, _ = read_wav(DEMO_AUDIO_DIR / "demo_math.wav")
        stt = NemotronSTTService(engine=engine, latency_ms=160)
        await loop.run_in_executor(engine._executor, sys.setprofile, trace.hook)
        trace.install()
        try:
            down, _ = await run_test(stt, frames_to_send=[SleepFrame(sleep=0.2), *turn(pcm)], start_timeout=5.0)
        finally:
            trace.uninstall()
            await loop.run_in_executor(engine._executor, sys.setprofile, None)
    finally:
        await engine.stop()
    finals = finals_of(down)
    assert [f.text for f in finals] == ["Hello. What is four times six?"] and finals[0].finalized
    assert len(trace.threads) == 2, trace.threads  # the event loop and the model's worker thread
    count, files = documented("chunk")
    assert sorted(trace.files) == sorted(files), "update docs/ARCHITECTURE.md's chunk path"
    assert count == len(trace.files)


async def test_a_reply_passes_through_the_files_the_map_names(tiny_magpie: tuple[Path, Path]) -> None:
    magpie, codec = tiny_magpie
    trace = PathTrace("run_tts", "tts/service.py", ("stop", "cancel"), "tts/service.py")
    trace.install()  # the engine's worker thread starts traced
    try:
        engine = MagpieEngine(str(magpie), device="cpu", codec_model_path=str(codec))
    finally:
        trace.uninstall()
    try:
        await asyncio.to_thread(engine.wait_until_ready, 300)
        sys.setprofile(trace.hook)
        try:
            down, _ = await run_test(
                MagpieTTSService(engine=engine), frames_to_send=[TTSSpeakFrame("Hello there.")], start_timeout=5.0
            )
        finally:
            sys.setprofile(None)
    finally:
        engine.close()
    assert any(isinstance(f, TTSAudioRawFrame) for f in down)
    assert len(trace.threads) == 2, trace.threads  # the event loop and the engine's worker thread
    count, files = documented("reply")
    assert sorted(trace.files) == sorted(files), "update docs/ARCHITECTURE.md's reply path"
    assert count == len(trace.files)
