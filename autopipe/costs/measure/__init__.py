"""Measuring a model on this machine: each block timed alone (``timing``), the measured profile
built from it (``measured``), the host's slowdown with several ranks (``contention``), and
whether a profile belongs to a model (``match``). Tests: tests/costs/test_measured.py,
test_timing.py, test_spread.py, test_contention.py; tests/cli/test_plan_cmd.py (match)."""
