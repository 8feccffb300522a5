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
    # One stored tensor per (expert, part): output suffixes hold "{e}" and shapes have no expert dimension. The
    # plan then makes each expert's tensor whole from that expert's slice; verify and the eval loader stack the
    # experts' tensors of a part (over a contiguous expert range) before ``unpack``.
    per_expert: bool = False

    def outputs(self, dims: ExpertDims) -> list[OutputSpec]:
        raise NotImplementedError

    def padded_intermediate(self, dims: ExpertDims) -> int:
        """The intermediate width the stored experts compute with (the logical one unless the layout pads it
        with inert units that the written model declares, as ``compressed-tensors`` does)."""
        return dims.intermediate

    def config_overrides(self, dims: ExpertDims) -> dict:
        """Keys this layout sets in the written ``config.json`` (applied where the recipe's
        ``quantization_config`` mode is ``compressed-tensors``, the only mode that loads such padded units as
        real ones). Default: none."""
        return {}

    def unpack_padded(self, stored: dict[str, torch.Tensor], dims: ExpertDims) -> dict[str, torch.Tensor]:
        """Stored tensors (by suffix) -> source parts at the layout's padded sizes, in checkpoint order
        (gate/up rows interleaved, padding rows/columns after the real ones), or dense weights
        ``[E, out, in]`` where ``exact_bytes`` is False.

        This is what a consumer kernel computes with; cropping it gives the source (``unpack``).
        Works on any contiguous expert range (the first dimension), like ``pack``.
        """
        raise NotImplementedError

    def unpack(self, stored: dict[str, torch.Tensor], dims: ExpertDims) -> dict[str, torch.Tensor]:
        """The exact inverse of packing: stored tensors -> source parts (or dense weights)."""
        return crop_parts(self.unpack_padded(stored, dims), dims)

    def spec(self, dims: ExpertDims) -> dict:
        """A JSON-able description for the manifest."""
        return {
            "layout": self.name,
            "description": self.description,
            "tensors": {
                o.suffix: {
                    "dtype": str(o.dtype).removeprefix("torch."),
                    "shape": list(o.shape),
                    "logical_shape": list(o.logical_shape or o.shape),
                    "padding": o.padding,
                    "inputs": list(o.inputs),
                    "upstream": o.upstream,
                }
                for o in self.outputs(dims)
            },
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
    out = x.new_empty((x.shape[0], rows, cols))
    copy_padded(out, x)
    return out


def copy_padded(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``src [E, r, c]`` into the top-left of ``dst [E, R, C]``, the rest of ``dst`` zeroed.

    Every pack writes its output once this way (one strided copy plus zeroing only the padding): a
    zero-filled output overwritten afterwards, or a padded copy then permuted, moves each byte two or
    three times, and packing runs at memory speed (docs/PERF.md, layouts).
    """
    r, c = src.shape[1], src.shape[2]
    dst[:, :r, :c] = src
    _zero_padding(dst, r, c)


def _zero_padding(dst: torch.Tensor, r: int, c: int) -> None:
    """Zero ``dst [E, R, C]`` outside its top-left ``[r, c]`` block (the rows below, the columns beside)."""
    dst[:, r:].zero_()
    dst[:, :r, c:].zero_()


def permute_row_blocks(x: torch.Tensor, rows: int, cols: int, perm: list[int]) -> torch.Tensor:
    """``[E, r, c]`` -> ``[E, rows, cols]``: in each block of ``len(perm)`` rows, out row ``p`` is in row
    ``perm[p]`` of the same block; padding rows and columns (beyond ``r`` and ``c``) zero.

    ``r`` must be whole blocks. Done as one strided copy per position in the block, each moving whole
    rows, so the cost is one pass over the bytes whatever the permutation.
    """
    E, r, c = x.shape
    B = len(perm)
    if r % B or rows % B:
        raise ValueError(f"permute_row_blocks: rows {r} -> {rows} are not whole blocks of {B}")
    out = x.new_empty((E, rows, cols))
    dst, src = out[:, :r].unflatten(1, (r // B, B)), x.unflatten(1, (r // B, B))
    for p, q in enumerate(perm):
        dst[:, :, p, :c] = src[:, :, q]
    _zero_padding(out, r, c)
    return out


def crop_parts(parts: dict[str, torch.Tensor], d: ExpertDims) -> dict[str, torch.Tensor]:
    """Padded checkpoint-order parts -> the logical sizes (rows: 2I or H; columns: H or I)."""
    H, I = d.hidden, d.intermediate
    out = {}
    for name, x in parts.items():
        rows, cols = (2 * I, H) if name.startswith("gate_up_proj") else (H, I)
        if name.endswith("_blocks"):
            x = x[:, :rows, : cols // 32]
        elif name.endswith("_scales"):
            x = x[:, :rows, : cols // 32]
        elif name.endswith("_bias"):
            x = x[:, :rows]
        else:  # dense [E, out, in]
            x = x[:, :rows, :cols]
        out[name] = x.contiguous()
    return out


def packed_expert_outputs(
    d: ExpertDims,
    Hp: int,
    Ip: int,
    packs: dict[str, Callable[..., torch.Tensor]],
    bias_dtype: torch.dtype,
    upstream: str,
) -> list[OutputSpec]:
    """The six outputs of a layout that keeps packed FP4 bytes ``[E, rows, K/2]``, E8M0 byte scales
    ``[E, rows, K/32]`` (in any flat order of that size) and biases ``[E, rows]``, at the padded widths
    ``Hp``/``Ip``; ``packs`` maps each suffix (``w13_weight`` ...) to its pack function."""
    H, I, E = d.hidden, d.intermediate, d.experts
    pad = {"hidden": [H, Hp], "intermediate": [I, Ip]}
    rows = {"w13": (2 * Ip, 2 * I, Hp, H, "gate_up_proj"), "w2": (Hp, H, Ip, I, "down_proj")}
    out = []
    for w, (n_pad, n, k_pad, k, proj) in rows.items():
        out += [
            OutputSpec(
                f"{w}_weight",
                torch.uint8,
                (E, n_pad, k_pad // 2),
                (f"{proj}_blocks",),
                packs[f"{w}_weight"],
                (E, n, k // 2),
                pad,
                upstream,
            ),
            OutputSpec(
                f"{w}_weight_scale",
                torch.uint8,
                (E, n_pad, k_pad // 32),
                (f"{proj}_scales",),
                packs[f"{w}_weight_scale"],
                (E, n, k // 32),
                pad,
                upstream,
            ),
            OutputSpec(
                f"{w}_bias", bias_dtype, (E, n_pad), (f"{proj}_bias",), packs[f"{w}_bias"], (E, n), pad, upstream
            ),
        ]
    return out


def gate_up_halves_padded(x: torch.Tensor, rows_per_half: int, cols: int, up_first: bool = False) -> torch.Tensor:
    """Interleaved gate/up rows ``[E, 2I, c]`` -> ``[gate | up]`` (or ``[up | gate]``), each half zero-padded
    to ``rows_per_half`` rows on its own and to ``cols`` columns."""
    E = x.shape[0]
    out = x.new_empty((E, 2 * rows_per_half, cols))
    pairs = x.unflatten(1, (-1, 2))  # [E, I, (gate, up), c]
    for half, which in enumerate((1, 0) if up_first else (0, 1)):
        copy_padded(out[:, half * rows_per_half : (half + 1) * rows_per_half], pairs[:, :, which])
    return out


def gate_up_from_halves(x: torch.Tensor, up_first: bool = False) -> torch.Tensor:
    """Inverse of :func:`gate_up_halves_padded` at the padded size: halves -> interleaved rows (gate first)."""
    first, second = x.unflatten(1, (2, -1)).unbind(1)
    gate, up = (second, first) if up_first else (first, second)
    out = x.new_empty(x.shape)
    pairs = out.unflatten(1, (-1, 2))
    pairs[:, :, 0] = gate
    pairs[:, :, 1] = up
    return out


def swizzle_128x4(s: torch.Tensor) -> torch.Tensor:
    """The 128x4 block-scale-factor layout (CUTLASS ``Sm1xxBlockScaledBasicChunk``, FlashInfer
    ``block_scale_interleave``; layouts.md 2.4) of ``[E, R, C]`` with R % 128 == 0 and C % 4 == 0.

    Rows in blocks of 128, 4 scale columns per 512-byte atom, atoms K-major inside a row block; inside
    an atom byte ``(r % 32) * 16 + (r % 128 // 32) * 4 + c % 4``. Same shape, flat order.
    """
    E, R, C = s.shape
    # The 4 columns of an atom row stay together, so the permutation moves 32-bit words: torch copies
    # those ~8x faster than single bytes (innermost runs of 4 elements).
    w = _words(s).reshape(E, R // 128, 4, 32, C // 4)
    return w.permute(0, 1, 4, 3, 2).contiguous().view(s.dtype).reshape(E, R, C)


def unswizzle_128x4(s: torch.Tensor) -> torch.Tensor:
    E, R, C = s.shape
    w = _words(s).reshape(E, R // 128, C // 4, 32, 4)
    return w.permute(0, 1, 4, 3, 2).contiguous().view(s.dtype).reshape(E, R, C)


def _words(s: torch.Tensor) -> torch.Tensor:
    """A byte tensor whose last dim is a multiple of 4 as int32 words (copied if not contiguous)."""
    return s.contiguous().view(torch.int32)


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
