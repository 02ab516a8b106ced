"""autopipe/config/check.py: a config's module names held to a model (``autopipe config --check``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autopipe.config.check import check_layers, check_parts, model_units, name_list
from autopipe.errors import ConfigError


class Decoder(nn.Module):
    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))  # the root's own: every part keeps it
        self.embed = nn.Embedding(8, 4)
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(n))
        self.drop = nn.Dropout()  # nothing to hold
        self.head = nn.Linear(4, 8)


def _fails(parts: list[list[str]], model: nn.Module) -> str:
    with pytest.raises(ConfigError) as e:
        check_parts(parts, model, "m.py")
    return str(e.value)


def test_units_and_name_lists() -> None:
    assert model_units(Decoder()) == ["embed", "layers.0", "layers.1", "layers.2", "drop", "head"]
    assert name_list(["wte", "blocks.0", "blocks.1", "blocks.2", "ln_f", "blocks.4"]) == (
        "wte, blocks.0 .. blocks.2, ln_f, blocks.4"
    )
    assert name_list([f"x{i}" for i in range(10)]).endswith("x7, ...")


def test_parts_that_name_and_cover_the_model_pass() -> None:
    model = Decoder().to("meta")
    check_parts([["embed", "layers.0"], ["layers.1", "layers.2", "head"]], model, "m.py")
    check_parts([["embed..layers.1"], ["layers.2..head"]], model, "m.py")  # merged blocks, end to end


def test_missing_uncovered_and_doubled_modules_are_one_line() -> None:
    model = Decoder()
    assert _fails([["wte", "layers.0"], ["layers.1", "layers.2", "lm_head"]], model) == (
        "m.py: the config names wte, lm_head, which the model has no module for "
        "(it has embed, layers.0 .. layers.2, drop, head); plan this model, or map the names"
    )
    assert _fails([["embed..layers.7"]], model).startswith("m.py: the config names embed..layers.7,")
    assert _fails([["embed", "layers.0"], ["layers.2"]], model).startswith("m.py: no part holds layers.1, head, ")
    assert _fails([["embed", "layers"], ["layers.2", "head"]], model) == (
        "m.py: layers.2 (parts 0 and 1) sit in two parts, which would train two copies; "
        "plan this model, or name each module in one part"
    )


def test_layer_list_and_its_length() -> None:
    model = Decoder(4).to("meta")
    check_layers("layers", 4, model, "m.py")
    with pytest.raises(
        ConfigError, match=r"^m.py: the config has --num-layers 3 but the model has 4 layers in layers;"
    ):
        check_layers("layers", 3, model, "m.py")
    with pytest.raises(
        ConfigError,
        match=r"^m.py: the config's layers are the plan's blocks, .* "
        r"\(it has embed, layers, drop, head\); plan this model$",
    ):
        check_layers("blocks", 4, model, "m.py")
