"""elmo_tf/embed/malloc.py: glibc's arenas capped, and the free pages of its heap given back."""

import ctypes
import ctypes.util
import os
import platform

import pytest

from elmo_tf.embed.malloc import limit_malloc_arenas, release_free_memory

GLIBC = platform.libc_ver()[0] == "glibc" and os.path.exists("/proc/self/status")


def rss_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc, RSS from /proc")
def test_release_free_memory_gives_back_holes_in_the_heap():
    """40 MiB in 4 KiB blocks, all freed but the last (which pins the heap's top, so glibc cannot shrink it by
    itself): the freed pages stay in RSS until `release_free_memory`."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = []
    for _ in range(10_000):
        block = libc.malloc(4096)
        ctypes.memset(block, 1, 4096)  # touched: in RSS
        blocks.append(block)
    for block in blocks[:-1]:
        libc.free(block)
    held = rss_kib()
    assert release_free_memory() is True
    released = held - rss_kib()
    libc.free(blocks[-1])
    assert released > 20 * 1024, released


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_limit_malloc_arenas_is_set():
    assert limit_malloc_arenas() is True
