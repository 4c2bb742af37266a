"""``python -m flodl_hf ...``: the same as the ``flodl-hf`` command."""

import sys

from .cli import console

if __name__ == "__main__":
    sys.exit(console())
