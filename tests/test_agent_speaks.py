"""The agent's mouth checked by its ears: the bundled tiny Magpie's speech, transcribed by the bundled tiny ASR.

A reply that is truncated, cut at the wrong word by a barge-in, or streamed in the wrong order sounds wrong; these
tests listen. The LLM is a real OpenAI-compatible server on loopback with a scripted reply; the speaker is
Pipecat's own ``BaseOutputTransport`` (chunked, paced in real time, cleared by interruptions, as a room's is).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from openai_server import FakeOpenAIServer
from pipecat.frames.frames import InterruptionFrame, OutputAudioRawFrame
from pipecat.transports.base_transport import TransportParams

from pipecat_nemotron.agent.assembly import build_voice_agent
from pipecat_nemotron.agent.wav_input import feed_wav, run_worker_on_wav, silence
from pipecat_nemotron.asr import EngineConfig, NemotronEngine
from pipecat_nemotron.bench.wer import normalize_text
from pipecat_nemotron.llm.service import create_nemotron_llm
from pipecat_nemotron.models import DEMO_AUDIO_DIR, TINY_MAGPIE_PATH, TINY_MODEL_PATH
from pipecat_nemotron.stt import NemotronSTTService
from pipecat_nemotron.tts.magpie import MagpieEngine, MagpieSynthesisOptions
from pipecat_nemotron.tts.service import MagpieTTSService

#: Replies the tiny Magpie says and the tiny ASR reads back word for word, in the agent's default voice: held-out
#: sentences (in neither model's training text) right for 8 seeds of 8, each alone and (REPLY) together, as
#: ``docs/TINY_MAGPIE.md`` records. The agent's TTS says each sentence as its own request; longer texts in one
#: request lose their last words more often (the training utterances are at most 6.2 s).
REPLY = "What time is it? What is nine minus six?"
LONG_REPLY = "What is five times eight? What is seven minus eight? What is six times six?"

#: The Magpie's output rate, Hz.
MAGPIE_RATE = 22050


def words(text: str) -> list[str]:
    """Lower-case words without punctuation (the WER's normalisation)."""
    return normalize_text(text).split()


@pytest.fixture(scope="module")
def speaking_magpie():
    """The bundled trained tiny Magpie, loaded as the agent loads it (its codec found beside it)."""
    engine = MagpieEngine(str(TINY_MAGPIE_PATH), device="cpu")
    engine.wait_until_ready(timeout=300)
    yield engine
    engine.close()


@pytest.fixture
async def ears():
    """The bundled tiny ASR, which transcribes what the agent said."""
    async with NemotronEngine(EngineConfig(model=str(TINY_MODEL_PATH), device="cpu", max_streams=4)) as engine:
        yield engine


async def hear(ears: NemotronEngine, pcm: bytes, rate: int = MAGPIE_RATE) -> list[str]:
    """The words the tiny ASR hears in int16 ``pcm`` at ``rate``."""
    assert pcm, "nothing was said"
    return words((await ears.transcribe(pcm, latency_ms=160, sample_rate=rate)).text)


class ListeningSpeaker:
    """Pipecat's ``BaseOutputTransport`` as a loudspeaker: each 40 ms chunk is "played" in real time and kept.

    ``played`` is the audio the user heard, in order; an interruption clears what was queued (Pipecat's media
    sender does), and ``heard_before_interruption`` keeps what had been played when the first one after the
    reply began arrived.
    ``wait_played(s)`` returns once ``s`` seconds have been played.
    """

    def __new__(cls, sample_rate: int = MAGPIE_RATE):
        from pipecat.transports.base_output import BaseOutputTransport

        class _Speaker(BaseOutputTransport):
            def __init__(self) -> None:
                super().__init__(
                    TransportParams(audio_out_enabled=True, audio_out_sample_rate=sample_rate, audio_out_10ms_chunks=4)
                )
                self.played = bytearray()
                self._progress = asyncio.Condition()

                self.heard_before_interruption: bytes | None = None
                self.interrupted = asyncio.Event()

            async def start(self, frame) -> None:
                await super().start(frame)
                await self.set_transport_ready(frame)

            async def process_frame(self, frame, direction) -> None:
                # The user's first words interrupt too (nothing is playing yet): the barge-in is the first
                # interruption after the reply began.
                if isinstance(frame, InterruptionFrame) and self.played and self.heard_before_interruption is None:
                    self.heard_before_interruption = bytes(self.played)
                    self.interrupted.set()
                await super().process_frame(frame, direction)

            async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
                await asyncio.sleep(len(frame.audio) / (2 * frame.num_channels * frame.sample_rate))
                async with self._progress:
                    self.played += frame.audio
                    self._progress.notify_all()
                return True

            @property
            def played_s(self) -> float:
                return len(self.played) / (2 * sample_rate)

            async def wait_played(self, seconds: float) -> None:
                async with self._progress:
                    await self._progress.wait_for(lambda: self.played_s >= seconds)

        return _Speaker()


def listening_agent(openai_server: FakeOpenAIServer, reply: str, speaking_magpie, ears):
    """The whole agent (tiny ASR, loopback LLM answering ``reply``, the bundled Magpie) into a ListeningSpeaker.

    Returns:
        ``(agent, stt, speaker)``.

    """
    openai_server.reply = reply
    stt = NemotronSTTService(engine=ears, latency_ms=160)
    speaker = ListeningSpeaker()
    agent = build_voice_agent(
        stt=stt,
        llm=create_nemotron_llm(base_url=openai_server.base_url),
        tts=MagpieTTSService(engine=speaking_magpie, options=MagpieSynthesisOptions(seed=0)),
        output_processor=speaker,
        idle_timeout_secs=None,
    )
    return agent, stt, speaker


async def test_the_agent_says_what_the_llm_wrote(openai_server: FakeOpenAIServer, speaking_magpie, ears) -> None:
    """Bundled speech in; the reply the user hears, transcribed, is the LLM's text, word for word."""
    agent, stt, speaker = listening_agent(openai_server, REPLY, speaking_magpie, ears)
    await run_worker_on_wav(agent.worker, stt, DEMO_AUDIO_DIR / "demo_weather.wav", trailing_silence_s=4.0, timeout_s=120)

    assert len(agent.observer.turns) == 1
    assert await hear(ears, bytes(speaker.played)) == words(REPLY)


async def test_a_barge_in_leaves_heard_a_prefix_of_the_reply(
    openai_server: FakeOpenAIServer, speaking_magpie, ears
) -> None:
    """The user speaks again 1.5 s into a three-sentence reply: what they heard is the reply's start, no more."""
    agent, stt, speaker = listening_agent(openai_server, LONG_REPLY, speaking_magpie, ears)

    started = asyncio.Event()

    @agent.worker.event_handler("on_pipeline_started")
    async def _started(_worker, _frame) -> None:
        started.set()

    async def user() -> None:
        await started.wait()
        await stt.wait_until_ready()
        await feed_wav(agent.worker, DEMO_AUDIO_DIR / "demo_weather.wav", trailing_silence_s=0.0, end=False)
        # Silence (as a microphone sends) until the reply has played 1.5 s, then the barge-in.
        played = asyncio.ensure_future(speaker.wait_played(1.5))
        while not played.done():
            await feed_wav_pcm(agent.worker, silence(0.02, 16000))
        await feed_wav(agent.worker, DEMO_AUDIO_DIR / "demo_math.wav", trailing_silence_s=0.0, end=False)
        # What follows the barge-in (the reply to it) is not this test's: stop there.
        await speaker.interrupted.wait()
        await agent.worker.cancel()

    from pipecat.pipeline.runner import WorkerRunner

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(agent.worker)
    await asyncio.wait_for(asyncio.gather(user(), runner.run()), timeout=180)

    assert speaker.heard_before_interruption is not None, "the barge-in did not interrupt the reply"
    heard = await hear(ears, speaker.heard_before_interruption)
    reply = words(LONG_REPLY)
    # The last heard word may be cut mid-way; every word before it is the reply's, in order.
    assert 2 <= len(heard) < len(reply), heard
    assert heard[:-1] == reply[: len(heard) - 1], heard


async def feed_wav_pcm(worker, pcm: bytes, rate: int = 16000) -> None:
    """Queue ``pcm`` (20 ms or less) as one microphone frame and wait its duration."""
    from pipecat.frames.frames import InputAudioRawFrame

    await worker.queue_frame(InputAudioRawFrame(audio=pcm, sample_rate=rate, num_channels=1))
    await asyncio.sleep(len(pcm) / (2 * rate))


async def test_streamed_chunks_say_the_words_in_order(speaking_magpie, ears) -> None:
    """Chunk by chunk as the engine streams them, the audio reads as the text; the halves swapped do not."""
    stream = speaking_magpie.submit(REPLY, voice="aria", options=MagpieSynthesisOptions(seed=0))
    chunks = [chunk.audio for chunk in stream]
    assert stream.error is None and len(chunks) >= 4
    audio = np.concatenate(chunks).astype("<i2")
    assert await hear(ears, audio.tobytes()) == words(REPLY)
    half = len(chunks) // 2
    swapped = np.concatenate(chunks[half:] + chunks[:half]).astype("<i2")
    assert await hear(ears, swapped.tobytes()) != words(REPLY)
