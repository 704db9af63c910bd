"""Our own Magpie decoder step: a per-layer KV cache and many sequences (rows) advancing one frame per call.

NeMo 3.0's ``MagpieTTSModel.generate_speech`` re-embeds and re-runs the whole decoder over every frame generated so
far at each step (O(n^2) in the sentence length), and decodes one batch that starts and ends together. This module
runs the same weights (the model's own ``nn.Module`` layers, called piecewise) on the new frame only:

- self-attention keys/values are cached per layer in a slot tensor ``(slots, heads, time, head_dim)``; active
  sequences keep slots ``0..n-1`` (a leaving one is replaced by the last), so each step reads a view, never a copy;
- the text encoder output and each layer's cross-attention keys/values are computed once when a sequence joins;
- classifier-free guidance is a second slot per sequence (NeMo's zero conditioning, its own KV cache);
- the local transformer (NeMo's module, our cache: :mod:`~pipecat_nemotron.tts.magpie.local_transformer`) samples
  the codebooks of all rows at once;
- the attention prior, alignment tracking and end-of-speech detection call NeMo's own public methods per row
  (``get_most_attended_text_timestep``, ``construct_inference_prior``, ``detect_eos``), with one row's state each.

Semantics: those of ``generate_speech`` for one text chunk (``beginning_of_text=True``, ``end_of_text=True``) with the
decoder in NeMo's own KV-cache mode (``decoder.reset_cache(use_cache=True)``, what ``infer_batch`` uses with
``use_kv_cache_for_inference``): a frame's cross-attention is computed once, under the attention prior of its own
step. NeMo's cache-less loop re-applies the newest prior to every past frame at each step, which no cache can
reproduce; the two agree wherever the prior is off (``apply_attention_prior=False``, or text of 5 tokens or fewer).
Sampling uses one ``torch.Generator`` per row, so a row's codes do not depend on the other rows; the end-of-speech
check takes the argmax where NeMo samples at temperature 0.01 with top-k 1 (the same token but on exact ties).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pipecat_nemotron.tts.magpie.alignment import align_rows, attend, feed_forward, row_flags
from pipecat_nemotron.tts.magpie.local_transformer import LocalTransformer
from pipecat_nemotron.tts.magpie.step_state import (
    MIN_CAPACITY,
    Row,
    RowSampling,
    RowsPicker,
    SlotCache,
    StepOutput,
    eos_method,
    unsupported_reason,
)

__all__ = ["FastMagpieStep", "Row", "RowSampling", "StepOutput", "unsupported_reason"]


class FastMagpieStep:
    """Decodes many Magpie sequences together, one frame each per :meth:`step`, with a KV cache.

    Not thread-safe: one owner thread (the engine's scheduler) calls everything, between steps.
    """

    def __init__(self, model: Any, *, max_slots: int = 32) -> None:
        """Bind to a loaded model (see :func:`unsupported_reason`).

        Args:
            model: A loaded ``MagpieTTSModel`` in eval mode.
            max_slots: Slots allocated up front (a CFG row takes two); more are added on demand.

        Raises:
            ValueError: The model is not supported (the message says why).

        """
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the fast Magpie step does not support this model: {reason}")
        self.model = model
        param = next(model.decoder.parameters())  # (the codec may stay fp32 under a bf16 decoder)
        self.device, self.dtype = param.device, param.dtype
        self.max_slots = max_slots
        self.params = model.inference_parameters
        self._cache = SlotCache(model, max_slots, self.device, self.dtype)
        self._slots: list[Row | None] = []  # slot -> row (compact: active slots are 0..n-1)
        self.rows: list[Row] = []
        xlayers = set(model.transcript_decoder_layers)
        if self.params.estimate_alignment_from_layers is not None:
            xlayers &= set(self.params.estimate_alignment_from_layers)
        self._align_layers = sorted(xlayers)
        n = model.decoder.n_layers
        self._prior_layers = set(
            range(n) if self.params.apply_prior_to_layers is None else self.params.apply_prior_to_layers
        )
        self._uncond_prefill: tuple[int, torch.Tensor, torch.Tensor, list[dict[str, torch.Tensor]]] | None = (
            None
        )
        self._index_key: tuple[tuple[int, int], ...] | None = None
        self._index: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        autoregressive = str(getattr(model.local_transformer_type, "value", "none")) == "autoregressive"
        #: Samples a frame's codebooks (None: the model has no local transformer; the logits are sampled directly).
        self._lt = LocalTransformer(model, self.device) if autoregressive else None

    # Joining and leaving.

    @torch.inference_mode()
    def add_row(self, text: torch.Tensor, speaker_index: int, sampling: RowSampling) -> Row:
        """:meth:`add_rows` for one sequence."""
        return self.add_rows([(text, speaker_index, sampling)])[0]

    @torch.inference_mode()
    def add_rows(self, requests: Sequence[tuple[torch.Tensor, int, RowSampling]]) -> list[Row]:
        """Encode text chunks and prefill their decoder context in one batched call; return their rows.

        The text encoder, the cross-attention keys/values and the context prefill (speaker context plus BOS
        through every decoder layer) run once for all joiners, padded to the longest text (padding is masked, so
        each row's outputs are those it gets alone). Each row's first frame comes at the next :meth:`forward`.

        Args:
            requests: Per sequence: token ids ``(T,)`` of one chunk (as ``chunk_text_for_inference`` makes them),
                baked speaker index, sampling settings and generator.

        """
        if not requests:
            return []
        ctx = self._encode(requests)
        model, count = self.model, len(requests)
        ones = torch.ones(count, device=self.device, dtype=torch.long)
        bos = torch.full((count, model.num_audio_codebooks, 1), model.audio_bos_id, device=self.device)
        bos_emb, _ = model.embed_audio_tokens(bos, ones)
        add = ctx.additional_decoder_input
        prefix = bos_emb if add is None else torch.cat([add, bos_emb], 1)
        memory_lens = ctx.cond_mask.sum(dim=1).tolist()
        rows = [
            Row(
                sampling=sampling,
                text_len=int(ctx.text_lens[i]),
                prefix_len=prefix.shape[1],
                max_steps=int(self.params.max_decoder_steps),
                memory_len=int(memory_lens[i]),
            )
            for i, (_, _, sampling) in enumerate(requests)
        ]
        taken = len(self._slots)
        try:
            return self._prefill_rows(ctx, prefix, bos_emb, rows)
        except BaseException:
            del self._slots[taken:]  # The step's other rows are untouched; their slots come first.
            raise

    def _prefill_rows(
        self, ctx: Any, prefix: torch.Tensor, bos_emb: torch.Tensor, rows: list[Row]
    ) -> list[Row]:
        """Take slots for ``rows`` and prefill them (and, once per step object, the shared unconditional row)."""
        model, count, add = self.model, len(rows), ctx.additional_decoder_input
        for row in rows:
            row.slot = self._take_slot(row)
        cfg = [row for row in rows if row.sampling.use_cfg]
        for row in cfg:
            row.uncond_slot = self._take_slot(row)
        self._cache.grow(prefix.shape[1] + MIN_CAPACITY, ctx.cond.shape[1])
        xs, memories, masks, slots = [prefix], [ctx.cond], [ctx.cond_mask.bool()], [row.slot for row in rows]
        cached = self._uncond_prefill
        fresh_uncond = bool(cfg) and (cached is None or cached[0] != prefix.shape[1])
        if (
            fresh_uncond
        ):  # The unconditional row sees zero context and zero text: one prefill for every request.
            dummy_cond, dummy_mask, dummy_add, _, _ = model.prepare_dummy_cond_for_cfg(
                ctx.cond[:1], ctx.cond_mask[:1], None if add is None else add[:1], ctx.additional_decoder_mask
            )
            xs.append(bos_emb[:1] if dummy_add is None else torch.cat([dummy_add, bos_emb[:1]], 1))
            memories.append(dummy_cond)
            masks.append(dummy_mask.bool())
            slots.append(cfg[0].uncond_slot)
        slot_index = torch.tensor(slots, device=self.device)
        xmask = torch.cat(masks, 0)
        self._cache.xmask[slot_index] = False
        self._cache.xmask[slot_index, : xmask.shape[1]] = xmask
        out, scores = self._prefill(torch.cat(xs, 0), torch.cat(memories, 0), slot_index)
        if fresh_uncond:
            saved = self._cache.save_prefix(cfg[0].uncond_slot, prefix.shape[1])
            self._uncond_prefill = (prefix.shape[1], out[count:], scores[count], saved)
        _, uncond_out, uncond_scores, saved = self._uncond_prefill if cfg else (0, None, None, None)
        for i, row in enumerate(rows):
            if not row.sampling.use_cfg:
                row.pending = (out[i : i + 1], [scores[i]])
                continue
            row.pending = (torch.cat([out[i : i + 1], uncond_out]), [scores[i], uncond_scores])
            if not (fresh_uncond and row is cfg[0]):
                self._cache.restore_prefix(row.uncond_slot, saved)
                self._cache.xmask[row.uncond_slot] = False
                self._cache.xmask[row.uncond_slot, 0] = True
        self.rows.extend(rows)
        return rows

    def _encode(self, requests: Sequence[tuple[torch.Tensor, int, RowSampling]]) -> Any:
        """NeMo's context tensors (text encoder, speaker context) for the joiners, texts padded to the longest."""
        lens = [int(text.shape[0]) for text, _, _ in requests]
        text = torch.zeros(len(requests), max(lens), dtype=torch.long, device=self.device)
        for i, (tokens, _, _) in enumerate(requests):
            text[i, : lens[i]] = tokens.to(self.device)
        ctx = self.model.prepare_context_tensors(
            {
                "text": text,
                "text_lens": torch.tensor(lens, device=self.device, dtype=torch.long),
                "speaker_indices": torch.tensor([s for _, s, _ in requests], device=self.device),
            }
        )
        if ctx.additional_decoder_mask is not None and not bool(ctx.additional_decoder_mask.all()):
            raise ValueError("the fast Magpie step needs a fully valid decoder context")
        return ctx

    @torch.inference_mode()
    def remove_row(self, row: Row) -> None:
        """Free a row's slots (a finished or cancelled sequence). Idempotent."""
        if row not in self.rows:
            return
        self.rows.remove(row)
        for slot in sorted((s for s in (row.slot, row.uncond_slot) if s >= 0), reverse=True):
            last = len(self._slots) - 1
            if slot != last:
                moved = self._slots[last]
                self._cache.move(last, slot)
                assert moved is not None
                if moved.slot == last:
                    moved.slot = slot
                else:
                    moved.uncond_slot = slot
                self._slots[slot] = moved
            self._slots.pop()
        row.slot = row.uncond_slot = -1

    def _take_slot(self, row: Row) -> int:
        slot = len(self._slots)
        self._slots.append(row)
        if slot >= self._cache.xmask.shape[0]:
            for cache in self._cache.layers:
                for name, tensor in cache.items():
                    cache[name] = torch.cat([tensor, torch.zeros_like(tensor)], 0)
            self._cache.xmask = torch.cat([self._cache.xmask, torch.zeros_like(self._cache.xmask)], 0)
        return slot

    # The decoder on new positions.

    def _run_layers(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        self_mask: torch.Tensor,
        length: int,
        prior: torch.Tensor | None,
        read: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the decoder on ``x (B, T, d)`` at ``positions (B, T)``, writing K/V to ``slots``; read ``length``.

        ``read`` selects the slots to read (a slice gives views, not copies; default ``slots``). Returns the last
        position's output ``(B, d)`` and its alignment scores ``(B, X)`` (NeMo's
        ``get_cross_attention_scores``: mean over heads, then over the alignment layers).
        """
        decoder, cache = self.model.decoder, self._cache
        if decoder.use_learnable_pos_emb:
            x = x + decoder.position_embeddings(positions)
        batch, steps = x.shape[:2]
        read = slots if read is None else read
        xmask = cache.xmask[read][:, None, None, :]
        scores = []
        for index, layer in enumerate(decoder.layers):
            kv = cache.layers[index]
            sa, xa = layer.self_attention, layer.cross_attention
            qkv = sa.qkv_net(layer.norm_self(x)).reshape(batch, steps, 3, sa.n_heads, sa.d_head)
            q, k, v = (t.squeeze(2).transpose(1, 2) for t in qkv.chunk(3, dim=2))
            rows = slots[:, None].expand(batch, steps)
            kv["k"][rows, :, positions] = k.transpose(1, 2)
            kv["v"][rows, :, positions] = v.transpose(1, 2)
            keys, values = kv["k"][read, :, :length], kv["v"][read, :, :length]
            y, _ = attend(q, keys, values, self_mask, sa.scale, None)
            x = x + sa.o_net(y)
            xq = (
                xa.q_net(layer.norm_xattn_query(x))
                .reshape(batch, steps, xa.n_heads, xa.d_head)
                .transpose(1, 2)
            )
            y, prob = attend(
                xq,
                kv["xk"][read],
                kv["xv"][read],
                xmask,
                xa.scale,
                prior if index in self._prior_layers else None,
            )
            x = x + xa.o_net(y)
            if index in self._align_layers:
                scores.append(prob[:, :, -1, :].mean(dim=1))
            x = x + feed_forward(layer.pos_ff, layer.norm_pos_ff(x))
        out = decoder.norm_out(x)[:, -1, :]
        return out, torch.stack(scores, 1).mean(dim=1)

    def _prefill(
        self, x: torch.Tensor, memory: torch.Tensor, slots: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        steps = x.shape[1]
        for index, layer in enumerate(self.model.decoder.layers):
            xa, kv = layer.cross_attention, self._cache.layers[index]
            mem = layer.norm_xattn_memory(memory)
            kvx = xa.kv_net(mem).reshape(mem.shape[0], mem.shape[1], 2, xa.n_heads, xa.d_head)
            kx, vx = (t.squeeze(2).transpose(1, 2) for t in kvx.chunk(2, dim=2))
            kv["xk"][slots] = 0.0
            kv["xv"][slots] = 0.0
            kv["xk"][slots, :, : mem.shape[1]] = kx
            kv["xv"][slots, :, : mem.shape[1]] = vx
        positions = torch.arange(steps, device=self.device).expand(x.shape[0], steps)
        causal = torch.ones(steps, steps, dtype=torch.bool, device=self.device).tril()[None, None]
        return self._run_layers(x, positions, slots, causal, steps, None)

    # One step for every row.

    @torch.inference_mode()
    def forward(self) -> StepOutput:
        """Run the decoder for every row's newest frame (rows that just joined reuse their prefill).

        Returns:
            The step's decoder outputs, CFG-combined logits and alignment scores, for :meth:`advance`.

        """
        rows, n = list(self.rows), len(self._slots)
        need = max((r.position + 1 for r in rows), default=1)
        if need > self._cache.capacity:
            self._cache.grow(need, 0)
        decoding = [r for r in rows if r.pending is None]
        width = self.model.decoder.layers[0].norm_self.normalized_shape[0]
        dec_out = torch.zeros(n, width, device=self.device, dtype=self.dtype)
        scores = torch.zeros(n, self._cache.xmask.shape[1], device=self.device, dtype=self.dtype)
        if decoding:
            codes = torch.zeros(n, self.model.num_audio_codebooks, 1, dtype=torch.long, device=self.device)
            positions = torch.zeros(n, 1, dtype=torch.long, device=self.device)
            prior = torch.ones(n, self._cache.xmask.shape[1], device=self.device, dtype=self.dtype)
            has_prior = False
            for row in rows:
                for slot, index in ((row.slot, 0), (row.uncond_slot, 1)):
                    if slot < 0:
                        continue
                    positions[slot, 0] = row.position
                    if row.pending is None:
                        codes[slot, :, 0] = row.last_codes
                        if row.prior is not None:
                            prior[slot, : row.prior.shape[1]] = row.prior[index]
                            has_prior = True
            emb, _ = self.model.embed_audio_tokens(codes, torch.ones(n, device=self.device, dtype=torch.long))
            dec_out, scores = self._decode_rows(emb, positions, prior if has_prior else None, n)
        for row in rows:
            if row.pending is not None:
                out, row_scores = row.pending
                for i, slot in enumerate(s for s in (row.slot, row.uncond_slot) if s >= 0):
                    dec_out[slot] = out[i]
                    scores[slot] = 0.0
                    scores[slot, : row_scores[i].shape[0]] = row_scores[i]
        logits = self.model.final_proj(dec_out).float()  # Sampling in fp32 whatever the model's dtype.
        return StepOutput(rows, dec_out, self._combine(rows, logits, self.params.cfg_scale), scores)

    def _decode_rows(
        self, emb: torch.Tensor, positions: torch.Tensor, prior: torch.Tensor | None, n: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder on slots ``0..n-1``: new frames ``emb (n, 1, d)`` at ``positions (n, 1)``; outputs, scores."""
        length = int(positions.max()) + 1
        keys = torch.arange(length, device=self.device)
        self_mask = (keys[None, :] <= positions)[:, None, None, :]
        return self._run_layers(
            emb, positions, torch.arange(n, device=self.device), self_mask, length, prior, read=slice(0, n)
        )

    def _lt_logits(self, x: torch.Tensor, codebook: int) -> torch.Tensor:
        """The local transformer on ``x (slots, codebook + 1, d_lt)``: per-slot logits of ``codebook``."""
        assert self._lt is not None  # called only by the local transformer's sampling
        return self._lt.logits(x, codebook)

    def _combine(self, rows: list[Row], per_slot: torch.Tensor, scale: float) -> torch.Tensor:
        """Per-row logits from per-slot ones: NeMo's ``(1 - s) * uncond + s * cond`` for CFG rows."""
        key = tuple((r.slot, r.uncond_slot) for r in rows)
        if self._index_key != key:
            cfg = [i for i, r in enumerate(rows) if r.uncond_slot >= 0]
            self._index = (
                torch.tensor([r.slot for r in rows], device=self.device),
                torch.tensor(cfg, device=self.device, dtype=torch.long),
                torch.tensor([rows[i].uncond_slot for i in cfg], device=self.device, dtype=torch.long),
            )
            self._index_key = key
        cond_index, cfg_rows, uncond_index = self._index
        cond = per_slot.index_select(0, cond_index)
        if cfg_rows.numel():
            uncond = per_slot.index_select(0, uncond_index)
            cond.index_copy_(0, cfg_rows, (1 - scale) * uncond + scale * cond.index_select(0, cfg_rows))
        return cond

    @torch.inference_mode()
    def advance(self, out: StepOutput, forced: dict[int, torch.Tensor] | None = None) -> list[Row]:
        """Sample every row's next frame, update its alignment and end-of-speech state; return the finished rows.

        Each row's new frame (unless it is the end of speech) is appended to ``row.codes``. Finished rows stay in
        :attr:`rows` until :meth:`remove_row`.

        Args:
            out: This step's :meth:`forward` output.
            forced: Teacher forcing (tests): ``id(row)`` -> codes ``(num_codebooks,)`` fed instead of sampling.

        """
        model, params = self.model, self.params
        rows = out.rows
        if params.apply_attention_prior:
            align_rows(model, params, rows, out.scores)
        flags = [row_flags(model, params, row) for row in rows]
        draw = forced is None or len(forced) < len(rows)
        picker = RowsPicker(model, rows, flags, draw)
        codes = self._sample(out, picker) if draw else None
        argmax = picker.argmax(out.logits.clone())
        method = eos_method(params.eos_detection_method)
        finished = []
        for i, row in enumerate(rows):
            frame = forced[id(row)].to(self.device) if forced and id(row) in forced else codes[i]
            eos = model.detect_eos(frame[:, None], argmax[i][:, None], method)
            row.pending = None
            row.last_codes = frame
            row.step += 1
            if eos != float("inf"):
                row.ended = True
                row.end_indices[0] = row.step - 1
            else:
                row.codes.append(frame)
            if row.done:
                finished.append(row)
        return finished

    def _sample(self, out: StepOutput, picker: RowsPicker) -> torch.Tensor:
        """Every row's next frame ``(rows, num_codebooks)``: the local transformer over all slots, or the logits."""
        if self._lt is None:
            view = out.logits.view(len(out.rows), self.model.num_audio_codebooks, -1)
            return torch.stack([picker.sample(view[:, c].clone(), c) for c in range(view.shape[1])], dim=1)
        return self._lt.sample(
            out, picker, lambda per_slot: self._combine(out.rows, per_slot, self.params.cfg_scale), self._lt_logits
        )
