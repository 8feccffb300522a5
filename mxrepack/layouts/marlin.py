"""``marlin``: vLLM's Marlin MXFP4 MoE weights (W4A16, BF16 activations), as vLLM 0.33.0 prepares them.

Matches ``marlin_utils_fp4.py::prepare_moe_mxfp4_layer_for_marlin`` byte for byte (golden
``vllm_marlin.safetensors``). Steps per expert and projection (layouts.md 1.2-1.6):

* zero-pad: hidden to a multiple of 256, intermediate to a multiple of 128 (gpt-oss 2880/2880 ->
  3072/2944), padding rows/columns appended after the real ones (what vLLM's loader does);
* weight: ``gptq_marlin_repack`` (4-bit) -> int32 ``[E, K/16, 2N]``. In each 16x64 tile, lane
  ``l`` and warp ``w`` own column ``n = 16w + l//4`` (and ``n+8``) and rows ``k = 2(l%4)`` (+1, +8,
  +9); the eight nibbles of a word are, low to high, (k,n) (k+8,n) (k,n+8) (k+8,n+8) (k+1,n)
  (k+9,n) (k+1,n+8) (k+9,n+8) -- the B fragment of ``mma.sync m16n8k16``;
* scales: ``[K/32, N]``, ``marlin_permute_scales`` (8x8 transposes of 64-column groups), then the
  E8M0 ``[0,2,1,3]`` swap of each 4 consecutive bytes, stored as ``float8_e8m0fnu``;
  ``fp8_activations=True`` instead adds 6 to every exponent and skips the swap (W4A8-FP8 kernels);
* bias: ``marlin_permute_bias`` on each expert's ``[N]``, BF16.

Gate/up rows keep the checkpoint interleave (even = gate, odd = up).
"""

from __future__ import annotations

import torch

from mxrepack.errors import MxRepackError
from mxrepack.layouts.base import ExpertDims, ExpertLayout, OutputSpec, pad_rows_cols, round_up

UPSTREAM = "vllm 0.33.0 marlin_utils_fp4.prepare_moe_mxfp4_layer_for_marlin (gptq_marlin_repack, marlin_permute_scales, mxfp4_marlin_process_scales, marlin_permute_bias)"
_SCALE_PERM = torch.tensor([i + 8 * j for i in range(8) for j in range(8)])
_BIAS_PERM = torch.tensor([2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)])
_E8M0_SWAP = torch.tensor([0, 2, 1, 3])  # self-inverse


