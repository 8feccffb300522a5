"""Expert layouts, one module each (pack via ``outputs``, exact inverse via ``unpack``, ``spec``)."""

from __future__ import annotations

from mxrepack.errors import MxRepackError
from mxrepack.layouts import bf16, compressed_tensors, flashinfer_cutlass, marlin, mxfp4, strided, triton_hopper, trtllm
from mxrepack.layouts.base import EXPERTS_PREFIX, ExpertDims, ExpertLayout, OutputSpec, dense_weights

LAYOUTS: dict[str, ExpertLayout] = {
    m.LAYOUT.name: m.LAYOUT
    for m in (mxfp4, bf16, marlin, trtllm, flashinfer_cutlass, triton_hopper, strided, compressed_tensors)
}
# Former names: a recipe written for an earlier release still names the same bytes.
RENAMED = {"b12x": "flashinfer-cutlass"}


def get_layout(name: str) -> ExpertLayout:
    try:
        return LAYOUTS[RENAMED.get(name, name)]
    except KeyError:
        raise MxRepackError(f"unknown layout {name!r}; valid: {', '.join(sorted(LAYOUTS))}") from None


def make_layout(name: str, options: dict | None = None) -> ExpertLayout:
    """The registered layout, or a new instance of its class with recipe ``experts.options``."""
    layout = get_layout(name)
    if not options:
        return layout
    try:
        return type(layout)(**options)
    except TypeError as e:
        import inspect

        valid = [p for p in inspect.signature(type(layout)).parameters]
        raise MxRepackError(
            f"experts.options {sorted(options)} not accepted by layout {name!r}"
            f" (valid options: {', '.join(valid) or 'none'})"
        ) from e


__all__ = [
    "EXPERTS_PREFIX",
    "ExpertDims",
    "ExpertLayout",
    "LAYOUTS",
    "OutputSpec",
    "dense_weights",
    "get_layout",
    "make_layout",
]
