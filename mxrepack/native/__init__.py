"""Optional compiled loops for byte-level layout permutations (``mxrepack_native.c``).

Built with the system C compiler on first use into ``$XDG_CACHE_HOME/mxrepack/native/<hash>/`` (``~/.cache``
by default), keyed by the source and compiler, and loaded with ctypes; calls release the GIL, so a
layout splits its work over threads. Where no compiler is found, the build fails, or ``MXREPACK_NATIVE=0``
is set, :func:`library` returns None and each layout runs its numpy twin, which gives the same bytes
(the tests compare both). Some loops also have an AVX-512 twin, used where the CPU has it (:func:`simd`)."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("mxrepack_native.c")
_U8 = ctypes.POINTER(ctypes.c_uint8)
_U16 = ctypes.POINTER(ctypes.c_uint16)
_U32 = ctypes.POINTER(ctypes.c_uint32)
_SIGNATURES = {
    "hopper_values_pack": (_U8, _U8, ctypes.c_int64, ctypes.c_int64, _U32),
    "hopper_values_unpack": (_U8, _U8, ctypes.c_int64, ctypes.c_int64, _U32),
    "hopper_values_pack_simd": (_U8, _U8, ctypes.c_int64, ctypes.c_int64, _U32, _U32, ctypes.c_int),
    "hopper_values_unpack_simd": (_U8, _U8, ctypes.c_int64, ctypes.c_int64, _U32, _U32, ctypes.c_int),
    "marlin_weights_pack": (_U8, _U32, *(ctypes.c_int64,) * 6, _U8),
    "marlin_weights_pack_simd": (_U8, _U32, *(ctypes.c_int64,) * 6, _U8),
    "permute_word_bits": (_U32, ctypes.c_int64, _U32),
    "mxfp4_bf16_rows": (_U8, _U8, _U16, *(ctypes.c_int64,) * 3),
    "mxfp4_bf16_cols": (_U8, _U8, _U16, *(ctypes.c_int64,) * 4),
    "native_simd": (),
}


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mxrepack" / "native"


def _build(cc: str) -> Path:
    """Compile the library once per (source, compiler) into the cache; concurrent builders each write a
    temporary file and rename it into place, so a reader never sees half a library."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(SOURCE.read_bytes() + version.encode()).hexdigest()[:16]
    lib = _cache_dir() / key / "libmxrepack_native.so"
    if not lib.exists():
        lib.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=lib.parent, suffix=".so.tmp")
        os.close(fd)
        try:
            subprocess.run(
                [cc, "-O3", "-shared", "-fPIC", "-o", tmp, str(SOURCE)],
                check=True,
                capture_output=True,
                text=True,
                timeout=120,
            )
            os.replace(tmp, lib)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return lib


def compiler() -> str | None:
    """The C compiler the helpers are built with: ``$CC``, else cc, gcc or clang on the PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled helpers, or None (no compiler, a failed build, or ``MXREPACK_NATIVE=0``)."""
    if os.environ.get("MXREPACK_NATIVE", "1") == "0":
        return None
    cc = compiler()
    if cc is None:
        log.info("no C compiler: layouts use their numpy paths")
        return None
    try:
        lib = ctypes.CDLL(str(_build(cc)))
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("mxrepack native helpers not built (%s): layouts use their numpy paths", str(e).splitlines()[0])
        return None
    for name, args in _SIGNATURES.items():
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = ctypes.c_int if name == "native_simd" else None
    return lib


def simd() -> bool:
    """Whether the loops that have an AVX-512 (VBMI) twin may use it: the library is built, the CPU has the
    instructions, and ``MXREPACK_NATIVE`` is not ``scalar`` (which keeps the portable C loops, for tests)."""
    lib = library()
    return lib is not None and os.environ.get("MXREPACK_NATIVE", "1") != "scalar" and _cpu_simd(lib)


@functools.cache
def _cpu_simd(lib: ctypes.CDLL) -> bool:
    return bool(lib.native_simd())


def empty(shape: tuple[int, ...] | int, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a 64-byte boundary: the AVX-512 loops write
    their outputs with streaming stores, which need whole aligned lines (elsewhere they fall back to plain
    stores)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    buf = np.empty(n + 64, np.uint8)
    start = -buf.ctypes.data % 64
    return buf[start : start + n].view(dtype).reshape(shape)


def ptr(a: np.ndarray):
    """A ctypes pointer to a C-contiguous array's first element, typed by its dtype (uint8, uint16 or uint32)."""
    assert a.flags.c_contiguous
    return a.ctypes.data_as(ctypes.POINTER(np.ctypeslib.as_ctypes_type(a.dtype)))
