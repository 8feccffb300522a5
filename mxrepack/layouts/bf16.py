"""``bf16``: experts dequantized to BF16, in the module layout stock transformers loads.

transformers' ``GptOssExperts`` holds ``gate_up_proj [E, H, 2I]`` and ``down_proj [E, I, H]``
(``[in, out]``, the transpose of the checkpoint) plus biases (formats.md 3.1); a checkpoint with these
names and no ``quantization_config`` loads with no quantizer at all. Gate/up stay row-interleaved
(even = gate, odd = up) as in the source, which is what ``_apply_gate`` expects.

Dequantization is exact (every MXFP4 value is ``code * 2**k``, which BF16 holds), so the inverse
recovers the values exactly but not the bytes: a value has several (code, scale) spellings.
"""

from __future__ import annotations

import torch

from mxrepack.layouts.base import ExpertDims, ExpertLayout, OutputSpec
from mxrepack.quant import dequantize_mxfp4


def _dequant_transposed(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return dequantize_mxfp4(blocks, scales, torch.bfloat16, transpose=True)


def _dequant_gate_up(gate_up_proj_blocks, gate_up_proj_scales):
    return _dequant_transposed(gate_up_proj_blocks, gate_up_proj_scales)


def _dequant_down(down_proj_blocks, down_proj_scales):
    return _dequant_transposed(down_proj_blocks, down_proj_scales)


def _bias(**parts: torch.Tensor) -> torch.Tensor:
    (value,) = parts.values()
    return value.to(torch.bfloat16)


UPSTREAM = "transformers 5.x GptOssExperts parameters; values == integrations.mxfp4.convert_moe_packed_tensors"


class Bf16Layout(ExpertLayout):
    name = "bf16"
    description = "experts dequantized to BF16: gate_up_proj [E,H,2I], down_proj [E,I,H] (transformers module layout)"
    exact_bytes = False

    def outputs(self, d: ExpertDims) -> list[OutputSpec]:
        H, I, E = d.hidden, d.intermediate, d.experts
        return [
            OutputSpec(
                "gate_up_proj",
                torch.bfloat16,
                (E, H, 2 * I),
                ("gate_up_proj_blocks", "gate_up_proj_scales"),
                _dequant_gate_up,
                upstream=UPSTREAM,
                work_factor=6,
            ),
            OutputSpec(
                "gate_up_proj_bias", torch.bfloat16, (E, 2 * I), ("gate_up_proj_bias",), _bias, upstream=UPSTREAM
            ),
            OutputSpec(
                "down_proj",
                torch.bfloat16,
                (E, I, H),
                ("down_proj_blocks", "down_proj_scales"),
                _dequant_down,
                upstream=UPSTREAM,
                work_factor=6,
            ),
            OutputSpec("down_proj_bias", torch.bfloat16, (E, H), ("down_proj_bias",), _bias, upstream=UPSTREAM),
        ]

    def unpack_padded(self, stored: dict[str, torch.Tensor], d: ExpertDims) -> dict[str, torch.Tensor]:
        return {
            "gate_up_proj": stored["gate_up_proj"].transpose(1, 2),
            "gate_up_proj_bias": stored["gate_up_proj_bias"],
            "down_proj": stored["down_proj"].transpose(1, 2),
            "down_proj_bias": stored["down_proj_bias"],
        }


LAYOUT = Bf16Layout()
