"""A bot process for ``tests/test_barge_in.py``: the voice agent against a model server, driven over stdin/stdout.

Run as ``python tests/barge_in_bot.py SPEC.json`` (``asr_url``, ``tts_address``, ``llm_url``). The pipeline is the
one ``bench agent-load --bots processes`` runs in its bot processes (:func:`pipecat_nemotron.agent.assembly.
build_voice_agent`: Silero VAD, the STT owning turn detection, the LLM, simulated playback) with
:class:`~pipecat_nemotron.stt.NemotronServerSTTService` and Pipecat's ``NvidiaTTSService`` on the server. Its
microphone sends 20 ms frames in real time: silence, or a clip the parent names.

The parent writes JSON lines to stdin: ``{"say": "demo_weather.wav"}`` (a bundled demo clip, spoken next) and
``{"end": true}`` (the user interrupts the bot's reply, if one is going, and hangs up: an ``EndFrame``, so the STT
waits for the finals it is owed and reports any it lost). The bot prints JSON lines prefixed with :data:`PREFIX`:
``ready``; ``final`` (each finalized transcript, ``text``); ``bot_started`` (the bot started speaking, ``n``);
``interrupted`` (an interruption went down the pipeline); ``error`` (``text``, each ``ErrorFrame``); ``done``
(``errors``: every error) once the pipeline has ended.
"""

from __future__ import annotations

import asyncio
import collections
import json
import sys
from pathlib import Path
from typing import Any

from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    EndFrame,
    ErrorFrame,
    InputAudioRawFrame,
    InterruptionFrame,
    TranscriptionFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.pipeline.runner import WorkerRunner
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.nvidia.tts import NvidiaTTSService

from pipecat_nemotron.agent.assembly import build_voice_agent
from pipecat_nemotron.agent.wav_input import read_pcm16
from pipecat_nemotron.llm.service import create_nemotron_llm
from pipecat_nemotron.models import DEMO_AUDIO_DIR
from pipecat_nemotron.stt.eager import EagerSettings
from pipecat_nemotron.stt.remote.service import NemotronServerSTTService

#: Marks this bot's protocol lines on its stdout.
PREFIX = "barge-in-bot "
#: 20 ms of 16 kHz 16-bit mono audio, bytes.
FRAME_BYTES = 640


def say(event: str, **fields: Any) -> None:
    """One protocol line to the parent."""
    print(PREFIX + json.dumps({"event": event, **fields}), flush=True)


class Events(BaseObserver):
    """Reports the frames the parent waits on, each once (its first push)."""

    def __init__(self) -> None:
        super().__init__()
        self.bot_started = 0
        self.errors: list[str] = []

    async def on_push_frame(self, data: FramePushed) -> None:
        frame = data.frame
        if not data.first_push:
            return
        if isinstance(frame, TranscriptionFrame) and frame.finalized:
            say("final", text=frame.text)
        elif isinstance(frame, BotStartedSpeakingFrame) and data.direction == FrameDirection.DOWNSTREAM:
            self.bot_started += 1
            say("bot_started", n=self.bot_started)
        elif isinstance(frame, InterruptionFrame):
            say("interrupted")
        elif isinstance(frame, ErrorFrame):
            self.errors.append(frame.error)
            say("error", text=frame.error)


class Microphone:
    """Queues 20 ms input frames on the worker in real time: the clips asked for, in order, else silence."""

    def __init__(self, worker: Any) -> None:
        self._worker = worker
        self._pending: collections.deque[bytes] = collections.deque()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def speak(self, pcm: bytes) -> None:
        """Say ``pcm`` (16 kHz mono int16) after what is already being said."""
        self._pending.extend(pcm[i : i + FRAME_BYTES].ljust(FRAME_BYTES, b"\0") for i in range(0, len(pcm), FRAME_BYTES))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        n = 0
        while True:
            audio = self._pending.popleft() if self._pending else bytes(FRAME_BYTES)
            await self._worker.queue_frame(InputAudioRawFrame(audio=audio, sample_rate=16000, num_channels=1))
            n += 1
            await asyncio.sleep(max(0.0, start + n * 0.02 - loop.time()))  # a microphone's pace, not a wait on events

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def read_stdin_line() -> str:
    """The next line from the parent ('' at end of input), read off the event loop."""
    return await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


async def run_bot(spec: dict[str, Any]) -> None:
    """Run the agent until the parent says ``end``; report what happened."""
    # The STT owns turn detection, committed by the VAD stop, and never predicts (as agent-load's bots).
    stt = NemotronServerSTTService(
        url=spec["asr_url"], token=None, latency_ms=160, eager=EagerSettings(silence_ms=600_000.0)
    )
    tts = NvidiaTTSService(server=spec["tts_address"], use_ssl=False)
    events = Events()
    agent = build_voice_agent(
        stt=stt, llm=create_nemotron_llm(base_url=spec["llm_url"]), tts=tts, observers=[events], idle_timeout_secs=None
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(agent.worker)
    started = asyncio.Event()

    @agent.worker.event_handler("on_pipeline_started")
    async def _started(_worker: Any, _frame: Any) -> None:
        started.set()

    run = asyncio.ensure_future(runner.run())
    await started.wait()
    await stt.wait_until_ready()
    microphone = Microphone(agent.worker)
    say("ready")
    while line := await read_stdin_line():
        command = json.loads(line)
        if "say" in command:
            microphone.speak(read_pcm16(DEMO_AUDIO_DIR / Path(command["say"]).name, convert=True).tobytes())
        elif command.get("end"):
            break
    await agent.worker.queue_frame(InterruptionFrame())  # the user cuts the reply short and hangs up
    await microphone.stop()
    await agent.worker.queue_frame(EndFrame())
    await run
    say("done", errors=events.errors)


def main() -> int:
    """``python tests/barge_in_bot.py SPEC.json``."""
    from loguru import logger

    logger.remove()  # Pipecat logs every frame decision at DEBUG: warnings only, on stderr (the parent's log file)
    logger.add(sys.stderr, level="WARNING")
    asyncio.run(run_bot(json.loads(Path(sys.argv[1]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
