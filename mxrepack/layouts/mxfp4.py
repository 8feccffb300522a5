"""``mxfp4``: the native gpt-oss checkpoint layout, bytes unchanged.

Useful to normalize an ``original/`` checkpoint to the Hugging Face names, to re-shard, and as the
identity against which every other layout is checked. Consumers: transformers' Mxfp4 integration,
vLLM's native ``mxfp4`` loader (formats.md 1.3, 5a).
"""

from __future__ import annotations

import torch

from mxrepack.gptoss import EXPERT_PARTS
from mxrepack.layouts.base import ExpertDims, ExpertLayout, OutputSpec, passthrough


class NativeMxfp4Layout(ExpertLayout):
    name = "mxfp4"
    description = "native gpt-oss MXFP4 (blocks [E,N,K/32,16] + E8M0 scales [E,N,K/32] + bf16 bias), bytes unchanged"

    def outputs(self, d: ExpertDims) -> list[OutputSpec]:
        H, I, E = d.hidden, d.intermediate, d.experts
        shapes = {
            "gate_up_proj_blocks": ((E, 2 * I, H // 32, 16), torch.uint8),
            "gate_up_proj_scales": ((E, 2 * I, H // 32), torch.uint8),
            "gate_up_proj_bias": ((E, 2 * I), torch.bfloat16),
            "down_proj_blocks": ((E, H, I // 32, 16), torch.uint8),
            "down_proj_scales": ((E, H, I // 32), torch.uint8),
            "down_proj_bias": ((E, H), torch.bfloat16),
        }
        return [
            OutputSpec(
                part,
                dtype,
                shape,
                (part,),
                passthrough,
                work_factor=1,
                upstream="openai/gpt-oss checkpoint format (HF layout)",
            )
            for part, (shape, dtype) in ((p, shapes[p]) for p in EXPERT_PARTS)
        ]

    def unpack_padded(self, stored: dict[str, torch.Tensor], d: ExpertDims) -> dict[str, torch.Tensor]:
        return {p: stored[p] for p in EXPERT_PARTS}


LAYOUT = NativeMxfp4Layout()
