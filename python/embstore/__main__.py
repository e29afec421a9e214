"""``python -m embstore``: the command line (see :mod:`embstore.cli`)."""

import sys

from embstore.cli import main

if __name__ == "__main__":
    sys.exit(main())
