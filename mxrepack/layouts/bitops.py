"""Nibble and byte shuffles as whole-array integer operations, run a cache-sized block at a time.

Some layouts (Marlin, triton_kernels' Hopper swizzle) put into one 32-bit word four bytes from two
rows and two byte offsets, and mix their nibbles. Written as a strided copy that moves single bytes,
that runs at ~0.2 GB/s in torch and numpy (a per-element loop over 1-4 byte runs). Here it is split
into two kinds of step that run at memory or cache speed instead:

* a **delta swap** exchanges the bits selected by ``mask`` with the bits ``shift`` places above them,
  either inside each 64-bit word (:func:`delta_swap`) or between two arrays of words
  (:func:`delta_swap_pair`, e.g. row ``n`` and row ``n + 8``). Each swaps two address bits of the
  nibble or byte index (nibble-in-byte with word-half, byte-in-word with row, ...), in six passes of
  vectorised integer ops;
* a **gather of whole 32-bit words** (``np.take`` with a precomputed index) does the rest.

Both run on one block of rows at a time, small enough (a few hundred KB) that every pass after the
first reads from L2, with the blocks spread over the cores (the numpy loops release the GIL).
"""

from __future__ import annotations

import numpy as np

from mxrepack.quant.mx import map_row_blocks

BLOCK_BYTES = 384 << 10  # per block of rows: the block and its temporaries stay in a 2 MB L2


def delta_swap(x: np.ndarray, t: np.ndarray, shift: int, mask: int) -> None:
    """In place on uint64 words: swap the bits of ``mask`` with those ``shift`` places above them.
    ``t`` is scratch of ``x``'s shape. (The pair swap of ``x`` with itself.)"""
    delta_swap_pair(x, x, t, shift, mask)


def delta_swap_pair(a: np.ndarray, b: np.ndarray, t: np.ndarray, shift: int, mask: int) -> None:
    """In place on two uint64 arrays of one shape: swap the bits of ``b`` selected by ``mask`` with the
    bits of ``a`` ``shift`` places above them."""
    np.right_shift(a, np.uint64(shift), out=t)
    t ^= b
    t &= np.uint64(mask)
    b ^= t
    t <<= np.uint64(shift)
    a ^= t


def for_each_block(count: int, work, make_scratch) -> None:
    """Run ``work(i, scratch)`` for ``i in range(count)``, the indices split over the cores; each thread
    gets its own ``scratch = make_scratch()`` (reused for every block it runs)."""

    def run(start: int, stop: int) -> None:
        scratch = make_scratch()
        for i in range(start, stop):
            work(i, scratch)

    map_row_blocks(count, run)
