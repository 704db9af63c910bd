"""Benchmark audio: the held-out clips (or synthetic ones), looped audio, and real-time pacing of a stream.

Nothing here imports NeMo or torch.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipecat_nemotron.agent.wav_input import read_float32
from pipecat_nemotron.asr.audio import MODEL_SAMPLE_RATE, SAMPLES_PER_MS
from pipecat_nemotron.bench.common import REPO_ROOT

if TYPE_CHECKING:
    from pipecat_nemotron.asr import ASRStream, EngineConfig

#: The CI subset of the tiny model's held-out sets (FLAC files and ``manifest.json``).
HELDOUT_DIR = REPO_ROOT / "tests" / "assets" / "heldout"
#: Held-out WAVs of the tiny model (``[{"audio", "text", "split"}]``, paths relative to the manifest).
HELDOUT_MANIFEST = HELDOUT_DIR / "manifest.json"


@dataclass(frozen=True)
class Clip:
    """One utterance of benchmark audio.

    Attributes:
        name: File name (or ``synthetic-N``).
        audio: float32 mono samples at 16 kHz, in [-1, 1].
        text: Reference transcript (None for synthetic audio).

    """

    name: str
    audio: np.ndarray
    text: str | None

    @property
    def seconds(self) -> float:
        """Duration, s."""
        return self.audio.size / MODEL_SAMPLE_RATE


def synthetic_clip(seconds: float, seed: int) -> np.ndarray:
    """Deterministic noise with a gated tone, float32, 16 kHz (random-weight models turn it into tokens)."""
    rng = np.random.default_rng(seed)
    n = int(MODEL_SAMPLE_RATE * seconds)
    t = np.arange(n) / MODEL_SAMPLE_RATE
    tone = 0.03 * np.sin(2 * np.pi * (200 + 37 * seed) * t) * (np.sin(2 * np.pi * 1.5 * t) > 0)
    return (0.02 * rng.standard_normal(n) + tone).astype(np.float32)


def manifest_rows(manifest: Path) -> list[dict[str, str]]:
    """Rows of a JSON list manifest (``[{"audio", "text", ...}]``) or a NeMo JSON-lines one, audio paths absolute.

    Each row's audio path (``audio`` or ``audio_filepath``, relative to the manifest's folder) is returned under
    ``audio``.
    """
    text = manifest.read_text().strip()
    rows = (
        json.loads(text) if text.startswith("[") else [json.loads(line) for line in text.splitlines() if line]
    )
    return [
        {**row, "audio": str(manifest.parent / (row.get("audio") or row["audio_filepath"]))} for row in rows
    ]


async def transcribe_clips(
    config: EngineConfig, clips: Sequence[np.ndarray], modes: Sequence[int]
) -> dict[int, list[str]]:
    """Final text of every clip in every latency mode, ``config.max_streams`` clips batched at a time.

    Args:
        config: The engine to start (its ``max_streams`` sets the batch).
        clips: 16 kHz mono audio (int16 or float32), one utterance each.
        modes: Latency modes, ms.

    Returns:
        Per mode, the final text of each clip in order.

    """
    from pipecat_nemotron.asr import NemotronEngine

    texts: dict[int, list[str]] = {}
    async with NemotronEngine(config) as engine:
        for mode in modes:
            finals = []
            for start in range(0, len(clips), config.max_streams):
                batch = clips[start : start + config.max_streams]
                finals += await asyncio.gather(*(engine.transcribe(c, latency_ms=mode) for c in batch))
            texts[mode] = [f.text for f in finals]
    return texts


def load_clips(manifest: Path | None = None, max_seconds: float | None = None) -> tuple[list[Clip], str]:
    """Benchmark audio: the held-out WAVs when present, else synthetic clips.

    Args:
        manifest: A JSON list ``[{"audio", "text", ...}]`` (paths relative to it) or a NeMo JSON-lines manifest
            (``audio_filepath``, ``text``). Default: ``tests/assets/heldout/manifest.json``.
        max_seconds: Stop adding clips once this much audio is collected (None: all).

    Returns:
        The clips and a description of the source.

    """
    manifest = manifest or HELDOUT_MANIFEST
    clips: list[Clip] = []
    if manifest.exists():
        total = 0.0
        for row in manifest_rows(manifest):
            path = Path(row["audio"])
            clip = Clip(path.name, read_float32(path), row.get("text"))
            clips.append(clip)
            total += clip.seconds
            if max_seconds is not None and total >= max_seconds:
                break
        return clips, f"{manifest} ({len(clips)} clips, {total:.1f} s)"
    seconds = max_seconds or 30.0
    n = max(1, math.ceil(seconds / 3.0))
    clips = [Clip(f"synthetic-{i}", synthetic_clip(seconds / n, i), None) for i in range(n)]
    return clips, f"synthetic noise+tone ({n} clips, {seconds:.1f} s; {manifest} not found)"


def loop_audio(clips: Sequence[Clip], seconds: float, gap_s: float = 0.0) -> np.ndarray:
    """``seconds`` of audio made by concatenating ``clips`` (with ``gap_s`` of silence between) in a loop."""
    n = int(seconds * MODEL_SAMPLE_RATE)
    gap = np.zeros(int(gap_s * MODEL_SAMPLE_RATE), dtype=np.float32)
    parts: list[np.ndarray] = []
    have = 0
    i = 0
    while have < n:
        for piece in (clips[i % len(clips)].audio, gap):
            parts.append(piece)
            have += piece.size
        i += 1
    return np.concatenate(parts)[:n]


# ---- pacing -----------------------------------------------------------------------------------------------


@dataclass
class PaceStats:
    """How well a real-time feeder kept to its schedule.

    Attributes:
        frames: Frames pushed.
        late_max_ms: Worst lateness of a push against its deadline, ms (event-loop stalls show up here).

    """

    frames: int = 0
    late_max_ms: float = 0.0


async def feed_realtime(
    stream: ASRStream,
    audio: np.ndarray,
    t0: float,
    frame_ms: float = 20.0,
    stop_at: float | None = None,
    stats: PaceStats | None = None,
) -> PaceStats:
    """Push ``audio`` in ``frame_ms`` frames, frame ``i`` at ``t0 + (i + 1) * frame_ms`` (loop monotonic time).

    Deadlines come from ``t0`` and the frame index, never from summed sleeps, so pacing does not drift; a
    frame whose deadline has passed is pushed at once (and counted as late).

    Args:
        stream: Engine stream to feed.
        audio: float32 samples at 16 kHz.
        t0: Loop time (``loop.time()``) at which the audio starts "being spoken".
        frame_ms: Frame length, ms.
        stop_at: Loop time after which no more frames are pushed.
        stats: Accumulate into this object (else a new one).

    Returns:
        The pacing statistics.

    """
    loop = asyncio.get_running_loop()
    stats = stats or PaceStats()
    step = int(SAMPLES_PER_MS * frame_ms)
    for i, start in enumerate(range(0, audio.size, step)):
        deadline = t0 + (i + 1) * frame_ms / 1000.0
        if stop_at is not None and deadline > stop_at:
            break
        delay = deadline - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        stats.late_max_ms = max(stats.late_max_ms, (loop.time() - deadline) * 1000.0)
        await stream.push(audio[start : start + step])
        stats.frames += 1
    return stats


async def wait_caught_up(stream: ASRStream, timeout_s: float = 300.0) -> None:
    """Wait until the engine has taken every complete chunk the stream has received.

    Raises:
        TimeoutError: Still behind after ``timeout_s``.

    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while stream.backlog_ms >= stream.chunk_ms + 16 or stream.in_flight:
        if loop.time() > deadline:
            raise TimeoutError(f"stream still {stream.backlog_ms:.0f} ms behind after {timeout_s} s")
        await asyncio.sleep(0.005)
