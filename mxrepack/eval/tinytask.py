"""The bundled tiny model's task: synthetic multiple-choice questions in the GPQA CSV format.

Every option is a single character (one token of the byte-level tokenizer), so a model of a few
hundred thousand parameters can learn the skill the format tests -- read four options, find the one
that answers the question, report its letter -- in minutes on a CPU. Kinds of question:

* classification -- "Which of these is a digit?" / "... an uppercase letter?";
* ordering -- "Which number is the largest?" (or smallest) over four distinct digits;
* arithmetic -- "What is 3 + 4?" with a one-digit answer and three other digits (not in the bundled
  task: too slow to learn for a model trained in 15 CPU minutes).

Rows come from a seeded generator; the test split excludes every row of the training split.
"""

from __future__ import annotations

import csv
import random
import string
from pathlib import Path

from mxrepack.eval.gpqa_format import COLUMNS

DIGITS = string.digits
LOWER = string.ascii_lowercase
UPPER = string.ascii_uppercase


def _row(question: str, correct: str, wrong: list[str]) -> dict:
    return dict(zip(COLUMNS, [question, correct, *wrong]))


def _classify(rng: random.Random) -> dict:
    if rng.random() < 0.5:
        return _row("Which of these is a digit?", rng.choice(DIGITS), rng.sample(LOWER + UPPER, 3))
    return _row("Which of these is an uppercase letter?", rng.choice(UPPER), rng.sample(LOWER + DIGITS, 3))


def _ordering(rng: random.Random) -> dict:
    nums = rng.sample(DIGITS, 4)
    largest = rng.random() < 0.5
    best = max(nums) if largest else min(nums)
    return _row(f"Which number is the {'largest' if largest else 'smallest'}?", best, [n for n in nums if n != best])


def _arithmetic(rng: random.Random) -> dict:
    a = rng.randrange(0, 10)
    b = rng.randrange(0, 10 - a)
    wrong = rng.sample([d for d in DIGITS if d != str(a + b)], 3)
    return _row(f"What is {a} + {b}?", str(a + b), wrong)


KINDS = (_classify, _ordering)  # arithmetic rows are available (make_rows(kinds=...)) but not in the bundled task


def make_rows(n: int, seed: int, exclude: set[tuple] | None = None, kinds=KINDS) -> list[dict]:
    rng = random.Random(seed)
    rows, seen = [], set(exclude or ())
    while len(rows) < n:
        row = rng.choice(kinds)(rng)
        key = row_key(row)
        if key in seen:
            continue
        seen.add(key)
        rows.append(row)
    return rows


def row_key(row: dict) -> tuple:
    return tuple(row[c] for c in COLUMNS)


def write_csv(rows: list[dict], path: str | Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS))
        w.writeheader()
        w.writerows(rows)
