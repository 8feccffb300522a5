"""Where an output goes, and what may happen there: the per-output lock, the overwrite rules, the atomic
replace.

The rules protect what the user did not ask mxrepack to make:

* ``--overwrite`` replaces only a folder that is itself an mxrepack output (it holds an mxrepack manifest)
  and holds nothing its manifest does not list, every file as mxrepack left it (the manifest's own digest, each
  file's size, and the hash of any file newer than the manifest); anything else is refused, naming the path.
* An output never is, contains, or lies inside the source checkpoint (nor the folders its files resolve to,
  such as the Hugging Face cache's blobs), with or without ``--overwrite``.
* One conversion at a time writes to a given output: a second one fails at once and leaves the first's
  work alone (an advisory ``flock`` on a hidden sibling file; the kernel releases it if the process dies).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Iterable

from mxrepack.errors import MxRepackError
from mxrepack.repack.output import MANIFEST, MANIFEST_KIND, check_manifest_digest
from mxrepack.repack.safetensors_io import sha256_file


def lock_path(out: Path) -> Path:
    return out.parent / f".{out.name}.mxrepack-lock"


class OutputLock:
    """An exclusive, non-blocking lock on one output path, held from before the first check of the path to
    after its final rename. Used as a context manager; the lock file is removed on release."""

    def __init__(self, out: Path):
        self.out = out
        self.path = lock_path(out)
        self._fd: int | None = None

    def __enter__(self) -> "OutputLock":
        fd = None
        try:  # an interrupt part way closes the file: an open descriptor would hold the lock for the process's life
            while True:
                try:
                    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                except OSError as e:
                    raise MxRepackError(
                        f"{self.out.parent}: cannot write the output here ({e.strerror or e})"
                    ) from None
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as e:
                    if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        holder = _read_pid(self.path)
                        who = f" (process {holder})" if holder else ""
                        raise MxRepackError(
                            f"{self.out}: another repack is writing this output{who}; wait for it to "
                            "finish or choose another --out"
                        ) from None
                    raise MxRepackError(f"{self.path}: cannot lock the output ({e.strerror or e})") from None
                # The holder before us may have removed the file between our open and our lock: then we hold a
                # lock on an unlinked file that nobody else can see, and must take the one at the path instead.
                try:
                    same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    break
                fd, stale = None, fd
                os.close(stale)
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.unlink(self.path)  # while still held: a waiting process re-checks the inode (above)
            except OSError:
                pass
            finally:
                os.close(fd)

    def __del__(self) -> None:  # an interrupt before __exit__ ran: the lock must not outlive the conversion
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _overlaps(a: Path, b: Path) -> bool:
    """Whether ``a`` is ``b``, contains it, or lies inside it (both already resolved)."""
    return a == b or a in b.parents or b in a.parents


def source_places(root: Path, files: Iterable[Path]) -> list[Path]:
    """The folders a source checkpoint occupies: its root and, where its files are links (the Hub cache's
    snapshots point into ``blobs/``), the folders they resolve into."""
    places = {_real(root)}
    for f in files:
        places.add(_real(f).parent)
    return sorted(places)


def check_destination(out: Path, source: list[Path], overwrite: bool) -> None:
    """Refuse an output path that would overwrite or nest in the source, or replace what is not ours.

    ``out`` is absolute (not resolved: a link named as the output is replaced as a link would be);
    ``source`` comes from :func:`source_places`. Raises MxRepackError naming the path; touches nothing."""
    real = _real(out)
    for place in source:
        if _overlaps(real, place):
            how = (
                "is the source checkpoint"
                if real == place
                else (
                    "lies inside the source checkpoint" if place in real.parents else "contains the source checkpoint"
                )
            )
            raise MxRepackError(f"{out}: the output {how} ({place}); choose an --out outside it")
    if not (out.exists() or out.is_symlink()):
        return
    if not overwrite:
        raise MxRepackError(f"{out}: output already exists; pass --overwrite to replace it")
    problem = _not_replaceable(out)
    if problem:
        raise MxRepackError(
            f"{out}: --overwrite only replaces an mxrepack output, and {problem}; "
            "remove it yourself or choose another --out"
        )


def _not_replaceable(out: Path) -> str | None:
    """Why ``out`` is not an mxrepack output that ``--overwrite`` may replace whole, or None."""
    if out.is_symlink() or not out.is_dir():
        return "this is not a folder"
    manifest = out / MANIFEST
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return f"it holds no readable {MANIFEST}"
    if not isinstance(data, dict) or data.get("format") != MANIFEST_KIND:
        return f"its {MANIFEST} is not an mxrepack manifest"
    listed = set(data.get("files") or {}) | {MANIFEST}
    for entry in sorted(out.iterdir()):
        if entry.name not in listed:
            return f"it holds {entry.name!r}, which its manifest does not list (not written by mxrepack)"
    return _changed_since_written(out, data)


def _changed_since_written(out: Path, manifest: dict) -> str | None:
    """Why a file of output ``out`` is not as mxrepack left it, or None: the manifest edited (its own digest), a file of
    another size than it records, or one modified after the manifest was written (mxrepack writes the manifest last,
    and renaming the folder into place keeps its files' times) whose sha256 then differs from the manifest's. Sizes and
    times first, a hash only for a newer file: a user's edit to a config or a shard is theirs to keep, and hashing a
    whole model before every overwrite would double its time."""
    problem, _ = check_manifest_digest(out, manifest)
    if problem:
        return "its manifest was edited since mxrepack wrote it"
    written = (out / MANIFEST).stat().st_mtime_ns
    for name, entry in sorted((manifest.get("files") or {}).items()):
        try:
            st = (out / name).stat()
        except OSError:
            continue  # gone: nothing of the user's to lose
        if isinstance(entry, dict) and entry.get("size") not in (None, st.st_size):
            return f"{name!r} is {st.st_size} bytes where its manifest says {entry['size']} (changed since written)"
        # newer than the manifest: an edit, or a copy that did not keep file times (cp -r, rsync without -t, in
        # whatever order): the file's own hash decides, for these few files only
        if st.st_mtime_ns > written and not (
            isinstance(entry, dict) and sha256_file(out / name) == entry.get("sha256")
        ):
            return f"{name!r} was modified after mxrepack wrote this output (its sha256 differs from the manifest's)"
    return None


def replace_with(out: Path, tmp: Path) -> None:
    """Move the finished ``tmp`` to ``out``, replacing an mxrepack output there (already checked by
    :func:`check_destination` under the lock): the old one is renamed aside first, then removed, so ``out``
    holds a complete output but for the instant between the two renames, and the old one again if the second fails."""
    if out.exists() or out.is_symlink():
        old = out.parent / f".{out.name}.mxrepack-old-{os.getpid()}"
        os.rename(out, old)
        try:
            os.rename(tmp, out)
        except BaseException:  # the old output back where it was (a kill here leaves it to the next run's leftovers)
            os.rename(old, out)
            raise
        # removed under the temporary name, free again: a kill during the removal (seconds for a whole model) leaves a
        # folder the next run removes, never a part of an output that it would take for one set aside and put back
        os.rename(old, tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.rename(tmp, out)