def repack_weight(packed: torch.Tensor) -> torch.Tensor:
    """``[E, N, K/2]`` uint8 (checkpoint nibble order) -> Marlin int32 ``[E, K/16, 2N]``.

    Done on bytes, not nibbles: the two codes of a source byte are k and k+1 of one column, and a
    word's bytes are (slots 0-1) lo(B0)|lo(B1), (2-3) lo(B2)|lo(B3), (4-5) hi(B0)|hi(B1), (6-7)
    hi(B2)|hi(B3) for the source bytes B(c, a) at rows k + 8a, column n + 8c. So one byte permute
    gathers each word's four source bytes, and four byte-wise mask/shift ops finish it.
    """
    E, N, K = packed.shape[0], packed.shape[1], packed.shape[2] * 2
    if N % 64 or K % 16:
        raise MxRepackError(f"Marlin repack needs N % 64 == 0 and K % 16 == 0, got N={N}, K={K}")
    # byte kb = 8 kt + 4 a + l4 ; n = 64 nt + 16 warp + 8 c + l8
    b = packed.view(E, N // 64, 4, 2, 8, K // 16, 2, 4)  # e, nt, warp, c, l8, kt, a, l4
    b = b.permute(0, 5, 1, 4, 7, 2, 3, 6).reshape(E, K // 16, 2 * N, 4)  # e, kt, nt, l8, l4, warp, (c, a)
    b0, b1, b2, b3 = b.unbind(-1)
    out = torch.stack([(b0 & 15) | (b1 << 4), (b2 & 15) | (b3 << 4), (b0 >> 4) | (b1 & 0xF0), (b2 >> 4) | (b3 & 0xF0)], -1)
    return out.view(torch.int32).reshape(E, K // 16, 2 * N)


def unrepack_weight(words: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`repack_weight`."""
    E, K16, N2 = words.shape
    N, K = N2 // 2, K16 * 16
    o0, o1, o2, o3 = words.contiguous().view(torch.uint8).view(E, K16, N2, 4).unbind(-1)
    b = torch.stack([(o0 & 15) | (o2 << 4), (o0 >> 4) | (o2 & 0xF0), (o1 & 15) | (o3 << 4), (o1 >> 4) | (o3 & 0xF0)], -1)
    b = b.view(E, K // 16, N // 64, 8, 4, 4, 2, 2)  # e, kt, nt, l8, l4, warp, c, a
    return b.permute(0, 2, 5, 6, 3, 1, 7, 4).reshape(E, N, K // 2)


def permute_scales(scales: torch.Tensor, fp8_activations: bool = False) -> torch.Tensor:
    """``[E, N, K/32]`` E8M0 bytes -> Marlin ``[E, K/32, N]`` bytes (pure permutation, or +6 for FP8)."""
    E = scales.shape[0]
    s = scales.transpose(1, 2).contiguous()  # [E, K/32, N]
    shape = s.shape
    s = s.reshape(E, -1, 64)[:, :, _SCALE_PERM].reshape(shape)
    if fp8_activations:
        if int(s.max()) > 249:
            raise MxRepackError("Marlin FP8-activation scales need every E8M0 byte <= 249 (exponent + 6)")
        return s + 6
    return s.reshape(E, -1, 4)[:, :, _E8M0_SWAP].reshape(shape)


def unpermute_scales(s: torch.Tensor, fp8_activations: bool = False) -> torch.Tensor:
    E, shape = s.shape[0], s.shape
    s = s - 6 if fp8_activations else s.reshape(E, -1, 4)[:, :, _E8M0_SWAP].reshape(shape)
    inv = torch.argsort(_SCALE_PERM)
    return s.reshape(E, -1, 64)[:, :, inv].reshape(shape).transpose(1, 2).contiguous()


def permute_bias(bias: torch.Tensor) -> torch.Tensor:
    return bias.reshape(bias.shape[0], -1, 32)[:, :, _BIAS_PERM].reshape(bias.shape)


def unpermute_bias(bias: torch.Tensor) -> torch.Tensor:
    return bias.reshape(bias.shape[0], -1, 32)[:, :, torch.argsort(_BIAS_PERM)].reshape(bias.shape)


class MarlinLayout(ExpertLayout):
    name = "marlin"
    description = ("vLLM Marlin MXFP4 MoE: hidden padded to 256, intermediate to 128; int32 [E,K/16,2N] repacked "
                   "weights, permuted E8M0 scales [E,K/32,N], permuted bf16 biases")

    def __init__(self, fp8_activations: bool = False):
        self.fp8_activations = fp8_activations

    def padded(self, d: ExpertDims) -> tuple[int, int]:
        return round_up(d.hidden, 256), round_up(d.intermediate, 128)

    def outputs(self, d: ExpertDims) -> list[OutputSpec]:
        H, I, E = d.hidden, d.intermediate, d.experts
        Hp, Ip = self.padded(d)
        pad = {"hidden": [H, Hp], "intermediate": [I, Ip]}
        fp8 = self.fp8_activations

        def w13(gate_up_proj_blocks):
            x = gate_up_proj_blocks.flatten(2)
            return repack_weight(pad_rows_cols(x, 2 * Ip, Hp // 2))

        def w13_scale(gate_up_proj_scales):
            return permute_scales(pad_rows_cols(gate_up_proj_scales, 2 * Ip, Hp // 32), fp8).view(torch.float8_e8m0fnu)

        def w13_bias(gate_up_proj_bias):
            return permute_bias(pad_rows_cols(gate_up_proj_bias.unsqueeze(-1), 2 * Ip, 1).squeeze(-1).to(torch.bfloat16))

        def w2(down_proj_blocks):
            return repack_weight(pad_rows_cols(down_proj_blocks.flatten(2), Hp, Ip // 2))

        def w2_scale(down_proj_scales):
            return permute_scales(pad_rows_cols(down_proj_scales, Hp, Ip // 32), fp8).view(torch.float8_e8m0fnu)

        def w2_bias(down_proj_bias):
            return permute_bias(pad_rows_cols(down_proj_bias.unsqueeze(-1), Hp, 1).squeeze(-1).to(torch.bfloat16))

        u = UPSTREAM + (" with FP8-activation scales (+6)" if fp8 else "")
        return [
            OutputSpec("w13_weight", torch.int32, (E, Hp // 16, 4 * Ip), ("gate_up_proj_blocks",), w13, (E, H // 16, 4 * I), pad, u, 6),
            OutputSpec("w13_weight_scale", torch.float8_e8m0fnu, (E, Hp // 32, 2 * Ip), ("gate_up_proj_scales",), w13_scale, (E, H // 32, 2 * I), pad, u),
            OutputSpec("w13_bias", torch.bfloat16, (E, 2 * Ip), ("gate_up_proj_bias",), w13_bias, (E, 2 * I), pad, u),
            OutputSpec("w2_weight", torch.int32, (E, Ip // 16, 2 * Hp), ("down_proj_blocks",), w2, (E, I // 16, 2 * H), pad, u, 6),
            OutputSpec("w2_weight_scale", torch.float8_e8m0fnu, (E, Ip // 32, Hp), ("down_proj_scales",), w2_scale, (E, I // 32, H), pad, u),
            OutputSpec("w2_bias", torch.bfloat16, (E, Hp), ("down_proj_bias",), w2_bias, (E, H), pad, u),
        ]

    def unpack_padded(self, stored: dict[str, torch.Tensor], d: ExpertDims) -> dict[str, torch.Tensor]:
        fp8 = self.fp8_activations
        w13, w2 = unrepack_weight(stored["w13_weight"]), unrepack_weight(stored["w2_weight"])
        E = w13.shape[0]
        return {
            "gate_up_proj_blocks": w13.reshape(E, w13.shape[1], -1, 16),
            "gate_up_proj_scales": unpermute_scales(stored["w13_weight_scale"].view(torch.uint8), fp8),
            "gate_up_proj_bias": unpermute_bias(stored["w13_bias"]),
            "down_proj_blocks": w2.reshape(E, w2.shape[1], -1, 16),
            "down_proj_scales": unpermute_scales(stored["w2_weight_scale"].view(torch.uint8), fp8),
            "down_proj_bias": unpermute_bias(stored["w2_bias"]),
        }


LAYOUT = MarlinLayout()
