"""The optional C extensions and the one switch between them and their Python twins.

Three hot loops have a C extension, built by ``pip install`` where a C compiler is (setup.py;
optional: without one the install still succeeds), and a Python twin that gives the same numbers
to the last bit (the same operations in the same order; tests/conftest.py's
``native_and_python`` fixture runs each twin test on both paths):

- :data:`SIMULATOR`, ``autopipe/simulate/_simcore.c``: the event simulator's core (its twin
  :mod:`autopipe.simulate.simcore`);
- :data:`PROBE`, ``autopipe/partition/_probe.c``: the bisection solver's greedy probe (its twin
  :mod:`autopipe.partition.greedy`);
- :data:`V_BUILDER`, ``autopipe/schedules/v_shapes/_vbuild.c``: the V-Half / V-Min builder (its
  twin :mod:`autopipe.schedules.v_shapes.v_block`).

Each twin module loads its extension once (:func:`load`) and runs it while :func:`enabled`: on,
unless ``AUTOPIPE_NO_SIMCORE=1`` is set (:data:`OFF`); :func:`use_native` switches all of them
at once at run time (tests, benchmarks).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

__all__ = [
    "EXTENSIONS",
    "OFF",
    "PROBE",
    "SIMULATOR",
    "V_BUILDER",
    "available",
    "enabled",
    "in_use",
    "load",
    "missing",
    "python_twins",
    "use_native",
]

SIMULATOR = "autopipe.simulate._simcore"
PROBE = "autopipe.partition._probe"
V_BUILDER = "autopipe.schedules.v_shapes._vbuild"
EXTENSIONS = (SIMULATOR, PROBE, V_BUILDER)
OFF = "AUTOPIPE_NO_SIMCORE"  # set to 1: the Python twins run, built or not

# The one switch (read by the twins on every call; written only by use_native).
_on = os.environ.get(OFF, "") in ("", "0")


def load(name: str) -> ModuleType | None:
    """The extension ``name`` (one of :data:`EXTENSIONS`), or None where it was not built."""
    if name not in EXTENSIONS:
        raise ValueError(f"{name!r} is not one of autopipe's C extensions; use one of {', '.join(EXTENSIONS)}")
    importlib.import_module(name.rpartition(".")[0])  # the package's own errors are not "not built"
    try:
        return importlib.import_module(name)
    except ImportError:  # built without a C compiler (or for another Python): the Python twin runs
        return None


def missing() -> tuple[str, ...]:
    """The extensions that were not built (empty when all were)."""
    return tuple(name for name in EXTENSIONS if load(name) is None)


def available(name: str | None = None) -> bool:
    """Whether extension ``name`` was built (every one of them when ``name`` is None)."""
    return load(name) is not None if name is not None else not missing()


def enabled() -> bool:
    """Whether the C loops run where they are built (the switch: :func:`use_native`, :data:`OFF`)."""
    return _on


def in_use(name: str | None = None) -> bool:
    """Whether extension ``name`` runs (built, and the switch on); every one when ``name`` is None."""
    return _on and available(name)


def use_native(on: bool) -> bool:
    """Run the C extensions (where built) or the Python twins from now on, all of them; returns the
    previous setting. The default is on unless ``AUTOPIPE_NO_SIMCORE=1``."""
    global _on
    before, _on = _on, on
    return before


@contextmanager
def python_twins() -> Iterator[None]:
    """Run the Python twins inside the ``with`` block, then switch back to the previous setting."""
    before = use_native(False)
    try:
        yield
    finally:
        use_native(before)
