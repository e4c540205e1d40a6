"""glibc's malloc, tuned for long runs that mix TensorFlow's threads with many small writes (`embed`, `beam-embed`).

Both are no-ops (returning False) where glibc is not the C library. No TensorFlow here.
"""

import ctypes
import ctypes.util
import functools


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def limit_malloc_arenas(arenas=2):
    """Caps glibc's malloc arenas for this process (`mallopt(M_ARENA_MAX, arenas)`); returns True when set.

    Each thread that allocates under contention gets an arena of its own, and freed memory stays in it: with
    TensorFlow's thread pools that is about 100 MB of peak RSS on the original model (measured with
    bench/embed_throughput.py, batch 32: 1,697 -> 1,599 MiB, speed within noise). Called by `python -m elmo_tf
    embed` before the model loads; a no-op where glibc is not the C library.
    """
    libc = _libc()
    try:
        return bool(libc and libc.mallopt(-8, int(arenas)))  # M_ARENA_MAX = -8 in glibc's malloc.h
    except AttributeError:
        return False


def release_free_memory():
    """Gives the free pages of glibc's heaps back to the system (`malloc_trim(0)`); returns True when some were.

    Freed memory stays in the process until a later allocation reuses it; many small allocations (HDF5's metadata
    for thousands of datasets, a shard's keys) leave it in holes that the larger blocks of the next batch cannot
    use, and RSS grows. `embed_file` calls this after each shard it writes, and `merge_shards` once it has written
    `sentence_to_index`.
    """
    libc = _libc()
    try:
        return bool(libc and libc.malloc_trim(0))
    except AttributeError:
        return False
