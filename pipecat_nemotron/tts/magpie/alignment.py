"""Per-row pieces of the fast Magpie step that follow NeMo's ``generate_speech`` rules: attention, EOS flags, alignment.

``model`` is a loaded ``MagpieTTSModel`` and ``params`` its ``inference_parameters``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from pipecat_nemotron.tts.magpie.step_state import Row


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


def align_rows(model: Any, params: Any, rows: list[Row], scores: torch.Tensor) -> None:
    """NeMo's alignment tracking and next-step prior for every row (``beginning_of_text=True``), batched.

    One call of ``get_most_attended_text_timestep`` and one of ``construct_inference_prior`` for all rows, as
    ``generate_speech`` makes for its batch (item ``i`` = ``rows[i]``; NeMo's per-item state is keyed by item,
    ours by row, under key 0). Reads the step's alignment ``scores (slots, text)``; updates each row's state and
    ``row.prior`` ``(1, or 2 with CFG: the unconditional slot's prior is all epsilon, as NeMo's, text_len)``.
    """
    if not rows:
        return
    device, count = scores.device, len(rows)
    slots = torch.tensor([row.slot for row in rows], device=device)
    cond = scores.index_select(0, slots)[:, : max(row.memory_len for row in rows)]
    text_lens = torch.tensor([row.text_len for row in rows], device=device)
    counters = [row.counter[0] for row in rows]  # NeMo updates these dicts in place.
    attended, _ = model.get_most_attended_text_timestep(
        alignment_attention_scores=cond,
        last_attended_timesteps=[[row.last_attended[-1][0] for row in rows]],
        text_lens=text_lens,
        lookahead_window_size=params.attention_prior_lookahead_window,
        attended_timestep_counter=counters,
        batch_size=count,
    )

    def keyed(states: list[dict[int, Any]]) -> dict[int, Any]:
        return {i: state[0] for i, state in enumerate(states) if 0 in state}

    prior, unfinished, finished = model.construct_inference_prior(
        prior_epsilon=params.attention_prior_epsilon,
        cross_attention_scores=cond,
        text_lens=text_lens,
        text_time_step_attended=attended,
        attended_timestep_counter=counters,
        unfinished_texts=keyed([row.unfinished for row in rows]),
        finished_texts_counter=keyed([row.finished_counter for row in rows]),
        end_indices=keyed([row.end_indices for row in rows]),
        lookahead_window_size=params.attention_prior_lookahead_window,
        batch_size=count,
    )
    epsilon = torch.zeros(1, cond.shape[1], device=device) + params.attention_prior_epsilon
    for i, row in enumerate(rows):
        row.last_attended = [[attended[i]]]
        row.unfinished = {0: unfinished[i]} if i in unfinished else {}
        row.finished_counter = {0: finished[i]} if i in finished else {}
        own = prior[i, :, : row.memory_len]
        row.prior = torch.cat([own, epsilon[:, : row.memory_len]]) if row.uncond_slot >= 0 else own
