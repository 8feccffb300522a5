"""Read a checkpoint's safetensors onto the GPU with several threads, tensor by tensor, in file order.

What a serving engine's weight phase spends once the conversion is gone (the plugin's targets need none) is reading:
vLLM's default reader hands each tensor over in fresh host memory from a memory map, one thread touching the pages, and
its copy to the GPU starts from pageable memory, which the driver stages through a bounce buffer. Here ``threads``
workers ``preadv`` each tensor's bytes, ``chunk_bytes`` at a time, into a small ring of page-locked staging slots, and
each slot is copied to the tensor's GPU memory on a side stream as soon as it is full, while the next slots are read.
The tensor is handed out on the GPU, as vLLM's ``fastsafetensors`` reader does; the weight loaders' copy into the
parameter is then a device-to-device copy.

Why a small ring and not whole tensors in page-locked memory: page-locking costs ~0.4 s per GiB on the lent H100's
host (``benchmarks/experiments/pin_probe.py``), more than reading the same GiB from the page cache.
Cost on the GPU: the tensor being read, and the one handed out before it while the consumer still holds it (vLLM's
loops keep it until they ask for the next): at most twice the largest tensor (2 x 1.1 GiB for gpt-oss's embedding).
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Iterator

import torch

from mxrepack.errors import MxRepackError
from mxrepack.repack.safetensors_io import TensorInfo, read_header


def _read_into(path: Path, fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise MxRepackError(f"{path}: truncated while reading {len(view)} bytes at {offset}")
        done += n


class _Staging:
    """``slots`` page-locked buffers of ``chunk`` bytes (pageable where locking fails), each with the event of the copy
    last issued from it."""

    def __init__(self, slots: int, chunk: int, device: torch.device):
        self.size = slots * chunk
        self.buf = mmap.mmap(-1, self.size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        with contextlib.suppress(OSError, AttributeError):  # fewer page faults; optional
            self.buf.madvise(mmap.MADV_HUGEPAGE)
        cudart = torch.cuda.cudart()
        self.ptr = torch.frombuffer(self.buf, dtype=torch.uint8, count=1).data_ptr()
        if cudart.cudaHostRegister(self.ptr, self.size, 0) != cudart.cudaError.success:
            self.ptr = 0
        self.slots = [memoryview(self.buf)[k * chunk : (k + 1) * chunk] for k in range(slots)]
        self.tensors = [torch.frombuffer(v, dtype=torch.uint8) for v in self.slots]
        self.events: list[torch.cuda.Event | None] = [None] * slots

    def close(self) -> None:
        for e in self.events:
            if e is not None:
                e.synchronize()
        self.tensors.clear()
        if self.ptr:
            torch.cuda.cudart().cudaHostUnregister(self.ptr)
            self.ptr = 0


def _infos(files: Iterable[str | Path]) -> list[TensorInfo]:
    infos: list[TensorInfo] = []
    for f in files:
        header, _ = read_header(Path(f))
        infos += sorted(header.values(), key=lambda i: i.start)
    return infos


def read_tensors(
    files: Iterable[str | Path],
    device: torch.device | str | None = None,
    threads: int = 8,
    chunk_bytes: int = 16 << 20,
    slots: int = 16,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every tensor of ``files`` (safetensors), file by file, in the order of their bytes, on
    ``device`` (a CUDA device: through ``slots`` staging buffers of ``chunk_bytes``; else in fresh host memory, read
    by the same threads). Headers are checked as the repack's reader checks them: a tensor outside its file or of the
    wrong size is a one-line error naming both."""
    infos = _infos(files)
    device = torch.device(device) if device is not None else torch.device("cpu")
    fds: dict[Path, int] = {}
    staging = _Staging(slots, chunk_bytes, device) if device.type == "cuda" else None
    stream = torch.cuda.Stream(device) if staging else None

    def fd_of(info: TensorInfo) -> int:
        if info.file not in fds:
            fds[info.file] = os.open(info.file, os.O_RDONLY)
        return fds[info.file]

    try:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mxrepack-read") as pool:
            for info in infos:
                if staging is None or not info.nbytes:
                    raw = torch.empty(info.nbytes, dtype=torch.uint8)
                    view = memoryview(raw.numpy())
                    reads = [
                        pool.submit(_read_into, info.file, fd_of(info), view[a : a + chunk_bytes], info.start + a)
                        for a in range(0, info.nbytes, chunk_bytes)
                    ]
                    for r in reads:
                        r.result()
                    yield info.name, raw.to(device).view(info.dtype).view(info.shape)
                    continue
                dst = torch.empty(info.nbytes, dtype=torch.uint8, device=device)
                dst.record_stream(stream)
                stream.wait_stream(torch.cuda.current_stream(device))  # dst's memory may have been in use there
                starts = list(range(0, info.nbytes, chunk_bytes))
                reads: deque[tuple[int, int, Future]] = deque()
                n_slots = len(staging.slots)
                for k, a in enumerate(starts + [None] * min(n_slots, len(starts))):
                    if a is not None:  # read chunk k into slot k % n_slots once its last copy is done
                        slot = k % n_slots
                        if staging.events[slot] is not None:
                            staging.events[slot].synchronize()
                        n = min(chunk_bytes, info.nbytes - a)
                        view = staging.slots[slot][:n]
                        reads.append((slot, a, pool.submit(_read_into, info.file, fd_of(info), view, info.start + a)))
                    if len(reads) == n_slots or (a is None and reads):  # the oldest read: copy it out
                        slot, b, fut = reads.popleft()
                        fut.result()
                        n = min(chunk_bytes, info.nbytes - b)
                        with torch.cuda.stream(stream):
                            dst[b : b + n].copy_(staging.tensors[slot][:n], non_blocking=True)
                            event = staging.events[slot] = torch.cuda.Event()
                            event.record(stream)
                torch.cuda.current_stream(device).wait_stream(stream)
                yield info.name, dst.view(info.dtype).view(info.shape)
                del dst
    finally:
        for fd in fds.values():
            os.close(fd)
        if staging is not None:
            staging.close()
