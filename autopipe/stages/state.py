"""Where each entry of a model's ``state_dict`` lives among a plan's stages.

Which stage holds which entry of the model's ``state_dict`` (:func:`state_slots`): every entry a
stage module holds, found by tensor identity (the stages hold the model's own parameters and
buffers, under fx and torch.export alike) or, for a rank's deep copy of the trace, by the name
both give it; a tied weight under all of its names, in every stage that uses it. What is not
the model's state is left out: non-persistent buffers (``inv_freq``, ``position_ids``) and
constants torch.export lifts (``lifted_tensor_0``). An entry no stage uses (CLIP's unused
``post_layernorm``) is kept by one stage, the same on every rank: the stage that holds the
entry nearest to it in ``state_dict`` order within its innermost module that has an entry a
stage holds (its own module, else its parent, ... up to the whole model; at equal distance the
earlier entry, of the first stage holding it), stage 0 if no stage holds anything.

Tests: tests/runtime/test_checkpoint.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["Slot", "aliases", "slot_tensor", "state_slots"]


def aliases(model: torch.nn.Module) -> dict[str, tuple[str, ...]]:
    """For every tensor of ``model``'s state reachable by several names: name -> its other names."""
    groups: dict[int, list[str]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(t), []).append(name)
    return {n: tuple(o for o in names if o != n) for names in groups.values() if len(names) > 1 for n in names}


@dataclass(frozen=True)
class Slot:
    """One tensor of the model's state that a stage holds, under every name the model gives it."""

    stage: int  # the virtual stage index
    module: nn.Module  # where the tensor lives: the stage module, or the model for an entry no stage uses
    local: str  # its name in ``module``
    keys: tuple[str, ...]  # its names in the model's state_dict, in the model's order


def state_slots(model: nn.Module, stages: Sequence[tuple[int, nn.Module]], complete: bool = True) -> tuple[Slot, ...]:
    """Where each entry of ``model.state_dict()`` lives among ``stages`` ((index, module) pairs),
    in the model's order (see the module docstring). ``complete``: ``stages`` are all the plan's
    stages, so entries none of them holds go to their owner stage; else those are left out."""
    state = model.state_dict(keep_vars=True)
    order = {k: i for i, k in enumerate(state)}
    names_of: dict[int, list[str]] = {}
    for k, t in state.items():
        names_of.setdefault(id(t), []).append(k)
    other = aliases(model)
    slots: list[Slot] = []
    held: dict[str, int] = {}  # model key -> the first stage holding it
    for index, module in stages:
        seen: set[str] = set()
        for local, t in [
            *module.named_parameters(remove_duplicate=False),
            *module.named_buffers(remove_duplicate=False),
        ]:
            keys = names_of.get(id(t)) or ([local, *other.get(local, ())] if local in order else [])
            if not keys or keys[0] in seen:
                continue
            seen.update(keys)
            slots.append(Slot(index, module, local, tuple(sorted(keys, key=order.__getitem__))))
            for k in keys:
                held.setdefault(k, index)
    if complete:
        every, used = list(state), dict(held)
        for k in every:
            if k not in held:
                names = tuple(sorted([k, *other.get(k, ())], key=order.__getitem__))
                slots.append(Slot(_owner(k, every, used), model, k, names))
                held.update(dict.fromkeys(names, -1))
    return tuple(sorted(slots, key=lambda s: (order[s.keys[0]], s.stage)))


def _owner(key: str, keys: list[str], held: dict[str, int]) -> int:
    """The stage that keeps ``key``, an entry no stage uses: the module docstring's rule."""
    at = keys.index(key)
    parts = key.split(".")[:-1]
    for depth in range(len(parts), -1, -1):
        prefix = "".join(p + "." for p in parts[:depth])
        near = [(abs(i - at), i) for i, k in enumerate(keys) if k in held and k.startswith(prefix)]
        if near:
            return held[keys[min(near)[1]]]
    return 0


def slot_tensor(slot: Slot) -> torch.Tensor:
    """The live tensor of ``slot`` (looked up each time: moving a module replaces its buffers)."""
    owner, _, leaf = slot.local.rpartition(".")
    t = getattr(slot.module.get_submodule(owner), leaf)
    assert isinstance(t, torch.Tensor)
    return t
