"""``python -m flodl_hf ...``: the same as the ``flodl-hf`` command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
