"""``python -m mmgcu.cli``: the ``mmgcu`` command without the console script."""

import sys

from . import main

sys.exit(main())
