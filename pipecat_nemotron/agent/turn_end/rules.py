"""What a transcript says about the end of a turn: complete, visibly continuing, or no telling (per language).

The rules are data (:class:`TurnEndRules`, one per language in :data:`RULES`), read against the turn's final text:

- **continues**: the text ends on a mark that leads on (``,`` ``;`` ``:`` ``-`` ``…``), on a word no sentence
  ends on (an article, a conjunction, a possessive, a filler: "and", "the", "my", "um"), or, unpunctuated, on a
  word a sentence rarely ends on (a preposition, an auxiliary, a question word, an arithmetic operator: "set a
  timer for", "what is nine plus"). Punctuated, those end questions ("Where are you from?", "¿Qué hora es?"),
  but a few never end a statement: before a full stop they still go on ("Set a timer for.", written by a
  punctuating model at a pause inside the sentence).
- **complete**: the text ends with terminal punctuation (``.`` ``?`` ``!``), as the real Nemotron models write
  it ("What is nine plus four?"). Lower-case text with no punctuation at all (a model that writes neither, as the
  bundled bilingual tiny model) is complete when it ends on a closing word ("please", "thanks", "thank you") or when, after a greeting, it
  opens like a question or a request ("what", "how", "set", "remind") and runs at least ``min_words`` words.
- **unknown**: anything else ("my number is four three nine"); the audio (Smart Turn) decides.

A punctuated text is judged by its punctuation and last word only: a model that writes punctuation writes it where
the sentence ends, and its absence then means the sentence has not ended. A text with a capital counts as
punctuated: models that write case ("Set a timer for six") write punctuation too.
"""

from __future__ import annotations

import enum
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["RULES", "TextVerdict", "TurnEndRules", "rules_for"]


class TextVerdict(enum.Enum):
    """What the transcript says about the end of the turn."""

    COMPLETE = "complete"
    CONTINUES = "continues"
    UNKNOWN = "unknown"


def _fold(word: str) -> str:
    """Lower case, accents and surrounding punctuation removed ("¿Qué?" -> "que")."""
    decomposed = unicodedata.normalize("NFD", word.lower())
    plain = "".join(c for c in decomposed if unicodedata.category(c) != "Mn")
    return plain.strip(".,;:!?¿¡'\"()[]…-–—")


def _words(text: str) -> frozenset[str]:
    return frozenset(_fold(w) for w in text.split())


def _phrases(text: str) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(_fold(w) for w in p.split()) for p in text.split("|"))


