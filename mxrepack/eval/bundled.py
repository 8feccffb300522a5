"""The bundled tiny trained gpt-oss (``mxrepack/data/tiny-gpt-oss``): official MXFP4 HF format, a
byte-level tokenizer, and its task files (``tasks/train.csv``, ``tasks/test.csv`` in the GPQA CSV
format, ``tasks/text.txt`` for logit comparisons). Made by ``python -m mxrepack.eval.train_tiny``."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from mxrepack.errors import MxRepackError


def bundled_model() -> Path:
    path = Path(str(resources.files("mxrepack") / "data" / "tiny-gpt-oss"))
    if not (path / "model.safetensors").is_file():
        raise MxRepackError(f"{path}: the bundled tiny model is missing (reinstall mxrepack)")
    return path
