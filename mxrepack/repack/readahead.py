"""Start the disk reading the source's first tensors while the process is still starting.

``repack`` spends its first ~3 s importing torch and planning, with the disk idle. From a cold page cache
(the user's case: gpt-oss-120b's 65 GB cannot stay cached on a 24 GB machine) that is time the disk could
have spent reading. The plan reads in the canonical order, which starts with the embeddings and lm_head
(2.3 GB at 120b, copied unchanged). So before torch is imported, a thread reads those two tensors' bytes into
one small reused buffer, which leaves them in the page cache for the pipeline. (``posix_fadvise(WILLNEED)``
does not do it: on this machine's kernel each call queues at most 16 MB and returns, so a 1.1 GB hint cached
16 MB.) This is a hint only: when anything here fails (a source that is not local, an unexpected file)
nothing happens, and the pipeline reads the same bytes itself, with its own checks and errors.

Torch-free on purpose: it must run before torch is imported.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from mxrepack.repack.safetensors_header import raw_header

# The plan's first tensors (mxrepack.gptoss.expected_tensors puts them first), by their HF and
# original/ names.
FIRST_TENSORS = ("model.embed_tokens.weight", "lm_head.weight", "embedding.weight", "unembedding.weight")
_BUFFER_BYTES = 16 << 20
_CACHED_BYTES_PER_S = 3e9  # above what a disk gives one reader (this VM's: 0.3-1.2 GB/s); page-cache copies run 5+


def local_source_dir(source: str, revision: str | None = None) -> Path | None:
    """The directory holding ``source``'s files when they are on this machine (a directory, or a Hub repo id
    already in the Hugging Face cache); None otherwise. Never touches the network."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if source.count("/") != 1 or path.exists():
        return None
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(source, "config.json", revision=revision)
    return Path(cached).parent if isinstance(cached, str) else None


def first_ranges(root: Path, names=FIRST_TENSORS) -> list[tuple[Path, int, int]]:
    """(file, offset, length) of the tensors ``names`` that ``root``'s safetensors files hold."""
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({weight_map[n] for n in names if n in weight_map})
    else:
        files = sorted(p.name for p in root.glob("*.safetensors"))
    ranges = []
    for name in files:
        data, header, _ = raw_header(root / name)
        for tensor in names:
            if tensor in header:
                start, stop = header[tensor]["data_offsets"]
                ranges.append((root / name, data + start, stop - start))
    return ranges


def read_ahead(ranges: list[tuple[Path, int, int]]) -> None:
    """Read the ranges into one reused buffer (the read releases the GIL: torch's import goes on meanwhile).
    Stops at once when the first buffer comes faster than a disk gives it: the bytes are already cached, and
    copying them again would only take CPU from the import."""
    buf = memoryview(bytearray(_BUFFER_BYTES))
    first = True
    for path, offset, length in ranges:
        fd = os.open(path, os.O_RDONLY)
        try:
            end = offset + length
            while offset < end:
                started = time.perf_counter()
                n = os.preadv(fd, [buf[: min(_BUFFER_BYTES, end - offset)]], offset)
                if n <= 0:
                    break
                if first and n / max(time.perf_counter() - started, 1e-9) > _CACHED_BYTES_PER_S:
                    return
                first = False
                offset += n
        finally:
            os.close(fd)


def start(source: str, revision: str | None = None) -> threading.Thread | None:
    """Read the source's first tensors in a background thread; returns it (None with
    ``MXREPACK_EARLY_READ_AHEAD=0``)."""
    if os.environ.get("MXREPACK_EARLY_READ_AHEAD", "1") == "0":
        return None

    def work() -> None:
        try:
            root = local_source_dir(source, revision)
            if root is not None:
                read_ahead(first_ranges(root))
        except Exception:  # a hint only: the pipeline reads and checks the same files
            pass

    thread = threading.Thread(target=work, name="mxrepack-early-read-ahead", daemon=True)
    thread.start()
    return thread
