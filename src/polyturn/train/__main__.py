"""``torchrun --nproc_per_node K -m polyturn.train --config FILE [--set k=v ...] [--resume]``: data-parallel training.

The same arguments as ``polyturn train`` (which starts this through torchrun when given ``--nproc K``).
Rank 0 shows progress and writes the run; the other ranks stay quiet (polyturn.train.distributed).
"""

from __future__ import annotations

import sys

from polyturn.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
