"""Language prompts of multilingual models: what a stream asks for, and the one-hot index the model gets.

A model of NeMo's prompt class (``EncDecRNNTBPEModelWithPrompt`` and its hybrid variant, the class of
``nvidia/nemotron-3.5-asr-streaming-0.6b``) joins a language one-hot to every encoder frame and projects it
back (``prompt_kernel``) before decoding. Its config maps locales to one-hot indices
(``model_defaults.prompt_dictionary``, e.g. ``{"en-US": 0, ..., "auto": 101}``); ``"auto"`` is the
language-agnostic prompt. Nothing here imports torch or NeMo.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipecat_nemotron.asr.config import MULTILINGUAL_MODEL

#: Prompt key of the language-agnostic prompt ("work out the language yourself").
AUTO = "auto"

#: A normalised language code: a language of 2-8 letters, then subtags of 1-8 letters or digits (BCP 47's shape).
_CODE = re.compile(r"[a-z]{2,8}(-[a-z0-9]{1,8})*")


def language_code(language: Any) -> str:
    """A language given as a string or a ``str`` enum (Pipecat's ``Language``) as its normalised code.

    ``"es_ES"``, ``"ES-es"`` and ``Language.ES_ES`` all become ``"es-es"`` (compare case-insensitively).

    Raises:
        ValueError: Not shaped like a language code (BCP 47: ``"es"``, ``"es-ES"``, ``"zh-Hans-CN"``) nor ``"auto"``.

    """
    value = getattr(language, "value", language)
    code = value.strip().replace("_", "-").lower() if isinstance(value, str) else ""
    if code != AUTO and not _CODE.fullmatch(code):
        raise ValueError(f"a language must be a code such as 'es-ES', 'es' or 'auto', got {language!r:.60}")
    return code


def is_english(language: Any) -> bool:
    """True for ``"en"`` and every English locale (``"en-US"``, ``Language.EN_GB``)."""
    return language_code(language).split("-")[0] == "en"


@dataclass(frozen=True)
class LanguagePrompts:
    """The prompt dictionary of a loaded multilingual model.

    Attributes:
        dictionary: Prompt key (a locale such as ``"es-ES"``, or ``"auto"``) -> one-hot index.
        num_prompts: Width of the one-hot.

    """

    dictionary: Mapping[str, int]
    num_prompts: int

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.dictionary.items() if not 0 <= int(v) < self.num_prompts}
        if bad:
            raise ValueError(f"prompt indices outside [0, {self.num_prompts}): {bad}")

    @classmethod
    def from_model(cls, model: Any) -> LanguagePrompts | None:
        """The model's prompts, or None for a model without language prompts (the English model).

        Raises:
            ValueError: A prompt model whose config has no usable ``prompt_dictionary``.

        """
        if not getattr(model, "concat", False) or getattr(model, "prompt_kernel", None) is None:
            return None
        defaults = model.cfg.model_defaults
        dictionary = dict(defaults.get("prompt_dictionary") or {})
        num_prompts = int(getattr(model, "num_prompts", None) or defaults.get("num_prompts", 0))
        if not dictionary or num_prompts <= 0:
            raise ValueError(
                "the model joins a language prompt to its encoder output but its config has no "
                "model_defaults.prompt_dictionary / num_prompts; re-export it with them"
            )
        return cls({str(k): int(v) for k, v in dictionary.items()}, num_prompts)

    @classmethod
    def from_keys(cls, keys: tuple[str, ...] | list[str]) -> LanguagePrompts:
        """Prompts numbered in the order of ``keys`` (what a server's ``ready.languages`` lists)."""
        return cls({k: i for i, k in enumerate(keys)}, max(1, len(keys)))

    @property
    def languages(self) -> tuple[str, ...]:
        """The model's locales (without ``"auto"``), in index order."""
        return tuple(k for k, _ in sorted(self.dictionary.items(), key=lambda kv: kv[1]) if k != AUTO)

    @property
    def has_auto(self) -> bool:
        """The model has the language-agnostic prompt."""
        return AUTO in self.dictionary

    def resolve(self, language: Any) -> str:
        """The prompt key for a requested language.

        An exact locale wins (case and ``_``/``-`` ignored); a bare language (``"es"``, ``Language.ES``) takes
        the locale of the same name (``es-ES``, and ``en-US`` for English) or else the first of that language.
        A locale the model lacks (``"en-GB"`` on a model with only ``en-US``) is refused, not mapped to another
        locale of its language: the caller asked for that locale, and the model's locales are listed to it.

        Raises:
            ValueError: The model has no such language (the message lists the model's).

        """
        code = language_code(language)
        by_code = {k.lower(): k for k in self.dictionary}
        if code in by_code:
            return by_code[code]
        base = code.split("-")[0]
        same = [k for k in self.languages if k.lower().split("-")[0] == base]
        if same and code == base:
            preferred = {f"{base}-{base}", "en-us"}
            return next((k for k in same if k.lower() in preferred), same[0])
        raise ValueError(
            f"language {getattr(language, 'value', language)!r} is not one of this model's languages: "
            f"{list(self.languages)}{' or auto' if self.has_auto else ''}"
        )

    def default(self) -> str:
        """The key used when a stream asks for none: ``"auto"`` if the model has it, else its first locale."""
        return AUTO if self.has_auto else self.languages[0]

    def index(self, key: str) -> int:
        """One-hot index of a resolved prompt key."""
        return self.dictionary[key]


def resolve_prompt(
    prompts: LanguagePrompts | None, requested: Any, model: str
) -> tuple[str | None, int | None]:
    """``(prompt key, one-hot index)`` a stream asking for ``requested`` decodes with (None: the model's default).

    The one language check of the engine (streams, the configured default) and of the server client (against the
    ``ready`` of its session).

    Raises:
        ValueError: The model has no such language (the message lists the model's), or an English-only model
            (``prompts`` None: English and ``"auto"`` pass) is asked for another language.

    """
    if prompts is None:
        if requested is not None and language_code(requested) != AUTO and not is_english(requested):
            raise ValueError(
                f"the loaded model ({model}) transcribes English only, got language "
                f"{getattr(requested, 'value', requested)!r}; load a multilingual model such as "
                f"{MULTILINGUAL_MODEL!r} for other languages"
            )
        return None, None
    key = prompts.default() if requested is None else prompts.resolve(requested)
    return key, prompts.index(key)
