"""``compressed-tensors``: experts split per expert into Linear-style MXFP4 tensors, Marlin-valid widths.

What llm-compressor's MXFP4 checkpoints hold for an MoE (format ``mxfp4-pack-quantized``, formats.md
4.1), written straight from the native bytes: per layer ``L`` and expert ``e``::

    model.layers.L.mlp.experts.e.{gate,up}_proj.weight_packed  uint8 [Ip, H/2]
    model.layers.L.mlp.experts.e.{gate,up}_proj.weight_scale   uint8 [Ip, H/32]   (E8M0)
    model.layers.L.mlp.experts.e.{gate,up}_proj.bias           bf16  [Ip]
    model.layers.L.mlp.experts.e.down_proj.weight_packed       uint8 [H, Ip/2]
    model.layers.L.mlp.experts.e.down_proj.weight_scale        uint8 [H, Ip/32]
    model.layers.L.mlp.experts.e.down_proj.bias                bf16  [H]

* Gate and up are de-interleaved as gpt-oss stores them: **even** rows of ``gate_up_proj`` are gate,
  **odd** rows are up (llm-compressor's current ``linearize`` splits first/second halves instead,
  which mislabels them; its older ``copy_from_fused_weights`` used 0::2 / 1::2 as here).
* No re-quantization: compressed-tensors packs E2M1 with the low nibble first and stores E8M0 with
  bias 127, exactly like gpt-oss, so values and scales are copied byte for byte. (A native ``-0``
  code stays ``-0``; compressed-tensors' own quantizer would write ``+0``, the same value.)
* Padding: the intermediate width is zero-padded to a multiple of ``pad_intermediate`` (128) so
  that both MoE GEMMs of vLLM's Marlin have a thread configuration: (n % 128, k % 64) or
  (n % 64, k % 128) (layouts.md 1.6). For gpt-oss, I 2880 -> 2944: w13 is n=5888, k=2880 and w2 is
  n=2880, k=2944; unpadded, w2 (n=k=2880) has none (vLLM #38022). The hidden width is left alone: it
  is the residual stream's width. Padded rows/columns are zero bytes, zero scales (2^-127) and zero
  bias: gate = up = 0 gives SwiGLU (0 + 1) * 0 * sigmoid(0) = 0, so they are exactly inert. The
  config's ``intermediate_size`` becomes the padded width; the manifest records the logical one.
"""

from __future__ import annotations

import torch

from mxrepack.errors import MxRepackError
from mxrepack.layouts.base import ExpertDims, ExpertLayout, OutputSpec, round_up

UPSTREAM = (
    "compressed-tensors 0.20 mxfp4-pack-quantized per-Linear tensors (MXFP4PackedCompressor.compression_param_names)"
)


def marlin_moe_valid(n: int, k: int) -> bool:
    """Whether a Marlin MoE GEMM of output width n and input width k has a thread configuration."""
    return (n % 128 == 0 and k % 64 == 0) or (n % 64 == 0 and k % 128 == 0)


def _rows(x: torch.Tensor, proj: str) -> torch.Tensor:
    """Expert ``[1, 2I, ...]`` gate_up part -> gate (even) or up (odd) rows ``[I, ...]``."""
    return x[0, 0::2] if proj == "gate_proj" else x[0, 1::2]


