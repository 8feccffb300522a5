"""The one error type users see.

Every problem with the user's input (a missing file, a wrong dtype, a bad recipe) is raised as
:class:`MxRepackError` with a single-line message that names the file or tensor and says what was
expected. The CLI prints it as ``error: <message>`` and exits non-zero; anything else is a bug and
keeps its traceback.
"""


class MxRepackError(Exception):
    """A user-facing error: one line, naming the file or tensor and what was expected."""

    def __init__(self, message: str):
        # Collapse to one line: messages sometimes embed text from other libraries.
        super().__init__(" ".join(str(message).split()))
