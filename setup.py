# The build lives in pyproject.toml; this file only adds three optional C extensions: the
# simulator's core (autopipe/simulate/_simcore.c), the V-Half / V-Min builder
# (autopipe/schedules/v_shapes/_vbuild.c) and the bisection solver's greedy probe
# (autopipe/partition/_probe.c), with the buffer checks they share in autopipe/_native.h.
# optional=True: without a C compiler the install still succeeds and autopipe runs the same loops
# in Python (the twins: autopipe/simulate/simcore.py, autopipe/schedules/v_shapes/v_block.py,
# autopipe/partition/greedy.py; autopipe/native.py loads the extensions and switches them off).
import sys

from setuptools import Extension, setup

# No fused multiply-add (GCC fuses by default on some targets, e.g. aarch64): a * b + c rounded
# once would differ from the Python twins' last bit.
_EXACT = [] if sys.platform == "win32" else ["-ffp-contract=off"]
_HEADER = "autopipe/_native.h"


def _extension(name: str, source: str) -> Extension:
    return Extension(
        name, [source], include_dirs=["autopipe"], depends=[_HEADER], extra_compile_args=_EXACT, optional=True
    )


setup(
    ext_modules=[
        _extension("autopipe.simulate._simcore", "autopipe/simulate/_simcore.c"),
        _extension("autopipe.schedules.v_shapes._vbuild", "autopipe/schedules/v_shapes/_vbuild.c"),
        _extension("autopipe.partition._probe", "autopipe/partition/_probe.c"),
    ]
)
