"""``python size_limited.py LIMIT ARGS...``: ``flodl-hf ARGS`` with every file capped at LIMIT bytes.

A write past the cap fails with EFBIG in the kernel, in Python's writes and in safetensors' Rust writer alike: a real
failed write on every path, which a test can cause without filling a disk.
"""
import resource
import signal
import sys

limit = int(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG instead of killing the process
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
from flodl_hf.cli import main

sys.exit(main(sys.argv[2:]))
