"""``LocalTransformer``: Magpie's autoregressive local transformer, run by us: a frame's codebooks for every slot.

After the decoder's step, NeMo's local transformer samples one frame's codebooks one after another, each
conditioned on the codes already drawn. This runs NeMo's own module and projections (``_nemo_private``'s
``local_transformer_helper``) over every slot of a step at once, in one of two ways:

- by position (the default): each new position once, with keys and values cached per layer by us. NeMo's cached
  module attends from the new position only but re-runs every earlier position's feed-forward at each codebook;
- over all positions so far, with NeMo's module uncached: the static shapes CUDA graphs need
  (:class:`~pipecat_nemotron.tts.magpie.graphs.GraphedMagpieStep`).

Both give the same codes. Used by :class:`~pipecat_nemotron.tts.magpie.fast_step.FastMagpieStep` on its worker
thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pipecat_nemotron.tts.magpie._nemo_private import local_transformer_helper
from pipecat_nemotron.tts.magpie.alignment import attend, feed_forward
from pipecat_nemotron.tts.magpie.step_state import RowsPicker, StepOutput

__all__ = ["LocalTransformer"]

#: Per layer, keys and values ``(slots, heads, codebooks, d_head)`` of the positions run so far.
PositionCache = list[tuple[torch.Tensor, torch.Tensor]]


class LocalTransformer:
    """Samples a frame's codebooks for every slot of a step with a model's local transformer.

    Not thread-safe: the step's owner thread calls it.

    Args:
        model: A loaded ``MagpieTTSModel`` with an autoregressive local transformer.
        device: The model's device.

    """

    def __init__(self, model: Any, device: torch.device) -> None:
        self.helper = local_transformer_helper(model)
        self.num_codebooks = int(model.num_audio_codebooks)
        self.device = device
        #: Run one position at a time with our own cache (:meth:`position`); False: NeMo's module over all
        #: positions so far (:meth:`logits`, the static shapes CUDA graphs need).
        self.by_position = True
        self._all_true = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)

    def sample(
        self,
        out: StepOutput,
        picker: RowsPicker,
        combine: Callable[[torch.Tensor], torch.Tensor],
        logits: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Every row's next frame ``(rows, num_codebooks)`` from the step's decoder outputs.

        Args:
            out: The step's :meth:`~pipecat_nemotron.tts.magpie.fast_step.FastMagpieStep.forward` output.
            picker: Draws each row's code from its logits.
            combine: Per-row logits from per-slot ones (classifier-free guidance).
            logits: Per-slot logits of a codebook over all positions so far (default :meth:`logits`; a graphed
                step passes its own). Used when :attr:`by_position` is False.

        """
        helper = self.helper
        lt = helper.local_transformer
        lt.reset_cache(use_cache=False)  # by position the cache is ours; over all positions it is recomputed
        logits = logits or self.logits
        x = helper.local_transformer_in_projection(out.dec_out.unsqueeze(1))
        cache = self.new_cache(x.shape[0], x) if self.by_position else []
        owners = [0] * out.dec_out.shape[0]  # slot -> index of its row
        for i, row in enumerate(out.rows):
            for slot in (row.slot, row.uncond_slot):
                if slot >= 0:
                    owners[slot] = i
        slot_rows = torch.tensor(owners, dtype=torch.long, device=self.device)
        preds = []
        try:
            for codebook in range(self.num_codebooks):
                if self.by_position:
                    h = helper.local_transformer_audio_out_projection(self.position(x[:, -1:], cache, codebook))
                    per_slot = helper.local_transformer_out_projections[codebook](h).float()
                else:
                    per_slot = logits(x, codebook).float()
                pred = picker.sample(combine(per_slot), codebook)
                preds.append(pred)
                nxt = helper.audio_embeddings[codebook](pred[slot_rows]).unsqueeze(1)
                nxt = helper.local_transformer_in_projection(helper.audio_in_projection(nxt))
                x = nxt if self.by_position else torch.cat([x, nxt], dim=1)
        finally:
            lt.reset_cache(use_cache=False)
        return torch.stack(preds, dim=1)

    def position(self, x: torch.Tensor, cache: PositionCache, pos: int) -> torch.Tensor:
        """The local transformer on one new position ``x (slots, 1, d_lt)`` at ``pos``; its output ``(slots, d_lt)``.

        Each position runs once, into ``cache`` (:meth:`new_cache`).
        """
        lt = self.helper.local_transformer
        if lt.use_learnable_pos_emb:
            x = x + lt.position_embeddings.weight[pos]
        for layer, (keys, values) in zip(lt.layers, cache, strict=True):
            sa = layer.self_attention
            qkv = sa.qkv_net(layer.norm_self(x)).reshape(x.shape[0], 1, 3, sa.n_heads, sa.d_head)
            q, k, v = (t.squeeze(2).transpose(1, 2) for t in qkv.chunk(3, dim=2))
            keys[:, :, pos : pos + 1] = k
            values[:, :, pos : pos + 1] = v
            y, _ = attend(q, keys[:, :, : pos + 1], values[:, :, : pos + 1], self._all_true, sa.scale, None)
            x = x + sa.o_net(y)
            x = x + feed_forward(layer.pos_ff, layer.norm_pos_ff(x))
        return lt.norm_out(x)[:, 0]

    def new_cache(self, slots: int, like: torch.Tensor) -> PositionCache:
        """Empty keys/values per layer, ``(slots, heads, codebooks, d_head)`` each, of ``like``'s dtype and device."""
        shapes = [
            (slots, la.self_attention.n_heads, self.num_codebooks, la.self_attention.d_head)
            for la in self.helper.local_transformer.layers
        ]
        return [(like.new_empty(shape), like.new_empty(shape)) for shape in shapes]

    def logits(self, x: torch.Tensor, codebook: int) -> torch.Tensor:
        """NeMo's module on all positions so far ``x (slots, codebook + 1, d_lt)``: per-slot logits of ``codebook``."""
        helper = self.helper
        mask = torch.ones(x.shape[0], x.shape[1], device=self.device, dtype=x.dtype)
        h = helper.local_transformer(x, mask)["output"]
        h = helper.local_transformer_audio_out_projection(h[:, -1, :])
        return helper.local_transformer_out_projections[codebook](h)
