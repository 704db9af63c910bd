"""Per-row pieces of the fast Magpie step that follow NeMo's ``generate_speech`` rules: attention, EOS flags, alignment.

``model`` is a loaded ``MagpieTTSModel`` and ``params`` its ``inference_parameters``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from pipecat_nemotron.magpie.step_state import Row


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    prior: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """NeMo's ``Attention.attn_naive`` (eval mode): ``q (B,H,T,dh)``, ``k``/``v (B,H,S,dh)``, ``mask (B,1,T|1,S)``."""
    score = torch.matmul(q, k.transpose(2, 3)) * scale
    score = score.masked_fill(~mask, float("-inf"))
    prob = torch.softmax(score, dim=-1)
    if prior is not None:
        prob = prob * (prior[:, None, None, :] + torch.finfo(prior.dtype).tiny)
        prob = prob / prob.sum(dim=-1, keepdim=True)
    prob = prob.masked_fill(~mask, 0.0)
    y = torch.matmul(prob, v)
    return y.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1), prob


def feed_forward(ff: Any, x: torch.Tensor) -> torch.Tensor:
    """NeMo's ``PositionwiseConvFF`` (kernel 1, eval mode, every position valid) on ``x (B, T, d)`` as two matmuls.

    A kernel-1 convolution is a linear map per position. On CPU, ``conv1d`` over a few positions of 16 slots cost
    ~14x a ``linear`` (735 vs 52 us for the tiny model's layer), the largest part of a step that grew with rows.
    """
    hidden = ff.non_linearity(F.linear(x, ff.proj.conv.weight[:, :, 0], ff.proj.conv.bias))
    return F.linear(hidden, ff.o_net.conv.weight[:, :, 0], ff.o_net.conv.bias)


def row_flags(model: Any, params: Any, row: Row) -> tuple[bool, bool, bool]:
    """(forbid EOS now: too early, text unfinished; force EOS: text finished) as ``generate_speech`` decides."""
    config = model.chunked_inference_config
    early = row.step < params.min_generated_frames
    if params.ignore_finished_sentence_tracking:
        return early, False, False
    unfinished = bool(row.unfinished.get(0, False))
    finished = row.finished_counter.get(0, -1) >= config.finished_limit_first_chunk
    return early, unfinished, finished


def align_row(model: Any, params: Any, row: Row, scores: torch.Tensor) -> None:
    """NeMo's alignment tracking and next-step prior for one row (``beginning_of_text=True``).

    Reads the step's alignment ``scores (slots, text)``; updates the row's state and ``row.prior``.
    """
    slots = [s for s in (row.slot, row.uncond_slot) if s >= 0]
    row_scores = scores[slots, : row.memory_len]
    text_lens = torch.tensor([row.text_len], device=scores.device)
    attended, row.counter = model.get_most_attended_text_timestep(
        alignment_attention_scores=row_scores,
        last_attended_timesteps=row.last_attended,
        text_lens=text_lens,
        lookahead_window_size=params.attention_prior_lookahead_window,
        attended_timestep_counter=row.counter,
        batch_size=1,
    )
    row.last_attended = [attended]
    prior, row.unfinished, row.finished_counter = model.construct_inference_prior(
        prior_epsilon=params.attention_prior_epsilon,
        cross_attention_scores=row_scores,
        text_lens=text_lens,
        text_time_step_attended=attended,
        attended_timestep_counter=row.counter,
        unfinished_texts=row.unfinished,
        finished_texts_counter=row.finished_counter,
        end_indices=row.end_indices,
        lookahead_window_size=params.attention_prior_lookahead_window,
        batch_size=1,
    )
    row.prior = prior[:, 0, :]
