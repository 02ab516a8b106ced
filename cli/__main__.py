"""``python -m autopipe.cli``: the same as the ``autopipe`` command."""

import sys

from .main import main

sys.exit(main())
