# The build lives in pyproject.toml; this file only adds two optional C cores: the simulator's
# (autopipe/simulate/_simcore.c) and the bisection solver's greedy probe
# (autopipe/partition/_probe.c). optional=True: without a C compiler the install still succeeds and
# autopipe runs the same loops in Python (autopipe/simulate/simcore.py, autopipe/partition/greedy.py).
import sys

from setuptools import Extension, setup

# No fused multiply-add (GCC fuses by default on some targets, e.g. aarch64): a * b + c rounded
# once would differ from the Python twins' last bit.
_EXACT = [] if sys.platform == "win32" else ["-ffp-contract=off"]

setup(
    ext_modules=[
        Extension("autopipe.simulate._simcore", ["autopipe/simulate/_simcore.c"], extra_compile_args=_EXACT, optional=True),
        Extension("autopipe.partition._probe", ["autopipe/partition/_probe.c"], extra_compile_args=_EXACT, optional=True),
    ]
)
