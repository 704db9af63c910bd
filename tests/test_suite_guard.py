"""A guard on the suite itself: every ``test_`` function can fail.

Each ``tests/test_*.py`` is parsed with :mod:`ast` (nothing is imported or run): a test function must contain an
``assert``, a ``raise``, a ``pytest.raises`` / ``pytest.warns`` / ``pytest.fail``, or a call to one of the
helpers in :data:`ASSERTING_HELPERS`. A test with none of these passes whatever the code does.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent

#: Helpers that assert on a test's behalf, by the name they are called with. Keep it small: a test that asserts
#: itself needs no entry.
ASSERTING_HELPERS: dict[str, str] = {
    # helpers.py: asserts the finals equal the engine's transcripts in each language, the one refusal's
    # ErrorFrame and the service's language afterwards.
    "run_language_switches": "finals, languages, the refusal and the final setting",
    # test_server_boost.py: asserts the finals, the two refusals' ErrorFrames and the boost settings after them.
    "check_settings_run": "finals, refusals and boost settings",
}

#: ``pytest.<name>(...)`` calls that make a test fail when their expectation does not hold.
_PYTEST_CHECKS = frozenset({"raises", "warns", "fail"})


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _can_fail(test: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for node in ast.walk(test):
        if isinstance(node, (ast.Assert, ast.Raise)):
            return True
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in _PYTEST_CHECKS:
                if isinstance(func.value, ast.Name) and func.value.id == "pytest":
                    return True
            if _called_name(node) in ASSERTING_HELPERS:
                return True
    return False


def cannot_fail(source: str, filename: str = "<source>") -> list[str]:
    """``"file:line name"`` of every ``test_`` function in ``source`` that cannot fail (see the module docstring)."""
    tree = ast.parse(source, filename=filename)
    tests = [
        node
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")
    ]
    return [f"{filename}:{t.lineno} {t.name}" for t in sorted(tests, key=lambda t: t.lineno) if not _can_fail(t)]


def test_every_test_in_the_suite_can_fail() -> None:
    files = sorted(TESTS.glob("test_*.py"))
    assert len(files) > 30, files  # the glob found the suite
    found = [f for path in files for f in cannot_fail(path.read_text(), path.name)]
    assert not found, "tests that assert nothing (add an assert, or an ASSERTING_HELPERS entry):\n" + "\n".join(found)


def test_the_guard_flags_an_empty_test_and_passes_the_ways_a_test_can_fail() -> None:
    source = '''
import pytest

def test_empty():
    pass

async def test_only_calls(engine):
    await engine.start()

class TestGroup:
    def test_method_without_check(self):
        print("hi")

    def test_method_with_assert(self):
        assert 1

def test_assert():
    assert 1 + 1 == 2

def test_raise():
    raise RuntimeError("never")

def test_pytest_raises():
    with pytest.raises(ValueError):
        int("x")

def test_pytest_fail():
    pytest.fail("always")

def test_calls_an_asserting_helper(stt):
    check_settings_run(stt, [], [], {}, 3)

def test_a_raises_of_another_module():
    with other.raises(ValueError):
        pass

def helper_without_check():
    pass
'''
    assert cannot_fail(source, "synthetic.py") == [
        "synthetic.py:4 test_empty",
        "synthetic.py:7 test_only_calls",
        "synthetic.py:11 test_method_without_check",
        "synthetic.py:33 test_a_raises_of_another_module",
    ]
