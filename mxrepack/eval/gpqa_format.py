"""The GPQA conventions of ``gpt_oss.evals`` as data and pure functions: prompt, sampling, grading.

Kept apart from the harness so that the tiny model's training script, the harness and the parity
test all use one definition (formats.md 2.4, evals.md):

* data: CSV rows with ``Question``, ``Correct Answer``, ``Incorrect Answer 1..3``;
* sampling: ``rng = random.Random(0)``; rows repeated ``n_repeats`` times; each sample in order draws
  ``rng.sample(range(4), 4)`` and the choices ``[correct, inc1, inc2, inc3]`` are reordered by it;
* prompt: the question, a blank line, ``(A) ...`` to ``(D) ...``, a blank line, the instruction line,
  sent as one user message;
* grading: an ordered ladder of patterns; the earliest pattern that matches wins, ties between
  matches of one pattern go to the shortest; nothing matches -> the first character after an
  optional leading ``**`` (which may be any character, and is then graded wrong).
"""

from __future__ import annotations

import csv
import random
import re
from dataclasses import dataclass
from pathlib import Path

from mxrepack.errors import MxRepackError, reading

COLUMNS = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
INSTRUCTION = "Express your final answer as the corresponding option 'A', 'B', 'C', or 'D'."
LETTERS = "ABCD"


def format_prompt(question: str, choices: list[str]) -> str:
    options = "\n".join(f"({LETTERS[i]}) {c}" for i, c in enumerate(choices))
    return f"{question}\n\n{options}\n\n{INSTRUCTION}"


@dataclass(frozen=True)
class Sample:
    index: int  # position in the sampled list
    row: int  # row of the CSV it came from
    prompt: str
    answer: str  # the correct letter
    choices: tuple[str, ...]


def read_rows(path: str | Path, warnings: list[str] | None = None) -> list[dict]:
    """The CSV's rows; one line naming the file and line for a row that is not a question with four answers.
    ``warnings`` gets rows that are scored but questionable: a row repeated, a correct answer also among the
    incorrect ones (graded by its first position, as gpt_oss.evals does)."""
    path = Path(path)
    what = "a CSV in the gpqa_diamond.csv format"
    expected = f"expected {what}"
    rows, lines = [], []
    try:
        # read as parsed (newline="": a quoted cell keeps its line ends), so reading()'s errors wrap the parse;
        # utf-8-sig: a spreadsheet's byte order mark would otherwise be part of the first column's name
        with reading(path, what), open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None:
                raise MxRepackError(f"{path}: empty; {expected}")
            missing = [c for c in COLUMNS if c not in reader.fieldnames]
            if missing:
                raise MxRepackError(
                    f"{path}: missing column(s) {', '.join(missing)}; expected the gpqa_diamond.csv columns"
                )
            end = reader.line_num
            for r in reader:  # named by the line it starts on: a quoted cell may span lines (gpqa_diamond's do)
                start, end = end + 1, reader.line_num
                _check_row(path, start, len(reader.fieldnames), r)
                rows.append(dict(r))
                lines.append(start)
    except csv.Error as e:
        raise MxRepackError(f"{path}: not a readable CSV ({e}); expected the gpqa_diamond.csv format") from None
    if not rows:
        raise MxRepackError(f"{path}: no rows")
    if warnings is not None:
        seen: dict[tuple, int] = {}
        for line, r in zip(lines, rows):
            key = tuple(r[c] for c in COLUMNS)  # only a row as a whole: the tiny task asks a question twice
            if key in seen:
                warnings.append(f"{path}: line {line} repeats line {seen[key]}; both are scored")
            seen.setdefault(key, line)
            if r["Correct Answer"] in (r[c] for c in COLUMNS[2:]):
                warnings.append(
                    f"{path}: line {line}: the correct answer is also an incorrect one; only its first option "
                    "is graded correct"
                )
    return rows


def _check_row(path: Path, line: int, width: int, r: dict) -> None:
    """A short row read its missing cells as None (the prompt said "None"); a long one (an unquoted comma) had
    its cells shifted."""
    extra = [v for v in r.get(None) or [] if v.strip()]
    if extra or any(r[c] is None for c in COLUMNS):
        fields = width + len(r.get(None) or []) - sum(v is None for v in r.values())
        cells = f"{fields} field{'s' * (fields != 1)}"
        raise MxRepackError(
            f"{path}: line {line} has {cells} where the header has {width}; expected one cell per column (quote "
            "a cell that holds a comma)"
        )
    empty = next((c for c in COLUMNS if not r[c].strip()), None)
    if empty is not None:
        raise MxRepackError(f"{path}: line {line}: '{empty}' is empty; expected a question and four answers")


