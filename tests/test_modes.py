"""The named modes (autopipe/modes.py) read, print and serialise as their plain text."""

from __future__ import annotations

import json

import pytest

from autopipe.modes import Engine, Recompute, Tracer


@pytest.mark.parametrize("mode", [*Recompute, *Tracer, *Engine])
def test_a_mode_is_its_text_everywhere(mode: Recompute | Tracer | Engine) -> None:
    text = mode.value
    assert mode == text and str(mode) == text and f"{mode}" == text and f"{mode:>8}" == f"{text:>8}"
    assert repr(mode) == repr(text)
    assert json.dumps({"m": mode}) == json.dumps({"m": text})
    assert type(mode)(text) is mode  # read back from a file or a flag


def test_the_modes_are_the_ones_the_flags_name() -> None:
    assert [m.value for m in Recompute] == ["auto", "never", "always"]
    assert {m.value for m in Tracer} >= {"auto", "fx", "export"}
    assert {m.value for m in Engine} == {"autopipe", "torch"}
    with pytest.raises(ValueError, match="'sometimes' is not a valid Recompute"):
        Recompute("sometimes")