@dataclass(frozen=True)
class TurnEndRules:
    """One language's rules (words compared folded: lower case, no accents, no punctuation).

    Attributes:
        language: ISO 639-1 code (``"en"``, ``"es"``).
        open_words: A turn whose last word is one of these goes on, punctuated or not.
        continue_words: An unpunctuated turn whose last word is one of these goes on.
        closers: Phrases (word tuples) that end a request ("please", "thank you"): unpunctuated text ending in
            one is complete.
        openers: First words of a question or a request: unpunctuated text starting with one (after
            ``skip_words``) and running ``min_words`` words is complete.
        skip_words: Greetings and fillers skipped before the opener ("hi", "hello").
        statement_continue_words: A turn ending in one of these before a full stop goes on: no statement ends on
            them ("Set a timer for."), though a question may ("What is it for?").
        min_words: Words from the opener on that make an unpunctuated question or request complete.
        terminal_marks: Characters that end a sentence.
        continue_marks: Characters that, last in the text, lead on.

    """

    language: str
    open_words: frozenset[str]
    continue_words: frozenset[str]
    closers: tuple[tuple[str, ...], ...]
    openers: frozenset[str]
    skip_words: frozenset[str]
    statement_continue_words: frozenset[str] = frozenset()
    min_words: int = 5
    full_stop: str = "."
    terminal_marks: str = ".?!"
    continue_marks: str = ",;:-–—…"

    def __post_init__(self) -> None:
        if self.min_words < 1:
            raise ValueError(f"min_words must be >= 1, got {self.min_words!r}")
        if set(self.terminal_marks) & set(self.continue_marks):
            raise ValueError("terminal_marks and continue_marks must not share a character")

    def verdict(self, text: str) -> TextVerdict:
        """Judge a turn's text (all its finals joined) by these rules."""
        stripped = text.strip().rstrip("\"')]»”’")
        words = [w for w in (_fold(w) for w in stripped.split()) if w]
        if not words:
            return TextVerdict.UNKNOWN
        if stripped[-1] in self.continue_marks or words[-1] in self.open_words:
            return TextVerdict.CONTINUES
        if stripped[-1] in self.full_stop and words[-1] in self.statement_continue_words:
            return TextVerdict.CONTINUES
        if stripped[-1] in self.terminal_marks:
            return TextVerdict.COMPLETE
        if words[-1] in self.continue_words:
            return TextVerdict.CONTINUES
        if any(c in stripped for c in self.terminal_marks + self.continue_marks) or any(c.isupper() for c in stripped):
            # A punctuating model (marks, or capitals: the models that write case punctuate too) writes no mark
            # at the end: the sentence has not ended.
            return TextVerdict.UNKNOWN
        if any(tuple(words[-len(p) :]) == p for p in self.closers if len(p) <= len(words)):
            return TextVerdict.COMPLETE
        start = 0
        while start < len(words) and words[start] in self.skip_words:
            start += 1
        if start < len(words) and words[start] in self.openers and len(words) - start >= self.min_words:
            return TextVerdict.COMPLETE
        return TextVerdict.UNKNOWN


ENGLISH = TurnEndRules(
    language="en",
    open_words=_words("a an the and or but because if than my your our their its um uh er"),
    continue_words=_words(
        "so for to of in on at by with from into about after before until is are was were am be been do does "
        "did can could will would should shall may might must what which who whom whose how when where why his "
        "her times plus minus divided"
    ),
    closers=_phrases("please|thanks|thank you|thanks a lot|that's all|that is all"),
    openers=_words(
        "what how where when who why which is are can could do does will would should set remind cancel tell "
        "give show play stop start turn call"
    ),
    skip_words=_words("hi hey hello okay ok so well oh please"),
    # Not "to", "in", "on", "up", "by": statements end on them ("I'd love to.", "Log me in.", "Stop by.").
    statement_continue_words=_words("for of from with into than plus minus times divided"),
)

SPANISH = TurnEndRules(
    language="es",
    open_words=_words("el la los las un una unos unas al del y e o u ni pero porque aunque mi mis tu tus su sus eh"),
    continue_words=_words(
        "lo que si de a en con por para sin sobre entre hasta desde hacia es son esta estan era fue ha han hay "
        "puede puedes nuestro nuestra cual cuanto cuantos cuantas como donde cuando quien mas menos este"
    ),
    closers=_phrases("por favor|gracias|muchas gracias|eso es todo"),
    openers=_words(
        "que como cual cuanto cuanta cuantos cuantas donde cuando quien pon ponme recuerdame dime cancela es hay "
        "puedes podrias"
    ),
    skip_words=_words("hola oye bueno vale buenas buenos dias tardes"),
    # Spanish strands no preposition: a sentence never ends on one.
    statement_continue_words=_words("de a en con por para sin sobre entre hasta desde hacia mas menos"),
)

#: Rules per language code; :func:`rules_for` picks one.
RULES: Mapping[str, TurnEndRules] = {"en": ENGLISH, "es": SPANISH}


def rules_for(language: object | None, default: str = "en") -> TurnEndRules:
    """The rules for a language (Pipecat's ``Language``, ``"es-ES"``, ``"es"``); ``default``'s when unknown."""
    code = str(getattr(language, "value", language) or "").split("-")[0].lower()
    return RULES.get(code) or RULES[default]
