"""The style gate: `ruff check` and `ruff format --check` over the repository, with the configuration in
pyproject.toml ([tool.ruff]: 120 columns, rules E, F, W and I). Fix a failure with `ruff check --fix .` and
`ruff format .` from the repository root."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ruff():
    if importlib.util.find_spec("ruff") is None:
        if os.environ.get("CI"):  # CI installs the dev extra, which pins ruff: a missing ruff is a broken run
            pytest.fail("ruff is not installed (CI is set: the dev extra must have installed it)")
        pytest.skip("ruff is not installed (pip install -e '.[dev]' pins it)")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)

    version = run("--version").stdout.strip()  # in the messages: the dev extra pins the version the tree passes
    return run, version


def test_ruff_check(ruff):
    run, version = ruff
    r = run("check", "--no-cache", "--output-format", "concise", ".")
    assert r.returncode == 0, f"{version}: `ruff check .` found problems (`ruff check --fix .`)\n{r.stdout}{r.stderr}"


def test_ruff_format(ruff):
    run, version = ruff
    r = run("format", "--check", "--no-cache", "--output-format", "concise", ".")
    assert r.returncode == 0, f"{version}: files not formatted (`ruff format .`)\n{r.stdout}{r.stderr}"
