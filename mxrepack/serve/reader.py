"""Read a checkpoint's safetensors onto the GPU with several threads, tensor by tensor, file by file.

What a serving engine's weight phase spends once the conversion is gone (the plugin's targets need none) is reading:
vLLM's default reader hands each tensor over in fresh host memory from a memory map, one thread touching the pages, and
its copy to the GPU starts from pageable memory, which the driver stages through a bounce buffer. Here ``threads``
workers ``preadv`` each tensor's bytes, ``chunk_bytes`` at a time, into a small ring of page-locked staging slots, and
each slot is copied to the tensor's GPU memory on a side stream as soon as it is full, while the next slots are read.
The tensor is handed out on the GPU, as vLLM's ``fastsafetensors`` reader does; the weight loaders' copy into the
parameter is then a device-to-device copy. Files come in vLLM's order (natural sort of the names), each file's tensors
in the order of their bytes.

Why a small ring (256 MiB by default) and not whole tensors in page-locked memory: page-locking costs 0.4-0.95 s per
GiB on the lent H100's host by method, 0.6 for torch's ``pin_memory`` used here (``benchmarks/experiments/
pin_probe.py``), more than reading the same GiB from the page cache.
Cost on the GPU: the tensor being read, and the one handed out before it while the consumer still holds it (vLLM's
loops keep it until they ask for the next): at most twice the largest tensor (2 x 1.1 GiB for gpt-oss's embedding).
The consumer uses each tensor on the CUDA stream that was current when it asked for it (vLLM's loaders do).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Iterator

import torch

from mxrepack.repack.safetensors_io import TensorInfo, read_header, read_into


class _Staging:
    """``slots`` page-locked buffers of ``chunk`` bytes (pageable where page-locking fails), each with the event of the
    copy last issued from it, and the side stream those copies run on."""

    def __init__(self, slots: int, chunk: int, device: torch.device):
        self.chunk = chunk
        try:
            buf = torch.empty(slots * chunk, dtype=torch.uint8, pin_memory=True)
        except RuntimeError:  # no page-locked memory to be had: the same copies, from pageable memory (slower)
            buf = torch.empty(slots * chunk, dtype=torch.uint8, device="cpu")
        self.tensors = [buf[k * chunk : (k + 1) * chunk] for k in range(slots)]
        self.views = [memoryview(t.numpy()) for t in self.tensors]
        self.events: list[torch.cuda.Event | None] = [None] * slots
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def read(self, pool: ThreadPoolExecutor, fd: int, info: TensorInfo) -> torch.Tensor:
        """``info``'s bytes in fresh GPU memory: chunk k is read into slot k % slots once the copy last issued from it
        is done, and copied out (on the side stream) while the reads of the following slots run."""
        dst = torch.empty(info.nbytes, dtype=torch.uint8, device=self.device)
        dst.record_stream(self.stream)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # dst's memory may still be in use there
        pending: deque[tuple[int, int, Future]] = deque()
        for k, start in enumerate(range(0, info.nbytes, self.chunk)):
            slot = k % len(self.views)
            if self.events[slot] is not None:
                self.events[slot].synchronize()
            view = self.views[slot][: min(self.chunk, info.nbytes - start)]
            pending.append((slot, start, pool.submit(read_into, fd, info, view, info.start + start)))
            if len(pending) == len(self.views):
                self._copy_out(dst, *pending.popleft())
        while pending:
            self._copy_out(dst, *pending.popleft())
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        return dst

    def _copy_out(self, dst: torch.Tensor, slot: int, start: int, read: Future) -> None:
        read.result()
        n = min(self.chunk, dst.numel() - start)
        with torch.cuda.stream(self.stream):
            dst[start : start + n].copy_(self.tensors[slot][:n], non_blocking=True)
            event = self.events[slot] = torch.cuda.Event()
            event.record(self.stream)

    def close(self) -> None:
        """Wait for the copies still reading the slots (the page-locked block goes back to torch's cache after)."""
        for e in self.events:
            if e is not None:
                e.synchronize()


def _read_to_host(pool: ThreadPoolExecutor, fd: int, info: TensorInfo, chunk: int) -> torch.Tensor:
    raw = torch.empty(info.nbytes, dtype=torch.uint8, device="cpu")
    view = memoryview(raw.numpy())
    starts = range(0, info.nbytes, chunk)
    for r in [pool.submit(read_into, fd, info, view[a : a + chunk], info.start + a) for a in starts]:
        r.result()
    return raw


def _natural_key(path: str | Path) -> list:
    """vLLM's order of shard files (``weight_utils._natural_sort_key``): digit runs compare as numbers."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def _infos(files: Iterable[str | Path]) -> list[TensorInfo]:
    infos: list[TensorInfo] = []
    for f in sorted(files, key=_natural_key):
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

    def fd_of(info: TensorInfo) -> int:
        if info.file not in fds:
            fds[info.file] = os.open(info.file, os.O_RDONLY)
        return fds[info.file]

    try:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mxrepack-read") as pool:
            for info in infos:
                if staging is not None and info.nbytes:
                    raw = staging.read(pool, fd_of(info), info)
                else:
                    raw = _read_to_host(pool, fd_of(info), info, chunk_bytes).to(device)
                yield info.name, raw.view(info.dtype).view(info.shape)
                del raw  # the consumer's reference is the only one left
    except BaseException:  # an error, or the consumer stopped early (GeneratorExit): that is what is reported
        with contextlib.suppress(Exception):
            _close(fds, staging)
        raise
    _close(fds, staging)


def _close(fds: dict[Path, int], staging: _Staging | None) -> None:
    for fd in fds.values():
        os.close(fd)
    fds.clear()
    if staging is not None:
        staging.close()
