"""Validated, init-only configuration of the streaming engine and the latency-mode table."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from pipecat_nemotron.asr.boosting import (
    DEFAULT_BOOST_ALPHA,
    DEFAULT_MAX_BOOST_PHRASE_CHARS,
    DEFAULT_MAX_BOOST_PHRASES,
    validate_boost_alpha,
    validate_boost_phrases,
    validate_limits,
)
from pipecat_nemotron.runtime.gil import DEFAULT_SWITCH_INTERVAL_MS, check_switch_interval

#: The default model: NVIDIA's cache-aware streaming English ASR (600M FastConformer-RNNT).
DEFAULT_MODEL = "nvidia/nemotron-speech-streaming-en-0.6b"

#: NVIDIA's multilingual sibling (40 locales, language per stream or ``auto``, adds a 320 ms mode).
MULTILINGUAL_MODEL = "nvidia/nemotron-3.5-asr-streaming-0.6b"

#: Encoder frame length of the Nemotron streaming family, ms (10 ms mel hop x 8x subsampling).
ENCODER_FRAME_MS = 80

#: The English model's latency modes (chunk length in ms) -> right attention context, in 80 ms encoder frames.
#: The engine reads a loaded model's modes from its ``att_context_size`` list (a mode of right context ``R``
#: is ``(R + 1) * 80`` ms); this table is the default of tools that run before a model is loaded.
LATENCY_MODES: dict[int, int] = {80: 0, 160: 1, 560: 6, 1120: 13}

#: Left attention context of the English model's modes, in encoder frames (its cache length). The
#: multilingual model's 320 ms mode has 56.
LEFT_CONTEXT_FRAMES = 70

#: Longest latency mode accepted before a model is loaded, ms (the family's longest is 1120 ms).
MAX_LATENCY_MS = 4000

#: Bounds of ``EngineConfig.max_utterance_s``, seconds (the shortest leaves room for the longest chunk, 1.12 s).
MIN_UTTERANCE_LIMIT_S = 2.0
MAX_UTTERANCE_LIMIT_S = 3600.0

FinalizeMode = Literal["soft", "hard"]
EncoderStep = Literal["fast", "nemo"]


def validate_latency_ms(latency_ms: int, modes: Iterable[int] | None = None) -> int:
    """Return ``latency_ms`` if it names a latency mode.

    Args:
        latency_ms: Chunk length of the mode, ms.
        modes: The loaded model's modes, ms. None (no model loaded yet): any multiple of 80 ms up to
            :data:`MAX_LATENCY_MS` (the loaded model checks it again when the engine starts).

    Raises:
        ValueError: Naming the allowed values.

    """
    if modes is not None:
        allowed = sorted(modes)
        if not isinstance(latency_ms, int) or isinstance(latency_ms, bool) or latency_ms not in allowed:
            raise ValueError(
                f"latency_ms must be one of the loaded model's modes {allowed} (ms), got {latency_ms!r}"
            )
        return latency_ms
    if (
        not isinstance(latency_ms, int)
        or isinstance(latency_ms, bool)
        or not ENCODER_FRAME_MS <= latency_ms <= MAX_LATENCY_MS
        or latency_ms % ENCODER_FRAME_MS
    ):
        raise ValueError(
            f"latency_ms must be a multiple of {ENCODER_FRAME_MS} ms that the model offers (the English model: "
            f"{sorted(LATENCY_MODES)}; the multilingual one adds 320), got {latency_ms!r}"
        )
    return latency_ms


def default_cpu_threads() -> int:
    """Intra-op threads (torch) of an engine on CPU whose config names none: half the usable cores, at least 1.

    The other half is left to the event loop (VAD, transport, the pipeline) and to other processes: threads
    that outnumber the idle cores make every step wait for the slowest, descheduled one.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // 2)


