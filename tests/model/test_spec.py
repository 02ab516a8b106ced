"""ModelSpec (``path[:factory]``) and ``-k key=value`` parsing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autopipe.errors import ModelLoadError
from autopipe.model.load import (
    ModelSpec,
    parse_kwargs,
)

torch.set_num_threads(1)


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        ([], {}),
        (["n_layer=48"], {"n_layer": 48}),
        (["lr=1e-3", "tie=True", "act=gelu", "name='gpt'"], {"lr": 1e-3, "tie": True, "act": "gelu", "name": "gpt"}),
        (["dims=(4, 8)", "x=None", "s="], {"dims": (4, 8), "x": None, "s": ""}),
        (["path=a=b"], {"path": "a=b"}),
        ([" n = 3 "], {"n": 3}),
    ],
)
def test_parse_kwargs(items: list[str], expected: dict[str, object]) -> None:
    assert parse_kwargs(items) == expected


@pytest.mark.parametrize(
    ("items", "parts"),
    [
        (["n_layer"], ["'n_layer'", "-k key=value"]),
        (["1x=3"], ["'1x'", "identifier"]),
        (["n=1", "n=2"], ["n", "twice"]),
    ],
)
def test_parse_kwargs_errors(items: list[str], parts: list[str]) -> None:
    with pytest.raises(ModelLoadError) as info:
        parse_kwargs(items)
    assert "\n" not in str(info.value)
    for part in parts:
        assert part in str(info.value)


def test_model_spec_parse_and_str() -> None:
    spec = ModelSpec.parse("models/gpt.py", {"n_layer": 4, "act": "gelu", "tag": "4"})
    assert spec.path == Path("models/gpt.py") and spec.factory == "build_model"
    assert str(spec) == "models/gpt.py:build_model -k n_layer=4 -k act=gelu -k tag='4'"
    assert parse_kwargs(["n_layer=4", "act=gelu", "tag='4'"]) == dict(spec.kwargs)
    assert ModelSpec.parse("models/gpt.py:build_small").factory == "build_small"
    assert ModelSpec.parse("models/gpt.py:build_small") == ModelSpec(Path("models/gpt.py"), "build_small")
    with pytest.raises(TypeError):
        spec.kwargs["n_layer"] = 5  # type: ignore[index]


@pytest.mark.parametrize("text", ["models/gpt.py:", "models/gpt.py:1abc", ":build"])
def test_model_spec_parse_errors(text: str) -> None:
    with pytest.raises(ModelLoadError):
        ModelSpec.parse(text)


def test_unwritable_kwargs_are_the_values_that_do_not_read_back() -> None:
    literals = {"a": 1, "b": 2.5, "c": "x y", "d": (1, [2, "3"]), "e": None, "f": True, "g": {"k": -1}, "h": "1"}
    assert ModelSpec(Path("m.py"), kwargs=literals).unwritable_kwargs() == ()
    objects = {"ok": 1, "obj": object(), "nan": float("nan"), "path": Path("p")}
    assert ModelSpec(Path("m.py"), kwargs=objects).unwritable_kwargs() == ("obj", "nan", "path")
