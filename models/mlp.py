"""Deep MLP with uneven layer widths, as an autopipe model file.

    autopipe profile models/mlp.py -k widths=512,2048,256,1024,128 -k depth=20

``depth`` hidden layers (Linear then GELU) in ``layers``, whose output widths cycle through
``widths``, then a linear ``head``. Layer i maps widths[i-1] to widths[i] features, so the
per-layer costs (in_features x out_features multiply-adds) differ by up to 64x between
neighbours with the default widths: the simplest chain on which equal-layer-count pipeline cuts
are visibly unbalanced. Inputs are random features; targets are random regression values (MSE).

``widths`` may be a tuple, a list, a single int, or a string such as "512,2048,256"
(``-k widths=512,2048,256`` arrives as a tuple).
"""

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

IntsLike = tuple[int, ...] | list[int] | int | str  # how -k may spell a tuple of ints


@dataclass(frozen=True)
class MLPConfig:
    widths: tuple[int, ...] = (512, 2048, 256, 1024, 128)  # hidden widths, cycled over the layers
    depth: int = 10  # hidden layers
    in_features: int = 256  # input features
    out_features: int = 16  # regression outputs

    def __post_init__(self) -> None:
        if not self.widths or not all(_is_positive_int(w) for w in self.widths):
            raise ValueError(
                f"widths must be positive layer widths (got {self.widths!r}); pass e.g. -k widths=512,2048,256"
            )
        for name in ("depth", "in_features", "out_features"):
            if not _is_positive_int(getattr(self, name)):
                raise ValueError(f"{name} must be a positive integer (got {getattr(self, name)!r})")

    def layer_widths(self) -> list[int]:
        """Output width of each hidden layer: widths repeated to length depth."""
        return [self.widths[i % len(self.widths)] for i in range(self.depth)]


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def int_tuple(value: IntsLike) -> tuple[int, ...]:
    """(512, 2048) from a tuple or list, a single int, or a string such as "512,2048"."""
    if isinstance(value, str):
        try:
            return tuple(int(part) for part in value.strip("()[] ").split(",") if part.strip())
        except ValueError:
            raise ValueError(f"expected comma-separated integers such as 512,2048,256 (got {value!r})") from None
    if isinstance(value, (tuple, list)):
        return tuple(value)
    return (value,)


class Layer(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.act = nn.GELU()

    def forward(self, x: Tensor) -> Tensor:  # x: (B, in_features)
        out: Tensor = self.act(self.linear(x))
        return out  # (B, out_features)


class MLP(nn.Module):
    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        self.config = cfg
        sizes = [cfg.in_features, *cfg.layer_widths()]
        self.layers = nn.ModuleList(Layer(a, b) for a, b in itertools.pairwise(sizes))
        self.head = nn.Linear(sizes[-1], cfg.out_features)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, in_features)
        for layer in self.layers:
            x = layer(x)  # (B, widths[i % len(widths)])
        out: Tensor = self.head(x)
        return out  # (B, out_features)


def make_config(
    widths: IntsLike | None = None,
    depth: int | None = None,
    in_features: int | None = None,
    out_features: int | None = None,
) -> MLPConfig:
    """The default config with every argument that is not None put in its place."""
    d = MLPConfig()
    return MLPConfig(
        widths=d.widths if widths is None else int_tuple(widths),
        depth=d.depth if depth is None else depth,
        in_features=d.in_features if in_features is None else in_features,
        out_features=d.out_features if out_features is None else out_features,
    )


def build_model(
    widths: IntsLike | None = None,
    depth: int | None = None,
    in_features: int | None = None,
    out_features: int | None = None,
) -> MLP:
    """A randomly initialised MLP (PyTorch's default Linear init)."""
    return MLP(make_config(widths, depth, in_features, out_features))


def example_inputs(batch_size: int, in_features: int | None = None, **_unused: object) -> Tensor:
    cfg = make_config(in_features=in_features)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch_size, cfg.in_features, generator=g, device="cpu")
    return x.to(torch.get_default_device())  # (B, in_features)


def example_targets(batch_size: int, out_features: int | None = None, **_unused: object) -> Tensor:
    cfg = make_config(out_features=out_features)
    g = torch.Generator().manual_seed(1)  # seed 1: not a function of the inputs
    y = torch.randn(batch_size, cfg.out_features, generator=g, device="cpu")
    return y.to(torch.get_default_device())  # (B, out_features)


def loss_fn(output: Tensor, targets: Tensor) -> Tensor:
    """Mean squared error: output and targets (B, out_features)."""
    return F.mse_loss(output, targets)
