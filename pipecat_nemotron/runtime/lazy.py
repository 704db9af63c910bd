"""Names a package exports without importing their modules until first use (PEP 562).

Every package ``__init__`` of ``pipecat_nemotron`` that re-exports names uses :func:`lazy_exports`, so that
``import pipecat_nemotron.tts`` (say) costs milliseconds and torch, NeMo or Pipecat load only when a name that
needs them is first read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: Mapping[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Build a package's module-level ``__getattr__`` and ``__dir__`` for names defined in its submodules.

    Args:
        package: The package's ``__name__`` (for the error message).
        exports: Exported name -> the dotted module that defines it.
        namespace: The package's ``globals()`` (what ``dir()`` lists besides the exports).

    Returns:
        ``(__getattr__, __dir__)`` to assign at the package's top level.

    """

    def __getattr__(name: str) -> Any:  # noqa: N807
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def __dir__() -> list[str]:  # noqa: N807
        return sorted([*namespace, *exports])

    return __getattr__, __dir__
