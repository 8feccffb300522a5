"""Expert layouts, one module each (pack via ``outputs``, exact inverse via ``unpack``, ``spec``)."""

from __future__ import annotations

from mxrepack.errors import MxRepackError
from mxrepack.layouts import bf16, marlin, mxfp4, trtllm
from mxrepack.layouts.base import EXPERTS_PREFIX, ExpertDims, ExpertLayout, OutputSpec, dense_weights

LAYOUTS: dict[str, ExpertLayout] = {m.LAYOUT.name: m.LAYOUT for m in (mxfp4, bf16, marlin, trtllm)}


def get_layout(name: str) -> ExpertLayout:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise MxRepackError(f"unknown layout {name!r}; valid: {', '.join(sorted(LAYOUTS))}") from None


__all__ = ["EXPERTS_PREFIX", "ExpertDims", "ExpertLayout", "LAYOUTS", "OutputSpec", "dense_weights", "get_layout"]
