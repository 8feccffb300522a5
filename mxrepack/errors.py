"""The one error type users see.

Every problem with the user's input (a missing file, a wrong dtype, a bad recipe) is raised as
:class:`MxRepackError` with a single-line message that names the file or tensor and says what was
expected. The CLI prints it as ``error: <message>`` and exits non-zero; anything else is a bug and
keeps its traceback.
"""

from pathlib import Path


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


def read_text(path, what: str) -> str:
    """The UTF-8 text of ``path``; one line naming it when it is missing, a folder, unreadable or not text."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MxRepackError(f"{path}: file does not exist; expected {what}") from None
    except OSError as e:
        raise MxRepackError(f"{path}: cannot read it ({e.strerror or e}); expected {what}") from None
    except UnicodeDecodeError as e:
        raise MxRepackError(f"{path}: not UTF-8 text (byte {e.start}); expected {what}") from None
