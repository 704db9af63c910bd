"""A scripted stand-in for the model runner: the scheduler runs on it without a model (tests, bug hunts).

:class:`FakeRunner` has the real runner's chunk geometry (the real
:class:`~pipecat_nemotron.asr.features.MelFrontend` arithmetic on a 16 kHz, 10 ms hop) and its slot pool's
rules (a stream takes a slot at its first chunk, a step frees released slots before its forwards, a step with no
free slot fails that stream), but its "decoder" emits one token per chunk, chosen from the stream id and the
chunk's position, so every result is known in advance. :class:`FakeEngine` is a :class:`NemotronEngine` that loads
it instead of a model: the whole public API (``open_stream``, ``push``, ``finalize``, ``peek``, ``close``)
runs through the real scheduler, stream and policy.

The runner can fail chosen streams (``fail_streams``) and hold a step on the worker thread until the test lets
it go (``hold``), to place a close or a finalize exactly while a step runs.
"""

from __future__ import annotations

import itertools
import queue
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from pipecat_nemotron.asr.config import validate_latency_ms
from pipecat_nemotron.asr.engine import NemotronEngine
from pipecat_nemotron.asr.eou import NO_MARKERS
from pipecat_nemotron.asr.features import MelFrontend
from pipecat_nemotron.asr.policy import SchedulerPolicy
from pipecat_nemotron.asr.scheduler import run_plan
from pipecat_nemotron.asr.state import StreamState
from pipecat_nemotron.asr.step_plan import ItemOutput, Resolution, StepGroup, StepOutput, StepPlan
from pipecat_nemotron.asr.stream import ASRStream
from pipecat_nemotron.asr.words import WORD_START, WordAligner

#: Token ids of the fake vocabulary (each piece starts a word: ``"▁w0"`` ... ``"▁w31"``).
VOCAB = 32

#: Mel frames of a regular chunk, and of a stream's first chunk, per latency mode (the English model's).
FAKE_MODES: dict[int, tuple[int, int]] = {80: (8, 9), 160: (16, 17), 560: (56, 57), 1120: (112, 113)}


class FakeTokenizer:
    """A SentencePiece-like tokenizer of :data:`VOCAB` one-word pieces."""

    vocab_size = VOCAB

    def ids_to_tokens(self, ids: list[int]) -> list[str]:
        """The pieces of ``ids``."""
        return [f"{WORD_START}w{i}" for i in ids]

    def ids_to_text(self, ids: list[int]) -> str:
        """The text of ``ids``."""
        return " ".join(f"w{i}" for i in ids)


@dataclass(frozen=True)
class FakeShape:
    """Chunk geometry of a fake mode (what the engine reads of :class:`~pipecat_nemotron.asr.modes.ModeShape`)."""

    latency_ms: int
    chunk_frames: int
    first_chunk_frames: int


@dataclass
class FakeStep:
    """What one step was asked to do: ``(latency_ms, first, num_frames, stream ids, peek flags)`` per group."""

    groups: list[tuple[int, bool, int, list[int], list[bool]]]
    releases: list[int]


class _CpuDevice:
    """Where the fake "runs" (the engine reads ``device.type`` and prints the device)."""

    type = "cpu"

    def __str__(self) -> str:
        return "cpu"


@dataclass
class _Slots:
    """The slot pool as the engine reads it (``free_slots.qsize()``)."""

    free_slots: queue.Queue[int]
    held: dict[int, int] = field(default_factory=dict)


def fake_token(stream_id: int, decoded_frames: int, num_frames: int) -> int:
    """The token the fake decoder emits for a chunk: a function of the stream and where the chunk ends.

    Args:
        stream_id: The stream.
        decoded_frames: Mel frames of the stream decoded before the chunk (since it opened, all utterances).
        num_frames: Mel frames of the chunk.

    """
    return (stream_id * 7 + decoded_frames + num_frames) % VOCAB