@dataclass(frozen=True)
class EngineConfig:
    """Init-only settings of a :class:`~pipecat_nemotron.asr.NemotronEngine`.

    Attributes:
        model: A local ``.nemo`` path or a Hugging Face model id.
        model_revision: Git revision (commit hash or tag) of a model id; pin it in production, since the
            ``main`` checkpoint of the Nemotron model has changed over time. Ignored for local paths.
        device: ``"auto"`` (CUDA if present, else CPU with a warning), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        dtype: ``"auto"`` (bf16 on GPU, fp32 on CPU), ``"float32"``, ``"bfloat16"``, ``"float16"``, or
            ``"int8"`` (CPU only: fp32 with the encoder's feed-forward Linear layers, two thirds of its weights,
            quantised to int8 by torch's dynamic quantisation; see docs/BENCHMARKS.md section 13).
        max_streams: Concurrent streams (preallocated cache slots). One more ``open_stream`` raises
            :class:`~pipecat_nemotron.asr.errors.CapacityError`.
        max_batch_size: Most stream chunks in one batched model step.
        default_latency_ms: Latency mode of streams opened without one, ms: one of the loaded model's modes (the
            English model: 80, 160, 560, 1120; the multilingual one adds 320), checked when the model loads.
        default_language: Language of streams opened without one, on a multilingual model: a locale of the
            model's prompt dictionary (``"es-ES"``), a bare language (``"es"``) or ``"auto"``. None: ``"auto"``
            if the model has it. An English-only model accepts only English (or None).
        detect_language: At the final of an utterance decoded with ``"auto"``, score the words under each locale's
            prompt and report the best as ``detected_language`` (:mod:`~pipecat_nemotron.asr.language_id`;
            for the 600M model and 40 locales about 52 GFLOP per 10 s utterance, ~34% of the encoder FLOPs of that
            audio; it runs inside the step that produces the final, which it delays: 0.65-0.9 s on one CPU core,
            ``docs/BENCHMARKS.md`` section 8). Only ``auto`` streams pay it. False: ``detected_language`` stays None.
        finalize_mode: ``"soft"`` keeps encoder caches and decoder state across utterances of a stream
            (context carries over, cheaper); ``"hard"`` resets them after each final (each utterance is
            decoded exactly as if it were a clip of its own).
        warmup: Run a few steps in every mode at ``start()`` so the first user does not pay for it.
        cpu_threads: On CPU, torch's intra-op threads for the model (set on the engine's model thread at
            ``start()``; threads torch creates later inherit it). None: :func:`default_cpu_threads`, half the
            cores this process may use (at least 1). More threads than idle cores make a step wait for
            descheduled threads: on 2 cores beside a busy process, torch's default (all cores) turned a 10 ms
            finalize into seconds (``docs/BENCHMARKS.md``). Ignored on CUDA.
        encoder_step: ``"fast"`` runs our encoder step (:mod:`pipecat_nemotron.asr.fast_step`: cached
            projected K/V, reused positional projections, matmul convolutions; same output as NeMo's, twice
            the attention cache per stream); ``"nemo"`` runs NeMo's ``cache_aware_stream_step`` (for
            comparison, or for encoders the fast step does not support).
        cuda_graphs: On CUDA, replay the fast step from CUDA graphs captured per mode, chunk shape and batch
            bucket (1, 2, 4, ... ``max_batch_size``) on first use; shapes that fail to capture run eagerly.
            Ignored on CPU and with ``encoder_step="nemo"``.
        cuda_graph_decoder: On CUDA, use NeMo's CUDA-graph greedy RNNT decoder. Off by default (NeMo issue
            15640 reports crashes with it; the reference agent disables it on Blackwell); if it raises, the
            engine logs a warning and switches to the plain label-looping decoder for good.
        word_timings: Words with timings and confidence on every transcript (NeMo's token confidence in the
            decoder, words assembled after each step). False: ``words`` stay empty and ``confidence`` None;
            it saves about 3% of a small CPU step (``docs/BENCHMARKS.md``).
        word_timing_offsets_ms: ``(start, end)`` corrections added to word starts and ends, ms: an RNNT emits
            a word's tokens some frames after the word's audio. None: the offsets measured for the model
            (:data:`~pipecat_nemotron.asr.words.MEASURED_CALIBRATIONS`: the bundled tiny model), else
            ``(0, 0)`` (NeMo's own convention: a word starts at its first token's frame). Measure your model's
            with ``scripts/eval_word_timings.py --raw`` (see ``docs/TRANSCRIPTS.md``).
        max_utterance_s: Longest utterance, seconds (from :data:`MIN_UTTERANCE_LIMIT_S` to
            :data:`MAX_UTTERANCE_LIMIT_S`). Every partial, peek and final carries its whole utterance, so an
            utterance that reaches this much decoded audio without a ``finalize()`` is split: the words before a
            pause near the limit are delivered as a final of their own (``Transcript.forced``), and the
            speech goes on as the next utterance, decoded without interruption (no word lost or changed; see
            :mod:`~pipecat_nemotron.asr.splits`). At 60 s a final with word timings stays under 20 KB. None:
            no limit.
        default_boost_phrases: Phrases boosted on streams opened without ``boost_phrases`` (names, product
            words; :mod:`~pipecat_nemotron.asr.boosting`). Spell and case them as the model writes them: the
            Nemotron models write cased, punctuated text, the bundled tiny model lower case. Checked against the
            model's characters when it loads. Empty: streams are not boosted unless they ask.
        default_boost_alpha: Weight of the boost of streams that give no ``boost_alpha``, in (0, 10]
            (:data:`~pipecat_nemotron.asr.boosting.DEFAULT_BOOST_ALPHA`, 1.0: NeMo's default weight).
        max_boost_phrases: Most phrases per stream (default 1,000). Above 0 the decoder holds NeMo's per-stream
            biasing multi-model (~68 MB preallocated on the model's device; <0.5% of a 600M CPU step,
            ``docs/BENCHMARKS.md`` section 15). 0 turns phrase boosting off: the decoder is built without it and
            ``boost_phrases`` are refused.
        max_boost_phrase_chars: Longest phrase, characters (default 64).
        eou: End-of-utterance events on streams opened without ``eou``: a model that emits ``<EOU>``
            (``nvidia/parakeet_realtime_eou_120m-v1``; :mod:`~pipecat_nemotron.asr.eou`) says where each
            utterance ends, and the stream's updates carry it as an ``"eou"`` record. A model without the token
            fails the load when this is True. The token is never part of any text, whatever this says.
        gil_switch_interval_ms: At ``start()``, lower Python's thread switch interval (process-wide, never
            raised) to this many ms (:mod:`~pipecat_nemotron.runtime.gil`): the model thread takes the GIL back
            after each torch op within this time while the event loop runs Python. CPython's 5 ms default made
            ASR finalizes take seconds with 8 sessions in one process on 2 loaded vCPUs (``docs/BENCHMARKS.md`` §12).
            None: leave the interval as it is.

    """

    model: str = DEFAULT_MODEL
    model_revision: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    max_streams: int = 64
    max_batch_size: int = 32
    default_latency_ms: int = 160
    default_language: str | None = None
    detect_language: bool = True
    finalize_mode: FinalizeMode = "soft"
    warmup: bool = True
    cpu_threads: int | None = None
    encoder_step: EncoderStep = "fast"
    cuda_graphs: bool = True
    cuda_graph_decoder: bool = False
    word_timings: bool = True
    word_timing_offsets_ms: tuple[float, float] | None = None
    max_utterance_s: float | None = 60.0
    default_boost_phrases: tuple[str, ...] = ()
    default_boost_alpha: float = DEFAULT_BOOST_ALPHA
    max_boost_phrases: int = DEFAULT_MAX_BOOST_PHRASES
    max_boost_phrase_chars: int = DEFAULT_MAX_BOOST_PHRASE_CHARS
    gil_switch_interval_ms: float | None = DEFAULT_SWITCH_INTERVAL_MS
    eou: bool = False

    def __post_init__(self) -> None:
        _check_eou(self.eou)
        check_switch_interval(self.gil_switch_interval_ms)
        self._check_boosting()
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError("model must be a .nemo path or a model id such as " + repr(DEFAULT_MODEL))
        if self.dtype not in ("auto", "float32", "bfloat16", "float16", "int8"):
            raise ValueError(
                f"dtype must be one of 'auto', 'float32', 'bfloat16', 'float16', 'int8', got {self.dtype!r}"
            )
        if self.dtype == "int8" and self.device != "cpu":
            raise ValueError(
                f"dtype='int8' runs on the CPU only (torch's dynamic quantisation): set device='cpu', got "
                f"{self.device!r}"
            )
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if not isinstance(self.max_streams, int) or self.max_streams < 1:
            raise ValueError(f"max_streams must be a positive int, got {self.max_streams!r}")
        if not isinstance(self.max_batch_size, int) or self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be a positive int, got {self.max_batch_size!r}")
        if self.cpu_threads is not None and (
            not isinstance(self.cpu_threads, int) or isinstance(self.cpu_threads, bool) or self.cpu_threads < 1
        ):
            raise ValueError(
                f"cpu_threads must be a positive int or None (half the cores), got {self.cpu_threads!r}"
            )
        if self.finalize_mode not in ("soft", "hard"):
            raise ValueError(f"finalize_mode must be 'soft' or 'hard', got {self.finalize_mode!r}")
        if self.encoder_step not in ("fast", "nemo"):
            raise ValueError(f"encoder_step must be 'fast' or 'nemo', got {self.encoder_step!r}")
        validate_latency_ms(self.default_latency_ms)
        if self.default_language is not None and (
            not isinstance(self.default_language, str) or not self.default_language.strip()
        ):
            raise ValueError(
                f"default_language must be a locale such as 'es-ES', a language such as 'es', 'auto' or None, "
                f"got {self.default_language!r}"
            )
        _check_max_utterance_s(self.max_utterance_s)
        offsets = self.word_timing_offsets_ms
        if offsets is not None and (
            len(offsets) != 2 or not all(isinstance(v, (int, float)) and abs(v) < 10_000 for v in offsets)
        ):
            raise ValueError(
                f"word_timing_offsets_ms must be (start_ms, end_ms) within +-10 s, got {offsets!r}"
            )

    def _check_boosting(self) -> None:
        """Validate the boosting fields; store the default phrases normalised, as a tuple.

        Raises:
            ValueError: Naming the field and the limit (a :class:`~.errors.BoostPhraseError` for the phrases).

        """
        validate_limits(self.max_boost_phrases, self.max_boost_phrase_chars)
        validate_boost_alpha(self.default_boost_alpha)
        phrases = validate_boost_phrases(
            self.default_boost_phrases, max_phrases=self.max_boost_phrases, max_chars=self.max_boost_phrase_chars
        )
        object.__setattr__(self, "default_boost_phrases", phrases)


def _check_max_utterance_s(value: float | None) -> None:
    """Refuse a ``max_utterance_s`` outside its bounds, naming them.

    Raises:
        ValueError: Naming the bounds.

    """
    if value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not MIN_UTTERANCE_LIMIT_S <= value <= MAX_UTTERANCE_LIMIT_S
    ):
        raise ValueError(
            f"max_utterance_s must be seconds from {MIN_UTTERANCE_LIMIT_S:g} to {MAX_UTTERANCE_LIMIT_S:g} "
            f"(or None for no limit), got {value!r}"
        )


def _check_eou(value: object) -> None:
    """Refuse an ``eou`` that is not a bool.

    Raises:
        ValueError: Naming the values allowed.

    """
    if not isinstance(value, bool):
        raise ValueError(f"eou must be True or False, got {value!r}")
