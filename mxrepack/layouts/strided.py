"""``strided``: the layout mxrepack's own Triton kernels consume (``mxrepack.kernels``), safe on sm_12x.

Plain K-major bytes, nothing a TMA descriptor or a swizzled shared-memory atom would need:

* w13 ``[E, 2*Ip, Hp/2]`` packed FP4 (low nibble = even k), rows ``[gate(0:Ip) | up(Ip:2Ip)]`` so one
  output tile loads its gate and up rows at ``n`` and ``Ip + n`` and applies the SwiGLU in registers;
  w2 ``[E, Hp, Ip/2]``;
* scales row-major ``[E, rows, K/32]`` raw E8M0 bytes;
* hidden and intermediate zero-padded to ``tile`` (default 128, 2880 -> 2944) so kernels need no K
  masks and every row is 16-byte aligned (Kp/2 % 16 == 0 for 16-byte vector loads);
* biases float32 (the kernels add them to the fp32 accumulator).
"""

from __future__ import annotations

import torch

from mxrepack.errors import MxRepackError
from mxrepack.layouts.base import (ExpertDims, ExpertLayout, OutputSpec, gate_up_from_halves, gate_up_halves_padded,
                                   pad_rows_cols, packed_expert_outputs, round_up)

UPSTREAM = "mxrepack.kernels (moe_mxfp4 / linear_mxfp4 Triton kernels)"


class StridedLayout(ExpertLayout):
    name = "strided"
    description = ("mxrepack Triton kernels (sm_12x-safe, no TMA): K-major packed FP4 [gate|up] rows, row-major "
                   "E8M0 scales, hidden/intermediate padded to the tile, fp32 biases")

    def __init__(self, tile: int = 128):
        if tile % 32 or tile <= 0:
            raise MxRepackError(f"strided option tile={tile!r}: expected a positive multiple of 32")
        self.tile = tile

    def padded(self, d: ExpertDims) -> tuple[int, int]:
        return round_up(d.hidden, self.tile), round_up(d.intermediate, self.tile)

    def outputs(self, d: ExpertDims) -> list[OutputSpec]:
        Hp, Ip = self.padded(d)

        def fp32_column(bias):
            return bias.to(torch.float32).unsqueeze(-1)

        return packed_expert_outputs(d, Hp, Ip, {
            "w13_weight": lambda gate_up_proj_blocks: gate_up_halves_padded(gate_up_proj_blocks.flatten(2), Ip, Hp // 2),
            "w13_weight_scale": lambda gate_up_proj_scales: gate_up_halves_padded(gate_up_proj_scales, Ip, Hp // 32),
            "w13_bias": lambda gate_up_proj_bias: gate_up_halves_padded(fp32_column(gate_up_proj_bias), Ip, 1).squeeze(-1),
            "w2_weight": lambda down_proj_blocks: pad_rows_cols(down_proj_blocks.flatten(2), Hp, Ip // 2),
            "w2_weight_scale": lambda down_proj_scales: pad_rows_cols(down_proj_scales, Hp, Ip // 32),
            "w2_bias": lambda down_proj_bias: pad_rows_cols(fp32_column(down_proj_bias), Hp, 1).squeeze(-1),
        }, torch.float32, UPSTREAM)

    def unpack_padded(self, stored: dict[str, torch.Tensor], d: ExpertDims) -> dict[str, torch.Tensor]:
        w13, w2 = gate_up_from_halves(stored["w13_weight"]), stored["w2_weight"]
        E = w13.shape[0]
        return {
            "gate_up_proj_blocks": w13.reshape(E, w13.shape[1], -1, 16),
            "gate_up_proj_scales": gate_up_from_halves(stored["w13_weight_scale"]),
            "gate_up_proj_bias": gate_up_from_halves(stored["w13_bias"].unsqueeze(-1)).squeeze(-1).to(torch.bfloat16),
            "down_proj_blocks": w2.reshape(E, w2.shape[1], -1, 16),
            "down_proj_scales": stored["w2_weight_scale"],
            "down_proj_bias": stored["w2_bias"].to(torch.bfloat16),
        }


LAYOUT = StridedLayout()
