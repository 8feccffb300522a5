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
from mxrepack.layouts.base import (ExpertDims, ExpertLayout, OutputSpec, deinterleave_halves, interleave_halves,
                                   pad_rows_cols, round_up)

UPSTREAM = "mxrepack.kernels (moe_mxfp4 / linear_mxfp4 Triton kernels)"


def gate_up_padded(x: torch.Tensor, rows_per_half: int, cols: int) -> torch.Tensor:
    """Interleaved gate/up rows ``[E, 2I, c]`` -> ``[gate | up]``, each half zero-padded to ``rows_per_half``."""
    gate, up = deinterleave_halves(x).unflatten(1, (2, -1)).unbind(1)
    return torch.cat([pad_rows_cols(gate, rows_per_half, cols), pad_rows_cols(up, rows_per_half, cols)], dim=1)


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
        H, I, E = d.hidden, d.intermediate, d.experts
        Hp, Ip = self.padded(d)
        pad = {"hidden": [H, Hp], "intermediate": [I, Ip]}
        u = UPSTREAM

        def w13(gate_up_proj_blocks):
            return gate_up_padded(gate_up_proj_blocks.flatten(2), Ip, Hp // 2)

        def w13_scale(gate_up_proj_scales):
            return gate_up_padded(gate_up_proj_scales, Ip, Hp // 32)

        def w13_bias(gate_up_proj_bias):
            return gate_up_padded(gate_up_proj_bias.to(torch.float32).unsqueeze(-1), Ip, 1).squeeze(-1)

        def w2(down_proj_blocks):
            return pad_rows_cols(down_proj_blocks.flatten(2), Hp, Ip // 2)

        def w2_scale(down_proj_scales):
            return pad_rows_cols(down_proj_scales, Hp, Ip // 32)

        def w2_bias(down_proj_bias):
            return pad_rows_cols(down_proj_bias.to(torch.float32).unsqueeze(-1), Hp, 1).squeeze(-1)

        return [
            OutputSpec("w13_weight", torch.uint8, (E, 2 * Ip, Hp // 2), ("gate_up_proj_blocks",), w13, (E, 2 * I, H // 2), pad, u),
            OutputSpec("w13_weight_scale", torch.uint8, (E, 2 * Ip, Hp // 32), ("gate_up_proj_scales",), w13_scale, (E, 2 * I, H // 32), pad, u),
            OutputSpec("w13_bias", torch.float32, (E, 2 * Ip), ("gate_up_proj_bias",), w13_bias, (E, 2 * I), pad, u),
            OutputSpec("w2_weight", torch.uint8, (E, Hp, Ip // 2), ("down_proj_blocks",), w2, (E, H, I // 2), pad, u),
            OutputSpec("w2_weight_scale", torch.uint8, (E, Hp, Ip // 32), ("down_proj_scales",), w2_scale, (E, H, I // 32), pad, u),
            OutputSpec("w2_bias", torch.float32, (E, Hp), ("down_proj_bias",), w2_bias, (E, H), pad, u),
        ]

    def unpack_padded(self, stored: dict[str, torch.Tensor], d: ExpertDims) -> dict[str, torch.Tensor]:
        w13, w2 = interleave_halves(stored["w13_weight"]), stored["w2_weight"]
        E = w13.shape[0]
        return {
            "gate_up_proj_blocks": w13.reshape(E, w13.shape[1], -1, 16),
            "gate_up_proj_scales": interleave_halves(stored["w13_weight_scale"]),
            "gate_up_proj_bias": interleave_halves(stored["w13_bias"].unsqueeze(-1)).squeeze(-1).to(torch.bfloat16),
            "down_proj_blocks": w2.reshape(E, w2.shape[1], -1, 16),
            "down_proj_scales": stored["w2_weight_scale"],
            "down_proj_bias": stored["w2_bias"].to(torch.bfloat16),
        }


LAYOUT = StridedLayout()
