"""Per-stream phrase boosting: the lists a stream asks for, and their checks. Plain Python (no torch, no NeMo).

A stream may carry a list of phrases (names, product words) that the greedy RNNT decoder favours: NeMo 3.0's
per-stream biasing adds a boosting tree over the model's token vocabulary to the joint's scores of the streams that
asked for it, inside the one batched decode of a step (:mod:`~pipecat_nemotron.asr.boost_models` holds the
trees). Another stream's tokens are not affected: rows without a list get no boost.

Phrases are matched as the model writes them, token for token: cased and punctuated as the model's output is.
The Nemotron models write cased, punctuated text (``"Dr. Okafor"``). So does the bundled tiny model, but its
tokenizer has only the capitals of its training sentences (``"Friday"``, ``"Tuesday"``), so ``"Doctor"`` is refused
for it: it writes ``"d"`` in lower case only.

The checks here need no model (a server validates a client's list before it reaches the engine);
:func:`check_alphabet` adds the loaded model's characters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pipecat_nemotron.asr.errors import BoostingUnavailableError, BoostPhraseError

#: Default weight of a boosting tree's scores added to the joint's log-probabilities: NeMo's default
#: ``boosting_model_alpha``. On the tiny model (``docs/BENCHMARKS.md`` section 15) it inserts no boosted word into
#: speech without it, but fixes only 1 of 12 confident mishearings; 2.0 fixes every mishearing of "tuesday",
#: "today" and "two" there, also without insertions.
DEFAULT_BOOST_ALPHA = 1.0

#: Largest accepted ``boost_alpha``: beyond this the boost outweighs any acoustic evidence.
MAX_BOOST_ALPHA = 10.0

#: Default most phrases per list (``EngineConfig.max_boost_phrases``). A list of 1,000 phrases of ~3 words
#: builds in ~0.2 s on an idle CPU core (once per distinct list, off the model thread) and holds ~5,000 states.
DEFAULT_MAX_BOOST_PHRASES = 1000

#: Default longest phrase, characters (``EngineConfig.max_boost_phrase_chars``): a name or a product name.
DEFAULT_MAX_BOOST_PHRASE_CHARS = 64

#: Hard ceilings of the two limits above (a config asking for more is refused).
MAX_BOOST_PHRASES_LIMIT = 100_000
MAX_BOOST_PHRASE_CHARS_LIMIT = 1_000

#: The NeMo release whose greedy label-looping RNNT decoder has per-stream biasing (NeMo PR 15344).
NEMO_VERSION_FOR_BOOSTING = "3.0.0"


@dataclass(frozen=True)
class BoostList:
    """A stream's validated phrase list and its weight; equal lists share one boosting tree.

    Attributes:
        phrases: The phrases, whitespace-normalised, duplicates removed, in the order given. Empty: no boosting.
        alpha: Weight of the tree's scores.

    """

    phrases: tuple[str, ...]
    alpha: float

    @property
    def empty(self) -> bool:
        """No phrases: the stream is not boosted."""
        return not self.phrases


def validate_boost_phrases(
    phrases: Iterable[str] | None,
    *,
    max_phrases: int = DEFAULT_MAX_BOOST_PHRASES,
    max_chars: int = DEFAULT_MAX_BOOST_PHRASE_CHARS,
) -> tuple[str, ...]:
    """Check a phrase list's count and lengths; return it normalised. Needs no model.

    Whitespace inside a phrase is collapsed to single spaces and trimmed; repeated phrases are kept once.

    Args:
        phrases: The phrases (None: none).
        max_phrases: Most phrases accepted (after removing repeats).
        max_chars: Longest phrase accepted, characters (after normalising whitespace).

    Returns:
        The normalised phrases (empty: no boosting).

    Raises:
        BoostPhraseError: Not a list of strings, an empty phrase, a phrase over ``max_chars``, or more than
            ``max_phrases`` phrases (the message names the limit and the offending phrase).

    """
    if phrases is None:
        return ()
    if isinstance(phrases, (str, bytes)) or not isinstance(phrases, Iterable):
        raise BoostPhraseError(
            f"boost phrases must be a list of strings, got {type(phrases).__name__} (wrap a single phrase in a list)"
        )
    out: dict[str, None] = {}
    for i, phrase in enumerate(phrases):
        if not isinstance(phrase, str):
            raise BoostPhraseError(f"boost phrase {i} must be a string, got {type(phrase).__name__}")
        text = " ".join(phrase.split())
        if not text:
            raise BoostPhraseError(f"boost phrase {i} is empty")
        if len(text) > max_chars:
            raise BoostPhraseError(
                f"boost phrase {i} has {len(text)} characters, more than the limit of {max_chars} "
                f"(max_boost_phrase_chars): {text[:max_chars]!r}..."
            )
        out[text] = None
        if len(out) > max_phrases:
            raise BoostPhraseError(
                f"more than {max_phrases} boost phrases (max_boost_phrases); send at most {max_phrases}"
            )
    return tuple(out)


def validate_boost_alpha(alpha: float) -> float:
    """Return ``alpha`` as a float if it is a usable boosting weight.

    Raises:
        BoostPhraseError: Not a number in (0, :data:`MAX_BOOST_ALPHA`].

    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise BoostPhraseError(f"boost_alpha must be a number in (0, {MAX_BOOST_ALPHA:g}], got {alpha!r}")
    if not 0.0 < alpha <= MAX_BOOST_ALPHA:
        raise BoostPhraseError(f"boost_alpha must be in (0, {MAX_BOOST_ALPHA:g}], got {alpha!r}")
    return float(alpha)


