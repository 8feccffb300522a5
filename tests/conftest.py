import os
from pathlib import Path

# CI has no GPU: every Triton kernel launched in the test process runs under the interpreter. This must
# be set before triton.jit decorates the kernels. (`repack kernels check` runs in a subprocess without it.)
if not os.environ.get("MXREPACK_TEST_GPU"):
    os.environ["TRITON_INTERPRET"] = "1"

import pytest

GOLDEN = Path(__file__).resolve().parents[2] / "shared" / "golden"
if not GOLDEN.is_dir():  # CI clones the project with shared/ beside it; allow an override
    GOLDEN = Path(os.environ.get("MXREPACK_GOLDEN", GOLDEN))


@pytest.fixture(autouse=True)
def _same_random_numbers_in_every_run():
    """Each test draws the same random numbers however many tests ran or were skipped before it
    (CI with ../shared and a checkout without it run different test sets)."""
    import random

    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def golden():
    from safetensors.torch import load_file

    if not GOLDEN.is_dir():
        if os.environ.get("CI"):  # CI runs with ../shared beside the clone: a missing set is a broken run
            pytest.fail(f"golden vectors not found at {GOLDEN} (CI is set: they must be there)")
        pytest.skip(f"golden vectors not found at {GOLDEN}")
    return lambda name: load_file(str(GOLDEN / name))


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Path:
    """The tiny gpt-oss fixture, HF layout (shared, read-only by convention)."""
    from mxrepack.repack.fixture import make_fixture

    return make_fixture(tmp_path_factory.mktemp("src") / "tiny", "tiny", seed=1)


@pytest.fixture(scope="session")
def tiny_original(tmp_path_factory) -> Path:
    from mxrepack.repack.fixture import make_fixture

    return make_fixture(tmp_path_factory.mktemp("src") / "tiny-original", "tiny", seed=1, layout="original")


@pytest.fixture
def copy_of(tmp_path):
    """A private, writable copy of a fixture directory (for tests that damage it)."""
    import shutil

    def make(src: Path) -> Path:
        dst = tmp_path / (src.name + "-copy")
        shutil.copytree(src, dst)
        return dst

    return make


@pytest.fixture
def bars(monkeypatch):
    """Every progress bar a command opens, recorded instead of drawn (mxrepack.progress.ProgressBar replaced):
    its description, whether it would draw, and its updates. ``bar.totals()`` checks that within each phase
    the total stays put, ``done`` never goes back and ends at the total, and returns {phase: total}."""
    import mxrepack.progress

    made = []

    class RecordingBar:
        def __init__(self, description, enabled=True, unit="bytes"):
            self.description, self.enabled, self.unit, self.updates = description, enabled, unit, []
            made.append(self)

        def __enter__(self):
            return self.update if self.enabled else None

        def update(self, done, total, phase=None):
            self.updates.append((phase, done, total))

        def __exit__(self, *exc):
            return False

        def totals(self) -> dict:
            phases: dict = {}
            for phase, done, total in self.updates:
                phases.setdefault(phase, []).append((done, total))
            for phase, seq in phases.items():
                dones = [d for d, _ in seq]
                assert {t for _, t in seq} == {seq[-1][1]}, (self.description, phase, "total changed")
                assert dones == sorted(dones) and dones[-1] == seq[-1][1], (self.description, phase, seq[-3:])
            return {phase: seq[-1][1] for phase, seq in phases.items()}

    monkeypatch.setattr(mxrepack.progress, "ProgressBar", RecordingBar)
    return made


@pytest.fixture
def refused_in_one_line():
    """``check(source, out, target)``: the CLI converting ``source`` exits 1 with one ``error:`` line on stderr and
    leaves nothing at ``out`` nor a hidden folder beside it; returns that line."""
    import subprocess
    import sys

    def check(source, out: Path, target: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "mxrepack.cli", str(source), "--target", target, "--out", str(out)],
            capture_output=True,
            text=True,
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
        assert not out.exists() and not list(out.parent.glob(f".{out.name}.*"))
        return lines[0]

    return check
