"""Decode-time MXFP4 GEMV ``y = x @ W.T + b`` for a few rows of BF16 activations (W4A16), on CUDA cores.

At M = 1 a tensor-core tile is 15/16 padding and the dequantized weights must be moved into the MMA
operand layout; what bounds the time is streaming the packed weights and the instructions spent on
decoding them. So this kernel does no ``tl.dot``: each program owns ``BLOCK_N`` weight rows and walks K
holding ``[BLOCK_N, BLOCK_K/32, 4]`` int32 words, so that each thread loads a whole scale group (32
codes, 16 bytes) in one 128-bit load, decodes it, multiplies by the activations and sums the group in
registers before its scale is applied (one multiply per 32 weights). The next K tile is loaded before
the current one is decoded. Full K tiles run unmasked; a partial last tile is a separate masked step. Rows of x are separate programs, adjacent in the grid so
that they share a weight tile through L2.

Decoding: a code's sign goes to fp16 bit 15 and its three exponent/mantissa bits to bits 9..11, which
reads as ``value * 2^-14`` (E2M1's subnormal 0.5 is fp16's subnormal too); the fp16 -> fp32 widening
is exact and the 2^14 is applied once per output. ``DECODE="asm"`` (CUDA only) does it two codes at a
time on the two halves of a 32-bit word, ``(q & 0x80008000) | ((q & 0x70007000) >> 3)`` for the codes
in the top nibble of each half, about 2 integer instructions per code instead of 4-5; ``"ops"`` is the
same arithmetic in portable Triton (and runs under the interpreter).
The torch reference is :func:`mxrepack.kernels.reference.mxfp4_linear`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

TWO_POW_M127 = tl.constexpr(5.877471754111438e-39)  # E8M0 byte 0: 2^-127 is an fp32 subnormal, not (0 << 23)


@dataclass(frozen=True)
class GemvConfig:
    block_n: int = 64
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 3
    decode: str = "ops"  # "ops" (portable Triton integer ops) or "asm" (PTX; CUDA only)

    def name(self) -> str:
        return f"n{self.block_n}k{self.block_k}w{self.num_warps}st{self.num_stages}{self.decode}"


@triton.jit
def _decode_ops(w):
    """int32 words of eight codes (code j at bits 4j..4j+3) -> eight fp32 tensors, E2M1 value * 2^-14."""
    out = ()
    for j in tl.static_range(8):
        c = w >> (4 * j)
        bits = ((c & 8) << 12) | ((c & 7) << 9)  # sign -> fp16 bit 15, exponent/mantissa -> bits 9..11
        out = out + (bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32),)
    return out


@triton.jit
def _decode_asm(w):
    """The same in PTX: two codes per instruction group, on the two fp16 halves of a 32-bit word."""
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 q, t, p;
        .reg .b16 lo, hi;
        mov.b32 q, $8;
        and.b32 t, q, 0x70007000; shr.b32 t, t, 3; lop3.b32 p, q, t, 0x80008000, 0xEC;
        mov.b32 {lo, hi}, p; cvt.f32.f16 $3, lo; cvt.f32.f16 $7, hi;
        shl.b32 q, q, 4;
        and.b32 t, q, 0x70007000; shr.b32 t, t, 3; lop3.b32 p, q, t, 0x80008000, 0xEC;
        mov.b32 {lo, hi}, p; cvt.f32.f16 $2, lo; cvt.f32.f16 $6, hi;
        shl.b32 q, q, 4;
        and.b32 t, q, 0x70007000; shr.b32 t, t, 3; lop3.b32 p, q, t, 0x80008000, 0xEC;
        mov.b32 {lo, hi}, p; cvt.f32.f16 $1, lo; cvt.f32.f16 $5, hi;
        shl.b32 q, q, 4;
        and.b32 t, q, 0x70007000; shr.b32 t, t, 3; lop3.b32 p, q, t, 0x80008000, 0xEC;
        mov.b32 {lo, hi}, p; cvt.f32.f16 $0, lo; cvt.f32.f16 $4, hi;
        }
        """,
        constraints="=r,=r,=r,=r,=r,=r,=r,=r,r",
        args=[w], dtype=(tl.float32,) * 8, is_pure=True, pack=1)


@triton.jit
def _split8(x, G: tl.constexpr):
    """x [1, G, 32] -> eight [1, G, 4] tensors, the j-th holding x[.., 8 * word + j]."""
    x = tl.reshape(x, (1, G, 4, 2, 2, 2))  # index bits of j, high to low
    e, o = tl.split(x)  # j bit 0
    ee, eo = tl.split(e)  # j bit 1
    oe, oo = tl.split(o)
    x0, x4 = tl.split(ee)  # j bit 2
    x2, x6 = tl.split(eo)
    x1, x5 = tl.split(oe)
    x3, x7 = tl.split(oo)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _accumulate(acc, w, s, x, G: tl.constexpr, DECODE: tl.constexpr):
    """acc[n, g] += scale[n, g] * (W[n, group g] . x[group g]) for the G groups of one K tile."""
    xs = _split8(x.to(tl.float32), G)
    if DECODE == "asm":
        vs = _decode_asm(w)
    else:
        vs = _decode_ops(w)
    part = vs[0] * xs[0]
    for j in tl.static_range(1, 8):
        part += vs[j] * xs[j]
    dot = tl.sum(part, axis=2)
    s = s.to(tl.int32)
    scale = tl.where(s == 0, TWO_POW_M127, (s << 23).to(tl.float32, bitcast=True))  # 2^(s-127)
    return acc + dot * scale


