"""``python -m tfpipe.cli``: the ``tfpipe`` command."""

import sys

from tfpipe.cli import main

sys.exit(main())
