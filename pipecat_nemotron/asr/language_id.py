"""Which language an ``auto`` utterance was in, from the multilingual model itself.

A stream decoded with the language-agnostic prompt (``"auto"``) gets its words, not a language. At the final of
such an utterance the engine asks the model which of its language prompts explains those words best: for each
locale ``l`` it scores the greedy alignment the decoder produced (every token at the encoder frame it was
emitted, a blank closing each frame) under the prompt of ``l``,

    score(l) = sum over the alignment's steps of log P(symbol | encoder frame t conditioned on l, tokens before),

and reports the argmax. It reuses what the step computed (the utterance's encoder output before the prompt,
its tokens and their frames); the cost is one ``prompt_kernel`` pass per locale over the utterance's frames
and one joint evaluation per alignment step and locale (``T + U`` of them), not a decode per language.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

#: Longest utterance prefix kept for detection, encoder frames (80 ms each): 30 s.
MAX_DETECTION_FRAMES = 375


@dataclass
class UtteranceEvidence:
    """What an ``auto`` stream keeps of its current utterance for language detection.

    Attributes:
        frames: Encoder output chunks before the language prompt, ``[D, t]`` each, at most
            :data:`MAX_DETECTION_FRAMES` in all.
        token_frames: Encoder frame (within ``frames`` joined) of each token of the utterance.
        tokens: The utterance's token ids (those emitted within the kept frames).
        num_frames: Encoder frames kept so far (the joined length of ``frames``).

    """

    frames: list[torch.Tensor] = field(default_factory=list)
    token_frames: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    num_frames: int = 0

    def plus(self, encoded: torch.Tensor, tokens: list[int], frames: list[int]) -> UtteranceEvidence:
        """A new record: this one plus one step's output ``[D, t]`` and its new tokens.

        Args:
            encoded: The step's encoder output before the prompt ``[D, t]``.
            tokens: Its new tokens.
            frames: Each new token's frame within ``encoded``.

        Returns:
            The extended record; this one is left as it is (the kept chunks are shared, not copied).

        """
        out = UtteranceEvidence(list(self.frames), list(self.token_frames), list(self.tokens), self.num_frames)
        room = MAX_DETECTION_FRAMES - out.num_frames
        if room <= 0:
            return out
        kept = encoded[:, :room].detach().clone()
        for token, frame in zip(tokens, frames, strict=True):
            if frame < kept.size(1):
                out.tokens.append(token)
                out.token_frames.append(out.num_frames + max(0, frame))
        out.frames.append(kept)
        out.num_frames += kept.size(1)
        return out


def alignment_scores(
    model: Any, evidence: UtteranceEvidence, prompt_indices: list[int], num_prompts: int
) -> torch.Tensor | None:
    """Log-probability of the utterance's greedy alignment under each language prompt.

    Args:
        model: The loaded prompt-class model (``prompt_kernel``, ``decoder``, ``joint``).
        evidence: The utterance's encoder output, tokens and token frames.
        prompt_indices: One-hot index of each candidate language.
        num_prompts: Width of the one-hot.

    Returns:
        ``[len(prompt_indices)]`` scores (nats), or None when the utterance has no token.

    """
    if not evidence.tokens or not evidence.frames:
        return None
    encoded = torch.cat(evidence.frames, dim=-1).transpose(0, 1)  # [T, D]
    frames, dim = encoded.shape
    languages = len(prompt_indices)
    one_hot = torch.nn.functional.one_hot(
        torch.tensor(prompt_indices, device=encoded.device), num_prompts
    ).to(encoded.dtype)
    joined = torch.cat(
        (encoded[None].expand(languages, frames, dim), one_hot[:, None, :].expand(-1, frames, -1)), dim=-1
    )
    conditioned = model.prompt_kernel(joined).to(encoded.dtype)  # [L, T, D]
    enc_proj = model.joint.project_encoder(conditioned)  # [L, T, H]
    tokens = torch.tensor([evidence.tokens], device=encoded.device, dtype=torch.long)
    predicted, _ = model.decoder.predict(tokens, state=None, add_sos=True, batch_size=1)  # [1, U + 1, P]
    pred_proj = model.joint.project_prednet(predicted)[0]  # [U + 1, H]
    t_index, u_index, symbols = _greedy_path(evidence.token_frames, evidence.tokens, frames, _blank_id(model))
    device = encoded.device
    t_index = torch.tensor(t_index, device=device)
    u_index = torch.tensor(u_index, device=device)
    hidden = enc_proj[:, t_index, :] + pred_proj[u_index][None]  # [L, N, H]
    log_probs = model.joint.joint_net(hidden).float().log_softmax(dim=-1)  # [L, N, V + 1]
    picked = log_probs.gather(
        -1, torch.tensor(symbols, device=device)[None, :, None].expand(languages, -1, 1)
    )
    return picked.squeeze(-1).sum(dim=-1)


def _greedy_path(
    token_frames: list[int], tokens: list[int], frames: int, blank: int
) -> tuple[list[int], list[int], list[int]]:
    """The steps of a greedy RNNT alignment: ``(frame, tokens so far, symbol)`` each, tokens then a blank per frame."""
    t_index: list[int] = []
    u_index: list[int] = []
    symbols: list[int] = []
    u = 0
    for t in range(frames):
        while u < len(tokens) and min(token_frames[u], frames - 1) <= t:
            t_index.append(t)
            u_index.append(u)
            symbols.append(tokens[u])
            u += 1
        t_index.append(t)
        u_index.append(u)
        symbols.append(blank)
    return t_index, u_index, symbols


def _blank_id(model: Any) -> int:
    """The RNNT blank: the joint's last output."""
    return int(model.joint.num_classes_with_blank) - 1
