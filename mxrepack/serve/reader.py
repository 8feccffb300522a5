"""Read a checkpoint's safetensors into page-locked host memory with several threads, tensor by tensor, in file order.

What a serving engine's weight phase spends once the conversion is gone (the plugin's targets need none) is reading:
vLLM's default reader hands each tensor over from a memory map, one thread touching the pages, and the copy to the GPU
starts from pageable memory, which the driver stages through a bounce buffer. Here ``threads`` workers ``preadv`` the
next tensors' bytes straight into a ring of page-locked memory (``cudaHostRegister``), so the consumer's ``copy_`` to
the GPU is one DMA, while the following tensors are already being read.

What the consumer may do (vLLM's weight loaders copy each tensor into its parameter and drop it): keep a tensor as long
as it likes. Ring bytes are reused only once nothing references the tensor they were handed out as (the storage
``torch.frombuffer`` makes holds the ring's memoryview, whose reference count says so), and only after the current CUDA
stream has finished the copies queued from them without waiting (``non_blocking``). A tensor kept for good holds its
place; the tensors that no longer fit beside it are read into fresh memory instead.
"""

from __future__ import annotations

import mmap
import os
import sys
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch

from mxrepack.errors import MxRepackError
from mxrepack.repack.safetensors_io import TensorInfo, read_header

ALIGN = 4096  # ring regions start on a page: a dtype view needs at most 8-byte alignment, a page keeps reads aligned


@dataclass
class _Region:
    info: TensorInfo
    view: memoryview | None  # its ring bytes (None: fresh memory outside the ring)
    tensor: torch.Tensor | None  # until handed out
    reads: list[Future]

    def free(self) -> bool:
        """Nothing references the tensor handed out any more (``self.view`` is referenced by this region, by
        getrefcount's argument and, while it lives, by the tensor's storage)."""
        return self.view is None or sys.getrefcount(self.view) <= 2


class _PinnedRing:
    """``size`` bytes of anonymous memory, page-locked for the GPU where CUDA is, handed out first in, first out."""

    def __init__(self, size: int):
        self.size = size
        self.buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.ptr = 0
        if torch.cuda.is_available():
            cudart = torch.cuda.cudart()
            ptr = torch.frombuffer(self.buf, dtype=torch.uint8, count=1).data_ptr()
            if cudart.cudaHostRegister(ptr, size, 0) == cudart.cudaError.success:
                self.ptr = ptr  # else pageable: slower copies, same bytes
        self.head = 0  # next free byte
        self.used = 0  # bytes from the oldest region still held up to head (a skipped tail included)
        self.charged: deque[int] = deque()  # bytes each region not yet released took, oldest first

    def take(self, nbytes: int) -> memoryview | None:
        """``nbytes`` contiguous free bytes, or None while the ring is too full."""
        need = -(-nbytes // ALIGN) * ALIGN
        start, charged = self.head, need
        if start + need > self.size:  # does not fit before the end: skip the tail, start over at 0
            start, charged = 0, need + self.size - self.head
        if self.used + charged > self.size:
            return None
        self.charged.append(charged)
        self.head, self.used = (start + need) % self.size, self.used + charged
        return memoryview(self.buf)[start : start + nbytes]

    def release(self) -> None:
        """Free the oldest region."""
        self.used -= self.charged.popleft()
        if not self.charged:
            self.head = self.used = 0

    def close(self) -> None:
        if self.ptr:
            torch.cuda.synchronize()  # copies still reading it
            torch.cuda.cudart().cudaHostUnregister(self.ptr)
            self.ptr = 0
        # the mapping itself goes when the last tensor viewing it does (torch.frombuffer holds it)


def _read_into(path: Path, fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise MxRepackError(f"{path}: truncated while reading {len(view)} bytes at {offset}")
        done += n


def read_tensors(
    files: Iterable[str | Path],
    threads: int = 8,
    ring_bytes: int = 2 << 30,
    chunk_bytes: int = 16 << 20,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, CPU tensor)`` for every tensor of ``files`` (safetensors), file by file, in the order of their bytes.

    Up to ``ring_bytes`` of the following tensors are read ahead, in ``chunk_bytes`` pieces by ``threads`` workers; a
    tensor that does not fit is read into fresh (pageable) memory when its turn comes. Headers are checked as the
    repack's reader checks them (a tensor outside its file or of the wrong size: a one-line error naming both)."""
    todo: deque[TensorInfo] = deque()
    for f in files:
        header, _ = read_header(Path(f))
        todo += sorted(header.values(), key=lambda i: i.start)
    ring = _PinnedRing(max(ALIGN, min(ring_bytes, sum(-(-i.nbytes // ALIGN) * ALIGN for i in todo))))
    fds: dict[Path, int] = {}
    pending: deque[_Region] = deque()  # being read
    held: deque[_Region] = deque()  # handed out, ring bytes not yet released

    def reclaim() -> None:
        """Release, oldest first, the ring regions whose tensors nothing references any more."""
        synced = False
        while held and held[0].free():
            if held.popleft().view is not None:
                if not synced and torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.current_stream().synchronize()  # copies queued from them without waiting
                    synced = True
                ring.release()

    try:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mxrepack-read") as pool:

            def schedule(info: TensorInfo, view: memoryview | None) -> None:
                if view is None:
                    raw = torch.empty(info.nbytes, dtype=torch.uint8)
                else:
                    raw = torch.frombuffer(view, dtype=torch.uint8)
                fd = fds.get(info.file)
                if fd is None:
                    fd = fds[info.file] = os.open(info.file, os.O_RDONLY)
                target = view if view is not None else memoryview(raw.numpy())
                reads = [
                    pool.submit(_read_into, info.file, fd, target[a : a + chunk_bytes], info.start + a)
                    for a in range(0, info.nbytes, chunk_bytes)
                ]
                pending.append(_Region(info, view, raw.view(info.dtype).view(info.shape), reads))

            while todo or pending:
                while todo:  # read ahead as far as the ring allows
                    view, nbytes = None, todo[0].nbytes
                    if 0 < nbytes <= ring.size:
                        view = ring.take(nbytes)
                        if view is None:
                            reclaim()
                            view = ring.take(nbytes)
                        if view is None and pending:
                            break  # hand out what is read first
                    schedule(todo.popleft(), view)  # None: fresh memory (empty, larger than the ring, or no room)
                region = pending.popleft()
                for r in region.reads:
                    r.result()
                tensor, region.tensor = region.tensor, None
                held.append(region)
                yield region.info.name, tensor
                del tensor
                reclaim()
    finally:
        for fd in fds.values():
            os.close(fd)
        ring.close()
