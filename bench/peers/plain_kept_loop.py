"""The plain loop (bench/peers/plain_loop.py) with glibc's malloc set as `rul train` sets it on
a CPU (rul.training.hardware.keep_freed_memory: freed activation buffers kept for reuse, not
page-faulted in again each step): tells rul's loop from rul's allocator settings."""

from bench.peers import plain_loop
from bench.peers.common import Setup


def train(setup: Setup) -> dict:
    from rul.training.hardware import keep_freed_memory

    keep_freed_memory()
    return plain_loop.train(setup)
