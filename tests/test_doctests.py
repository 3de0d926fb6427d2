"""Every ``Example::`` in the package's docstrings runs and prints what it says."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest
import torch

import lightning_epipe

MODULES = sorted(m.name for m in pkgutil.walk_packages(lightning_epipe.__path__, "lightning_epipe."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    torch.manual_seed(0)  # the examples hold for any seed tried (30); CI runs one
    result = doctest.testmod(importlib.import_module(name), extraglobs={"torch": torch})
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples in {name} failed"
