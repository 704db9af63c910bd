"""Import costs a user pays: the light modules load no torch, NeMo or Pipecat; old import paths still work."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipecat_nemotron._moved import MOVED

HEAVY = ("torch", "nemo", "pipecat")

#: Modules a client, a tool or a log parser imports without wanting a model (plain Python).
LIGHT_MODULES = (
    "pipecat_nemotron",
    "pipecat_nemotron.stt",
    "pipecat_nemotron.stt.result",
    "pipecat_nemotron.server.protocol",
    "pipecat_nemotron.engine",
    "pipecat_nemotron.engine.config",
    "pipecat_nemotron.engine.types",
    "pipecat_nemotron.magpie",
    "pipecat_nemotron.latency_stats",
)


def _heavy_after(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter; the heavy packages it left imported."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", LIGHT_MODULES)
def test_light_modules_import_no_torch_nemo_or_pipecat(module: str) -> None:
    assert _heavy_after(f"import {module}") == []


def test_cli_help_imports_no_torch() -> None:
    code = (
        "import contextlib, io, sys\nfrom pipecat_nemotron.cli import main\n"
        "for argv in (['--help'], ['serve', '--help']):\n"
        "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "        main(argv)"
    )
    assert _heavy_after(code) == []


def test_package_names_resolve_lazily() -> None:
    import pipecat_nemotron.engine as engine
    import pipecat_nemotron.stt as stt

    assert stt.TranscriptResult.__module__ == "pipecat_nemotron.stt.result"
    assert engine.EngineConfig.__module__ == "pipecat_nemotron.engine.config"
    assert "NemotronServerSTTService" in dir(stt)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        stt.Nope  # noqa: B018


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_import_paths_warn_and_are_the_new_modules(old: str) -> None:
    code = (
        "import importlib, warnings\nwarnings.simplefilter('error', DeprecationWarning)\n"
        f"try:\n    importlib.import_module({old!r})\nexcept DeprecationWarning as w:\n    print('WARNED', w)\n"
        f"warnings.simplefilter('ignore')\nimport sys\nold = importlib.import_module({old!r})\n"
        f"print('SAME', old is sys.modules[{MOVED[old]!r}])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert f"WARNED {old} moved to {MOVED[old]}" in out
    assert "SAME True" in out


def test_stt_services_import_no_torch_until_an_engine_is_made() -> None:
    # A bot on a machine without a GPU runs only the remote service: it never needs torch or NeMo.
    heavy = _heavy_after("import pipecat_nemotron.stt.remote.service, pipecat_nemotron.stt.local")
    assert "torch" not in heavy and "nemo" not in heavy


def test_no_test_module_imports_another() -> None:
    # Shared code lives in helpers.py (and the peers' modules), shared fixtures in conftest.py.
    import re
    from pathlib import Path

    pattern = re.compile(r"^\s*(from (test_\w+|conftest) import|import (test_\w+|conftest)\b)", re.M)
    offenders = [p.name for p in Path(__file__).parent.glob("*.py") if pattern.search(p.read_text())]
    assert offenders == []
