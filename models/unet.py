"""U-Net with long skip connections, as an autopipe model file.

    autopipe profile models/unet.py -k depth=4 -k base_channels=32

Ronneberger et al. 2015, "U-Net: Convolutional Networks for Biomedical Image Segmentation",
with padded 3x3 convolutions and batch norm. The encoder (``inc``, then ``downs``: max-pool and
two convs per level, channels doubling) keeps each level's features; the decoder (``ups``:
2x2 transposed conv, then two convs) concatenates them back in, so level i of the encoder
feeds level i of the decoder. These long skips make the model a DAG, not a chain: a pipeline
cut between them carries every open skip tensor.

Defaults: depth 3, 16 base channels, 3-channel 64x64 images, a 1-channel per-pixel output
regressed with MSE. The original paper's network is ``-k depth=4 -k base_channels=64``.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class UNetConfig:
    depth: int = 3  # down-sampling levels (and up-sampling levels); image_size % 2**depth == 0
    base_channels: int = 16  # channels at full resolution; level i has base_channels * 2**i
    in_channels: int = 3  # input image channels
    out_channels: int = 1  # channels of the per-pixel output map
    image_size: int = 64  # H = W of example images

    def __post_init__(self) -> None:
        for name in ("depth", "base_channels", "in_channels", "out_channels", "image_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer (got {value!r}); pass e.g. -k {name}=4")
        if self.image_size % 2**self.depth:
            raise ValueError(
                f"image_size must be a multiple of 2**depth (image_size: {self.image_size}, "
                f"depth: {self.depth}); use e.g. -k image_size={2**self.depth * 8}"
            )


class DoubleConv(nn.Sequential):
    """(3x3 conv, batch norm, ReLU) twice; keeps H and W."""

    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__(
            nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_ch),
            nn.ReLU(),
            nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_ch),
            nn.ReLU(),
        )


class Down(nn.Module):
    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__()
        self.pool = nn.MaxPool2d(2)
        self.conv = DoubleConv(in_ch, out_ch)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, c, H, W)
        out: Tensor = self.conv(self.pool(x))
        return out  # (B, 2c, H/2, W/2)


class Up(nn.Module):
    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(in_ch, out_ch, 2, stride=2)
        self.conv = DoubleConv(2 * out_ch, out_ch)

    def forward(self, x: Tensor, skip: Tensor) -> Tensor:  # x: (B, 2c, H/2, W/2)
        x = self.up(x)  # (B, c, H, W), the shape of skip
        out: Tensor = self.conv(torch.cat((skip, x), dim=1))  # (B, 2c, H, W) -> (B, c, H, W)
        return out


class UNet(nn.Module):
    def __init__(self, cfg: UNetConfig) -> None:
        super().__init__()
        self.config = cfg
        ch = [cfg.base_channels * 2**i for i in range(cfg.depth + 1)]  # channels per level
        self.inc = DoubleConv(cfg.in_channels, ch[0])
        self.downs = nn.ModuleList(Down(ch[i], ch[i + 1]) for i in range(cfg.depth))
        self.ups = nn.ModuleList(Up(ch[i + 1], ch[i]) for i in reversed(range(cfg.depth)))
        self.outc = nn.Conv2d(ch[0], cfg.out_channels, 1)
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:  # x: (B, in_channels, H, W)
        x = self.inc(x)  # (B, c0, H, W)
        skips = [x]
        for down in self.downs:
            x = down(x)  # (B, c_{i+1}, H / 2**(i+1), W / 2**(i+1))
            skips.append(x)
        for i, up in enumerate(self.ups):
            x = up(x, skips[-2 - i])  # long skip from encoder level depth-1-i
        out: Tensor = self.outc(x)
        return out  # (B, out_channels, H, W)


def make_config(
    depth: int | None = None,
    base_channels: int | None = None,
    in_channels: int | None = None,
    out_channels: int | None = None,
    image_size: int | None = None,
) -> UNetConfig:
    """The default config with every argument that is not None put in its place."""
    d = UNetConfig()
    return UNetConfig(
        depth=d.depth if depth is None else depth,
        base_channels=d.base_channels if base_channels is None else base_channels,
        in_channels=d.in_channels if in_channels is None else in_channels,
        out_channels=d.out_channels if out_channels is None else out_channels,
        image_size=d.image_size if image_size is None else image_size,
    )


def build_model(
    depth: int | None = None,
    base_channels: int | None = None,
    in_channels: int | None = None,
    out_channels: int | None = None,
    image_size: int | None = None,
) -> UNet:
    """A randomly initialised U-Net; ``image_size`` only checks divisibility by 2**depth."""
    return UNet(make_config(depth, base_channels, in_channels, out_channels, image_size))


def example_inputs(
    batch_size: int,
    depth: int | None = None,
    in_channels: int | None = None,
    image_size: int | None = None,
    **_unused: object,
) -> Tensor:
    cfg = make_config(depth=depth, in_channels=in_channels, image_size=image_size)
    g, size = torch.Generator().manual_seed(0), cfg.image_size
    x = torch.randn(batch_size, cfg.in_channels, size, size, generator=g, device="cpu")
    return x.to(torch.get_default_device())  # (B, in_channels, H, W)


def example_targets(
    batch_size: int,
    depth: int | None = None,
    out_channels: int | None = None,
    image_size: int | None = None,
    **_unused: object,
) -> Tensor:
    cfg = make_config(depth=depth, out_channels=out_channels, image_size=image_size)
    g, size = torch.Generator().manual_seed(1), cfg.image_size  # seed 1: not the inputs' stream
    y = torch.rand(batch_size, cfg.out_channels, size, size, generator=g, device="cpu")
    return y.to(torch.get_default_device())  # (B, out_channels, H, W) per-pixel map in [0, 1)


def loss_fn(output: Tensor, targets: Tensor) -> Tensor:
    """Mean squared error over every pixel: output and targets (B, out_channels, H, W)."""
    return F.mse_loss(output, targets)
