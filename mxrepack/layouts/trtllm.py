"""``trtllm``: FlashInfer TRT-LLM-gen MXFP4 MoE weights (sm100 family), as vLLM 0.33.0 prepares them.

Matches ``oracle/mxfp4.py::convert_gpt_oss_weight_to_mxfp4_moe_kernel_format`` for
``FLASHINFER_TRTLLM_MXFP4_BF16`` byte for byte (golden ``flashinfer_trtllm.safetensors``). Steps
(layouts.md 2.1-2.4; the golden README: vLLM 0.33.0 pads intermediate to 128, hidden to 256):

* zero-pad hidden to a multiple of 256 and intermediate to a multiple of 128;
* w13 only: swap every two rows (checkpoint ``[g0,u0,g1,u1..]`` -> ``[u0,g0,u1,g1..]``) of
  weights, scales and bias;
* per expert, the epilogue-tile-128 row shuffle: in each 32-row block, out row ``p`` is in row
  ``(p % 8) * 4 + p // 8`` -- weights, scales and biases alike;
* scales: the 128x4 scale-factor swizzle (rows in blocks of 128, 4 scale columns per 512-byte atom,
  ``view(R/128, 4, 32, C/4, 4).permute(0, 3, 2, 1, 4)``), stored flat in the ``[E, rows, K/32]``
  shape vLLM reshapes it to, raw E8M0 bytes (vLLM tags them float8_e4m3fn; the bytes are E8M0);
* biases as float32.
"""

from __future__ import annotations

import torch

from mxrepack.layouts.base import (
    ExpertDims,
    ExpertLayout,
    OutputSpec,
    packed_expert_outputs,
    permute_row_blocks,
    round_up,
    swizzle_128x4,
    unswizzle_128x4,
)

UPSTREAM = (
    "vllm 0.33.0 oracle/mxfp4.convert_gpt_oss_weight_to_mxfp4_moe_kernel_format(FLASHINFER_TRTLLM_MXFP4_BF16); "
    "flashinfer fb28d72 get_shuffle_matrix_a_row_indices(epilogue_tile_m=128), 128x4 block_scale_interleave"
)

# In each 32-row block, out row p comes from row _ROW_SHUFFLE[p] (the epilogue-tile shuffle); w13 also swaps
# row pairs first (gate/up -> up/gate), so its rows come from _ROW_SHUFFLE[p] ^ 1. Both are applied as one
# block permutation (base.permute_row_blocks), padding included.
_ROW_SHUFFLE = [(p % 8) * 4 + p // 8 for p in range(32)]
_W13_ROWS = [q ^ 1 for q in _ROW_SHUFFLE]


def _inverse(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for p, q in enumerate(perm):
        inv[q] = p
    return inv


def w13_rows(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Checkpoint gate/up rows ``[E, r, c]`` -> padded, pair-swapped, shuffled ``[E, rows, cols]``."""
    return permute_row_blocks(x, rows, cols, _W13_ROWS)


def w2_rows(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return permute_row_blocks(x, rows, cols, _ROW_SHUFFLE)


def _unshuffle(x: torch.Tensor, perm: list[int]) -> torch.Tensor:
    return permute_row_blocks(x, x.shape[1], x.shape[2], _inverse(perm))


class TrtllmLayout(ExpertLayout):
    name = "trtllm"
    description = (
        "FlashInfer TRT-LLM-gen MXFP4 MoE (sm100): hidden padded to 256, intermediate to 128; gate/up "
        "row pairs swapped, epilogue-128 row shuffle, 128x4-swizzled E8M0 scales, fp32 biases"
    )

    def outputs(self, d: ExpertDims) -> list[OutputSpec]:
        Hp, Ip = round_up(d.hidden, 256), round_up(d.intermediate, 128)

        def w13(gate_up_proj_blocks):
            return w13_rows(gate_up_proj_blocks.flatten(2), 2 * Ip, Hp // 2)

        def w13_scale(gate_up_proj_scales):
            return swizzle_128x4(w13_rows(gate_up_proj_scales, 2 * Ip, Hp // 32))

        def w13_bias(gate_up_proj_bias):
            return w13_rows(gate_up_proj_bias.to(torch.float32).unsqueeze(-1), 2 * Ip, 1).squeeze(-1)

        def w2(down_proj_blocks):
            return w2_rows(down_proj_blocks.flatten(2), Hp, Ip // 2)

        def w2_scale(down_proj_scales):
            return swizzle_128x4(w2_rows(down_proj_scales, Hp, Ip // 32))

        def w2_bias(down_proj_bias):
            return w2_rows(down_proj_bias.to(torch.float32).unsqueeze(-1), Hp, 1).squeeze(-1)

        return packed_expert_outputs(
            d,
            Hp,
            Ip,
            {
                "w13_weight": w13,
                "w13_weight_scale": w13_scale,
                "w13_bias": w13_bias,
                "w2_weight": w2,
                "w2_weight_scale": w2_scale,
                "w2_bias": w2_bias,
            },
            torch.float32,
            UPSTREAM,
        )

    def unpack_padded(self, stored: dict[str, torch.Tensor], d: ExpertDims) -> dict[str, torch.Tensor]:
        def back13(x):
            return _unshuffle(x, _W13_ROWS)

        def back2(x):
            return _unshuffle(x, _ROW_SHUFFLE)

        w13, w2 = back13(stored["w13_weight"]), back2(stored["w2_weight"])
        E = w13.shape[0]
        return {
            "gate_up_proj_blocks": w13.reshape(E, w13.shape[1], -1, 16),
            "gate_up_proj_scales": back13(unswizzle_128x4(stored["w13_weight_scale"])),
            "gate_up_proj_bias": back13(stored["w13_bias"].unsqueeze(-1)).squeeze(-1).to(torch.bfloat16),
            "down_proj_blocks": w2.reshape(E, w2.shape[1], -1, 16),
            "down_proj_scales": back2(unswizzle_128x4(stored["w2_weight_scale"])),
            "down_proj_bias": back2(stored["w2_bias"].unsqueeze(-1)).squeeze(-1).to(torch.bfloat16),
        }


LAYOUT = TrtllmLayout()
