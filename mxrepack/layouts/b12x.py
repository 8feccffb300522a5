"""``b12x``: FlashInfer's sm120/sm121 fused MoE (b12x CuTe-DSL, ``b12x_fused_moe``, mxfp4 mode) and
CUTLASS sm12x block-scaled GEMMs.

No golden vector exists for this prep (golden README); it is implemented from layouts.md 2.4-2.5 and
FlashInfer PR #4290 (``prepare_*`` docstrings, ``_pad_intermediate_to_tile``), and its 128x4 scale
swizzle is the function the TRT-LLM golden vector proves byte for byte (``swizzle_128x4``):

* w13 ``[E, 2*Ip, Hp/2]``: gate/up de-interleaved to ``[up(0:Ip) | gate(Ip:2Ip)]`` (the
  ``swigluoai_uninterleave`` activation); each half zero-padded to Ip on its own (FlashInfer pads the
  halves separately at load time, so the real rows of both halves start at 0 and Ip);
* hidden zero-padded to a multiple of 128 (``MXFP4 b12x hidden_size must be a multiple of 128``:
  2880 -> 2944), intermediate to the 128-row tile ``_LEVEL_TILE_N`` (2880 -> 2944), done here so the
  engine's runtime pad-and-reswizzle is a no-op;
* scales: raw E8M0 bytes (``Float8E8M0FNU``, vector 32), each expert's ``[rows, K/32]`` in the 128x4
  swizzle (rows % 128 == 0 and K/32 % 4 == 0 by the padding above);
* w2 ``[E, Hp, Ip/2]`` unchanged apart from padding; biases bf16 in the same row order.
"""

from __future__ import annotations

import torch

from mxrepack.layouts.base import (ExpertDims, ExpertLayout, OutputSpec, gate_up_from_halves, gate_up_halves_padded,
                                   pad_rows_cols, packed_expert_outputs, round_up, swizzle_128x4, unswizzle_128x4)

UPSTREAM = ("flashinfer PR #4290 fused_moe/cute_dsl/b12x_moe.b12x_fused_moe (quant_mode mxfp4, "
            "swigluoai_uninterleave) weight prep; not golden-tested (no upstream vector), 128x4 swizzle = "
            "flashinfer swizzle_block_scale")


class B12xLayout(ExpertLayout):
    name = "b12x"
    description = ("FlashInfer sm120/sm121 b12x fused MoE / CUTLASS sm12x: [up|gate] rows, hidden and "
                   "intermediate padded to 128, 128x4-swizzled raw E8M0 scales, bf16 biases")

    def __init__(self, tile: int = 128):
        self.tile = tile

    def outputs(self, d: ExpertDims) -> list[OutputSpec]:
        Hp, Ip = round_up(d.hidden, 128), round_up(d.intermediate, self.tile)

        def up_gate(x, cols):
            return gate_up_halves_padded(x, Ip, cols, up_first=True)

        return packed_expert_outputs(d, Hp, Ip, {
            "w13_weight": lambda gate_up_proj_blocks: up_gate(gate_up_proj_blocks.flatten(2), Hp // 2),
            "w13_weight_scale": lambda gate_up_proj_scales: swizzle_128x4(up_gate(gate_up_proj_scales, Hp // 32)),
            "w13_bias": lambda gate_up_proj_bias: up_gate(gate_up_proj_bias.unsqueeze(-1), 1).squeeze(-1),
            "w2_weight": lambda down_proj_blocks: pad_rows_cols(down_proj_blocks.flatten(2), Hp, Ip // 2),
            "w2_weight_scale": lambda down_proj_scales: swizzle_128x4(pad_rows_cols(down_proj_scales, Hp, Ip // 32)),
            "w2_bias": lambda down_proj_bias: pad_rows_cols(down_proj_bias.unsqueeze(-1), Hp, 1).squeeze(-1),
        }, torch.bfloat16, UPSTREAM)

    def unpack_padded(self, stored: dict[str, torch.Tensor], d: ExpertDims) -> dict[str, torch.Tensor]:
        def gate_up(x):
            return gate_up_from_halves(x, up_first=True)

        w13, w2 = gate_up(stored["w13_weight"]), stored["w2_weight"]
        E = w13.shape[0]
        return {
            "gate_up_proj_blocks": w13.reshape(E, w13.shape[1], -1, 16),
            "gate_up_proj_scales": gate_up(unswizzle_128x4(stored["w13_weight_scale"])),
            "gate_up_proj_bias": gate_up(stored["w13_bias"].unsqueeze(-1)).squeeze(-1),
            "down_proj_blocks": w2.reshape(E, w2.shape[1], -1, 16),
            "down_proj_scales": unswizzle_128x4(stored["w2_weight_scale"]),
            "down_proj_bias": stored["w2_bias"],
        }


LAYOUT = B12xLayout()
