"""Character-level GPT on real text that ships with Python: the standard library's own source.

    autopipe plan models/chargpt.py --stages 2 --batch-size 16 --memory 1GiB
    autopipe run plan.json --steps 300           # trains on train_data below

Nothing is downloaded: the text is every ``*.py`` file directly in this Python's standard
library folder (``sysconfig.get_paths()["stdlib"]``), read in sorted file-name order up to
``max_bytes`` bytes; the vocabulary is the 128 ASCII bytes (other bytes are dropped). The
model is ``models/gpt.py``'s GPT (imported from beside this file, as autopipe's loader
allows) with a 128-symbol vocabulary, so an untrained model's loss is ln(128) = 4.85 nats per
character; a few hundred steps of next-character prediction bring it well below that.

    train_data(batch_size, seq_len)   an iterable of (inputs, targets): (B, T) character ids
                                      and the (B, T) next characters, windows drawn from the
                                      text with a seeded torch.Generator (the same every time)
"""

import functools
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from gpt import GPT, GPTConfig  # models/gpt.py, beside this file
from torch import Tensor

VOCAB = 128  # ASCII
MAX_BYTES = 1_000_000  # about a quarter of the standard library's top-level source


def build_model(n_layer: int = 4, n_head: int = 4, n_embd: int = 128, seq_len: int = 64, dropout: float = 0.0) -> GPT:
    """A randomly initialised character-level GPT (tied embedding and LM head)."""
    return GPT(
        GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=VOCAB, block_size=seq_len, dropout=dropout)
    )


@functools.cache
def corpus(max_bytes: int = MAX_BYTES) -> Tensor:
    """The text as one CPU tensor of ASCII codes (uint8), read once per process."""
    folder = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(folder.glob("*.py"))
    if not files:
        raise ValueError(f"no .py files in the standard library folder {folder}; this Python ships without its source")
    chunks: list[bytes] = []
    size = 0
    for path in files:
        if size >= max_bytes:
            break
        chunks.append(path.read_bytes()[: max_bytes - size])
        size += len(chunks[-1])
    data = torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)
    return data[data < VOCAB].clone()  # (N,)


class CharBatches:
    """``batches`` random windows of ``seq_len + 1`` characters per pass, as (inputs, targets);
    every pass draws the same windows (seeded), so training on it is reproducible."""

    def __init__(self, batch_size: int, seq_len: int, seed: int, max_bytes: int, batches: int | None) -> None:
        if batch_size < 1 or seq_len < 1:
            raise ValueError(f"batch_size and seq_len must be positive (got {batch_size}, {seq_len})")
        self.data = corpus(max_bytes)
        if self.data.numel() <= seq_len + 1:
            raise ValueError(
                f"the text holds {self.data.numel()} characters, too few for seq_len {seq_len}; raise max_bytes"
            )
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
        self.batches = batches if batches is not None else max(1, self.data.numel() // (batch_size * seq_len))

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        g = torch.Generator(device="cpu").manual_seed(self.seed)
        offsets = torch.arange(self.seq_len + 1, device="cpu")  # (T + 1,)
        device = torch.get_default_device()
        for _ in range(self.batches):
            starts = torch.randint(0, self.data.numel() - self.seq_len, (self.batch_size, 1), generator=g, device="cpu")
            window = self.data[starts + offsets].long()  # (B, T + 1)
            yield window[:, :-1].to(device), window[:, 1:].to(device)  # (B, T) inputs, (B, T) next characters


def train_data(
    batch_size: int,
    seq_len: int = 64,
    seed: int = 0,
    max_bytes: int = MAX_BYTES,
    batches: int | None = None,
    **_unused: object,
) -> CharBatches:
    """Batches of next-character prediction on the standard library's source (one pass: the
    text's length in windows, or ``batches``)."""
    return CharBatches(batch_size, seq_len, seed, max_bytes, batches)


def example_inputs(batch_size: int, seq_len: int = 64, **_unused: object) -> Tensor:
    return next(iter(train_data(batch_size, seq_len, batches=1)))[0]  # (B, T) int64: real text


def example_targets(batch_size: int, seq_len: int = 64, **_unused: object) -> Tensor:
    return next(iter(train_data(batch_size, seq_len, batches=1)))[1]  # (B, T) the next characters


def loss_fn(output: Tensor, targets: Tensor) -> Tensor:
    """Mean next-character cross-entropy (nats): output (B, T, 128) logits, targets (B, T) ids."""
    return F.cross_entropy(output.flatten(0, 1), targets.flatten())


def decode(ids: Tensor) -> str:
    """Character ids back to text."""
    return bytes(ids.tolist()).decode("ascii")
