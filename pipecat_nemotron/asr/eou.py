"""End-of-utterance tokens: models that say themselves where an utterance ends.

NVIDIA's realtime EOU models (``nvidia/parakeet_realtime_eou_120m-v1``: a cache-aware streaming
FastConformer-RNNT, the family of the engine's other models) have ``<EOU>`` in their SentencePiece vocabulary
(later exports also ``<EOB>``, the end of a backchannel such as "uh-huh") and emit it at the end of each
utterance: they are trained with plain RNNT loss on the text followed by ``<EOU>`` (NeMo's
``examples/asr/asr_eou`` recipe, ``EncDecRNNTBPEEOUModel``). The greedy decoder emits these markers as ordinary
labels, so the runner takes them out of each step's tokens (no text, word, peek or final ever holds one) and
reports where ``<EOU>`` was emitted; the policy turns that into an ``eou`` record for the streams that asked
(:class:`~pipecat_nemotron.asr.types.Transcript`). The marker stays in the decoder's state, as the model was
trained. No torch here.
"""

from __future__ import annotations

import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The end-of-utterance piece of NVIDIA's realtime EOU models (NeMo's ``EOU_STRING``).
EOU_PIECE = "<EOU>"

#: The end-of-backchannel piece of their later exports (NeMo's ``EOB_STRING``); never part of any text.
EOB_PIECE = "<EOB>"

#: Models known to emit :data:`EOU_PIECE`, for error messages (the bundled tiny one is
#: ``pipecat_nemotron/assets/tiny_nemotron_asr_eou.nemo``, ``pipecat_nemotron.models.TINY_EOU_MODEL_PATH``).
EOU_MODELS = ("nvidia/parakeet_realtime_eou_120m-v1", "tiny_nemotron_asr_eou.nemo")


@dataclass(frozen=True)
class MarkerTokens:
    """The end-of-utterance marker ids of a model's vocabulary.

    Attributes:
        eou: Id of ``<EOU>`` (None: the model has none, and cannot report end-of-utterance events).
        markers: Ids of every marker piece (``<EOU>``, ``<EOB>``) the model has: taken out of its tokens.

    """

    eou: int | None = None
    markers: frozenset[int] = frozenset()

    @classmethod
    def from_pieces(cls, pieces: Sequence[str]) -> MarkerTokens:
        """The markers among a vocabulary's pieces (``pieces[i]`` is token ``i``'s piece)."""
        ids = {piece: i for i, piece in enumerate(pieces) if piece in (EOU_PIECE, EOB_PIECE)}
        return cls(ids.get(EOU_PIECE), frozenset(ids.values()))

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> MarkerTokens:
        """The markers of a NeMo tokenizer (``ids_to_tokens``, ``vocab_size``): by piece, wherever they sit."""
        return cls.from_pieces([str(p) for p in tokenizer.ids_to_tokens(list(range(int(tokenizer.vocab_size))))])

    def split(
        self, tokens: list[int], frames: list[int], confidence: list[float]
    ) -> tuple[list[int], list[int], list[float], int | None]:
        """Take the markers out of one step's tokens.

        Args:
            tokens: The step's new token ids.
            frames: The frame of each token.
            confidence: The confidence of each token.

        Returns:
            The tokens, frames and confidences without markers, and the frame of the step's first ``<EOU>``
            (None: none in this step). Unchanged lists when there is no marker.

        """
        if not self.markers or not self.markers.intersection(tokens):
            return tokens, frames, confidence, None
        at = tokens.index(self.eou) if self.eou in tokens else None
        eou_frame = frames[at] if at is not None and at < len(frames) else None
        keep = [i for i, t in enumerate(tokens) if t not in self.markers]

        def kept(values: list[Any]) -> list[Any]:  # a list that does not match the tokens stays as it is
            return [values[i] for i in keep] if len(values) == len(tokens) else values

        return [tokens[i] for i in keep], kept(frames), kept(confidence), eou_frame


#: A model without markers.
NO_MARKERS = MarkerTokens()


def eou_unavailable_message(model: str) -> str:
    """Why end-of-utterance events cannot be had from ``model``, naming the fix."""
    return (
        f"end-of-utterance events (eou=True) need a model whose vocabulary has the {EOU_PIECE} token, and "
        f"{model!r} has none; load one that emits it ({', '.join(EOU_MODELS)}), or leave eou off "
        "(EngineConfig.eou=False, open_stream(eou=False)) and end utterances with finalize()"
    )


def nemo_file_has_eou(model: str | Path) -> bool | None:
    """Whether a local ``.nemo`` file's tokenizer has :data:`EOU_PIECE`, read from its ``tokenizer.vocab``.

    Cheap (the archive's member list and one small member; no torch, no model restore), so services and settings
    can refuse a model without the token when they are built, not when the stream opens.

    Args:
        model: A ``.nemo`` path, or a hub id.

    Returns:
        True or False for a readable local ``.nemo`` file; None when it cannot tell (a hub id, a missing file,
        an archive without a ``tokenizer.vocab``): the engine checks when it loads the model.

    """
    path = Path(model)
    if path.suffix != ".nemo" or not path.is_file():
        return None
    try:
        with tarfile.open(path) as tar:
            member = next((m for m in tar.getmembers() if m.name.endswith("tokenizer.vocab")), None)
            if member is None:
                return None
            handle = tar.extractfile(member)
            if handle is None:
                return None
            pieces = {line.split(b"\t", 1)[0] for line in handle.read().splitlines()}
    except (OSError, tarfile.TarError):
        return None
    return EOU_PIECE.encode() in pieces
