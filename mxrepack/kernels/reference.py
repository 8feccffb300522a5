"""Torch reference GEMMs: the ground truth fast kernels and layouts are checked against.

They unpack inside the function, so a layout bug shows up as a wrong product, not only as a
wrong byte. fp32 accumulation throughout; activations are used as given (bf16 stays exact in fp32).
"""

from __future__ import annotations

import torch

from mxrepack.quant import dequantize_mxfp4


def mxfp4_linear(x: torch.Tensor, blocks: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``y = x @ W.T + b`` for an MXFP4 weight ``W [N, K]`` (blocks ``[N, K/32, 16]`` or ``[N, K/2]``)."""
    w = dequantize_mxfp4(blocks, scales, torch.float32)
    y = x.to(torch.float32) @ w.T
    return y if bias is None else y + bias.to(torch.float32)


def gpt_oss_swiglu(gate_up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """gpt-oss's gated activation on interleaved ``[..., 2I]`` (even = gate, odd = up)."""
    gate = gate_up[..., ::2].clamp(max=limit)
    up = gate_up[..., 1::2].clamp(-limit, limit)
    return (up + 1) * gate * torch.sigmoid(alpha * gate)


def expert_mlp(x: torch.Tensor, weights: dict[str, torch.Tensor], expert: int) -> torch.Tensor:
    """One expert of a gpt-oss MoE layer on tokens ``x [T, H]`` from dense weights
    (``mxrepack.layouts.dense_weights`` form: ``[E, out, in]``)."""
    h = x.to(torch.float32) @ weights["gate_up_proj"][expert].T + weights["gate_up_proj_bias"][expert]
    return gpt_oss_swiglu(h) @ weights["down_proj"][expert].T + weights["down_proj_bias"][expert]
