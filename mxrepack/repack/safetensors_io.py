"""Streaming safetensors: a header-checking reader that reads row ranges, and a writer that streams.

Why not only ``safetensors.safe_open``: it maps whole files, and the touched pages of a 4.8 GB shard
count against the process's resident memory until the file is closed. Reading row ranges with
``os.pread`` keeps the footprint at one chunk, and lets us name exactly what is wrong with a
truncated or corrupted file. The format (8-byte little-endian header length, JSON header, one
contiguous data region) is small enough to handle exactly; files we write are re-opened with
``safe_open`` in the verify step, so the official parser has the last word.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import mmap
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

from mxrepack.errors import MxRepackError
from mxrepack.repack.safetensors_header import raw_header

DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "U16": torch.uint16,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "F32": torch.float32,
    "F64": torch.float64,
    "I64": torch.int64,
    "U64": torch.uint64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES[dtype]


def dtype_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes live in a safetensors file."""

    file: Path
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int

    @property
    def row_bytes(self) -> int:
        """Bytes per index of dim 0 (the unit of every streamed read)."""
        return self.nbytes // self.shape[0] if self.shape and self.shape[0] else self.nbytes


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Parse and check a safetensors header: every tensor must lie inside the file, without overlap."""
    path = Path(path)
    base, header, size = raw_header(path)
    metadata = header.pop("__metadata__", None) or {}
    infos: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        try:
            dtype = DTYPES[entry["dtype"]]
            shape = tuple(entry["shape"])
            begin, end = entry["data_offsets"]
            if not all(_is_count(x) for x in (*shape, begin, end)):  # 2.5 or -4 is no size or offset
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise MxRepackError(
                f"{path}: tensor '{name}' has a malformed or unsupported header entry {entry!r} (expected a "
                "known dtype, a shape of non-negative integers and two non-negative data_offsets)"
            ) from None
        expected = math.prod(shape) * dtype_size(dtype)
        if end - begin != expected:
            raise MxRepackError(
                f"{path}: tensor '{name}' spans {end - begin} bytes, "
                f"expected {expected} for {entry['dtype']} {list(shape)}"
            )
        if base + end > size:
            raise MxRepackError(f"{path}: truncated: tensor '{name}' ends at byte {base + end}, file has {size}")
        infos[name] = TensorInfo(path, name, dtype, shape, base + begin, expected)
    # Two tensors sharing bytes is a corrupted header (the official parser refuses it too): each would read the
    # other's data without a word.
    spans = sorted((i.start, i.start + i.nbytes, n) for n, i in infos.items() if i.nbytes)
    for (_, end_a, a), (begin_b, end_b, b) in zip(spans, spans[1:]):
        if begin_b < end_a:
            raise MxRepackError(
                f"{path}: corrupted safetensors header: tensors '{a}' and '{b}' overlap (bytes {begin_b - base}.."
                f"{min(end_a, end_b) - base} of the data belong to both)"
            )
    return infos, metadata


def _is_count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14+; Python names it from 3.13


def map_range(fd: int, offset: int, nbytes: int) -> memoryview:
    """Bytes ``[offset, offset + nbytes)`` of the open file ``fd``, mapped read-only from the page cache.

    For bytes that are in the page cache (a file just written): a ``pread`` would copy each of them into
    this process, and those kernel copies were a fifth of a repack's CPU on 2 cores (docs/PERF_LOG.md, stop 15).
    The mapping is filled at once (``MADV_POPULATE_READ``) instead of faulting page by page. Not for a cold
    source: from disk, reads through the mapping came slower than ``pread`` with its readahead (stop 16).
    The caller keeps the range inside the file (touching a page past its end raises SIGBUS); the mapping
    lives as long as the returned view.
    """
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    m = mmap.mmap(fd, offset + nbytes - start, offset=start, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    try:
        m.madvise(_MADV_POPULATE_READ)
    except OSError:  # an older kernel: the pages fault in as they are touched
        pass
    return memoryview(m)[offset - start :]


def read_into(fd: int, info: TensorInfo, view: memoryview, offset: int) -> None:
    """Fill ``view`` with the bytes at ``offset`` (absolute) of ``info``'s file, open as ``fd``; a file cut short is a
    one-line error naming it and the tensor."""
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            raise MxRepackError(f"{info.file}: truncated while reading tensor '{info.name}'")
        done += got


def read_rows(info: TensorInfo, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """Read rows ``[start, stop)`` of dim 0 (the whole tensor by default) into a fresh tensor."""
    rows = info.shape[0] if info.shape else 1
    stop = rows if stop is None else stop
    if not 0 <= start <= stop <= rows:
        raise ValueError(f"rows {start}:{stop} out of range for {info.name} {info.shape}")
    count = (stop - start) * info.row_bytes
    buf = np.empty(count, dtype=np.uint8)  # not zero-filled: every byte is read into below
    fd = os.open(info.file, os.O_RDONLY)
    try:
        read_into(fd, info, memoryview(buf), info.start + start * info.row_bytes)
    finally:
        os.close(fd)
    flat = torch.from_numpy(buf)
    shape = (stop - start, *info.shape[1:]) if info.shape else ()
    return flat.view(info.dtype).reshape(shape)


@dataclass
class PlannedTensor:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtype_size(self.dtype)


def _header_bytes(tensors: list[PlannedTensor], metadata: dict[str, str] | None) -> bytes:
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for t in tensors:
        header[t.name] = {
            "dtype": dtype_name(t.dtype),
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(len(raw) + 8) % 8)  # data starts 8-byte aligned, as the reference writer does
    return struct.pack("<Q", len(raw)) + raw


def plan_shards(tensors: Iterable[PlannedTensor], max_shard_bytes: int) -> list[list[PlannedTensor]]:
    """Split tensors, in order, into shards of at most ``max_shard_bytes`` (a bigger tensor gets its own)."""
    shards: list[list[PlannedTensor]] = []
    current: list[PlannedTensor] = []
    size = 0
    for t in tensors:
        if current and size + t.nbytes > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(t)
        size += t.nbytes
    if current:
        shards.append(current)
    return shards


class _FollowingHash:
    """sha256 of a file that is being written, computed on a thread that reads it back behind the writer.

    Reading back (from the page cache, where the bytes just went) instead of hashing the writer's
    chunks means the writer never waits for the hash and holds no chunk for it: one core writes shard
    ``k + 1`` while another still hashes shard ``k``. On a 2-core machine sha256 (~1.1 GB/s a core)
    is slower than writing, so hashing shards in parallel is what bounds the time (docs/PERF_LOG.md).
    """

    WINDOW = 64 << 20  # bytes mapped and hashed at a time

    def __init__(self, path: Path):
        self._fd = os.open(path, os.O_RDONLY)  # the writer's flushed bytes are all it maps
        self._hash = hashlib.sha256()
        self._cond = threading.Condition()
        self._written = 0  # bytes the writer has flushed to the file
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="mxrepack-sha256", daemon=True)
        self._thread.start()

    def advance(self, size: int) -> None:
        """The file now holds ``size`` bytes (flushed)."""
        with self._cond:
            self._written = size
            self._cond.notify()

    def _run(self) -> None:
        pos = 0
        try:
            while True:
                with self._cond:
                    while pos >= self._written and not self._closed:
                        self._cond.wait()
                    end, last = self._written, self._closed
                while pos < end:
                    n = min(self.WINDOW, end - pos)
                    with map_range(self._fd, pos, n) as view:  # mapped, not copied: see map_range
                        self._hash.update(view)
                    pos += n
                if last:
                    return
        except BaseException as e:  # whatever it is, the digest must not pass for the file's
            self._error = e

    def hexdigest(self) -> str:
        """Wait for the hash of everything advanced so far; the writer must be done."""
        self.stop()
        if self._error is not None:
            raise MxRepackError(f"reading back for sha256 failed: {self._error}")
        return self._hash.hexdigest()

    def stop(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class StreamingShardWriter:
    """Write one safetensors file whose tensor list is known up front, data streamed in chunks.

    The header (names, dtypes, shapes, offsets) is written first, so each tensor's bytes can follow
    chunk by chunk, in order, without ever holding a whole tensor. The sha256 is computed on the way.
    """

    def __init__(self, path: Path, tensors: list[PlannedTensor], metadata: dict[str, str] | None = None):
        self.path = Path(path)
        self.tensors = tensors
        self._index = 0
        self._written = 0  # bytes of the current tensor
        self._sync: threading.Thread | None = None
        self._sync_error: OSError | None = None
        self._file = open(self.path, "wb")
        self._hash = _FollowingHash(self.path)
        self.size = 0
        self._emit(_header_bytes(tensors, metadata))

    def _write_failed(self, e: OSError) -> MxRepackError:
        """The one-line error for a failed write, flush or fsync; the file is closed (the caller removes
        the temporary directory it is in)."""
        self._file.close()
        return MxRepackError(f"{self.path}: write failed ({e.strerror or e}); is the disk full?")

    def _emit(self, data) -> None:
        try:
            self._file.write(data)
            self._file.flush()  # the hash thread reads the file back
        except OSError as e:
            raise self._write_failed(e) from None
        self.size += len(data)
        self._hash.advance(self.size)

    @property
    def current(self) -> PlannedTensor | None:
        return self.tensors[self._index] if self._index < len(self.tensors) else None

    def write(self, name: str, chunk: torch.Tensor) -> None:
        """Append the next rows of tensor ``name`` (which must be the current one, in header order)."""
        t = self._expect(name, chunk.numel() * chunk.element_size())
        if chunk.dtype != t.dtype or tuple(chunk.shape[1:]) != tuple(t.shape[1:]):
            raise RuntimeError(f"{name}: chunk {chunk.dtype} {tuple(chunk.shape)} does not fit {t.dtype} {t.shape}")
        data = chunk.contiguous().reshape(-1).view(torch.uint8).numpy()
        self._emit(memoryview(data))
        self._tensor_done(data.nbytes)

    def _expect(self, name: str, nbytes: int) -> PlannedTensor:
        """The current tensor, checked to be ``name`` with room for ``nbytes`` more."""
        t = self.current
        if t is None or t.name != name:
            raise RuntimeError(f"{self.path}: expected data for {t.name if t else 'nothing'}, got {name}")
        if self._written + nbytes > t.nbytes:
            raise RuntimeError(f"{name}: more data than its shape {t.shape}")
        return t

    def _tensor_done(self, nbytes: int) -> None:
        self._written += nbytes
        if self._written == self.current.nbytes:
            self._index += 1
            self._written = 0

    def copy_from(self, name: str, path: Path, offset: int, nbytes: int) -> None:
        """Append the next ``nbytes`` of tensor ``name`` straight from ``path`` at ``offset``: a tensor stored
        unchanged is copied by the kernel (``copy_file_range``) and never passes through this process."""
        self._expect(name, nbytes)
        done = 0
        try:
            self._file.flush()
            src = os.open(path, os.O_RDONLY)
            try:
                while done < nbytes:
                    try:
                        got = os.copy_file_range(src, self._file.fileno(), nbytes - done, offset + done)
                    except OSError as e:
                        if done or e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                            raise
                        got = self._copy_by_reading(src, offset, nbytes)
                        got = got if got == nbytes else 0  # the source ended early: the error below
                    if got <= 0:
                        raise MxRepackError(f"{path}: truncated while reading tensor '{name}'")
                    done += got
            finally:
                os.close(src)
        except OSError as e:
            raise self._write_failed(e) from None
        self.size += nbytes
        self._hash.advance(self.size)
        self._tensor_done(nbytes)

    def _copy_by_reading(self, src: int, offset: int, nbytes: int) -> int:
        """The fallback where the kernel cannot copy between these files (e.g. across filesystems)."""
        buf = memoryview(bytearray(min(nbytes, 64 << 20)))
        done = 0
        while done < nbytes:
            got = os.preadv(src, [buf[: min(len(buf), nbytes - done)]], offset + done)
            if got <= 0:
                break
            self._file.write(buf[:got])
            done += got
        self._file.flush()
        return done

    def close(self) -> None:
        """Finish the file (all tensors must be complete). The fsync and the rest of the sha256 run on
        threads, overlapping the next shard's writing: :meth:`sha256` waits for the hash and
        :meth:`wait_synced` for the disk."""
        if self.current is not None:
            raise RuntimeError(f"{self.path}: closed before {self.current.name} was written")
        try:
            self._file.flush()
        except OSError as e:
            raise self._write_failed(e) from None
        self._sync = threading.Thread(target=self._fsync_and_close, name="mxrepack-fsync", daemon=True)
        self._sync.start()

    def sha256(self) -> str:
        """The file's sha256 (after :meth:`close`), from the bytes as written."""
        try:
            return self._hash.hexdigest()
        except MxRepackError as e:
            raise MxRepackError(f"{self.path}: {e}") from None

    def _fsync_and_close(self) -> None:
        try:
            os.fsync(self._file.fileno())
        except OSError as e:
            self._sync_error = e
        finally:
            self._file.close()

    def wait_synced(self) -> None:
        """Block until the file is on disk; a failed fsync (e.g. the disk filled up) is an error."""
        self._sync.join()
        if self._sync_error is not None:
            raise self._write_failed(self._sync_error)

    def abort(self) -> None:
        self._hash.stop()
        if self._sync is not None:
            self._sync.join()
        else:
            self._file.close()


def read_directory(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a (small) checkpoint directory, by name: the shards its index lists, or all
    ``*.safetensors`` files when it has none. For tests and the tiny-model runner, not for streaming."""
    from safetensors.torch import load_file

    from mxrepack.repack.output import read_weight_map

    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    files = (
        sorted(set(read_weight_map(directory).values()))
        if index.is_file()
        else sorted(p.name for p in directory.glob("*.safetensors"))
    )
    out: dict[str, torch.Tensor] = {}
    for fname in files:
        try:
            out.update(load_file(str(directory / fname)))
        except Exception as e:  # missing, a folder, truncated, a corrupted header: safetensors' own words
            reason = str(e) or type(e).__name__
            raise MxRepackError(f"{directory / fname}: cannot read it as safetensors ({reason})") from None
    return out


def sha256_file(path: Path, chunk: int = 16 << 20, on_block: Callable[[int], None] | None = None) -> str:
    """``on_block(n)`` after each block of ``n`` bytes hashed (verify's progress bar)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
            if on_block:
                on_block(len(block))
    return h.hexdigest()
