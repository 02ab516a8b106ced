"""The one loader and switch of the C extensions (autopipe/native.py): what it loads, what it
reports, and that one call switches every twin module to its Python loops."""

from __future__ import annotations

import numpy as np
import pytest

import autopipe.planner  # noqa: F401  # before autopipe.partition, which imports planner._recent (a circle being removed)
from autopipe import native
from autopipe.partition import greedy
from autopipe.schedules.v_shapes import v_block
from autopipe.simulate import simcore


def test_each_twin_module_holds_the_extension_the_loader_gives() -> None:
    assert (simcore._C, greedy._NATIVE, v_block._C) == tuple(native.load(name) for name in native.EXTENSIONS)
    assert native.missing() == tuple(name for name in native.EXTENSIONS if not native.available(name))
    assert native.available() == (not native.missing())


def test_an_unknown_extension_is_refused_in_one_line() -> None:
    with pytest.raises(
        ValueError,
        match=r"^'autopipe\.simulate\.events' is not one of autopipe's C extensions; "
        r"use one of autopipe\.simulate\._simcore, ",
    ):
        native.load("autopipe.simulate.events")


def test_one_switch_turns_every_extension_off_and_back(native_and_python: str) -> None:
    assert native.enabled() == (native_and_python == "native")
    assert native.in_use() == (native_and_python == "native")
    with native.python_twins():
        assert not native.enabled() and not any(native.in_use(name) for name in native.EXTENSIONS)
        assert v_block._in_c(np.array([[0, 1, 2, 3]]), 2) is None  # the V builder's Python steps
    assert native.enabled() == (native_and_python == "native")
    before = native.use_native(True)
    assert native.use_native(before) is True
