"""The raw header of a safetensors file, without torch: the start-up read (``mxrepack.repack.readahead``) runs
before torch is imported, and :func:`mxrepack.repack.safetensors_io.read_header` checks every entry on top."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from mxrepack.errors import MxRepackError

MAX_HEADER = 100 * 1024 * 1024


def raw_header(path: Path) -> tuple[int, dict, int]:
    """(offset of the data, header as a JSON object, file size) of the safetensors file ``path``; a one-line error
    when the file is too short, declares more header bytes than it has, or its header is not a JSON object."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise MxRepackError(f"{path}: not a safetensors file (only {size} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > min(MAX_HEADER, size - 8):
                raise MxRepackError(
                    f"{path}: corrupted or truncated safetensors header (declares {n} header bytes, file has {size})"
                )
            raw = f.read(n)
    except OSError as e:
        raise MxRepackError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise MxRepackError(f"{path}: corrupted safetensors header (not valid JSON)") from None
    if not isinstance(header, dict):
        raise MxRepackError(f"{path}: corrupted safetensors header (not a JSON object)")
    return 8 + n, header, size