@triton.jit
def gemv_rows(x_ptr, w_ptr, ws_ptr, rn, K, stride_wn, stride_wsn,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DECODE: tl.constexpr):
    """``W[rn, :K] @ x[:K]`` in fp32 for ``BLOCK_N`` valid row indices ``rn`` (clamp them, no mask here);
    ``x_ptr`` points at one bf16 row of at least K values. Shared by the dense and the MoE decode kernels."""
    G: tl.constexpr = BLOCK_K // 32
    rg = tl.arange(0, G)
    # [BLOCK_N, G, 4] int32 words: a thread holds whole groups (16 bytes, one load); a row is a multiple
    # of 16 bytes (K % 32 == 0 for dense rows; padded to 128 in the MoE layouts)
    row_words = tl.multiple_of(rn * (stride_wn // 4), 4)
    w_ptrs = (w_ptr.to(tl.pointer_type(tl.int32)) + row_words[:, None, None] + rg[None, :, None] * 4
              + tl.arange(0, 4)[None, None, :])
    s_ptrs = ws_ptr + rn[:, None] * stride_wsn + rg[None, :]
    x_ptrs = x_ptr + rg[None, :, None] * 32 + tl.arange(0, 32)[None, None, :]
    acc = tl.zeros((BLOCK_N, G), dtype=tl.float32)  # reduced over groups once, after the loop
    k_full = K - K % BLOCK_K
    if k_full > 0:
        # the next tile is loaded before this one is decoded, so that two tiles per program are in flight
        w, s, x = tl.load(w_ptrs), tl.load(s_ptrs), tl.load(x_ptrs)
        for _ in range(BLOCK_K, k_full, BLOCK_K):
            w_ptrs += BLOCK_K // 8
            s_ptrs += G
            x_ptrs += BLOCK_K
            w_next, s_next, x_next = tl.load(w_ptrs), tl.load(s_ptrs), tl.load(x_ptrs)
            acc = _accumulate(acc, w, s, x, G, DECODE)
            w, s, x = w_next, s_next, x_next
        acc = _accumulate(acc, w, s, x, G, DECODE)
        w_ptrs += BLOCK_K // 8
        s_ptrs += G
        x_ptrs += BLOCK_K
    if k_full < K:  # a partial last tile: mask whole groups
        g_ok = rg < (K - k_full) // 32
        w = tl.load(w_ptrs, mask=g_ok[None, :, None], other=0)
        s = tl.load(s_ptrs, mask=g_ok[None, :], other=127)
        x = tl.load(x_ptrs, mask=g_ok[None, :, None], other=0.0)
        acc = _accumulate(acc, w, s, x, G, DECODE)
    return tl.sum(acc, axis=1) * 16384.0  # the decoded values were E2M1 * 2^-14


@triton.jit
def _gemv_mxfp4_kernel(x_ptr, w_ptr, ws_ptr, b_ptr, y_ptr, N, K, stride_xm, stride_wn, stride_wsn, stride_ym,
                       HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DECODE: tl.constexpr):
    m = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    rn_load = tl.minimum(rn, N - 1)  # rows past N re-read the last row, so that the loads need no mask
    y = gemv_rows(x_ptr + m * stride_xm, w_ptr, ws_ptr, rn_load, K, stride_wn, stride_wsn, BLOCK_N, BLOCK_K, DECODE)
    if HAS_BIAS:
        y += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * stride_ym + rn, y.to(y_ptr.dtype.element_ty), mask=n_ok)


# Best of a sweep at M = 1 on H100 (benchmarks/gpu_check.py, docs/PERF.md): wide layers (lm_head) take 64
# rows x 128 k per program; narrow ones (q/k/v/o) 8 rows x 512 k, so that they still fill the GPU.
WIDE = GemvConfig(64, 128, 4, 1, "asm")
NARROW = GemvConfig(8, 512, 4, 1, "asm")


def pick_gemv_config(N: int, sm_count: int = 132, cuda: bool = True) -> GemvConfig:
    cfg = WIDE if triton.cdiv(N, WIDE.block_n) >= 4 * sm_count else NARROW
    return cfg if cuda else dataclasses.replace(cfg, decode="ops")


def gemv_mxfp4(x: torch.Tensor, w_packed: torch.Tensor, w_scales: torch.Tensor, bias: torch.Tensor | None,
               out: torch.Tensor, config: GemvConfig | None = None) -> torch.Tensor:
    """``x [M, K]`` bf16 (M small) times MXFP4 ``W [N, K]`` -> ``out [M, N]``; shapes checked by the caller."""
    M, K = x.shape
    N = w_packed.shape[0]
    # the kernel reads rows as 16-byte-aligned int32 words
    if w_packed.stride(1) != 1 or w_packed.stride(0) % 16:
        w_packed = w_packed.contiguous()
    if w_packed.data_ptr() % 16:
        w_packed = w_packed.clone()  # contiguous() keeps a misaligned storage offset; a copy does not
    cfg = config or pick_gemv_config(N, sm_count(x.device), x.device.type == "cuda")
    x = x.contiguous()
    grid = (M, triton.cdiv(N, cfg.block_n))
    _gemv_mxfp4_kernel[grid](x, w_packed, w_scales, bias if bias is not None else w_scales, out, N, K,
                             x.stride(0), w_packed.stride(0), w_scales.stride(0), out.stride(0),
                             HAS_BIAS=bias is not None, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, DECODE=cfg.decode,
                             num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


@functools.cache
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (132, an H100/H200, off CUDA); cached, as it is asked per launch."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132
