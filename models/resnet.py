"""ResNet with bottleneck blocks, as an autopipe model file.

    autopipe profile models/resnet.py -k layers=3,4,23,3
    autopipe plan models/resnet.py -k width=64 -k image_size=224 -k num_classes=1000

He et al. 2016, "Deep Residual Learning for Image Recognition" (bottleneck block 1x1-3x3-1x1,
expansion 4, projection shortcut where the shape changes; stride in the 3x3 conv as in
torchvision's "ResNet v1.5"). A stem (7x7/2 conv, 3x3/2 max-pool), stages in ``layers``
(stage i: ``layers[i]`` blocks, ``width * 2**i`` bottleneck channels, stride 2 from the second
stage on), global average pooling and a linear classifier in ``fc``.

Per-block costs are uneven on purpose: the first block of each stage carries the projection
shortcut, early stages hold large activations and few parameters, late stages the reverse.

Defaults: ResNet-50 layout (3, 4, 6, 3) at width 16 on 64x64 images with 10 classes, small
enough for a CPU. ``-k width=64 -k image_size=224 -k num_classes=1000`` is torchvision's
ResNet-50 (25,557,032 parameters); layers (3, 4, 23, 3) is ResNet-101, (3, 8, 36, 3) ResNet-152.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

EXPANSION = 4  # bottleneck output channels = EXPANSION * its inner width

IntsLike = tuple[int, ...] | list[int] | int | str  # how -k may spell a tuple of ints


@dataclass(frozen=True)
class ResNetConfig:
    layers: tuple[int, ...] = (3, 4, 6, 3)  # bottleneck blocks per stage (ResNet-50)
    width: int = 16  # stem channels and inner width of the first stage (ResNet-50: 64)
    num_classes: int = 10  # classifier outputs
    image_size: int = 64  # H = W of example images
    in_channels: int = 3  # image channels

    def __post_init__(self) -> None:
        if not self.layers or not all(_is_positive_int(n) for n in self.layers):
            raise ValueError(
                f"layers must be positive block counts, one per stage (got {self.layers!r}); pass e.g. -k layers=3,4,6,3"
            )
        for name in ("width", "num_classes", "image_size", "in_channels"):
            if not _is_positive_int(getattr(self, name)):
                raise ValueError(f"{name} must be a positive integer (got {getattr(self, name)!r})")


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def int_tuple(value: IntsLike) -> tuple[int, ...]:
    """(3, 4, 6, 3) from a tuple or list, a single int, or a string such as "3,4,6,3"."""
    if isinstance(value, str):
        try:
            return tuple(int(part) for part in value.strip("()[] ").split(",") if part.strip())
        except ValueError:
            raise ValueError(f"expected comma-separated integers such as 3,4,6,3 (got {value!r})") from None
    if isinstance(value, (tuple, list)):
        return tuple(value)
    return (value,)


class Bottleneck(nn.Module):
    """relu(x' + bn(conv1x1(relu(bn(conv3x3/stride(relu(bn(conv1x1(x))))))))), x' the shortcut."""

    def __init__(self, in_ch: int, inner: int, stride: int) -> None:
        super().__init__()
        out_ch = EXPANSION * inner
        self.conv1 = nn.Conv2d(in_ch, inner, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(inner)
        self.conv2 = nn.Conv2d(inner, inner, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(inner)
        self.conv3 = nn.Conv2d(inner, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:  # projection shortcut
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: Tensor) -> Tensor:  # x: (B, in_ch, H, W)
        y = F.relu(self.bn1(self.conv1(x)))  # (B, inner, H, W)
        y = F.relu(self.bn2(self.conv2(y)))  # (B, inner, H/s, W/s)
        y = self.bn3(self.conv3(y))  # (B, out_ch, H/s, W/s)
        return F.relu(y + self.downsample(x))  # (B, out_ch, H/s, W/s)


class ResNet(nn.Module):
    def __init__(self, cfg: ResNetConfig) -> None:
        super().__init__()
        self.config = cfg
        self.stem = nn.Sequential(
            nn.Conv2d(cfg.in_channels, cfg.width, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(cfg.width),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        stages = []
        in_ch = cfg.width
        for i, n_blocks in enumerate(cfg.layers):
            inner = cfg.width * 2**i
            blocks = []
            for j in range(n_blocks):
                blocks.append(Bottleneck(in_ch, inner, stride=2 if i > 0 and j == 0 else 1))
                in_ch = EXPANSION * inner
            stages.append(nn.Sequential(*blocks))
        self.layers = nn.ModuleList(stages)
        self.fc = nn.Linear(in_ch, cfg.num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, 3, H, W)
        x = self.stem(x)  # (B, width, H/4, W/4)
        for stage in self.layers:
            x = stage(x)  # (B, 4 * width * 2**i, H / 2**(i+2), W / 2**(i+2))
        logits: Tensor = self.fc(x.mean(dim=(2, 3)))
        return logits  # (B, num_classes)


def make_config(
    layers: IntsLike | None = None,
    width: int | None = None,
    num_classes: int | None = None,
    image_size: int | None = None,
    in_channels: int | None = None,
) -> ResNetConfig:
    """The default config with every argument that is not None put in its place."""
    d = ResNetConfig()
    return ResNetConfig(
        layers=d.layers if layers is None else int_tuple(layers),
        width=d.width if width is None else width,
        num_classes=d.num_classes if num_classes is None else num_classes,
        image_size=d.image_size if image_size is None else image_size,
        in_channels=d.in_channels if in_channels is None else in_channels,
    )


def build_model(
    layers: IntsLike | None = None,
    width: int | None = None,
    num_classes: int | None = None,
    image_size: int | None = None,
    in_channels: int | None = None,
) -> ResNet:
    """A randomly initialised ResNet; ``layers`` is a tuple, list, int or "3,4,6,3" string."""
    return ResNet(make_config(layers, width, num_classes, image_size, in_channels))


def example_inputs(
    batch_size: int,
    image_size: int | None = None,
    in_channels: int | None = None,
    **_unused: object,
) -> Tensor:
    cfg = make_config(image_size=image_size, in_channels=in_channels)
    g, size = torch.Generator().manual_seed(0), cfg.image_size
    x = torch.randn(batch_size, cfg.in_channels, size, size, generator=g, device="cpu")
    return x.to(torch.get_default_device())  # (B, 3, H, W)


def example_targets(batch_size: int, num_classes: int | None = None, **_unused: object) -> Tensor:
    cfg = make_config(num_classes=num_classes)
    g = torch.Generator().manual_seed(1)  # seed 1: not a function of the inputs
    y = torch.randint(0, cfg.num_classes, (batch_size,), generator=g, device="cpu")
    return y.to(torch.get_default_device())  # (B,) class ids


def loss_fn(output: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy: output (B, num_classes) logits, targets (B,) class ids."""
    return F.cross_entropy(output, targets)
