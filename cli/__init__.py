"""The ``autopipe`` command line: parsing, printing and exit codes only (installed as ``autopipe.cli``)."""
