# The build lives in pyproject.toml; this file only adds the optional C core of the simulator
# (autopipe/schedules/_simcore.c). optional=True: without a C compiler the install still succeeds
# and autopipe runs the same loops in Python (autopipe/schedules/simcore.py), about 50x slower.
from setuptools import Extension, setup

setup(ext_modules=[Extension("autopipe.schedules._simcore", ["autopipe/schedules/_simcore.c"], optional=True)])
