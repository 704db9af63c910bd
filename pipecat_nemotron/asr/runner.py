"""The batched cache-aware model step. Runs only on the scheduler's single worker thread.

One call of :meth:`ModelRunner.run_step` executes every group of a step: for each group (streams of one
latency mode and chunk shape) it computes exact mel features, gathers the streams' encoder caches from NeMo's
slot pool (:class:`~nemo.collections.asr.inference.utils.context_manager.CacheAwareContextManager`), runs one
batched encoder step (ours, :class:`~pipecat_nemotron.asr.fast_step.FastEncoderStep`, or NeMo's
``cache_aware_stream_step``), one batched greedy RNNT decode, and writes the caches back. It returns the new tokens as a
:class:`~pipecat_nemotron.asr.step_plan.StepOutput` with each stream's next decoder state: the runner reads stream state and
never writes it (the policy applies the output between steps).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from loguru import logger

from pipecat_nemotron.asr.audio import SAMPLES_PER_MS
from pipecat_nemotron.asr.boost_models import BoostModels, biasing_multi_model
from pipecat_nemotron.asr.boosting import model_alphabet
from pipecat_nemotron.asr.config import EncoderStep
from pipecat_nemotron.asr.cuda_graphs import GraphedEncoderStep
from pipecat_nemotron.asr.eou import MarkerTokens
from pipecat_nemotron.asr.fast_step import FastEncoderStep, UnsupportedEncoderError, nemo_encoder_step
from pipecat_nemotron.asr.features import MelFrontend
from pipecat_nemotron.asr.language_id import UtteranceEvidence, alignment_scores
from pipecat_nemotron.asr.languages import AUTO, LanguagePrompts
from pipecat_nemotron.asr.modes import ModeShape, left_pad, mode_shapes, tail_context
from pipecat_nemotron.asr.state import StreamState
from pipecat_nemotron.asr.step_plan import ItemOutput, StepGroup, StepItem, StepOutput
from pipecat_nemotron.asr.words import WordAligner


class ModelRunner:
    """Owns the model, the feature frontend and the cache slot pool.

    Args:
        model: A loaded, validated cache-aware RNNT model (see :func:`~pipecat_nemotron.asr.loading.load_asr_model`).
        num_slots: Cache slots to preallocate (the engine's ``max_streams``).
        device: The model's device.
        dtype: The encoder's dtype.
        encoder_step: ``"fast"`` (ours; falls back to NeMo's with a warning for an encoder it does not
            support) or ``"nemo"``.
        max_batch: Most streams in one step (the largest CUDA-graph bucket).
        cuda_graphs: Replay the fast step from CUDA graphs (CUDA only).
        cuda_graph_decoder: Use NeMo's CUDA-graph RNNT decoder, falling back to the plain one if it raises.

    """

    def __init__(
        self,
        model: Any,
        num_slots: int,
        device: torch.device,
        dtype: torch.dtype,
        encoder_step: EncoderStep = "fast",
        max_batch: int = 32,
        cuda_graphs: bool = True,
        cuda_graph_decoder: bool = False,
    ) -> None:
        from nemo.collections.asr.inference.utils.context_manager import CacheAwareContextManager

        self.model = model
        self.device = device
        self.dtype = dtype
        self.frontend = MelFrontend(model.preprocessor, device)
        #: Mel frames per encoder frame.
        self.subsampling = int(getattr(model.encoder, "subsampling_factor", 8))
        #: Groups an utterance's tokens into timed words.
        self.aligner = WordAligner(model.tokenizer, self.frontend.hop / SAMPLES_PER_MS, self.subsampling)
        #: The model's end-of-utterance markers (``<EOU>``, ``<EOB>``): taken out of every step's tokens.
        self.markers = MarkerTokens.from_tokenizer(model.tokenizer)
        #: The model's language prompts (None: a model without them, such as the English one).
        self.prompts = LanguagePrompts.from_model(model)
        #: Detect the language of ``auto`` utterances (a model with prompts for more than one locale).
        self.detect_language = self.prompts is not None and len(self.prompts.languages) > 1
        self.modes: dict[int, ModeShape] = mode_shapes(model.encoder)
        #: The streams' boosting trees (None: the decoder has no per-stream biasing, see :mod:`.boost_models`).
        self.boost = BoostModels(model) if biasing_multi_model(model) is not None else None
        #: Characters the model's tokenizer can write (None: any), to refuse boost phrases it could never match.
        vocab = getattr(model.tokenizer, "vocab", None)  # a tokenizer without a piece list: any character
        self.alphabet = model_alphabet(list(vocab)) if vocab is not None else None
        # The slot pool and the fast step are sized by the longest left context; the others use its tail.
        self.max_left = max(m.left_context for m in self.modes.values())
        widest = max(self.modes.values(), key=lambda m: (m.left_context, -m.latency_ms))
        model.encoder.set_default_att_context_size([widest.left_context, widest.right_context])
        self._active_mode: int | None = widest.latency_ms
        #: Called with ``(stream_ids, encoded [B, D, T], encoded_len [B])`` after every encoder step.
        self.encoder_output_hook: Callable[[list[int], torch.Tensor, torch.Tensor], None] | None = None
        self.fast_step: FastEncoderStep | None = None
        if encoder_step == "fast":
            try:
                self.fast_step = FastEncoderStep(model.encoder)
            except UnsupportedEncoderError as e:
                logger.warning(f"{e}: running NeMo's encoder step instead")
        #: The encoder step that runs: ``"fast"`` or ``"nemo"``.
        self.encoder_step: EncoderStep = "fast" if self.fast_step is not None else "nemo"
        self._encoder_fn: FastEncoderStep | GraphedEncoderStep | None = self.fast_step
        if self.fast_step is not None and cuda_graphs and device.type == "cuda":
            self._encoder_fn = GraphedEncoderStep(self.fast_step, max_batch)
        self._cuda_graph_decoder = False
        if cuda_graph_decoder and device.type == "cuda":
            self._set_cuda_graph_decoder(True)
        self.slots = CacheAwareContextManager(self.fast_step or model.encoder, num_slots=num_slots)
        for name in ("cache_last_channel", "cache_last_time"):
            setattr(self.slots, name, getattr(self.slots, name).to(device=device, dtype=dtype))
        keeps = {m.pre_encode_cache_frames for m in self.modes.values()}
        if len(keeps) != 1:
            raise ValueError(f"modes disagree on the pre-encode cache size: {sorted(keeps)}")
        #: Last mel frames of each slot's previous chunk, prepended to its next chunk: [slots, features, frames].
        self.pre_encode_cache = torch.zeros(
            num_slots, self.frontend.num_features, keeps.pop(), device=device, dtype=torch.float32
        )
        self.slot_bytes = self.pre_encode_cache[0].numel() * 4 + sum(
            t[:, :1].numel() * t.element_size()
            for t in (self.slots.cache_last_channel, self.slots.cache_last_time)
        )

    def shape(self, latency_ms: int) -> ModeShape:
        """Chunk geometry of a latency mode."""
        return self.modes[latency_ms]

    def chunk_frames(self, state: StreamState) -> int:
        """Mel frames the stream's next regular chunk needs."""
        mode = self.modes[state.latency_ms]
        return mode.chunk_frames if state.encoder_started else mode.first_chunk_frames

    def _set_mode(self, latency_ms: int) -> None:
        # The attention context is global to the encoder object; only this thread changes it.
        if self._active_mode != latency_ms:
            mode = self.modes[latency_ms]
            self.model.encoder.set_default_att_context_size([mode.left_context, mode.right_context])
            self._active_mode = latency_ms

    def release(self, stream_ids: list[int]) -> None:
        """Zero and free the cache slots of these streams (ids without a slot are ignored)."""
        if self.boost is not None:
            self.boost.release(stream_ids)
        held = [sid for sid in stream_ids if sid in self.slots.streamidx2slotidx]
        if held:
            self.slots.reset_slots(held, [True] * len(held))

    @torch.inference_mode()
    def run_step(self, groups: list[StepGroup], releases: list[int]) -> StepOutput:
        """Run one engine step: release slots, then one batched forward per group.

        A group whose batched forward raises is retried one stream at a time, so a stream that fails does so
        alone (its output carries the ``error``); the other streams' results are unaffected.

        Returns:
            Each item's new tokens (by stream id) and the step's wall time.

        """
        start = time.perf_counter()
        if releases:
            self.release(releases)
        outputs: dict[int, ItemOutput] = {}
        for group in groups:
            try:
                outputs.update(self._forward(group.latency_ms, group.items))
            except Exception as batch_error:  # isolate the failing stream(s)
                if len(group.items) == 1:
                    outputs[group.items[0].state.stream_id] = ItemOutput(error=batch_error)
                    continue
                logger.warning(f"Batched ASR step failed ({batch_error!r}); retrying its streams one by one")
                for item in group.items:
                    try:
                        outputs.update(self._forward(group.latency_ms, [item]))
                    except Exception as e:
                        outputs[item.state.stream_id] = ItemOutput(error=e)
        if self.boost is not None:
            self.boost.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return StepOutput((time.perf_counter() - start) * 1000.0, outputs)

    def _forward(self, latency_ms: int, items: list[StepItem]) -> dict[int, ItemOutput]:
        """One batched forward of items that share a mode and chunk shape; their outputs by stream id."""
        from nemo.collections.asr.inference.utils.context_manager import CacheAwareContext

        mode = self.modes[latency_ms]
        first = items[0].first
        num_frames = [it.num_frames for it in items]
        feats = self.frontend.compute([it.segment for it in items], num_frames)
        stream_ids = [it.state.stream_id for it in items]
        context, mapping = self.slots.get_context(stream_ids)  # assigns slots to new streams
        slot_index = torch.tensor(
            [self.slots.streamidx2slotidx[sid] for sid in stream_ids], device=self.device, dtype=torch.long
        )
        if first:
            cache = None
            signal, lengths, drop = feats, torch.tensor(num_frames, device=self.device), 0
        else:
            cache = self.pre_encode_cache.index_select(0, slot_index)
            signal = torch.cat((cache, feats), dim=-1)
            lengths = torch.tensor([cache.size(-1) + n for n in num_frames], device=self.device)
            drop = mode.drop_extra_pre_encoded
        previous, dec_states = self._previous_hypotheses(items)
        self._set_mode(latency_ms)
        # The encoder half of NeMo's ``conformer_stream_step`` and the decoder half are called separately so
        # the encoder output can be observed (``encoder_output_hook``, used by the equivalence tests).
        encoded, encoded_len, cache_channel, cache_time, cache_channel_len = self._encode(
            signal.to(self.dtype),
            lengths,
            tail_context(context, mode.left_context),
            drop,
            mode.right_context,
        )
        unprompted = encoded
        if self.prompts is not None:
            encoded = self.apply_prompts(encoded, [it.state.prompt_index for it in items])
        if self.encoder_output_hook is not None:
            self.encoder_output_hook(stream_ids, encoded, encoded_len)
        hyps = self._decode(encoded, encoded_len, previous)
        context = CacheAwareContext(left_pad(cache_channel, self.max_left), cache_time, cache_channel_len)
        self._keep_caches(items, context, mapping, slot_index, cache, feats[:, :, : num_frames[0]])
        # Encoder frame j of the chunk covers the mel frames up to (chunk start - pre-encode cache) + S*(j + drop)
        # (causal 8x subsampling, S = 8): the offset of this chunk's frame grid from its first mel frame.
        grid = (0 if first else -mode.pre_encode_cache_frames) + self.subsampling * drop
        lengths = encoded_len.tolist()
        outputs: dict[int, ItemOutput] = {}
        for row, (it, hyp, dec_state, tokens, frames, length) in enumerate(
            zip(items, hyps, dec_states, _token_lists(hyps), _frame_lists(hyps), lengths, strict=True)
        ):
            # NeMo counts a token's frame from the first frame decoded with this decoder state.
            base = it.state.decoded_frames if dec_state is not None else 0
            confidence, eou_frame = _confidence_list(hyp, len(tokens)), None
            if self.markers.markers:  # markers leave the tokens; the decoder state keeps them, as trained
                tokens, frames, confidence, eou_frame = self.markers.split(tokens, frames, confidence)
            out = ItemOutput(
                tokens,
                [it.start_frame + grid + self.subsampling * (t - base) for t in frames],
                confidence,
                dec_state=dec_state,  # a peek leaves its stream's decoder where it was (bar a new boost tree)
                decoded_frames=it.state.decoded_frames,
                eou_frame=None if eou_frame is None else it.start_frame + grid + self.subsampling * (eou_frame - base),
            )
            if not it.peek:
                out.dec_state, out.decoded_frames = hyp.dec_state, base + int(length)
                if it.state.language == AUTO and self.detect_language:
                    self._detect_language(
                        it, out, unprompted[row, :, : int(length)], tokens, [t - base for t in frames]
                    )
            outputs[it.state.stream_id] = out
        return outputs

    def _previous_hypotheses(self, items: list[StepItem]) -> tuple[list[Any], list[Any]]:
        """Each stream's hypothesis to continue (its decoder state and, if it is boosted, its tree's id).

        Returns:
            The hypotheses (None for a stream at the start of its sequence without a boost: NeMo starts it after
            ``<SOS>``), and each stream's decoder state they continue from: its own, or, where its boost list
            changed, that state at the new tree's start. The tree binding is the runner's, so a peek keeps that
            change too (the stream's next forward would make the same one).

        """
        from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis

        previous: list[Any] = []
        dec_states: list[Any] = []
        for it in items:
            state, biasing, dec_state = it.state, None, it.state.dec_state
            if self.boost is not None:
                biasing, dec_state = self.boost.prepare(state.stream_id, state.boost, dec_state)
            dec_states.append(dec_state)
            if dec_state is None and biasing is None:
                previous.append(None)
                continue
            previous.append(
                Hypothesis(score=0.0, y_sequence=None, dec_state=dec_state, timestamp=None, biasing_cfg=biasing)
            )
        return previous, dec_states

    def _detect_language(
        self, it: StepItem, out: ItemOutput, encoded: torch.Tensor, tokens: list[int], frames: list[int]
    ) -> None:
        """Keep an ``auto`` stream's step output in ``out``; at its utterance's final, say which language it was.

        Args:
            it: The stream's item (not a peek).
            out: Its output, which gets the extended evidence (and, at a final, the detected language).
            encoded: Its encoder output before the prompt ``[D, t]``.
            tokens: Its new tokens.
            frames: Each new token's frame within ``encoded``.

        """
        assert self.prompts is not None
        out.evidence = (it.state.evidence or UtteranceEvidence()).plus(encoded, tokens, frames)
        if it.final:
            out.detected_language = self.final_language(it.state.stream_id, out.evidence)

    def final_language(self, stream_id: int, evidence: UtteranceEvidence | None) -> str | None:
        """The locale an ``auto`` utterance was in, from its evidence (at its final; worker thread only).

        Returns:
            The locale, or None (no evidence, a model without prompts, or a detection that failed: logged).

        """
        if self.prompts is None or evidence is None:
            return None
        languages = self.prompts.languages
        try:
            scores = alignment_scores(
                self.model, evidence, [self.prompts.index(k) for k in languages], self.prompts.num_prompts
            )
        except Exception as e:  # the transcript stands without a detected language; say why
            logger.warning(f"ASR stream {stream_id}: language detection failed ({e!r}); no detected_language")
            return None
        return None if scores is None else languages[int(scores.argmax())]

    def _keep_caches(
        self,
        items: list[StepItem],
        context: Any,
        mapping: dict[int, int],
        slot_index: torch.Tensor,
        cache: torch.Tensor | None,
        chunk: torch.Tensor,
    ) -> None:
        """Write the step's next encoder caches and pre-encode caches back to the slots, except for peeks.

        Args:
            items: The forward's items (a peek's caches are computed on copies and dropped).
            context: The next encoder caches of all items, in item order.
            mapping: Slot to row of ``context`` (from ``get_context``).
            slot_index: Slot of each item ``[B]``.
            cache: The pre-encode caches the chunks were given ``[B, features, frames]`` (None on first chunks).
            chunk: The chunks' own mel frames ``[B, features, frames]`` (all items share the length).

        """
        kept = [i for i, it in enumerate(items) if not it.peek]
        if not kept:
            return
        self.slots.update_cache([items[i].state.stream_id for i in kept], context, mapping)
        # Next pre-encode cache: the last mel frames seen by each stream.
        keep = self.pre_encode_cache.size(-1)
        merged = chunk if cache is None else torch.cat((cache, chunk), dim=-1)
        if merged.size(-1) < keep:
            merged = torch.nn.functional.pad(merged, (keep - merged.size(-1), 0))
        if len(kept) < len(items):
            rows = torch.tensor(kept, device=self.device, dtype=torch.long)
            slot_index, merged = slot_index.index_select(0, rows), merged.index_select(0, rows)
        self.pre_encode_cache.index_copy_(0, slot_index, merged[:, :, -keep:])

    def _encode(
        self, signal: torch.Tensor, lengths: torch.Tensor, context: Any, drop: int, right_context: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One batched encoder step; returns the output, its lengths and the three next caches."""
        if self._encoder_fn is not None:
            return self._encoder_fn(
                signal,
                lengths,
                context.cache_last_channel,
                context.cache_last_time,
                context.cache_last_channel_len,
                drop_extra_pre_encoded=drop,
                right_context=right_context,
            )
        return nemo_encoder_step(
            self.model.encoder,
            signal,
            lengths,
            context.cache_last_channel,
            context.cache_last_time,
            context.cache_last_channel_len,
            drop_extra_pre_encoded=drop,
        )

    def apply_prompts(self, encoded: torch.Tensor, indices: list[int | None]) -> torch.Tensor:
        """Join each stream's language one-hot to its encoder frames and project back (``prompt_kernel``).

        As the prompt class's ``forward`` does offline, with a language per row.

        Args:
            encoded: Encoder output ``[B, D, T]``.
            indices: One-hot index of each row's language.

        Returns:
            The conditioned output ``[B, D, T]``.

        """
        assert self.prompts is not None
        if any(i is None for i in indices):
            raise ValueError("a stream of a multilingual model has no language prompt")
        rows = torch.tensor(indices, device=encoded.device, dtype=torch.long)
        one_hot = torch.nn.functional.one_hot(rows, self.prompts.num_prompts).to(encoded.dtype)
        frames = encoded.transpose(1, 2)  # [B, T, D]
        prompt = one_hot[:, None, :].expand(-1, frames.size(1), -1)
        joined = torch.cat((frames, prompt), dim=-1)
        return self.model.prompt_kernel(joined).to(encoded.dtype).transpose(1, 2)

    def _decode(self, encoded: torch.Tensor, encoded_len: torch.Tensor, previous: list[Any]) -> list[Any]:
        """Batched greedy RNNT decode continuing each stream's hypothesis."""

        def decode() -> list[Any]:  # looks up model.decoding anew: a fallback replaces it
            return self.model.decoding.rnnt_decoder_predictions_tensor(
                encoder_output=encoded,
                encoded_lengths=encoded_len,
                return_hypotheses=True,
                partial_hypotheses=previous,
            )

        try:
            return decode()
        except Exception as e:
            if not self._cuda_graph_decoder:
                raise
            logger.warning(
                f"NeMo's CUDA-graph RNNT decoder failed ({e!r}); using the plain label-looping decoder"
            )
            self._set_cuda_graph_decoder(False)
        return decode()

    def _set_cuda_graph_decoder(self, on: bool) -> None:
        from omegaconf import open_dict

        from pipecat_nemotron.runtime.nemo_logs import quiet_nemo

        decoding_cfg = self.model.cfg.decoding
        with open_dict(decoding_cfg):
            decoding_cfg.greedy.use_cuda_graph_decoder = on
        # Outside inference mode: the new decoder's biasing multi-model is edited in place when trees come and go.
        with torch.inference_mode(False), quiet_nemo():
            self.model.change_decoding_strategy(decoding_cfg, verbose=False)
        self._cuda_graph_decoder = on
        logger.info(f"NeMo's CUDA-graph RNNT decoder {'on' if on else 'off'}")

    def describe_gpu_path(self) -> dict[str, Any]:
        """What the GPU path runs: encoder step, CUDA graphs captured (count, memory), CUDA-graph decoder."""
        graphs = self._encoder_fn.describe() if isinstance(self._encoder_fn, GraphedEncoderStep) else None
        return {
            "encoder_step": self.encoder_step,
            "cuda_graphs": graphs,
            "cuda_graph_decoder": self._cuda_graph_decoder,
        }

    def detokenize(self, tokens: list[int]) -> str:
        """Text of a token sequence."""
        if not tokens:
            return ""
        return self.model.tokenizer.ids_to_text(tokens)


def _token_lists(hyps: list[Any]) -> list[list[int]]:
    """New token ids of each hypothesis."""
    return _host_int_lists([h.y_sequence for h in hyps])


def _frame_lists(hyps: list[Any]) -> list[list[int]]:
    """Encoder frame of each new token of each hypothesis (NeMo's ``Hypothesis.timestamp``)."""
    return _host_int_lists([h.timestamp for h in hyps])


def _host_int_lists(values: list[Any]) -> list[list[int]]:
    """Per-hypothesis tensors or lists (None: empty) as int lists, with one device-to-host copy for the batch."""
    sequences = [
        v.reshape(-1) if isinstance(v, torch.Tensor) else torch.tensor(v or [], dtype=torch.long)
        for v in values
    ]
    if not sequences:
        return []
    device = sequences[0].device
    flat = torch.cat([seq.to(device=device, dtype=torch.long) for seq in sequences]).tolist()
    out, offset = [], 0
    for seq in sequences:
        out.append(flat[offset : offset + seq.numel()])
        offset += seq.numel()
    return out


def _confidence_list(hyp: Any, count: int) -> list[float]:
    """Confidence of each new token (NeMo's ``token_confidence``); 1.0 each if the decoder kept none."""
    confidence = hyp.token_confidence
    if confidence is None:
        confidence = hyp.non_blank_step_confidence_precomputed
    if confidence is None or len(confidence) != count:
        return [1.0] * count
    return [float(c) for c in confidence]
