"""``autopipe run``: a plan's ranks started, fed and watched on this machine, and measured.

``options`` (the run flags, defined once), ``launch`` (S processes of ``python -m
autopipe.runtime``, fault handling), ``local`` (the ranks as threads of one process), ``rank``
(one rank's process: the torchrun entry point), ``worker`` (one rank: rebuild, pipeline, train),
``data`` (train_data or example_inputs), ``records`` (the results as JSON), ``report``
(measured against predicted, Chrome trace).
"""
