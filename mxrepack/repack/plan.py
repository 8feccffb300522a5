"""From a checkpoint and a recipe to the ordered list of output tensors, each with how to make it.

Every :class:`PlanItem` is one output tensor whose rows are a function of the same rows (experts,
or matrix rows) of its inputs; the pipeline streams it chunk by chunk. Planning reads no tensor
data, so shapes, shards and the manifest are known before the first byte is written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import torch

from mxrepack.errors import MxRepackError
from mxrepack.gptoss import EXPERT_PARTS, expected_tensors
from mxrepack.layouts import EXPERTS_PREFIX, ExpertDims, make_layout
from mxrepack.layouts.base import passthrough
from mxrepack.layouts.dense import DenseMxLayout
from mxrepack.quant.dense import ErrorStats, select_dense
from mxrepack.quant.mx import NonFiniteError
from mxrepack.recipes import Recipe
from mxrepack.repack.safetensors_io import dtype_name, dtype_size
from mxrepack.repack.source import Checkpoint, SourceTensor, ZeroPaddedRows


@dataclass
class PlanItem:
    """One output tensor and how to make it: what the pipeline streams, verify re-derives and the manifest records.

    ``pack(**{key: rows})`` maps the same rows (experts or matrix rows) of every input in ``inputs`` to those rows
    of the output ``[shape]`` (``dtype``), so the pipeline calls it chunk by chunk (:func:`rows_per_chunk`), or once
    on the whole inputs where ``whole``. ``layout`` is the expert layout's name, the dense layout's, or
    ``"passthrough"`` for a tensor stored unchanged; ``logical_shape``/``padding``/``upstream`` go to the manifest
    (``output.tensor_entry``).
    """

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
    row_align: int = 1  # chunks start at multiples of this many rows (e.g. 128-row scale swizzle blocks)
    observer: object | None = None  # has observe(inputs, chunk) and result(): fed by the pipeline only
    finite: object | None = None  # a FiniteGuard (mxrepack.repack.finite) for float inputs stored without quantizing
    whole: bool = False  # made in one piece from all of its inputs' rows (per-expert outputs)
    part: str | None = None  # the layout's output suffix (a template with "{e}" for per-expert layouts)
    expert: int | None = None  # the expert of a per-expert output

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtype_size(self.dtype)

    @property
    def row_bytes(self) -> int:
        return self.nbytes // self.shape[0]

    @property
    def source_bytes(self) -> int:
        return sum(s.nbytes for s in self.inputs.values())


def expert_dims(ck: Checkpoint) -> ExpertDims:
    """The expert sizes of a checkpoint, as layouts take them."""
    d = ck.dims
    return ExpertDims(d.experts, d.hidden, d.intermediate)


class DenseQuantizer:
    """Quantizes one dense weight chunk by chunk for its two stored tensors, and measures the error.

    The values item and the error observer see the same chunk object one after the other, so the values
    item's result is held (by identity, with a reference) until the observer has used it: the chunk is
    quantized once for both. Held no longer: the plan keeps every quantizer to the end of the run, and a
    result left behind per tensor (its last chunk's input and codes) added up to ~1.5 GB over 20b's layers."""

    def __init__(self, layout: DenseMxLayout, src: SourceTensor, recorded=None):
        self.layout, self.k = layout, src.shape[1]
        self.where = f"{src.info.file}: tensor '{src.name}'"
        self.stats = ErrorStats(src.name, self.k, recorded)
        self._held: tuple | None = None

    def _quantize(self, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._held is not None and self._held[0] is value:
            return self._held[1]
        try:
            return self.layout.quantize(value)
        except NonFiniteError as e:
            raise MxRepackError(
                f"{self.where}: {e.count} NaN/Inf value(s) (first in row {e.row} of this chunk); refusing to quantize"
            ) from None

    def pack(self, value: torch.Tensor, role: str) -> torch.Tensor:
        out = self._quantize(value)
        self._held = (value, out) if role == "values" else None  # for observe, which comes next
        return self.layout.store(*out, self.k, role)

    def observe(self, inputs: dict[str, torch.Tensor], chunk: torch.Tensor) -> None:
        value = inputs["value"]
        values, scales = self._quantize(value)
        self._held = None
        self.stats.add(value, self.layout.dequantize(values, scales))

    def result(self) -> dict:
        return {"format": self.layout.format, **self.stats.result()}


TEMP_BYTES_PER_WEIGHT = 17


def _dense_items(src: SourceTensor, layout: DenseMxLayout, recorded: torch.Tensor | None) -> list[PlanItem]:
    # dtype (BF16) and rank (2-D) were checked when the checkpoint was opened (gptoss.KIND_DTYPES).
    try:
        outputs = layout.outputs(src.shape)
    except MxRepackError as e:
        raise MxRepackError(f"{src.info.file}: tensor '{src.name}': {e}") from None
    rows = outputs[0].shape[0]
    source = src if rows == src.rows else ZeroPaddedRows(src, rows)
    quantizer = DenseQuantizer(layout, src, recorded)
    module = src.name.removesuffix(".weight")

    # Quantizing and measuring the error hold ~17 bytes of temporaries per weight (bf16 scaled copy, fp32
    # weight, dequantized weight and difference), and each of the two stored tensors quantizes its chunk's rows.
    # So a chunk is sized by its weights, not by what that tensor writes: the scales (1/32 byte per weight)
    # would otherwise take 16x the rows of the values, and a 256 MB budget grew to ~1.8 GB.
    def work_factor(o) -> int:
        out_row_bytes = math.prod(o.shape[1:]) * o.dtype.itemsize
        return -(-TEMP_BYTES_PER_WEIGHT * src.shape[1] // out_row_bytes)

    return [
        PlanItem(
            f"{module}.{o.suffix}",
            o.dtype,
            o.shape,
            {"value": source},
            partial(quantizer.pack, role=o.role),
            layout.name,
            src.name,
            o.logical_shape,
            layout.padding(src.shape),
            layout.upstream,
            work_factor=work_factor(o),
            row_align=layout.row_align,
            observer=quantizer if o.role == "values" else None,
        )
        for o in outputs
    ]


def _check_expert_bias_dtypes(ck: Checkpoint, target: str) -> None:
    """Every expert layout stores the BF16 expert biases gpt-oss ships (or FP32 widened from them): an F32 source bias
    would be rounded (and then fail verification, after the whole conversion) or fail deep in a layout's packing.
    Checked here, not in the source's validation: reading such a checkpoint (eval, inspect) is fine."""
    for name, t in ck.tensors.items():
        if ".mlp.experts." in name and name.endswith("_bias") and t.dtype != torch.bfloat16:
            raise MxRepackError(
                f"{t.info.file}: tensor '{name}': dtype {dtype_name(t.dtype)}, expected BF16 for target '{target}' "
                "(its expert layout stores BF16 biases, as gpt-oss ships them)"
            )


def build_plan(
    ck: Checkpoint, recipe: Recipe, activations: dict[str, torch.Tensor] | None = None, finite: object | None = None
) -> list[PlanItem]:
    """Every output tensor of converting ``ck`` with ``recipe``, in the canonical order (embeddings, norm, lm_head,
    then layer by layer), reading no tensor data.

    Per layer, the experts become the recipe's expert layout's outputs (``ExpertLayout.outputs``; one item per expert
    and output for a ``per_expert`` layout); dense weights the recipe's ``dense.layers`` select become the dense MX
    layout's values and scales (with an error observer); everything else is stored unchanged (``passthrough``).
    ``activations``: recorded layer inputs (weight name -> ``[T, K]``) for the dense error report. ``finite``: a
    FiniteGuard the pipeline runs on the float inputs of every item that does not quantize them (quantized dense
    layers refuse NaN/Inf themselves). Verify calls this too, with the recipe the manifest recorded, to re-derive
    a sample of the stored tensors."""
    layout = make_layout(recipe.expert_layout, recipe.expert_options)
    _check_expert_bias_dtypes(ck, recipe.name)
    specs = layout.outputs(expert_dims(ck))
    dense_layout = recipe.dense_layout
    names = list(expected_tensors(ck.dims))
    quantized = (
        set(select_dense(names, recipe.dense_layers, f"recipe {recipe.source}: dense.layers"))
        if dense_layout
        else set()
    )
    items: list[PlanItem] = []
    expert_done: set[int] = set()
    for name in names:  # canonical order: embeddings, norm, lm_head, then layer by layer
        if ".mlp.experts." not in name:
            src = ck.tensors[name]
            if name in quantized:
                items += _dense_items(src, dense_layout, (activations or {}).get(name))
            else:
                items.append(
                    PlanItem(
                        name, src.dtype, src.shape, {"value": src}, passthrough, "passthrough", name, finite=finite
                    )
                )
            continue
        layer = int(name.split(".")[2])
        if layer in expert_done:
            continue
        expert_done.add(layer)
        prefix = EXPERTS_PREFIX.format(layer=layer)
        parts = {p: ck.tensors[prefix + p] for p in EXPERT_PARTS}
        group = f"layers.{layer}.experts"
        if layout.per_expert:
            # One tensor per expert and part, each made whole from that expert's slice of the source.
            for e in range(ck.dims.experts):
                for spec in specs:
                    inputs = {p: expert_slice(parts[p], e) for p in spec.inputs}
                    name = prefix + spec.suffix.format(e=e)
                    items.append(_expert_item(spec, name, inputs, layout.name, group, finite, whole=True, expert=e))
            continue
        for spec in specs:
            inputs = {p: parts[p] for p in spec.inputs}
            items.append(_expert_item(spec, prefix + spec.suffix, inputs, layout.name, group, finite))
    return items


def _expert_item(spec, name: str, inputs: dict, layout: str, group: str, finite, **per_expert) -> PlanItem:
    """The plan item of one expert output ``spec`` (an ``OutputSpec`` of the expert layout ``layout``): the layer's
    stacked tensor, or with ``per_expert`` (``whole``, ``expert``) one expert's."""
    return PlanItem(
        name,
        spec.dtype,
        spec.shape,
        inputs,
        spec.pack,
        layout,
        group,
        spec.logical_shape,
        spec.padding,
        spec.upstream,
        spec.work_factor,
        part=spec.suffix,
        finite=finite,
        **per_expert,
    )


def expert_slice(src: SourceTensor, e: int) -> SourceTensor:
    """Expert ``e`` of a stacked ``[E, ...]`` source tensor, as a one-row source."""
    return SourceTensor(src.name, src.info, src.row_start + e, src.row_start + e + 1)


def rows_per_chunk(item: PlanItem, budget_bytes: int) -> int:
    """How many rows to handle at once so that inputs + output + temporaries stay near the budget."""
    if item.whole:
        return item.shape[0]
    per_row = item.row_bytes * item.work_factor + sum(s.nbytes // max(s.rows, 1) for s in item.inputs.values())
    rows = max(1, min(item.shape[0], budget_bytes // max(per_row, 1)))
    return max(item.row_align, rows // item.row_align * item.row_align)