class FakeRunner:
    """The model runner's interface with a scripted decoder (see the module docstring).

    Args:
        num_slots: Cache slots (the engine's ``max_streams``).

    """

    def __init__(self, num_slots: int = 4) -> None:
        featurizer = SimpleNamespace(hop_length=160, n_fft=512, nfilt=80)
        self.frontend = MelFrontend(SimpleNamespace(featurizer=featurizer), "cpu")  # type: ignore[arg-type]
        self.aligner = WordAligner(FakeTokenizer(), hop_ms=10.0, subsampling=8)
        self.modes = {ms: FakeShape(ms, chunk, first) for ms, (chunk, first) in FAKE_MODES.items()}
        self.prompts = None
        self.markers = NO_MARKERS
        #: No phrase boosting (``boost_phrases`` are refused); any character would be writable.
        self.boost = None
        self.alphabet = None
        self.detect_language = False
        self.device = _CpuDevice()
        self.dtype = "float32"
        self.encoder_step = "fake"
        self.slot_bytes = 0
        self.model = None
        self.num_slots = num_slots
        free: queue.Queue[int] = queue.Queue(num_slots)
        for slot in range(num_slots):
            free.put(slot)
        self.slots = _Slots(free)
        #: Every step run, in order.
        self.steps: list[FakeStep] = []
        #: Mel frames decoded per stream since it opened (peeks excluded).
        self.decoded: dict[int, int] = {}
        #: Most slots held at once.
        self.peak_slots = 0
        #: Streams whose forwards raise.
        self.fail_streams: set[int] = set()
        #: When set: each step waits until it is set (``entered`` tells the test a step is waiting).
        self.hold: threading.Event | None = None
        self.entered = threading.Event()
        #: When set: the next step raises it (a bug outside any one stream's forward).
        self.crash: BaseException | None = None

    def shape(self, latency_ms: int) -> FakeShape:
        """Chunk geometry of a mode."""
        return self.modes[latency_ms]

    def chunk_frames(self, state: StreamState) -> int:
        """Mel frames the stream's next regular chunk needs."""
        mode = self.modes[state.latency_ms]
        return mode.chunk_frames if state.encoder_started else mode.first_chunk_frames

    def detokenize(self, tokens: list[int]) -> str:
        """Text of a token sequence."""
        return FakeTokenizer().ids_to_text(tokens)

    def final_language(self, stream_id: int, evidence: object) -> str | None:
        """No language detection on the fake."""
        return None

    def describe_gpu_path(self) -> dict[str, object]:
        """Nothing runs on a GPU."""
        return {}

    def run_step(self, groups: list[StepGroup], releases: list[int]) -> StepOutput:
        """Free ``releases``, then decode every item: one token per chunk of at least one frame."""
        self.entered.set()
        if self.hold is not None:
            self.hold.wait()
        self.entered.clear()
        if self.crash is not None:
            raise self.crash
        self.steps.append(
            FakeStep(
                [
                    (
                        g.latency_ms,
                        g.items[0].first,
                        g.items[0].num_frames,
                        [it.state.stream_id for it in g.items],
                        [it.peek for it in g.items],
                    )
                    for g in groups
                ],
                list(releases),
            )
        )
        for sid in releases:
            if sid in self.slots.held:
                self.slots.free_slots.put(self.slots.held.pop(sid))
        outputs: dict[int, ItemOutput] = {}
        for group in groups:
            for it in group.items:
                outputs[it.state.stream_id] = self._decode(it.state, it.start_frame, it.num_frames, it.peek)
        self.peak_slots = max(self.peak_slots, len(self.slots.held))
        return StepOutput(1.0, outputs)

    def _decode(self, state: StreamState, start_frame: int, num_frames: int, peek: bool) -> ItemOutput:
        sid = state.stream_id
        if sid in self.fail_streams:
            return ItemOutput(error=RuntimeError(f"scripted failure of stream {sid}"))
        if sid not in self.slots.held:
            if self.slots.free_slots.empty():
                return ItemOutput(error=RuntimeError("no free cache slot"))
            self.slots.held[sid] = self.slots.free_slots.get()
        decoded = self.decoded.get(sid, 0)
        if not peek:
            self.decoded[sid] = decoded + num_frames
        if num_frames <= 0:
            return ItemOutput()
        return ItemOutput([fake_token(sid, decoded, num_frames)], [start_frame + num_frames - 1], [1.0])


