"""``python -m flodl_hf.bench``: the same as ``flodl-hf bench``."""

import sys

from . import main

if __name__ == "__main__":  # rank processes are spawned and re-import this module as __mp_main__
    sys.exit(main())
