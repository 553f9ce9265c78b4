"""Random bits from the operating system's CSPRNG, drawn a few KB at a time.

Generated msgIds must not be predictable (the Mersenne Twister's output gives away its state
after 624 draws), and os.urandom per id is a system call per send. So the bytes come from one
os.urandom call per CHUNK_BYTES, handed out slice by slice. A forked child starts on bytes of
its own (os.register_at_fork): it must never hand out what its parent does.
"""
import itertools
import os
import threading

SLICE_BYTES = 10  # 80 bits per draw: a msgId takes 74
CHUNK_BYTES = 4096 // SLICE_BYTES * SLICE_BYTES


class _Chunk:
    """One os.urandom draw and the counter that hands out its slices: itertools.count's next()
    is atomic under the GIL, so threads sharing a chunk never get the same slice."""

    __slots__ = ("data", "taken")

    def __init__(self):
        self.data = os.urandom(CHUNK_BYTES)
        self.taken = itertools.count()


_chunk = _Chunk()
_refilling = threading.Lock()


def _fresh_chunk_in_child() -> None:
    global _chunk
    _chunk = _Chunk()


os.register_at_fork(after_in_child=_fresh_chunk_in_child)


def random_bits(bits: int) -> int:
    """A random integer of `bits` (at most 80) bits, from bytes no other call of this process or
    of a process forked from it gets."""
    global _chunk
    while True:
        chunk = _chunk
        start = next(chunk.taken) * SLICE_BYTES
        if start < CHUNK_BYTES:
            return int.from_bytes(chunk.data[start:start + SLICE_BYTES]) >> (SLICE_BYTES * 8 - bits)
        with _refilling:
            if _chunk is chunk:  # the first thread to run out replaces it
                _chunk = _Chunk()
