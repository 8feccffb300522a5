"""On-the-fly MX quantization of activations in Triton (for the W4A8 and W4A4 GEMM modes).

Rows of ``x [M, K]`` (K % 32 == 0) are cut into groups of 32; each group gets an E8M0 scale by the OCP
rule (``floor(log2(amax)) - emax``, emax 2 for E2M1 and 8 for E4M3; an all-zero group gets 2^-127) and
its elements are scaled and rounded to nearest-even: to E4M3 (saturating at 448) or to E2M1 codes
packed two per byte, low nibble first. The bytes equal ``mxrepack.quant.quantize_mxfp8/mxfp4`` with
``scale_rule="ocp"`` (tested), so the torch codec is this kernel's reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MX_FORMATS = ("e4m3", "e2m1")


@triton.jit
def _e2m1_codes(a):
    """Scaled fp32 values -> E2M1 codes (uint8): nearest, ties to the even code, saturating at 6."""
    m = tl.abs(a)
    code = (m > 0.25).to(tl.uint8) + (m >= 0.75).to(tl.uint8) + (m > 1.25).to(tl.uint8) + (m >= 1.75).to(tl.uint8)
    code += (m > 2.5).to(tl.uint8) + (m >= 3.5).to(tl.uint8) + (m > 5.0).to(tl.uint8)
    return code | ((a < 0).to(tl.uint8) << 3)


@triton.jit
def _round_to_e4m3_grid(q):
    """Round fp32 to the nearest E4M3 value (ties to even) in fp32, so the later cast is exact whatever
    rounding the backend's fp32->fp8 conversion uses (the interpreter's differs from the hardware's)."""
    biased = (tl.abs(q).to(tl.int32, bitcast=True) >> 23) & 0xFF
    ulp_log2 = tl.maximum(biased - 127, -6) - 3  # 3 mantissa bits; subnormals below 2^-6
    to_units = ((127 - ulp_log2) << 23).to(tl.float32, bitcast=True)
    from_units = ((127 + ulp_log2) << 23).to(tl.float32, bitcast=True)
    y = q * to_units  # |y| < 16: adding 1.5 * 2^23 rounds it to an integer, ties to even
    y = (y + 12582912.0) - 12582912.0
    return tl.where(y == 0.0, q * 0.0, y * from_units)  # keep the sign of values that round to zero


@triton.jit
def mx_quantize_tile(x, FMT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """An fp32 tile ``[BLOCK_M, BLOCK_K]`` -> (values, E8M0 scales ``[BLOCK_M, BLOCK_K // 32]``).

    Values are float8e4nv ``[BLOCK_M, BLOCK_K]`` (FMT "e4m3") or packed uint8 ``[BLOCK_M, BLOCK_K // 2]``
    (FMT "e2m1"), ready for ``tl.dot_scaled``.
    """
    g = tl.reshape(x, (BLOCK_M, BLOCK_K // 32, 32))
    amax = tl.max(tl.abs(g), axis=2)
    biased = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF  # exponent field of the group max
    emax: tl.constexpr = 2 if FMT == "e2m1" else 8
    e = tl.where(biased == 0, -127, biased - 127 - emax)
    e = tl.minimum(tl.maximum(e, -127), 127)
    # multiply by 2^-e (always a normal float) instead of dividing by a possibly subnormal 2^e
    inv = ((127 - e) << 23).to(tl.float32, bitcast=True)
    inv = tl.where(e == -127, 1.7014118346046923e38, inv)  # 2^127: (127 - -127) overflows the field
    q = g * inv[:, :, None]
    scales = (e + 127).to(tl.uint8)
    if FMT == "e2m1":
        codes = tl.reshape(_e2m1_codes(q), (BLOCK_M, BLOCK_K // 2, 2))
        lo, hi = tl.split(codes)
        return lo | (hi << 4), scales
    else:
        q = tl.minimum(tl.maximum(_round_to_e4m3_grid(q), -448.0), 448.0)
        return tl.reshape(q, (BLOCK_M, BLOCK_K)).to(tl.float8e4nv), scales


@triton.jit
def _quantize_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    M,
    K,
    stride_xm,
    stride_qm,
    stride_sm,
    FMT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m, pid_k = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
    q, s = mx_quantize_tile(x.to(tl.float32), FMT, BLOCK_M, BLOCK_K)
    rs = pid_k * (BLOCK_K // 32) + tl.arange(0, BLOCK_K // 32)
    tl.store(s_ptr + rm[:, None] * stride_sm + rs[None, :], s, mask=(rm[:, None] < M) & (rs[None, :] < K // 32))
    if FMT == "e2m1":
        rq = pid_k * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
        tl.store(q_ptr + rm[:, None] * stride_qm + rq[None, :], q, mask=(rm[:, None] < M) & (rq[None, :] < K // 2))
    else:
        tl.store(q_ptr + rm[:, None] * stride_qm + rk[None, :], q, mask=(rm[:, None] < M) & (rk[None, :] < K))


def quantize_activations(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` -> (values, E8M0 uint8 scales ``[M, K/32]``); fmt "e4m3" (float8_e4m3fn ``[M, K]``)
    or "e2m1" (packed uint8 ``[M, K/2]``)."""
    if fmt not in MX_FORMATS:
        raise ValueError(f"fmt must be one of {MX_FORMATS}, got {fmt!r}")
    M, K = x.shape
    if K % 32:
        raise ValueError(f"K={K} is not a multiple of 32")
    x = x.contiguous()
    q = (
        torch.empty(M, K // 2, dtype=torch.uint8, device=x.device)
        if fmt == "e2m1"
        else torch.empty(M, K, dtype=torch.float8_e4m3fn, device=x.device)
    )
    s = torch.empty(M, K // 32, dtype=torch.uint8, device=x.device)
    BM, BK = 16, 128
    _quantize_kernel[(triton.cdiv(M, BM), triton.cdiv(K, BK))](
        x, q, s, M, K, x.stride(0), q.stride(0), s.stride(0), FMT=fmt, BLOCK_M=BM, BLOCK_K=BK
    )
    return q, s
