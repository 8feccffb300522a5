"""From a checkpoint and a recipe to the ordered list of output tensors, each with how to make it.

Every :class:`PlanItem` is one output tensor whose rows are a function of the same rows (experts,
or matrix rows) of its inputs; the pipeline streams it chunk by chunk. Planning reads no tensor
data, so shapes, shards and the manifest are known before the first byte is written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from mxrepack.layouts import EXPERTS_PREFIX, ExpertDims, make_layout
from mxrepack.layouts.base import passthrough
from mxrepack.recipes import Recipe
from mxrepack.repack.gptoss import EXPERT_PARTS, expected_tensors
from mxrepack.repack.safetensors_io import dtype_size
from mxrepack.repack.source import Checkpoint, SourceTensor


@dataclass
class PlanItem:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    inputs: dict[str, SourceTensor]  # pack keyword -> source
    pack: Callable[..., torch.Tensor]
    layout: str
    group: str  # the unit verify samples: "layers.N.experts", or the tensor name for dense tensors
    logical_shape: tuple[int, ...] | None = None
    padding: dict = field(default_factory=dict)
    upstream: str | None = None
    work_factor: int = 1

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtype_size(self.dtype)

    @property
    def row_bytes(self) -> int:
        return self.nbytes // self.shape[0]

    @property
    def source_bytes(self) -> int:
        return sum(s.nbytes for s in self.inputs.values())

    def manifest_entry(self) -> dict:
        return {
            "layout": self.layout,
            "dtype": str(self.dtype).removeprefix("torch."),
            "stored_shape": list(self.shape),
            "logical_shape": list(self.logical_shape or self.shape),
            "padding": self.padding,
            "source": sorted({s.name for s in self.inputs.values()}),
            "upstream": self.upstream,
        }


def expert_dims(ck: Checkpoint) -> ExpertDims:
    d = ck.dims
    return ExpertDims(d.experts, d.hidden, d.intermediate)


def build_plan(ck: Checkpoint, recipe: Recipe) -> list[PlanItem]:
    layout = make_layout(recipe.expert_layout, recipe.expert_options)
    specs = layout.outputs(expert_dims(ck))
    items: list[PlanItem] = []
    expert_done: set[int] = set()
    for name in expected_tensors(ck.dims):  # canonical order: embeddings, norm, lm_head, then layer by layer
        if ".mlp.experts." not in name:
            src = ck.tensors[name]
            items.append(PlanItem(name, src.dtype, src.shape, {"value": src}, passthrough, "passthrough", name))
            continue
        layer = int(name.split(".")[2])
        if layer in expert_done:
            continue
        expert_done.add(layer)
        prefix = EXPERTS_PREFIX.format(layer=layer)
        parts = {p: ck.tensors[prefix + p] for p in EXPERT_PARTS}
        for spec in specs:
            items.append(PlanItem(prefix + spec.suffix, spec.dtype, spec.shape, {p: parts[p] for p in spec.inputs},
                                  spec.pack, layout.name, f"layers.{layer}.experts", spec.logical_shape,
                                  spec.padding, spec.upstream, spec.work_factor))
    return items


def rows_per_chunk(item: PlanItem, budget_bytes: int) -> int:
    """How many rows to handle at once so that inputs + output + temporaries stay near the budget."""
    per_row = item.row_bytes * item.work_factor + sum(s.nbytes // max(s.rows, 1) for s in item.inputs.values())
    return max(1, min(item.shape[0], budget_bytes // max(per_row, 1)))