class FakeEngine(NemotronEngine):
    """A :class:`NemotronEngine` on a :class:`FakeRunner` (``config.max_streams`` slots; no model is loaded)."""

    def _load(self) -> tuple[FakeRunner, int]:  # type: ignore[override]
        return FakeRunner(self.config.max_streams), 0

    @property
    def fake(self) -> FakeRunner:
        """The runner (after ``start()``)."""
        assert isinstance(self._runner, FakeRunner)
        return self._runner


class ManualOwner:
    """A :class:`~pipecat_nemotron.asr.stream.StreamOwner` over a bare policy: the caller runs each step.

    Streams opened here queue their work as on an engine; nothing runs until the caller calls :meth:`step`
    (or :meth:`plan`, :meth:`run` and :meth:`resolve` apart, to act while a step "runs").

    Args:
        max_batch_size: Most chunks per step.
        slots: Cache slots of the fake runner.
        hard_reset: ``finalize_mode="hard"``.
        max_utterance_s: Longest utterance, seconds.

    """

    def __init__(
        self, max_batch_size: int = 4, slots: int = 4, hard_reset: bool = False, max_utterance_s: Any = None
    ) -> None:
        self.runner = FakeRunner(slots)
        self.policy = SchedulerPolicy(self.runner, max_batch_size, hard_reset, max_utterance_s)
        self.ids = itertools.count(1)
        self.wakes = 0

    # ---- StreamOwner (what an ASRStream calls) -----------------------------------------------------------------------------------

    @property
    def hop_samples(self) -> int:
        """Samples per mel frame."""
        return self.runner.frontend.hop

    def chunk_ms(self, latency_ms: int) -> float:
        """Audio per regular chunk, ms."""
        return self.runner.shape(latency_ms).chunk_frames * 10.0

    def wake(self) -> None:
        """Count the wake-ups (nothing runs until the caller steps)."""
        self.wakes += 1

    def request_latency(self, state: StreamState, latency_ms: int) -> None:
        """Queue a mode change (validated against the fake's modes)."""
        validate_latency_ms(latency_ms, self.runner.modes)
        self.policy.request(state, latency_ms=latency_ms)

    def request_language(self, state: StreamState, language: Any) -> None:
        """Queue a language change (any value: the fake has no prompts)."""
        self.policy.request(state, language=(language, None))

    async def close_stream(self, state: StreamState, error: BaseException | None = None) -> None:
        """Close the stream (its slot is freed by the next step)."""
        self.policy.release(state, error)

    # ---- driving ---------------------------------------------------------------------------------------

    def open(self, latency_ms: int = 160) -> ASRStream:
        """Open a stream (no capacity check: the caller keeps within ``slots``)."""
        state = StreamState(stream_id=next(self.ids), latency_ms=latency_ms)
        stream = ASRStream(self, state)
        self.policy.add(state, stream.updates_queue.put, stream.updates_queue.close)
        return stream

    def run(self, plan: StepPlan) -> StepOutput:
        """The worker half of a step (as the scheduler task runs it)."""
        return run_plan(self.runner, plan) if plan.runs_model else StepOutput()

    def resolve(self, plan: StepPlan, output: StepOutput) -> Resolution:
        """The loop half of a step: resolve and deliver the updates."""
        done = self.policy.resolve(plan, output)
        for entry, update in done.updates:
            entry.push(update)
        return done

    def plan(self) -> StepPlan:
        """The loop's first half of a step: pick the work."""
        return self.policy.plan()

    def step(self) -> tuple[StepPlan, Resolution]:
        """One whole step."""
        plan = self.policy.plan()
        return plan, self.resolve(plan, self.run(plan))

    def run_until_idle(self, limit: int = 10_000) -> list[StepPlan]:
        """Step until a plan is empty; returns the plans that had work.

        Raises:
            AssertionError: Still busy after ``limit`` steps.

        """
        plans = []
        for _ in range(limit):
            plan, _ = self.step()
            if plan.empty:
                return plans
            plans.append(plan)
        raise AssertionError(f"the policy still had work after {limit} steps")
