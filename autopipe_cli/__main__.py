"""``python -m autopipe_cli``: the same as the ``autopipe`` command."""

import sys

from autopipe_cli.main import main

sys.exit(main())
