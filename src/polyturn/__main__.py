"""``python -m polyturn``: the ``polyturn`` command, as the installed script and ``python -m polyturn.cli`` run it."""

import sys

from polyturn.cli import main

sys.exit(main())
