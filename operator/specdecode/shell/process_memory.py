"""The operator process's heap: glibc's allocator keeps what Python frees unless told.

Both calls do nothing where the C library is not glibc (musl has one heap and returns memory
by itself)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Optional

M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)


@functools.lru_cache(maxsize=1)
def _glibc() -> Optional[ctypes.CDLL]:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def limit_arenas(arenas: int = 2) -> None:
    """glibc gives each thread that allocates its own heap (up to 8 per core), and each keeps
    what it once held: with the reconcile, evaluation and Prometheus threads of a large fleet
    that was tens of MB of RSS. Two heaps are enough for a process that holds the GIL anyway
    (what MALLOC_ARENA_MAX=2 does, set here because the image's environment is not ours)."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_ARENA_MAX, arenas)


def release_free() -> None:
    """Hand the heap's free pages back to the system. Each evaluation tick parses one batched
    Prometheus answer for the whole fleet and drops the last one; glibc keeps the freed pages
    (only the heap's top is returned by itself), so RSS held every tick's peak."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
