"""Check a config's module names against the model the user will train (``autopipe config --check``).

A plan names its stages by the modules of the model it was planned from; a framework that places
modules by name trains another model, built by its own code. :func:`check_parts` holds a
torchtitan config's ``module_fqns_per_model_part`` to a model (built on the meta device is
enough):

- every listed name is a module of the model (``model.get_submodule``; a merged block
  ``a..b`` by both its ends);
- the parts cover the model: every entry of its ``state_dict`` (parameters and persistent
  buffers), the root module's own excepted, lies under a listed name (the name, or the name
  followed by ``.``) of exactly one part. A merged block holds the model's units from its first
  end's to its last end's, a unit being a top-level module or an item of a top-level module list
  or dict (what torchtitan's ``pipeline_module_split`` keeps or drops).

:func:`check_layers` holds Megatron-LM's arguments to it: the plan's layer list (``blocks``,
``layers``) is a module of the model, and its length is ``--num-layers``.
Failures are one :class:`~autopipe.errors.ConfigError` line that starts with the model's name.

Tests: tests/config/test_config_check.py.
"""

from __future__ import annotations

from torch import nn

from autopipe.errors import ConfigError

__all__ = ["check_layers", "check_parts", "model_units", "name_list"]

_SHOWN = 8  # names a message lists before "..."


def model_units(model: nn.Module) -> list[str]:
    """The model's units in order: top-level modules, and the items of a top-level list or dict."""
    units: list[str] = []
    for name, child in model.named_children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)) and len(child):
            units += [f"{name}.{item}" for item, _ in child.named_children()]
        else:
            units.append(name)
    return units


def name_list(names: list[str]) -> str:
    """``["wte", "blocks.0", "blocks.1", "blocks.2", "ln_f"]`` -> ``"wte, blocks.0 .. blocks.2, ln_f"``
    (runs of consecutive list items shortened), at most a few names then ``...``."""
    shown: list[str] = []
    i = 0
    while i < len(names):
        j = i
        head, _, idx = names[i].rpartition(".")
        while idx.isdigit() and j + 1 < len(names) and names[j + 1] == f"{head}.{int(idx) + j + 1 - i}":
            j += 1
        shown.append(names[i] if j == i else f"{names[i]} .. {names[j]}")
        i = j + 1
    return ", ".join(shown[:_SHOWN]) + (", ..." if len(shown) > _SHOWN else "")


def _has(model: nn.Module, name: str) -> bool:
    try:
        model.get_submodule(name)
    except AttributeError:
        return False
    return True


def _unit_of(name: str, units: list[str]) -> int:
    return next(k for k, u in enumerate(units) if name == u or name.startswith(u + ".") or u.startswith(name + "."))


def _held(name: str, units: list[str]) -> list[str]:
    """The prefixes a listed name holds: itself, or a merged block's units from end to end."""
    ends = name.split("..")
    if len(ends) == 1:
        return [name]
    lo, hi = _unit_of(ends[0], units), _unit_of(ends[-1], units)
    return units[lo : hi + 1]


def check_parts(parts: list[list[str]], model: nn.Module, source: str) -> None:
    """ConfigError unless every name in ``parts`` is a module of ``model`` and the parts cover it."""
    listed = [n for part in parts for n in part]
    missing = [n for n in listed if not all(_has(model, end) for end in n.split(".."))]
    units = model_units(model)
    if missing:
        raise ConfigError(
            f"{source}: the config names {name_list(missing)}, which the model has no module for "
            f"(it has {name_list(units)}); plan this model, or map the names"
        )
    holders: list[tuple[int, str]] = [
        (i, prefix) for i, part in enumerate(parts) for n in part for prefix in _held(n, units)
    ]
    own = {name for name, _ in model.named_parameters(recurse=False)} | {
        n for n, _ in model.named_buffers(recurse=False)
    }
    bare: list[str] = []
    twice: dict[str, list[int]] = {}
    for key in model.state_dict(keep_vars=True):
        if key in own:
            continue  # the root's own: torchtitan keeps them on every part
        by = sorted({i for i, prefix in holders if key == prefix or key.startswith(prefix + ".")})
        unit = units[_unit_of(key, units)] if any(key.startswith(u + ".") for u in units) else key
        if not by and unit not in bare:
            bare.append(unit)
        elif len(by) > 1:
            twice.setdefault(unit, by)
    if bare:
        raise ConfigError(
            f"{source}: no part holds {name_list(bare)}, whose weights the framework would drop "
            "(it keeps only the modules a part names); plan this model, or add them to a part"
        )
    if twice:
        raise ConfigError(
            f"{source}: {', '.join(f'{u} (parts {by[0]} and {by[1]})' for u, by in list(twice.items())[:_SHOWN])} "
            "sit in two parts, which would train two copies; "
            "plan this model, or name each module in one part"
        )


def check_layers(container: str, num_layers: int, model: nn.Module, source: str) -> None:
    """ConfigError unless ``model`` has the layer list ``container`` with ``num_layers`` items."""
    if not _has(model, container):
        tops = [name for name, _ in model.named_children()]
        raise ConfigError(
            f"{source}: the config's layers are the plan's {container}, which the model has no module for "
            f"(it has {name_list(tops)}); plan this model"
        )
    found = len(list(model.get_submodule(container).children()))
    if found != num_layers:
        raise ConfigError(
            f"{source}: the config has --num-layers {num_layers} but the model has {found} layers in {container}; "
            "plan this model with the -k arguments you train it with"
        )