def build_samples(rows: list[dict], n_repeats: int = 1, num_examples: int | None = None) -> list[Sample]:
    """The samples gpt_oss.evals' GPQAEval draws: same rng, same order, same permutations."""
    if n_repeats < 1:  # 0 asked nothing and the run failed as "0 of 0 requests failed"
        raise MxRepackError(f"--n-repeats {n_repeats}: expected 1 or more")
    if num_examples is not None and not 1 <= num_examples <= len(rows):  # 0 was all rows; more, a traceback
        raise MxRepackError(f"--num-examples {num_examples}: expected 1 to {len(rows)} (the rows of the CSV)")
    rng = random.Random(0)
    picked = list(enumerate(rows))
    if num_examples:
        if n_repeats != 1:
            raise MxRepackError("--num-examples needs --n-repeats 1 (as gpt_oss.evals asserts)")
        picked = rng.sample(picked, num_examples)
    picked = picked * n_repeats
    samples = []
    for i, (r, row) in enumerate(picked):
        perm = rng.sample(range(4), 4)
        base = [row[c] for c in COLUMNS[1:]]
        choices = [base[p] for p in perm]
        answer = LETTERS[choices.index(row["Correct Answer"])]
        samples.append(Sample(i, r, format_prompt(row["Question"], choices), answer, tuple(choices)))
    return samples


_WRAP = r"(?:\*{1,2}|_{1,2})"
# The ladder, in the order gpt_oss.evals' abcd_grader tries it (its list order, which puts the
# \boxed forms before the bare "(A)" form whatever their comment numbers say).
GRADER_LADDER: list[tuple[str, re.Pattern]] = [
    ("markdown Answer:", re.compile(rf"{_WRAP}Answers?\s*[:\-–]?{_WRAP}\s*([ABCD])\b", re.I)),
    ("line Answer:", re.compile(rf"^\s*{_WRAP}?Answer:?{_WRAP}?\s*:?\s*{_WRAP}?([ABCD]){_WRAP}?\s*", re.I | re.M)),
    ("Answer: (X)", re.compile(r"\bAnswers?\b\s*[:\-–]?\s*\(\s*([ABCD])\s*\)", re.I)),
    ("Answer: X", re.compile(r"\bAnswers?\b\s*[:\-–]?\s*([ABCD])\b", re.I)),
    ("Option/Choice X", re.compile(r"\b(?:Option|Choice)\b\s*[:\-–]?\s*([ABCD])\b", re.I)),
    ("\\boxed{X}", re.compile(r"\\boxed\{[^}]*?([ABCD])[^}]*\}", re.M)),
    ("\\boxed{\\textbf{X}}", re.compile(r"\\boxed\{[^}]*?\\textbf\{[^}]*?([ABCD])[^}]*\}[^}]*\}", re.M)),
    ("\\boxed{\\text{X}}", re.compile(r"\\boxed\{[^}]*?\\text\{[^}]*?([ABCD])[^}]*\}[^}]*\}", re.M)),
    ("(X) or [X]", re.compile(r"(?<![A-Za-z0-9])[(\[]\s*([ABCD])\s*[)\]](?![A-Za-z0-9])")),
    ("*X*", re.compile(rf"(?<![A-Za-z0-9]){_WRAP}([ABCD]){_WRAP}(?![A-Za-z0-9])")),
    ("\\textbf{X}", re.compile(r"\\textbf\{[^}]*?([ABCD])[^}]*\}")),
    ("**X) text**", re.compile(rf"(?<![A-Za-z0-9]){_WRAP}\s*([ABCD])\)[^*_\n]+?{_WRAP}(?![A-Za-z0-9])")),
    ("line starting with X", re.compile(rf"^\s*{_WRAP}?([ABCD]){_WRAP}?\s*[.)\-–:]?\s*.*$", re.M)),
]


def extract_letter(text: str) -> str:
    """The letter gpt_oss.evals' grader reads from a response (see the module docstring)."""
    found = []
    for priority, (_, pattern) in enumerate(GRADER_LADDER):
        m = pattern.search(text)
        if m and m.group(1).upper() in LETTERS:
            found.append((priority, len(m.group(0)), m.group(1).upper()))
    if found:
        return min(found)[2]
    return text.removeprefix("**")[:1]
