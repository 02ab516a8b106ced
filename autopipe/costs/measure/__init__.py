"""Measuring a model on this machine: each block timed alone (``timing``), the measured profile
built from it (``measured``), the host's slowdown with several ranks (``contention``), and
whether a profile belongs to a model (``match``). Tests: tests/costs/measure/, tests/costs/test_spread.py,
tests/cli/test_plan_cmd.py (match)."""
