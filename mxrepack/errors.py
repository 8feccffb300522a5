"""The one error type users see.

Every problem with the user's input (a missing file, a wrong dtype, a bad recipe) is raised as
:class:`MxRepackError` with a single-line message that names the file or tensor and says what was
expected. The CLI prints it as ``error: <message>`` and exits non-zero; anything else is a bug and
keeps its traceback.
"""

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class MxRepackError(Exception):
    """A user-facing error: one line, naming the file or tensor and what was expected."""

    def __init__(self, message: str):
        # Collapse to one line: messages sometimes embed text from other libraries.
        super().__init__(" ".join(str(message).split()))


def require_folder(path) -> None:
    """Raise the one-line error for a ``path`` that should be a folder and is not: it does not exist, or it is a
    file."""
    if not Path(path).is_dir():
        raise MxRepackError(f"{path}: {'not a folder' if Path(path).exists() else 'path does not exist'}")


@contextmanager
def reading(path, what: str) -> Iterator[None]:
    """Around the reading of text file ``path``: one line naming it when it is missing, a folder, unreadable or not
    UTF-8 text, which ``what`` (the kind of file expected) completes."""
    try:
        yield
    except FileNotFoundError:
        raise MxRepackError(f"{path}: file does not exist; expected {what}") from None
    except OSError as e:  # a folder, no permission
        raise MxRepackError(f"{path}: cannot read it ({e.strerror or e}); expected {what}") from None
    except UnicodeDecodeError as e:
        raise MxRepackError(f"{path}: not UTF-8 text (byte {e.start}); expected {what}") from None


def read_text(path, what: str) -> str:
    """The UTF-8 text of ``path`` (:func:`reading`'s errors)."""
    with reading(path, what):
        return Path(path).read_text(encoding="utf-8")


def load_json(path, what: str) -> dict:
    """The JSON object in ``path``; one line naming it (as ``what``) when it is missing, unreadable, not JSON or not an
    object."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise MxRepackError(f"{path}: missing; expected the {what}") from None
    except OSError as e:  # a folder of that name, no permission
        raise MxRepackError(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MxRepackError(f"{path}: the {what} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise MxRepackError(f"{path}: expected a JSON object for the {what}")
    return data


def file_in_the_way(path) -> Path | None:
    """The nearest existing folder above ``path`` when it is a file instead (``a/b/c`` where ``a`` is a file), else
    None: what would stop a write there, named before the work rather than after it."""
    nearest = next((p for p in Path(path).parents if p.exists()), None)
    return nearest if nearest is not None and not nearest.is_dir() else None
