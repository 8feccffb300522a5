"""Torch reference GEMMs: the ground truth fast kernels and layouts are checked against.

They unpack inside the function, so a layout bug shows up as a wrong product, not only as a
wrong byte. fp32 accumulation throughout; activations are used as given (bf16 stays exact in fp32).
"""

from __future__ import annotations

import torch

from mxrepack.quant import dequantize_mxfp4


def mxfp4_linear(
    x: torch.Tensor, blocks: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
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


def layout_moe_reference(
    x: torch.Tensor,
    stored: dict[str, torch.Tensor],
    layout,
    dims,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    padded: bool = True,
) -> torch.Tensor:
    """A gpt-oss MoE block computed from a layout's stored tensors (by suffix), unpacked in here.

    ``x [T, H]``, ``topk_ids``/``topk_weights [T, k]``. With ``padded`` the product runs at the layout's
    padded sizes (``x`` zero-padded on K, the output cropped to H), i.e. on exactly the bytes a consumer
    kernel reads, which is how padding is shown to be inert; otherwise on the cropped source.
    """
    from mxrepack.layouts import dense_weights

    parts = layout.unpack_padded(stored, dims) if padded else layout.unpack(stored, dims)
    w = dense_weights(parts)
    # A layout may pad the two projections' shared widths differently (triton_kernels pads value rows
    # and scale rows to different multiples): widen the shorter side with zeros so the chain composes.
    inter = max(w["gate_up_proj"].shape[1] // 2, w["down_proj"].shape[2])
    gu = w["gate_up_proj"]
    w["gate_up_proj"] = torch.nn.functional.pad(gu, (0, 0, 0, 2 * inter - gu.shape[1]))
    w["gate_up_proj_bias"] = torch.nn.functional.pad(w["gate_up_proj_bias"], (0, 2 * inter - gu.shape[1]))
    w["down_proj"] = torch.nn.functional.pad(w["down_proj"], (0, inter - w["down_proj"].shape[2]))
    H = x.shape[1]
    xp = torch.nn.functional.pad(x.to(torch.float32), (0, w["gate_up_proj"].shape[2] - H))
    out = torch.zeros(x.shape[0], w["down_proj"].shape[1])
    for e in topk_ids.unique().tolist():
        rows, slot = (topk_ids == e).nonzero(as_tuple=True)
        out[rows] += topk_weights[rows, slot, None].to(torch.float32) * expert_mlp(xp[rows], w, e)
    return out[:, :H]
