"""``python -m polyturn.cli``: the ``polyturn`` command (torchrun starts each ``polyturn train --nproc`` process so)."""

import sys

from polyturn.cli import main

sys.exit(main())