def validate_limits(max_phrases: int, max_chars: int) -> None:
    """Check ``EngineConfig``'s two limits (``max_phrases=0`` turns boosting off).

    Raises:
        ValueError: Naming the accepted ranges.

    """
    for name, value, ceiling in (
        ("max_boost_phrases", max_phrases, MAX_BOOST_PHRASES_LIMIT),
        ("max_boost_phrase_chars", max_chars, MAX_BOOST_PHRASE_CHARS_LIMIT),
    ):
        low = 0 if name == "max_boost_phrases" else 1
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= ceiling:
            raise ValueError(f"{name} must be an int from {low} to {ceiling}, got {value!r}")


def model_alphabet(pieces: Sequence[str]) -> frozenset[str] | None:
    """The characters a SentencePiece vocabulary can write, space included.

    Args:
        pieces: The tokenizer's pieces (``tokenizer.vocab``); ``"<...>"`` specials are skipped, ``"▁"`` is a space.

    Returns:
        The characters, or None if the vocabulary has byte-fallback pieces (``<0x41>``): it can write any.

    """
    chars: set[str] = {" "}
    for piece in pieces:
        if piece.startswith("<") and piece.endswith(">") and len(piece) > 2:
            if piece.startswith("<0x"):
                return None
            continue
        chars.update(piece.replace("\u2581", " "))
    return frozenset(chars)


def check_alphabet(phrases: Sequence[str], alphabet: frozenset[str] | None, model: str) -> None:
    """Refuse phrases with characters the model cannot write (they could never be matched).

    Args:
        phrases: Normalised phrases.
        alphabet: :func:`model_alphabet` of the model's tokenizer (None: any character).
        model: The model's name, for the message.

    Raises:
        BoostPhraseError: Naming the phrase and its characters, and saying that phrases are matched as the model
            writes them (case included).

    """
    if alphabet is None:
        return
    for i, phrase in enumerate(phrases):
        missing = sorted({c for c in phrase if c not in alphabet})
        if missing:
            lower_only = "".join(c.lower() for c in missing if c.lower() != c and c.lower() in alphabet)
            hint = (
                f" (this model writes {lower_only!r} in lower case only: write the phrase as it does)"
                if lower_only
                else ""
            )
            raise BoostPhraseError(
                f"boost phrase {i} {phrase!r} has characters that {model} cannot write: "
                f"{''.join(missing)!r}{hint}; phrases must be spelled and cased as the model writes them"
            )


@dataclass(frozen=True)
class BoostRules:
    """What a loaded engine accepts as a stream's boost list: the config's limits and the model's characters.

    Attributes:
        max_phrases: ``EngineConfig.max_boost_phrases``.
        max_chars: ``EngineConfig.max_boost_phrase_chars``.
        default_alpha: ``EngineConfig.default_boost_alpha``.
        alphabet: :func:`model_alphabet` of the model (None: any character).
        model: The model's name, for messages.
        unavailable: Says why this engine cannot boost (None: it can); called only when phrases are given.

    """

    max_phrases: int
    max_chars: int
    default_alpha: float
    alphabet: frozenset[str] | None
    model: str
    unavailable: Callable[[], str] | None = None

    def resolve(self, phrases: Iterable[str] | None, alpha: float | None) -> BoostList:
        """Validate a stream's phrases (count, length, the model's characters) and weight (None: the default).

        Raises:
            BoostPhraseError: Naming the limit or the phrase.
            BoostingUnavailableError: Phrases were given but the engine cannot boost.

        """
        # An engine that cannot boost says so rather than "more than 0 phrases" (max_boost_phrases=0).
        limit = self.max_phrases if self.unavailable is None else MAX_BOOST_PHRASES_LIMIT
        normalised = validate_boost_phrases(phrases, max_phrases=limit, max_chars=self.max_chars)
        weight = validate_boost_alpha(self.default_alpha if alpha is None else alpha)
        if normalised and self.unavailable is not None:
            raise BoostingUnavailableError(self.unavailable())
        check_alphabet(normalised, self.alphabet, self.model)
        return BoostList(normalised, weight)
