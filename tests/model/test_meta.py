"""Building on meta without running the weight initialisers: same model, no fills run."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from autopipe.model.load import load_model
from autopipe.model.meta import SkipMetaFills
from tests.helpers import MODELS

torch.set_num_threads(1)


class _Filled(TorchDispatchMode):
    """Counts the in-place fills (``normal_``, ``uniform_``, ``fill_``, ``zero_``, ...) that reach an
    operator, whatever called them."""

    FILLS = ("normal_", "uniform_", "fill_", "zero_", "bernoulli_", "exponential_", "random_", "copy_")

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        self.count += func.__name__.split(".")[0] in self.FILLS
        return func(*args, **(kwargs or {}))


class _Seen(TorchFunctionMode):
    """Below SkipMetaFills: records what it lets through."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        self.names.append(getattr(func, "__name__", ""))
        return func(*args, **(kwargs or {}))


def test_fills_of_meta_tensors_are_skipped_and_others_run() -> None:
    meta = torch.empty(3, 4, device="meta")
    cpu = torch.zeros(3, 4)
    with _Seen() as seen, SkipMetaFills():
        assert torch.nn.init.normal_(meta, std=0.02) is meta
        assert torch.nn.init.kaiming_uniform_(meta) is meta
        assert meta.uniform_() is meta
        skipped = list(seen.names)
        torch.nn.init.ones_(cpu)  # a real tensor is filled
        moved = meta.add_(1.0)  # not a fill: runs (on meta, shape only)
        with pytest.raises(ValueError, match="fewer than 2 dimensions"):  # as without the mode
            torch.nn.init.kaiming_uniform_(torch.empty(3, device="meta"))
    assert not {"normal_", "uniform_", "kaiming_uniform_"} & set(skipped), skipped  # only dim/size reads got through
    assert {"ones_", "fill_"} & set(seen.names) and "add_" in seen.names
    assert meta.shape == (3, 4) and meta.is_meta and moved.shape == (3, 4)
    assert float(cpu.sum()) == 12.0


def test_meta_build_matches_a_real_build_and_is_quick() -> None:
    kwargs = {"preset": "tiny", "n_layer": 3}
    real = load_model(str(MODELS / "gpt.py"), kwargs)
    meta = load_model(str(MODELS / "gpt.py"), kwargs, device="meta")
    shapes = {n: (p.shape, p.dtype) for n, p in real.model.named_parameters()}
    assert {n: (p.shape, p.dtype) for n, p in meta.model.named_parameters()} == shapes
    assert all(p.is_meta for p in meta.model.parameters())
    big = {"preset": "gpt3-175b", "n_layer": 8}  # 8 layers 12,288 wide: ~1 s of fills if they ran
    with _Filled() as filled:
        load_model(str(MODELS / "gpt.py"), big, device="meta")
    assert filled.count == 0  # not one initialiser reached an operator
    with _Filled() as unskipped, torch.device("meta"):
        load_model(str(MODELS / "gpt.py"), big)  # the same build, its fills not skipped
    assert unskipped.count > 0  # so the count above sees fills when they run
