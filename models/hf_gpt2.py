"""A Hugging Face GPT-2 (``transformers``, built from its config: random weights, nothing
downloaded) learning characters of the standard library's own source, as models/chargpt.py does.

    pip install transformers
    autopipe plan models/hf_gpt2.py --stages 2 --batch-size 8 --memory 1GiB
    autopipe run plan.json --steps 100           # trains on train_data (chargpt's text)

The model is ``GPT2LMHeadModel`` as it comes -- keyword inputs, a ``ModelOutput`` result, the
LM head tied to the token embedding -- so torch.fx cannot follow it and autopipe traces it with
``torch.export``. ``loss_fn`` reads the output's ``logits``. The text, the batches and the
128-character vocabulary are chargpt's (imported from beside this file).
"""

import torch
import torch.nn.functional as F
from chargpt import VOCAB, example_inputs, example_targets, train_data  # models/chargpt.py
from torch import Tensor, nn

__all__ = ["build_model", "example_inputs", "example_targets", "loss_fn", "train_data"]


def build_model(
    n_layer: int = 2, n_head: int = 4, n_embd: int = 64, seq_len: int = 64, dropout: float = 0.0
) -> nn.Module:
    """A randomly initialised ``GPT2LMHeadModel`` with a 128-character vocabulary."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        n_positions=seq_len,
        vocab_size=VOCAB,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        use_cache=False,
    )
    return GPT2LMHeadModel(config)


def loss_fn(output: object, targets: Tensor) -> Tensor:
    """Mean next-character cross-entropy (nats) of the output's (B, T, 128) logits."""
    logits = output.logits if hasattr(output, "logits") else output
    assert isinstance(logits, torch.Tensor)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
