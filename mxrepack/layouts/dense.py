"""Dense MX layout: a BF16 Linear weight ``[N, K]`` stored as MXFP4 or MXFP8 with E8M0 group scales.

Stored tensors, named as compressed-tensors names them (so one naming serves our kernels, the sm12x
recipes and the compressed-tensors target):

* MXFP4: ``<module>.weight_packed`` uint8 ``[N, K/2]`` (low nibble = even element) and
  ``<module>.weight_scale`` uint8 ``[N, K/32]`` (E8M0, bias 127);
* MXFP8: ``<module>.weight`` float8_e4m3fn ``[N, K]`` and ``<module>.weight_scale`` as above.

``scales="swizzled"`` stores the scales in the 128x4 block-scale-factor layout CUTLASS-style
consumers read (layouts.md 2.4): N is zero-padded to a multiple of 128 and K to a multiple of 128
(4 scale columns), and the values are padded to match. Padding quantizes zeros: zero bytes and
scale byte 0, inert in any GEMM. ``unpack`` is the exact inverse (crop, unswizzle).

``order`` (MXFP4 with plain scales only) is the byte order of the values, as the strided expert layout's option of
that name: ``"rows"`` (the default: the plain ``[N, K/2]`` above) or a chunk order, ``"wgmma"`` (sm_90) or ``"mma2"``
(sm_12x, sm_8x), which mxrepack's own kernels read (``mxrepack.kernels.linear_mxfp4.linear_chunks``; no other
consumer does). In a chunk order N is zero-padded to a multiple of 16 and K to a multiple of 128, the rows are stored
as the strided layout stores w2 (row tiles of 16, each K-tiled: ``[N/16, K/128, 16, 64]`` bytes), each 1 KB chunk in
the order's byte order (``strided.wgmma_order`` / ``strided.mma2_order``), and the scales ``[Np, Kp/32]`` in the quad
order (``strided.quad_scales`` with 16-row tiles). Each row tile is a contiguous range of stored rows, so the rows
are stored 16 at a time, and a row range of whole tiles (a q, k or v shard) is the stored form of those rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mxrepack.errors import MxRepackError
from mxrepack.layouts.base import round_up, swizzle_128x4, unswizzle_128x4
from mxrepack.quant.mx import SCALE_RULES, dequantize_mxfp4, dequantize_mxfp8, quantize_mxfp4, quantize_mxfp8

FORMATS = ("mxfp4", "mxfp8")
SCALE_LAYOUTS = ("plain", "swizzled")
ORDERS = ("rows", "wgmma", "mma2")  # the values' byte orders (option ``order``)
CHUNK_ROWS = 16  # rows per row tile in the chunk orders


@dataclass(frozen=True)
class DenseOutput:
    suffix: str  # replaces the source's trailing "weight"
    dtype: torch.dtype
    shape: tuple[int, ...]
    logical_shape: tuple[int, ...]
    role: str  # "values" or "scales"


@dataclass(frozen=True)
class DenseMxLayout:
    format: str = "mxfp4"
    scales: str = "plain"
    scale_rule: str = "ocp"
    scale_search: bool = False
    order: str = "rows"

    def __post_init__(self):
        for key, value, valid in (
            ("format", self.format, FORMATS),
            ("scales", self.scales, SCALE_LAYOUTS),
            ("scale_rule", self.scale_rule, SCALE_RULES),
            ("order", self.order, ORDERS),
        ):
            if value not in valid:
                raise MxRepackError(f"dense.{key}: unknown value {value!r} (valid: {', '.join(valid)})")
        if self.chunked and (self.format, self.scales) != ("mxfp4", "plain"):
            raise MxRepackError(
                f"dense.order: {self.order} is a byte order of MXFP4 with plain scales, not of {self.format} with "
                f"{self.scales} scales"
            )

    @property
    def chunked(self) -> bool:
        """Whether the values are in a chunk order (wgmma, mma2)."""
        return self.order != "rows"

    @property
    def name(self) -> str:
        return (
            f"dense-{self.format}"
            + ("-swizzled" if self.scales == "swizzled" else "")
            + (f"-{self.order}" if self.chunked else "")
        )

    @property
    def row_align(self) -> int:
        """Rows per unit of :meth:`store`: chunks of rows start at multiples of it."""
        return 128 if self.scales == "swizzled" else CHUNK_ROWS if self.chunked else 1

    @property
    def upstream(self) -> str:
        fmt = "mxfp4-pack-quantized" if self.format == "mxfp4" else "mxfp8-quantized"
        scales = "CUTLASS 128x4 block-scale interleave" if self.scales == "swizzled" else "plain [N, K/32]"
        rule = (
            "compressed-tensors' generate_mx_scales (bit-identical)"
            if self.scale_rule == "compressed-tensors"
            else "OCP MX v1.0"
        )
        if self.chunked:
            fmt = f"mxrepack linear_mxfp4's {self.order} order (MXFP4 in 16-row x 128-code chunks)"
            return f"{fmt}; scales in the quad order; scale rule {rule}" + (
                " with exponent search" if self.scale_search else ""
            )
        return f"compressed-tensors {fmt} tensors; scales {scales}; scale rule {rule}" + (
            " with exponent search" if self.scale_search else ""
        )

    def padded(self, n: int, k: int) -> tuple[int, int]:
        if self.chunked:
            return round_up(n, CHUNK_ROWS), round_up(k, 128)
        return (round_up(n, 128), round_up(k, 128)) if self.scales == "swizzled" else (n, k)

    def outputs(self, shape: tuple[int, int]) -> list[DenseOutput]:
        n, k = shape
        if k % 32:
            raise MxRepackError(f"input width K={k} is not a multiple of 32 (the MX group size)")
        np_, kp = self.padded(n, k)
        if self.format == "mxfp4":
            values = DenseOutput("weight_packed", torch.uint8, (np_, kp // 2), (n, k // 2), "values")
        else:
            values = DenseOutput("weight", torch.float8_e4m3fn, (np_, kp), (n, k), "values")
        return [values, DenseOutput("weight_scale", torch.uint8, (np_, kp // 32), (n, k // 32), "scales")]

    def padding(self, shape: tuple[int, int]) -> dict:
        n, k = shape
        np_, kp = self.padded(n, k)
        return {} if (np_, kp) == (n, k) else {"rows": [n, np_], "cols": [k, kp]}

    def quantize(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``[r, K]`` -> (values, plain scales) at the logical width."""
        fn = quantize_mxfp4 if self.format == "mxfp4" else quantize_mxfp8
        return fn(w, self.scale_rule, self.scale_search)

    def dequantize(self, values: torch.Tensor, scales: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
        if self.format == "mxfp4":
            return dequantize_mxfp4(values, scales, dtype)
        return dequantize_mxfp8(values, scales, dtype)

    def store(self, values: torch.Tensor, scales: torch.Tensor, k: int, role: str) -> torch.Tensor:
        """Plain rows at the logical width -> the stored rows (column padding, scale swizzle).

        Rows must be whole 128-row blocks when swizzled, whole 16-row tiles in a chunk order (:attr:`row_align`; the
        pipeline chunks and pads so)."""
        if self.chunked:
            return self._store_chunked(values if role == "values" else scales, k, role)
        if self.scales == "plain":
            return values if role == "values" else scales
        kp = round_up(k, 128)
        if role == "values":
            out = values.new_zeros((values.shape[0], kp // 2 if self.format == "mxfp4" else kp))
            out[:, : values.shape[1]] = values
            return out
        s = scales.new_zeros((scales.shape[0], kp // 32))
        s[:, : scales.shape[1]] = scales
        return swizzle_128x4(s.unsqueeze(0))[0]

    def _store_chunked(self, x: torch.Tensor, k: int, role: str) -> torch.Tensor:
        from mxrepack.layouts import strided

        r, kp = x.shape[0], round_up(k, 128)
        if r % CHUNK_ROWS:
            raise ValueError(f"dense {self.order} order: {r} rows are not whole {CHUNK_ROWS}-row tiles")
        if role == "values":
            tiled = strided.k_tiled(x.reshape(1, r // CHUNK_ROWS, CHUNK_ROWS, 1, x.shape[1]), r // CHUNK_ROWS, kp // 2)
            return strided.CHUNK_ORDERS[self.order][0](tiled, out=tiled)[0]
        s = x.new_zeros((1, r, kp // 32))
        s[0, :, : x.shape[1]] = x
        return strided.quad_scales(s, CHUNK_ROWS)[0]

    def unpack(
        self, values: torch.Tensor, scales: torch.Tensor, shape: tuple[int, int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stored tensors -> (values, plain scales) at the logical ``[N, K]``: the exact inverse of ``store``."""
        n, k = shape
        if self.chunked:
            from mxrepack.layouts import strided

            r, kb = values.shape
            tiled = strided.CHUNK_ORDERS[self.order][1](values.contiguous()).view(1, r, kb)
            values = strided.k_untiled(tiled, (CHUNK_ROWS, 1)).reshape(r, kb)
            scales = strided.scales_from_quad(scales.reshape(1, *scales.shape), CHUNK_ROWS)[0]
        if self.scales == "swizzled":
            scales = unswizzle_128x4(scales.unsqueeze(0))[0]
        width = k // 2 if self.format == "mxfp4" else k
        return values[:n, :width].contiguous(), scales[:n, : k // 32].contiguous()

    def spec(self) -> dict:
        return {
            "layout": self.name,
            "format": self.format,
            # the chunk orders' scales are in the quad order: "quad" there also makes a plugin older than the orders
            # (which serves plain scales only) refuse these bytes instead of reading them as rows
            "scales": "quad" if self.chunked else self.scales,
            "scale_rule": self.scale_rule,
            "scale_search": self.scale_search,
            **({"order": self.order} if self.chunked else {}),
            "upstream": self.upstream,
        }