def _pad_dim(x: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    if x.shape[dim] == size:
        return x.contiguous()
    shape = list(x.shape)
    shape[dim] = size
    out = x.new_zeros(shape)
    out.narrow(dim, 0, x.shape[dim]).copy_(x)
    return out


class CompressedTensorsLayout(ExpertLayout):
    name = "compressed-tensors"
    description = (
        "per-expert Linear MXFP4 (compressed-tensors mxfp4-pack-quantized), gate=even/up=odd rows, I padded for Marlin"
    )
    per_expert = True  # outputs are per expert: suffixes hold "{e}", shapes have no expert dimension

    def __init__(self, pad_intermediate: int = 128):
        if pad_intermediate < 32 or pad_intermediate % 32:
            raise MxRepackError(f"pad_intermediate must be a positive multiple of 32, got {pad_intermediate}")
        self.pad_intermediate = pad_intermediate

    def padded_intermediate(self, d: ExpertDims) -> int:
        return round_up(d.intermediate, self.pad_intermediate)

    def config_overrides(self, d: ExpertDims) -> dict:
        # Zero-padded intermediate units are real (inert) units of the written model.
        return {"intermediate_size": self.padded_intermediate(d)}

    def outputs(self, d: ExpertDims) -> list[OutputSpec]:
        H, I = d.hidden, d.intermediate
        Ip = self.padded_intermediate(d)
        pad = {"intermediate": [I, Ip]} if Ip != I else {}
        specs = []
        for proj in ("gate_proj", "up_proj"):

            def w(gate_up_proj_blocks, proj=proj):
                return _pad_dim(_rows(gate_up_proj_blocks, proj).flatten(-2), 0, Ip)

            def s(gate_up_proj_scales, proj=proj):
                return _pad_dim(_rows(gate_up_proj_scales, proj), 0, Ip)

            def b(gate_up_proj_bias, proj=proj):
                return _pad_dim(_rows(gate_up_proj_bias, proj), 0, Ip).to(torch.bfloat16)

            specs += [
                OutputSpec(
                    f"{{e}}.{proj}.weight_packed",
                    torch.uint8,
                    (Ip, H // 2),
                    ("gate_up_proj_blocks",),
                    w,
                    (I, H // 2),
                    pad,
                    UPSTREAM,
                    2,
                ),
                OutputSpec(
                    f"{{e}}.{proj}.weight_scale",
                    torch.uint8,
                    (Ip, H // 32),
                    ("gate_up_proj_scales",),
                    s,
                    (I, H // 32),
                    pad,
                    UPSTREAM,
                    2,
                ),
                OutputSpec(
                    f"{{e}}.{proj}.bias", torch.bfloat16, (Ip,), ("gate_up_proj_bias",), b, (I,), pad, UPSTREAM, 2
                ),
            ]

        def dw(down_proj_blocks):
            return _pad_dim(down_proj_blocks[0].flatten(-2), 1, Ip // 2)

        def ds(down_proj_scales):
            return _pad_dim(down_proj_scales[0], 1, Ip // 32)

        def db(down_proj_bias):
            return down_proj_bias[0].to(torch.bfloat16).contiguous()

        specs += [
            OutputSpec(
                "{e}.down_proj.weight_packed",
                torch.uint8,
                (H, Ip // 2),
                ("down_proj_blocks",),
                dw,
                (H, I // 2),
                pad,
                UPSTREAM,
                2,
            ),
            OutputSpec(
                "{e}.down_proj.weight_scale",
                torch.uint8,
                (H, Ip // 32),
                ("down_proj_scales",),
                ds,
                (H, I // 32),
                pad,
                UPSTREAM,
                2,
            ),
            OutputSpec("{e}.down_proj.bias", torch.bfloat16, (H,), ("down_proj_bias",), db, (H,), pad, UPSTREAM, 2),
        ]
        return specs

    def unpack_padded(self, stored: dict[str, torch.Tensor], d: ExpertDims) -> dict[str, torch.Tensor]:
        """``stored`` maps each suffix template ("{e}.gate_proj.weight_packed" ...) to the per-expert
        tensors stacked over a contiguous expert range."""
        g = {k.split(".", 1)[1]: v for k, v in stored.items()}
        H = d.hidden

        def interleave(gate, up):
            return torch.stack([gate, up], dim=2).flatten(1, 2)

        return {
            "gate_up_proj_blocks": interleave(g["gate_proj.weight_packed"], g["up_proj.weight_packed"]).unflatten(
                -1, (-1, 16)
            ),
            "gate_up_proj_scales": interleave(g["gate_proj.weight_scale"], g["up_proj.weight_scale"]),
            "gate_up_proj_bias": interleave(g["gate_proj.bias"], g["up_proj.bias"]),
            "down_proj_blocks": g["down_proj.weight_packed"].unflatten(-1, (-1, 16)),
            "down_proj_scales": g["down_proj.weight_scale"],
            "down_proj_bias": g["down_proj.bias"].reshape(-1, H),
        }


LAYOUT = CompressedTensorsLayout()
