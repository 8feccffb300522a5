"""``flashinfer-cutlass``: FlashInfer's CUTLASS fused MoE with MXFP4 weights, as vLLM 0.33.0 prepares them for its
``FLASHINFER_CUTLASS_MXFP4_MXFP8`` backend (MXFP4 weights x MXFP8 activations, expert biases supported).

On compute capability 12.x (RTX 50xx, RTX PRO 6000, GB10) this is vLLM's opt-in fast path for gpt-oss, reached in
stock vLLM 0.26 / 0.33 only through the Python API (``moe_backend="flashinfer_cutlass_afp8"``; the CLI's
``--moe-backend`` has no value for it); its default there is Marlin (the ``marlin`` layout). The mxrepack plugin
serves these bytes on that backend because the checkpoint names it. Byte-equal to
``convert_gpt_oss_weight_to_mxfp4_moe_kernel_format`` for that backend (golden ``flashinfer_cutlass_sm12x.safetensors``,
section ``ficutlass_mxfp8``):

* hidden and intermediate zero-padded to a multiple of 128 (gpt-oss 2880 -> 2944), as vLLM pads this backend's
  parameters before loading into them;
* w13 ``[E, 2*Ip, Hp/2]``: gate/up de-interleaved to ``[up(0:Ip) | gate(Ip:2Ip)]``, each half its real rows then
  its own zero rows; no weight shuffle;
* scales: raw E8M0 bytes, each expert's ``[rows, K/32]`` in the 128x4 block-scale swizzle (FlashInfer
  ``block_scale_interleave``);
* w2 ``[E, Hp, Ip/2]`` unchanged apart from padding; biases bf16 in the same row order.

FlashInfer's b12x fused MoE (sm120/121 CuTe-DSL) is not a consumer: it takes no expert biases, quantizes activations
to MXFP4, re-pads an intermediate of 2944 to 3072 at decode, and vLLM 0.33.0 never routes gpt-oss to it
(layouts.md 2.5, correction).
"""

from __future__ import annotations

import torch

from mxrepack.layouts.base import (
    ExpertDims,
    ExpertLayout,
    OutputSpec,
    gate_up_from_halves,
    gate_up_halves_padded,
    packed_expert_outputs,
    pad_rows_cols,
    round_up,
    swizzle_128x4,
    unswizzle_128x4,
)

UPSTREAM = (
    "vllm 0.33.0 oracle/mxfp4.convert_gpt_oss_weight_to_mxfp4_moe_kernel_format(FLASHINFER_CUTLASS_MXFP4_MXFP8) "
    "(swap w13 halves, flashinfer block_scale_interleave)"
)


class FlashInferCutlassLayout(ExpertLayout):
    name = "flashinfer-cutlass"
    description = (
        "FlashInfer CUTLASS MXFP4 MoE (vLLM FLASHINFER_CUTLASS_MXFP4_MXFP8): [up|gate] rows, hidden and "
        "intermediate padded to 128, 128x4-swizzled raw E8M0 scales, bf16 biases"
    )

    def __init__(self, tile: int = 128):
        self.tile = tile

    def padded(self, d: ExpertDims) -> tuple[int, int]:
        return round_up(d.hidden, 128), round_up(d.intermediate, self.tile)

    def outputs(self, d: ExpertDims) -> list[OutputSpec]:
        Hp, Ip = self.padded(d)

        def up_gate(x, cols):
            return gate_up_halves_padded(x, Ip, cols, up_first=True)

        return packed_expert_outputs(
            d,
            Hp,
            Ip,
            {
                "w13_weight": lambda gate_up_proj_blocks: up_gate(gate_up_proj_blocks.flatten(2), Hp // 2),
                "w13_weight_scale": lambda gate_up_proj_scales: swizzle_128x4(up_gate(gate_up_proj_scales, Hp // 32)),
                "w13_bias": lambda gate_up_proj_bias: up_gate(gate_up_proj_bias.unsqueeze(-1), 1).squeeze(-1),
                "w2_weight": lambda down_proj_blocks: pad_rows_cols(down_proj_blocks.flatten(2), Hp, Ip // 2),
                "w2_weight_scale": lambda down_proj_scales: swizzle_128x4(
                    pad_rows_cols(down_proj_scales, Hp, Ip // 32)
                ),
                "w2_bias": lambda down_proj_bias: pad_rows_cols(down_proj_bias.unsqueeze(-1), Hp, 1).squeeze(-1),
            },
            torch.bfloat16,
            UPSTREAM,
        )

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


LAYOUT = FlashInferCutlassLayout()
