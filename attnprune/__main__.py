"""``python -m attnprune ...``: the command line, for launchers that start a module
(``torchrun -m attnprune``, ``accelerate launch -m attnprune``)."""

import sys

from attnprune.cli import main

if __name__ == "__main__":
    sys.exit(main())
