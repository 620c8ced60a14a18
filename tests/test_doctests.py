"""The examples in the package's docstrings run and give what they show (one case per module)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import topocoll

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(topocoll.__path__, prefix="topocoll.")
    if not info.name.endswith("__main__")  # runs the command when imported
)


def _has_examples(name: str) -> bool:
    return any(test.examples for test in doctest.DocTestFinder().find(importlib.import_module(name)))


@pytest.mark.parametrize("name", [name for name in MODULES if _has_examples(name)])
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, report=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (run python -m doctest -v on it)"
