"""NaN and Inf in the float tensors a conversion writes without quantizing them (copied, or moved by a layout).

A quantized dense layer refuses non-finite values itself (:class:`mxrepack.quant.mx.NonFiniteError`); the
tensors that pass through unchanged -- the router, norms, biases, sinks, embeddings, and every dense layer a
target keeps in BF16 -- used to reach the output without a word, and a NaN in a router poisons every token.
:class:`FiniteGuard` checks them on the way: a one-line error naming the source file, tensor and row, or,
with ``--allow-nonfinite``, a warning per tensor and a record in the manifest.

The test is on the bits, not the values: an IEEE float is NaN or Inf exactly when its exponent bits are all
ones, i.e. when its bits with the sign cleared are at least the exponent mask. One AND and one max per
element, over slices small enough to stay in the CPU cache (~8 GB/s on one core). A range the kernel copies
(:meth:`FiniteGuard.check_range`) is checked after its copy, from the page cache through a mapping (no copy
into this process), on a thread of its own while the next range is copied. On 2 cores, a 20b checkpoint cut to
2 layers (2.4 GB of its 3.27 GB copied BF16: the worst case) to the mxfp4 target: ~0.3 s more CPU, wall time
within run-to-run noise on an idle machine, +0.5 s (6%) in the median of 4 runs on a loaded one; checked inline
with a ``pread`` before each copy it had cost ~1.5 s of ~7 s. A failed check is raised when the next range is
submitted, or by :meth:`FiniteGuard.result`.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from mxrepack.errors import MxRepackError
from mxrepack.repack.safetensors_io import TensorInfo, map_range, read_into

# float dtype -> (same-width integer dtype, sign-clearing mask, smallest non-finite magnitude's bits)
_BITS = {
    torch.bfloat16: (torch.int16, 0x7FFF, 0x7F80),
    torch.float16: (torch.int16, 0x7FFF, 0x7C00),
    torch.float32: (torch.int32, 0x7FFFFFFF, 0x7F800000),
}
_NP_BITS = {torch.bfloat16: np.int16, torch.float16: np.int16, torch.float32: np.int32}
_SLICE = 1 << 20  # elements per AND + max: the temporary stays in the cache
_READ = 8 << 20  # bytes per read of a copied range


def checked(dtype: torch.dtype) -> bool:
    """Whether tensors of ``dtype`` can hold NaN/Inf that this module finds (the float dtypes of gpt-oss)."""
    return dtype in _BITS


def all_finite(t: torch.Tensor) -> bool:
    """No NaN or Inf in ``t`` (a float tensor of a :func:`checked` dtype)."""
    itype, mask, limit = _BITS[t.dtype]
    bits = t.reshape(-1).view(itype)
    tmp = torch.empty(min(_SLICE, bits.numel()), dtype=itype)
    for i in range(0, bits.numel(), _SLICE):
        part = bits[i : i + _SLICE]
        out = tmp[: part.numel()]
        torch.bitwise_and(part, mask, out=out)
        if int(out.max()) >= limit:
            return False
    return True


def nonfinite(t: torch.Tensor) -> tuple[int, int]:
    """(how many NaN/Inf values, the first row holding one) of ``t`` (dim 0 is the row; slow path)."""
    bad = ~torch.isfinite(t.reshape(t.shape[0], -1) if t.dim() > 1 else t.reshape(-1, 1))
    rows = bad.any(-1).nonzero()
    return int(bad.sum()), int(rows[0, 0]) if rows.numel() else -1


class FiniteGuard:
    """Checks float tensors as a conversion reads or copies them. ``allow``: record instead of refusing.

    ``found`` maps each stored source tensor holding NaN/Inf (allowed) to its file, count and first row."""

    def __init__(self, allow: bool = False):
        self.allow = allow
        self.found: dict[str, dict] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []

    def check(self, info: TensorInfo, values: torch.Tensor) -> None:
        """``values``: rows of the stored tensor ``info``, read for a conversion."""
        if checked(values.dtype) and values.numel() and not all_finite(values):
            self._report(info)

    def check_range(self, info: TensorInfo, first_row: int, rows: int) -> None:
        """Rows ``[first_row, first_row + rows)`` of the stored tensor ``info`` in its file: a range the kernel has
        just copied (so it is in the page cache) and this process never saw. Checked on the guard's thread; raises
        the error of an earlier range that failed."""
        self._raise_failed(wait=False)
        if checked(info.dtype) and rows:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="mxrepack-finite")
            self._pending.append(self._pool.submit(self._check_mapped, info, first_row, rows))

    def result(self) -> dict[str, dict]:
        """``found``, once every submitted range is checked (raises the first failure)."""
        self._raise_failed(wait=True)
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        return dict(self.found)

    def _raise_failed(self, wait: bool) -> None:
        still = []
        for f in self._pending:
            if wait or f.done():
                f.result()  # raises a failed check's MxRepackError
            else:
                still.append(f)
        self._pending = still

    def _check_mapped(self, info: TensorInfo, first_row: int, rows: int) -> None:
        itype = _NP_BITS[info.dtype]
        _, mask, limit = _BITS[info.dtype]
        fd = os.open(info.file, os.O_RDONLY)
        try:
            view = map_range(fd, info.start + first_row * info.row_bytes, rows * info.row_bytes)
        finally:
            os.close(fd)  # the mapping stays valid without it
        try:
            bits = np.frombuffer(view, dtype=itype)
            tmp = np.empty(min(_SLICE, bits.size), dtype=itype)
            for i in range(0, bits.size, _SLICE):
                part = bits[i : i + _SLICE]
                out = tmp[: part.size]
                np.bitwise_and(part, mask, out=out)
                if int(out.max()) >= limit:
                    del bits, part
                    self._report(info)
                    return
        finally:
            bits = part = None
            view.release()

    def _report(self, info: TensorInfo) -> None:
        """A non-finite value was seen in ``info``: count them over the whole stored tensor (the slow path, once)."""
        if info.name in self.found:
            return
        count, first = 0, -1
        rows = info.shape[0] if info.shape else 1
        for at, values in _read(info, 0, rows):
            n, row = nonfinite(values.reshape(-1, *info.shape[1:]) if info.shape else values)
            count += n
            if first < 0 and n:
                first = at + row
        if not self.allow:
            raise MxRepackError(
                f"{info.file}: tensor '{info.name}': {count} NaN/Inf value(s) (first in row {first}); "
                "the output would carry "
                "them unchanged (pass --allow-nonfinite to write them anyway)"
            )
        self.found[info.name] = {"file": str(info.file), "count": count, "first_row": first}

    def warnings(self) -> list[str]:
        return [
            f"{e['file']}: tensor '{name}': {e['count']} NaN/Inf value(s) (first in row {e['first_row']}) written "
            "unchanged (--allow-nonfinite)"
            for name, e in self.found.items()
        ]


def _read(info: TensorInfo, first_row: int, rows: int):
    """(row, values) pieces of rows ``[first_row, first_row + rows)`` of ``info``, whole rows at a time, read with
    ``pread`` into one reused buffer (each piece is valid until the next is read)."""
    row_bytes = info.row_bytes
    offset, nbytes = info.start + first_row * row_bytes, rows * row_bytes
    step = max(row_bytes, _READ // row_bytes * row_bytes)
    buf = np.empty(min(step, nbytes), dtype=np.uint8)
    fd = os.open(info.file, os.O_RDONLY)
    try:
        for at in range(0, nbytes, step):
            n = min(step, nbytes - at)
            read_into(fd, info, memoryview(buf)[:n], offset + at)
            yield first_row + at // row_bytes, torch.from_numpy(buf[:n]).view(info.dtype)
    finally:
        os.close(fd)
