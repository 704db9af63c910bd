"""Import costs a user pays: the light modules load no torch, NeMo or Pipecat; the package layout's contracts hold."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "nemo", "pipecat")

#: Modules a client, a tool or a log parser imports without wanting a model (plain Python).
LIGHT_MODULES = (
    "pipecat_nemotron",
    "pipecat_nemotron.stt",
    "pipecat_nemotron.asr.types",
    "pipecat_nemotron.server.protocol",
    "pipecat_nemotron.asr",
    "pipecat_nemotron.asr.config",
    "pipecat_nemotron.asr.types",
    "pipecat_nemotron.tts.magpie",
    "pipecat_nemotron.observers.latency_stats",
    "pipecat_nemotron.tts",
    "pipecat_nemotron.llm",
    "pipecat_nemotron.agent",
    "pipecat_nemotron.observers",
    "pipecat_nemotron.runtime.stats",
)


def _heavy_after(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter; the heavy packages it left imported."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
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
    import pipecat_nemotron.asr as engine
    import pipecat_nemotron.stt as stt

    assert stt.Transcript.__module__ == "pipecat_nemotron.asr.types"
    assert engine.EngineConfig.__module__ == "pipecat_nemotron.asr.config"
    assert "NemotronServerSTTService" in dir(stt)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        stt.Nope  # noqa: B018


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


def test_the_layers_and_contracts_in_pyproject_hold() -> None:
    # The same check `make lint` runs: the engines import no Pipecat, lower layers never import upper ones, no
    # import circles inside a package (pyproject.toml, [tool.importlinter]).
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout or "broken" not in out.stdout.split("Contracts:")[-1]


def test_the_package_root_is_a_table_of_contents() -> None:
    # Each entry at the root is something a user imports or runs; moved names are not kept as aliases.
    from pathlib import Path

    import pipecat_nemotron

    root = Path(pipecat_nemotron.__file__).parent
    entries = sorted(
        p.name for p in root.iterdir() if p.name not in ("__pycache__", "__init__.py", "py.typed", "assets")
    )
    assert entries == [
        "agent",
        "asr",
        "bench",
        "cli.py",
        "demo.py",
        "llm",
        "models.py",
        "observers",
        "runtime",
        "server",
        "stt",
        "tts",
    ]
