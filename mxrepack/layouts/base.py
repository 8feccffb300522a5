"""What a layout is: a named, invertible re-arrangement of one layer's MoE experts.

A layout module defines one :class:`ExpertLayout`: ``outputs(dims)`` lists the tensors it writes
(name, dtype, stored shape, which source parts feed it and how), and ``unpack`` is the exact inverse,
back to the source parts. Every output's first dimension is the expert, and ``pack`` maps any
contiguous expert range of its inputs to the same range of its output: that is what lets the
pipeline stream a 128-expert layer a few experts at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from mxrepack.quant import dequantize_mxfp4

EXPERTS_PREFIX = "model.layers.{layer}.mlp.experts."


@dataclass(frozen=True)
class ExpertDims:
    experts: int
    hidden: int
    intermediate: int


@dataclass(frozen=True)
class OutputSpec:
    """One stored tensor of a layout (first dimension = expert)."""

    suffix: str  # appended to EXPERTS_PREFIX
    dtype: torch.dtype
    shape: tuple[int, ...]
    inputs: tuple[str, ...]  # source parts (gptoss.EXPERT_PARTS) that feed it
    pack: Callable[..., torch.Tensor]  # pack(**{part: chunk}) -> output chunk
    logical_shape: tuple[int, ...] | None = None  # the unpadded shape, where padding is applied
    padding: dict = field(default_factory=dict)  # e.g. {"hidden": [2880, 3072]}
    upstream: str | None = None  # the consumer function (and version) whose output this matches
    work_factor: int = 4  # rough peak working-set bytes per output byte, for chunk sizing


class ExpertLayout:
    """Base class: subclasses set the class attributes and implement ``outputs`` and ``unpack``."""

    name: str = ""
    description: str = ""
    exact_bytes: bool = True  # unpack returns the source bytes (False: only the dequantized values)

    def outputs(self, dims: ExpertDims) -> list[OutputSpec]:
        raise NotImplementedError

    def unpack(self, stored: dict[str, torch.Tensor], dims: ExpertDims) -> dict[str, torch.Tensor]:
        """Stored tensors (by suffix) -> source parts, or dense weights where ``exact_bytes`` is False.

        Works on any contiguous expert range (the first dimension), like ``pack``.
        """
        raise NotImplementedError

    def spec(self, dims: ExpertDims) -> dict:
        """A JSON-able description for the manifest."""
        return {
            "layout": self.name,
            "description": self.description,
            "tensors": {o.suffix: {"dtype": str(o.dtype).removeprefix("torch."), "shape": list(o.shape),
                                   "logical_shape": list(o.logical_shape or o.shape), "padding": o.padding,
                                   "inputs": list(o.inputs), "upstream": o.upstream}
                        for o in self.outputs(dims)},
        }


def passthrough(**parts: torch.Tensor) -> torch.Tensor:
    """The pack function of a tensor stored unchanged (exactly one input)."""
    (value,) = parts.values()
    return value


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def pad_rows_cols(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Zero-pad dims 1 and 2 of ``[E, r, c]`` to ``[E, rows, cols]`` (real data top-left, as vLLM's loader
    copies the checkpoint into zero-initialised padded parameters)."""
    out = x.new_zeros((x.shape[0], rows, cols))
    out[:, : x.shape[1], : x.shape[2]] = x
    return out


def dense_weights(parts: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Expert parts -> ``{gate_up_proj, gate_up_proj_bias, down_proj, down_proj_bias}`` as float,
    weights in checkpoint ``[E, out, in]`` order. Already-dense parts pass through (cast).

    This is the common ground on which any two layouts of the same experts can be compared.
    """
    out = {}
    for proj in ("gate_up_proj", "down_proj"):
        if proj in parts:
            out[proj] = parts[proj].to(dtype)
        else:
            out[proj] = dequantize_mxfp4(parts[f"{proj}_blocks"], parts[f"{proj}_scales"], dtype)
        out[f"{proj}_bias"] = parts[f"{proj}_bias"].to(dtype)
    return out
