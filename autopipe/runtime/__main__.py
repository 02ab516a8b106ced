"""``python -m autopipe.runtime plan.json --steps N``: one rank of a pipeline run (torchrun's
entry point); the body is :mod:`autopipe.runtime.run.rank`."""

import sys

from autopipe.runtime.run.rank import main

if __name__ == "__main__":
    sys.exit(main())
