"""The bundled tiny model's task: synthetic multiple-choice questions in the GPQA CSV format.

Two kinds of question, both answerable only by reading the options:

* category -- "Which of these is a fruit?": one word of the category, three of other categories;
* ordering -- "Which number is the largest?" (or smallest): four distinct two-digit numbers.

Rows are drawn from a seeded generator, so the train and test splits (different seeds; a test row's
exact question and options never appear in training) are reproducible byte for byte.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

from mxrepack.eval.gpqa_format import COLUMNS

CATEGORIES = {
    "fruit": "apple pear plum fig lime lemon mango grape peach melon kiwi cherry date guava papaya".split(),
    "color": "red blue green black white pink purple orange brown gray yellow violet cyan teal maroon".split(),
    "animal": "cat dog horse mouse tiger lion wolf bear sheep goat camel zebra otter fox rabbit".split(),
    "metal": "iron gold silver copper tin zinc lead nickel cobalt chrome steel bronze brass cadmium titanium".split(),
    "tool": "hammer saw drill wrench chisel spanner pliers shovel rake axe file clamp level ruler trowel".split(),
}


def _category_row(rng: random.Random) -> dict:
    cat = rng.choice(sorted(CATEGORIES))
    others = [w for c, ws in sorted(CATEGORIES.items()) if c != cat for w in ws]
    wrong = rng.sample(others, 3)
    return dict(zip(COLUMNS, [f"Which of these is a {cat}?", rng.choice(CATEGORIES[cat]), *wrong]))


def _ordering_row(rng: random.Random) -> dict:
    nums = rng.sample(range(10, 100), 4)
    largest = rng.random() < 0.5
    best = max(nums) if largest else min(nums)
    rest = [n for n in nums if n != best]
    word = "largest" if largest else "smallest"
    return dict(zip(COLUMNS, [f"Which number is the {word}?", str(best), *map(str, rest)]))


def make_rows(n: int, seed: int, exclude: set[tuple] | None = None) -> list[dict]:
    rng = random.Random(seed)
    rows, seen = [], set(exclude or ())
    while len(rows) < n:
        row = _category_row(rng) if rng.random() < 0.5 else _ordering_row(rng)
        key = tuple(row[c] for c in COLUMNS)
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
