"""Decode-time MXFP4 GEMV ``y = x @ W.T + b`` for a few rows of BF16 activations (W4A16), on CUDA cores.

At M = 1 a tensor-core tile is 15/16 padding and the dequantized weights must be moved into the MMA
operand layout; what bounds the time is streaming the packed weights and the instructions spent on
decoding them. So this kernel does no ``tl.dot``: each program owns ``BLOCK_N`` weight rows and walks K
holding ``[BLOCK_N, BLOCK_K/32, 4]`` int32 words, so that each thread loads a whole scale group (32
codes, 16 bytes) in one 128-bit load, decodes it, multiplies by the activations and sums the group in
registers before its scale is applied (one multiply per 32 weights). The next K tile is loaded before
the current one is decoded. Full K tiles run unmasked; a partial last tile is a separate masked step.
Rows of x are separate programs, adjacent in the grid so that they share a weight tile through L2; or, with
``GemvConfig.rows``, one program runs several rows and decodes each weight once for all of them (q/k/v/o at
M = 2 and 4: :data:`NARROW_ROWS`).

Decoding: a code's sign goes to fp16 bit 15 and its three exponent/mantissa bits to bits 9..11, which
reads as ``value * 2^-14`` (E2M1's subnormal 0.5 is fp16's subnormal too); the fp16 -> fp32 widening
is exact and the 2^14 is applied once per output. ``DECODE="asm"`` (CUDA only) does it two codes at a
time on the two halves of a 32-bit word, ``(q & 0x80008000) | ((q & 0x70007000) >> 3)`` for the codes
in the top nibble of each half, about 2 integer instructions per code instead of 4-5; ``"ops"`` is the
same arithmetic in portable Triton (and runs under the interpreter).
``DECODE="f16x2"`` (lm_head; q/k/v/o at 2-4 rows) does the math in packed fp16 instead: a small kernel first puts the
activations in fp16 pairs in the decode's order, each group of 32 rescaled by a power of two into fp16's
range; then eleven PTX instructions decode a word's eight codes into four fp16 pairs and four
``fma.rn.f16x2`` multiply and add them, with no widening: about 1.9 instructions per code instead of 3.5.
``"f16x2-ops"`` is its portable twin. See the section below for the numerics.
The torch reference is :func:`mxrepack.kernels.reference.mxfp4_linear`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from mxrepack.kernels import cdiv
from mxrepack.kernels.dequant_mxfp4 import (
    chunk_lane_scales,
    chunk_word_values,
    e8m0_to_fp32,
    launches_dependents,
    shift_scales,
    unshift,
)
from mxrepack.kernels.launch import Launcher


@dataclass(frozen=True)
class GemvConfig:
    block_n: int = 64
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 3
    # "ops" / "asm": fp32 math on bf16 activations, decoded by portable Triton integer ops or by PTX (CUDA
    # only); "f16x2" / "f16x2-ops": packed fp16 math on prepared activations, PTX or its portable twin
    decode: str = "ops"
    prefetch: int = 1  # f16x2 path: K tiles of weights loaded ahead of the one being multiplied (1 or 2)
    # f16x2 path, CUDA sm_90+: programmatic dependent launch. Each GEMV is launched while the kernel before
    # it (the activation-preparing one; for the MoE down GEMV, the gate_up one) still runs: its programs
    # request their first weight tiles, then wait (``griddepcontrol.wait``) for the activations. The launch
    # gap and the previous kernel's tail then overlap weight streaming. 0 or 1.
    pdl: int = 0
    # f16x2 path, dense only: rows of x per program, each weight decoded once for all of them (0: one row per program,
    # the programs of a weight tile adjacent in the grid and sharing it through L2). A power of 2.
    rows: int = 0

    def __post_init__(self):
        if self.pdl not in (0, 1):
            raise ValueError(f"pdl must be 0 or 1, got {self.pdl}")
        if self.rows and (not self.prepared or self.rows & (self.rows - 1)):
            raise ValueError(
                f"rows={self.rows}: a power of 2 on the f16x2 path (prepared activations), got {self.decode!r}"
            )
        if self.pdl and self.decode != "f16x2":
            raise ValueError(f"pdl={self.pdl} needs decode='f16x2' (CUDA, prepared activations), got {self.decode!r}")

    def launched(self, m: int) -> GemvConfig:
        """The configuration as it runs for ``m`` rows of x: a row block never passes m (the last block is shifted back
        to end at m), and a block of one row is the one-row kernel (``rows`` 0)."""
        rows = self.rows
        while rows > m:
            rows //= 2
        return dataclasses.replace(self, rows=rows if rows > 1 else 0)

    def name(self) -> str:
        ahead = f"p{self.prefetch}" if self.prefetch != 1 else ""
        pdl = f"pdl{self.pdl}" if self.pdl else ""
        rows = f"r{self.rows}" if self.rows else ""
        return f"n{self.block_n}k{self.block_k}w{self.num_warps}st{self.num_stages}{ahead}{self.decode}{pdl}{rows}"

    @property
    def prepared(self) -> bool:
        """The f16x2 path: activations prepared as fp16 pairs (:func:`prepare_x`) before the GEMV."""
        return self.decode.startswith("f16x2")

    @property
    def math(self) -> str:
        """ "asm" (inline PTX, CUDA only) or "ops" (portable Triton, runs under the interpreter)."""
        return "asm" if self.decode in ("asm", "f16x2") else "ops"

    def portable(self) -> GemvConfig:
        """The same configuration without PTX, for the interpreter and CPU."""
        return dataclasses.replace(
            self, decode={"asm": "ops", "f16x2": "f16x2-ops"}.get(self.decode, self.decode), pdl=0
        )

    def launch_options(self) -> dict:
        opts = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        return opts | {"launch_pdl": True} if self.pdl else opts


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
        args=[w],
        dtype=(tl.float32,) * 8,
        is_pure=True,
        pack=1,
    )


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
def _decode(w, DECODE: tl.constexpr):
    if DECODE == "asm":
        vs = _decode_asm(w)
    else:
        vs = _decode_ops(w)
    return vs


@triton.jit
def _dot_groups(acc, vs, s, xs):
    """acc[n, g] += scale[n, g] * (W[n, group g] . x[group g]): W's K tile decoded (``vs``) and x split
    (:func:`_split8`), eight tensors each."""
    part = vs[0] * xs[0]
    for j in tl.static_range(1, 8):
        part += vs[j] * xs[j]
    dot = tl.sum(part, axis=2)
    return acc + dot * e8m0_to_fp32(s.to(tl.int32))


@triton.jit
def _accumulate(acc, w, s, x, G: tl.constexpr, DECODE: tl.constexpr):
    """acc[n, g] += scale[n, g] * (W[n, group g] . x[group g]) for the G groups of one K tile."""
    xs = _split8(x.to(tl.float32), G)
    return _dot_groups(acc, _decode(w, DECODE), s, xs)


@triton.jit
def _weight_ptrs(w_ptr, rn, stride_wn, G: tl.constexpr, TILE_ROWS: tl.constexpr):
    """``[BLOCK_N, G, 4]`` int32 word pointers to the first K tile of rows ``rn``: a thread holds whole groups
    (16 bytes, one load); a row is a multiple of 16 bytes (K % 32 == 0 for dense rows; padded to 128 in
    the MoE layouts). ``TILE_ROWS`` 0: row-major rows of ``stride_wn`` bytes. ``TILE_ROWS`` R: the strided
    MoE layout's K-tiled rows, ``[N / R, Kp / 128, R, 64]`` bytes (``stride_wn`` still Kp / 2), in which one K
    step of R rows is contiguous (``mxrepack.layouts.strided``)."""
    rg = tl.arange(0, G)
    if TILE_ROWS:
        r_local = rn % TILE_ROWS
        row_words = tl.multiple_of((rn - r_local) * (stride_wn // 4) + r_local * 16, 4)
        group_words = (rg // 4) * (TILE_ROWS * 16) + (rg % 4) * 4  # 4 groups per 64-byte K tile
    else:
        row_words = tl.multiple_of(rn * (stride_wn // 4), 4)
        group_words = rg * 4
    return (
        w_ptr.to(tl.pointer_type(tl.int32))
        + row_words[:, None, None]
        + group_words[None, :, None]
        + tl.arange(0, 4)[None, None, :]
    )


@triton.jit
def gemv_rows(
    x_ptr,
    w_ptr,
    ws_ptr,
    rn,
    K,
    stride_wn,
    stride_wsn,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DECODE: tl.constexpr,
    TILE_ROWS: tl.constexpr = 0,
):
    """``W[rn, :K] @ x[:K]`` in fp32 for ``BLOCK_N`` valid row indices ``rn`` (clamp them, no mask here);
    ``x_ptr`` points at one bf16 row of at least K values. Shared by the dense and the MoE decode kernels.
    A partial K tile (K % BLOCK_K) is loaded first, in flight with the first full tile, and multiplied first.
    ``TILE_ROWS``: 0 for row-major weights, else the K-tiled MoE layout's row tile (:func:`_weight_ptrs`)."""
    G: tl.constexpr = BLOCK_K // 32
    rg = tl.arange(0, G)
    w_ptrs = _weight_ptrs(w_ptr, rn, stride_wn, G, TILE_ROWS)
    # words from one K tile to the next (tiled: BLOCK_K // 128 whole 64-byte tiles of TILE_ROWS rows)
    W_STEP: tl.constexpr = (BLOCK_K // 128) * TILE_ROWS * 16 if TILE_ROWS else BLOCK_K // 8
    s_ptrs = ws_ptr + rn[:, None] * stride_wsn + rg[None, :]
    x_ptrs = x_ptr + rg[None, :, None] * 32 + tl.arange(0, 32)[None, None, :]
    acc = tl.zeros((BLOCK_N, G), dtype=tl.float32)  # reduced over groups once, after the loop
    n_full = K // BLOCK_K
    k_full = n_full * BLOCK_K
    # The partial tile's loads go out first. Loaded last (as up to stop 10) they waited, alone, for a whole
    # memory latency at the end of every program; this way they overlap the first full tile's
    # (lm_head 0.1173 ms against 0.1364 in the same run, docs/PERF_LOG.md stop 11).
    g_ok = rg < (K - k_full) // 32  # the partial tile's whole groups (none when BLOCK_K divides K)
    wt = tl.load(w_ptrs + n_full * W_STEP, mask=g_ok[None, :, None], other=0)
    st = tl.load(s_ptrs + n_full * G, mask=g_ok[None, :], other=127)
    xt = tl.load(x_ptrs + k_full, mask=g_ok[None, :, None], other=0.0)
    if n_full > 0:
        # the next tile is loaded before this one is decoded, so that two tiles per program are in flight
        w, s, x = tl.load(w_ptrs), tl.load(s_ptrs), tl.load(x_ptrs)
        if k_full < K:
            acc = _accumulate(acc, wt, st, xt, G, DECODE)
        for t in range(1, n_full):
            w_next = tl.load(w_ptrs + t * W_STEP)
            s_next = tl.load(s_ptrs + t * G)
            x_next = tl.load(x_ptrs + t * BLOCK_K)
            acc = _accumulate(acc, w, s, x, G, DECODE)
            w, s, x = w_next, s_next, x_next
        acc = _accumulate(acc, w, s, x, G, DECODE)
    elif k_full < K:
        acc = _accumulate(acc, wt, st, xt, G, DECODE)
    return tl.sum(acc, axis=1) * 16384.0  # the decoded values were E2M1 * 2^-14


@triton.jit
def _store_rows(y, b_ptr, y_row, rn, N, HAS_BIAS: tl.constexpr):
    """The dense GEMVs' epilogue: + bias, stored to the output row for the rows ``rn`` below ``N``."""
    n_ok = rn < N
    if HAS_BIAS:
        y += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(y_row + rn, y.to(y_row.dtype.element_ty), mask=n_ok)


@triton.jit
def _gemv_mxfp4_kernel(
    x_ptr,
    w_ptr,
    ws_ptr,
    b_ptr,
    y_ptr,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_wsn,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DECODE: tl.constexpr,
):
    """One row of x per program; the row programs of a weight tile are adjacent and share it through L2."""
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_load = tl.minimum(rn, N - 1)  # rows past N re-read the last row, so that the loads need no mask
    m = tl.program_id(0)
    y = gemv_rows(x_ptr + m * stride_xm, w_ptr, ws_ptr, rn_load, K, stride_wn, stride_wsn, BLOCK_N, BLOCK_K, DECODE)
    _store_rows(y, b_ptr, y_ptr + m * stride_ym, rn, N, HAS_BIAS)


# -- f16x2 math on prepared activations ------------------------------------------------------------
# The fp32 path above spends per code ~1.5 decode instructions, one fp16 -> fp32 widening and one FFMA.
# Here the decoded fp16 pair itself is the operand of a packed ``fma.rn.f16x2`` (two codes per
# instruction, no widening), which needs the activations as fp16 pairs in the decode's order and in a
# range where fp16 keeps their precision. A small kernel prepares them once per row: each group of 32 is
# scaled by 2^(14 - e), e = the exponent of its largest magnitude, so that the largest is in [2^14, 2^15),
# products of it with value * 2^-14 stay below 12 and a group's sum below 400; the 2^e comes back with the
# weight's scale. fp16 accumulation over one group (16 pairs, two chains) adds ~6e-4 relative error, a
# third of the bf16 output rounding (simulated over normal, outlier-heavy and wide-range activations).


@triton.jit
def pack_groups(v, GB: tl.constexpr):
    """v [GB, 32] fp32 (bf16 values) -> (pairs [GB, 16] int32, factors [GB] fp32): each group rescaled by
    2^(14 - e), e = the exponent of its largest magnitude, as fp16 pairs; the factor 2^e restores it.

    Word w of a group holds codes 8w..8w+7; its pair slot s holds codes (8w + s, 8w + s + 4) as (lo, hi)
    fp16, stored at 4s + w so that a thread loads slot s of its group's four words as one 16-byte
    vector. A pure permutation of the 32 values, so a kernel that has them in registers (the MoE
    gate_up epilogue) packs them the same way as this file's preparing kernel."""
    eb = tl.max(tl.abs(v), axis=1).to(tl.int32, bitcast=True) >> 23  # biased exponent of the group's max
    eb = tl.maximum(eb, 14)  # an all-zero (or all below 2^-113) group: any factor in range will do
    factor = ((268 - eb) << 23).to(tl.float32, bitcast=True)  # 2^(14 - e), e = eb - 127
    bits = (v * factor[:, None]).to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    bits = tl.permute(tl.reshape(bits, (GB, 4, 2, 4)), (0, 3, 1, 2))  # k = 8w + 4h + s -> [s, w, h]
    lo, hi = tl.split(tl.reshape(bits, (GB, 16, 2)))
    return (hi << 16) | lo, (eb << 23).to(tl.float32, bitcast=True)


@triton.jit
def _prepare_x_kernel(x_ptr, xp_ptr, xe_ptr, K, stride_xm, stride_pm, stride_em, GB: tl.constexpr, PDL: tl.constexpr):
    """x [M, K] bf16 -> xp [M, K/2] int32 fp16 pairs in decode order, xe [M, K/32] fp32 = 2^e per group.
    ``PDL``: let the GEMV launched after this kernel start at once (it waits for these stores itself)."""
    if PDL:
        gdc_launch_dependents()
    m = tl.program_id(0)
    g = tl.program_id(1) * GB + tl.arange(0, GB)
    g_ok = g < K // 32
    xv = tl.load(x_ptr + m * stride_xm + g[:, None] * 32 + tl.arange(0, 32)[None, :], mask=g_ok[:, None], other=0.0)
    pairs, factors = pack_groups(xv.to(tl.float32), GB)
    tl.store(xe_ptr + m * stride_em + g, factors, mask=g_ok)
    tl.store(xp_ptr + m * stride_pm + g[:, None] * 16 + tl.arange(0, 16)[None, :], pairs, mask=g_ok[:, None])


PREPARE_GROUPS = 16  # groups of 32 activations per program of the preparing kernel
PREPARE_WARPS, PREPARE_STAGES = 4, 3  # Triton's defaults, which it ran on before it had a Launcher (stop 49)


def prepare_x(x: torch.Tensor, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` bf16 -> (fp16 pairs ``[M, K/2]`` int32, group factors ``[M, K/32]`` fp32) for the f16x2 GEMV.
    ``pdl``: the GEMV that follows is launched with programmatic dependent launch."""
    M, K = x.shape
    xp = torch.empty(M, K // 2, dtype=torch.int32, device=x.device)
    xe = torch.empty(M, K // 32, dtype=torch.float32, device=x.device)
    _LAUNCH_PREPARE(
        (M, cdiv(K // 32, PREPARE_GROUPS)),
        x,
        xp,
        xe,
        K,
        x.stride(0),
        xp.stride(0),
        xe.stride(0),
        GB=PREPARE_GROUPS,
        PDL=int(pdl),
        num_warps=PREPARE_WARPS,
        num_stages=PREPARE_STAGES,
    )
    return xp, xe


_LAUNCH_PREPARE = Launcher(_prepare_x_kernel)


def _decode_word_f16x2_ptx(word: str, pairs: tuple[str, str, str, str]) -> list[str]:
    """PTX decoding the eight codes of the 32-bit ``word`` into four fp16 pairs (registers ``pairs``; pair p is codes
    (3 - p, 7 - p), the activations' slot 3 - p), 11 instructions after a ``mov``, scratch registers q, t, v.

    Not 4 x 3 + 3: codes 3 and 1 of each half are built together in place (sign where it is, the three
    exponent/mantissa bits moved down 3 and masked), then codes 3 are masked out and codes 1 are moved up a byte by
    one ``prmt`` that also zeroes the rest; codes 2 and 0 the same after a shift of 4."""
    p0, p1, p2, p3 = pairs
    return [
        f"mov.b32 q, {word};",
        "shr.b32 t, q, 3; and.b32 t, t, 0x0E0E0E0E; lop3.b32 v, q, t, 0x80808080, 0xEC;",
        f"and.b32 {p0}, v, 0xFF00FF00; prmt.b32 {p2}, v, 0, 0x2404;",
        "shl.b32 t, q, 1; and.b32 t, t, 0x0E0E0E0E; shl.b32 v, q, 4; lop3.b32 v, v, t, 0x80808080, 0xEC;",
        f"and.b32 {p1}, v, 0xFF00FF00; prmt.b32 {p3}, v, 0, 0x2404;",
    ]


def _word_products_f16x2_ptx(word: int, pairs, xs) -> list[str]:
    """PTX adding word ``word``'s four products ``pairs[p] * xs[3 - p]`` (packed fp16) to its chain: words 0, 2 in
    register a, words 1, 3 in b (the first product of each chain starts it)."""
    acc = "ab"[word % 2]
    return [
        f"mul.rn.f16x2 {acc}, {pairs[p]}, {xs[3 - p]};"
        if word < 2 and p == 0
        else f"fma.rn.f16x2 {acc}, {pairs[p]}, {xs[3 - p]}, {acc};"
        for p in range(4)
    ]


# the two chains summed, widened to fp32 once per group
_CHAINS_TO_F32 = ["add.rn.f16x2 a, a, b;", "mov.b32 {lo, hi}, a;", "cvt.f32.f16 f0, lo;", "cvt.f32.f16 f1, hi;"]
_F16X2_REGS = [".reg .b16 lo, hi;", ".reg .f32 f0, f1;"]


def _group_dot_f16x2_asm_text() -> str:
    """PTX for one group: words $1..$4 (eight codes each), activation pairs $5..$20 (word-major, slot s of a
    word = its codes s and s + 4, lo and hi half) -> $0, the fp32 sum of the 32 products. A word decodes in 11
    instructions and multiplies in 4 ``fma.rn.f16x2``."""
    lines = ["{", ".reg .b32 q, t, v, p0, p1, p2, p3, a, b;", *_F16X2_REGS]
    for word in range(4):
        lines += _decode_word_f16x2_ptx(f"${1 + word}", ("p0", "p1", "p2", "p3"))
        lines += _word_products_f16x2_ptx(word, ("p0", "p1", "p2", "p3"), [f"${5 + 4 * word + s}" for s in range(4)])
    return "\n".join(lines + [*_CHAINS_TO_F32, "add.f32 $0, f0, f1;", "}"])


def _decode_word_f16x2_asm_text() -> str:
    """PTX for one word $4 -> its four fp16 pairs $0..$3 (multi-row GEMV: decoded once, used by every row)."""
    return "\n".join(["{", ".reg .b32 q, t, v;", *_decode_word_f16x2_ptx("$4", ("$0", "$1", "$2", "$3")), "}"])


def _sum_group_f16x2_asm_text() -> str:
    """PTX for one group and one row: decoded pairs $1..$16 (word-major, pair p of a word = codes 3 - p, 7 - p) and
    the row's activation pairs $17..$32 (word-major, slot order) -> $0, the fp32 sum of the 32 products."""
    lines = ["{", ".reg .b32 a, b;", *_F16X2_REGS]
    for word in range(4):
        pairs = [f"${1 + 4 * word + p}" for p in range(4)]
        lines += _word_products_f16x2_ptx(word, pairs, [f"${17 + 4 * word + s}" for s in range(4)])
    return "\n".join(lines + [*_CHAINS_TO_F32, "add.f32 $0, f0, f1;", "}"])


GROUP_DOT_F16X2 = tl.constexpr(_group_dot_f16x2_asm_text())
DECODE_WORD_F16X2 = tl.constexpr(_decode_word_f16x2_asm_text())
SUM_GROUP_F16X2 = tl.constexpr(_sum_group_f16x2_asm_text())


@triton.jit
def _split4(v, A: tl.constexpr, B: tl.constexpr):
    """v [A, B, 4] -> four [A, B] tensors, v[..., j] in order of j (register moves: one thread holds all 4)."""
    even, odd = tl.split(tl.reshape(v, (A, B, 2, 2)))  # j = 2i + bit: even = j 0, 2; odd = j 1, 3
    v0, v2 = tl.split(even)
    v1, v3 = tl.split(odd)
    return v0, v1, v2, v3


@triton.jit
def _fp16_half(v, HI: tl.constexpr):
    if HI:
        v = v >> 16
    return v.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _word_major(xq, G: tl.constexpr):
    """A row's activation pairs (four [1, G, 4] tensors, slot s of words 0..3) -> 16 [1, G] tensors, word-major."""
    x0, x1, x2, x3 = _split4(xq[0], 1, G)
    y0, y1, y2, y3 = _split4(xq[1], 1, G)
    z0, z1, z2, z3 = _split4(xq[2], 1, G)
    u0, u1, u2, u3 = _split4(xq[3], 1, G)
    return (x0, y0, z0, u0, x1, y1, z1, u1, x2, y2, z2, u2, x3, y3, z3, u3)


@triton.jit
def _group_dot(w, xq, BLOCK_N: tl.constexpr, G: tl.constexpr, MATH: tl.constexpr):
    """[BLOCK_N, G] fp32: each group's 32 codes (``w`` [BLOCK_N, G, 4] words) times its activation pairs
    (``xq``: four [1, G, 4] tensors, slot s of words 0..3), unscaled."""
    ws = _split4(w, BLOCK_N, G)
    xs = _word_major(xq, G)
    if MATH == "asm":
        b = ()
        for i in tl.static_range(16):
            b = b + (tl.broadcast_to(xs[i], (BLOCK_N, G)),)
        return tl.inline_asm_elementwise(
            asm=GROUP_DOT_F16X2,
            constraints="=r" + ",r" * 20,
            args=[
                ws[0],
                ws[1],
                ws[2],
                ws[3],
                b[0],
                b[1],
                b[2],
                b[3],
                b[4],
                b[5],
                b[6],
                b[7],
                b[8],
                b[9],
                b[10],
                b[11],
                b[12],
                b[13],
                b[14],
                b[15],
            ],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )
    return _group_dot_rows(w, (xq,), BLOCK_N, G, MATH, 1)[0]  # the portable sum (fp32 math, the interpreter's)


@triton.jit
def _group_dot_rows(w, xqs, BLOCK_N: tl.constexpr, G: tl.constexpr, MATH: tl.constexpr, ROWS: tl.constexpr):
    """:func:`_group_dot` for ROWS rows of activations (``xqs``, a tuple of ROWS ``xq``) -> a tuple of ROWS [BLOCK_N, G]
    sums: each word is decoded once, its pairs multiplied with every row. Its portable branch is :func:`_group_dot`'s
    too."""
    ws = _split4(w, BLOCK_N, G)
    out = ()
    if MATH == "asm":
        pairs = ()
        for word in tl.static_range(4):
            pairs = pairs + tl.inline_asm_elementwise(
                asm=DECODE_WORD_F16X2,
                constraints="=r,=r,=r,=r,r",
                args=[ws[word]],
                dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
                is_pure=True,
                pack=1,
            )
        for r in tl.static_range(ROWS):
            xs = _word_major(xqs[r], G)
            args = pairs
            for i in tl.static_range(16):
                args = args + (tl.broadcast_to(xs[i], (BLOCK_N, G)),)
            out = out + (
                tl.inline_asm_elementwise(
                    asm=SUM_GROUP_F16X2, constraints="=r" + ",r" * 32, args=args, dtype=tl.float32, is_pure=True, pack=1
                ),
            )
    else:  # portable Triton: fp32 math, runs under the interpreter
        vs = ()
        for word in tl.static_range(4):
            vs = vs + (_decode_ops(ws[word]),)
        for r in tl.static_range(ROWS):
            xs = _word_major(xqs[r], G)
            acc = tl.zeros((BLOCK_N, G), dtype=tl.float32)
            for word in tl.static_range(4):
                for pair in tl.static_range(4):
                    xw = xs[4 * word + pair]
                    acc += vs[word][pair] * _fp16_half(xw, False) + vs[word][4 + pair] * _fp16_half(xw, True)
            out = out + (acc,)
    return out


@triton.jit
def _accumulate_f16x2(acc, w, s, xq, xe, BLOCK_N: tl.constexpr, G: tl.constexpr, MATH: tl.constexpr):
    """acc[n, g] += scale[n, g] * 2^e[g] * (W[n, group g] . x'[group g]) for the G groups of one K tile."""
    return acc + _group_dot(w, xq, BLOCK_N, G, MATH) * (e8m0_to_fp32(s.to(tl.int32)) * xe)


@triton.jit
def _load_pairs(p_ptrs, g_ok, MASKED: tl.constexpr):
    xq = ()
    for pair in tl.static_range(4):
        if MASKED:
            xq = xq + (tl.load(p_ptrs + 4 * pair, mask=g_ok[None, :, None], other=0),)
        else:
            xq = xq + (tl.load(p_ptrs + 4 * pair),)
    return xq


@triton.jit
def _load_row_f16x2(p_ptrs, e_ptrs, g_ok, MASKED: tl.constexpr):
    """One row's prepared activations for a K tile: (pairs, factors). ``MASKED``: the partial tile (``g_ok``)."""
    xq = _load_pairs(p_ptrs, g_ok, MASKED)
    if MASKED:
        xe = tl.load(e_ptrs, mask=g_ok[None, :], other=0.0)
    else:
        xe = tl.load(e_ptrs)
    return xq, xe


@triton.jit
def _load_acts_f16x2(p_ptrs, e_ptrs, g_ok, MASKED: tl.constexpr, ROWS: tl.constexpr, stride_pm, stride_em):
    """One K tile's prepared activations: (pairs, factors) of one row, or with ``ROWS`` > 0 (a tuple of ROWS pairs,
    a tuple of ROWS factors) from rows ``stride_pm``/``stride_em`` apart. ``MASKED``: the partial tile (``g_ok``)."""
    if ROWS:
        xq = ()
        xe = ()
        for r in tl.static_range(ROWS):
            q, e = _load_row_f16x2(p_ptrs + r * stride_pm, e_ptrs + r * stride_em, g_ok, MASKED)
            xq = xq + (q,)
            xe = xe + (e,)
    else:
        xq, xe = _load_row_f16x2(p_ptrs, e_ptrs, g_ok, MASKED)
    return xq, xe


@triton.jit
def _load_tile_f16x2(ptrs, t, g_ok, MASKED: tl.constexpr, W_STEP: tl.constexpr, G: tl.constexpr):
    """K tile ``t``'s weights and scales (``MASKED``: the partial tile, whole groups ``g_ok``); ``ptrs``: (weights,
    scales, activation pairs, factors) at tile 0."""
    w_ptrs, s_ptrs, _, _ = ptrs
    if MASKED:
        w = tl.load(w_ptrs + t * W_STEP, mask=g_ok[None, :, None], other=0)
        s = tl.load(s_ptrs + t * G, mask=g_ok[None, :], other=127)
    else:
        w = tl.load(w_ptrs + t * W_STEP)
        s = tl.load(s_ptrs + t * G)
    return w, s


@triton.jit
def _step_f16x2(
    acc,
    tile,
    ptrs,
    t,
    g_ok,
    MASKED: tl.constexpr,
    BLOCK_N: tl.constexpr,
    G: tl.constexpr,
    MATH: tl.constexpr,
    ROWS: tl.constexpr,
    stride_pm,
    stride_em,
):
    """``acc`` += loaded K tile ``t`` (:func:`_load_tile_f16x2`) times its activations, loaded here (from L1/L2).
    ``ROWS`` > 0: ``acc`` is a tuple of ROWS accumulators. Loading the activations with the weights instead, a tile
    or two ahead, took twice as long at 2-8 rows (register spills; PERF_LOG stop 26)."""
    w, s = tile
    _, _, p_ptrs, e_ptrs = ptrs
    xq, xe = _load_acts_f16x2(p_ptrs + t * (16 * G), e_ptrs + t * G, g_ok, MASKED, ROWS, stride_pm, stride_em)
    if ROWS:
        dots = _group_dot_rows(w, xq, BLOCK_N, G, MATH, ROWS)
        scale = e8m0_to_fp32(s.to(tl.int32))
        out = ()
        for r in tl.static_range(ROWS):
            out = out + (acc[r] + dots[r] * (scale * xe[r]),)
    else:
        out = _accumulate_f16x2(acc, w, s, xq, xe, BLOCK_N, G, MATH)
    return out


@triton.jit
def _x_codes(x_row, kt, j: tl.constexpr, K, ORDER: tl.constexpr, MASKED: tl.constexpr):
    """x at the codes a chunk order's words of K tile ``kt`` hold at value ``j`` (:func:`chunk_word_values`), shaped to
    multiply the words' values: mma2 code 32 q + 8 t + j as ``[1, 1, 4 t, 4 q, 1]`` (word 2 q + c); wgmma code 16 s + 2
    t + j as ``[1, 1, 4 t, 8 s]`` (word s). ``MASKED``: the partial last tile (codes from ``K`` on read as 0)."""
    t = tl.arange(0, 4)[:, None]
    if ORDER == "wgmma":
        k = kt * 128 + 16 * tl.arange(0, 8)[None, :] + 2 * t + j
    else:
        k = kt * 128 + 32 * tl.arange(0, 4)[None, :] + 8 * t + j
    x = tl.load(x_row + k, mask=k < K, other=0.0) if MASKED else tl.load(x_row + k)
    if ORDER == "wgmma":
        x = tl.reshape(x.to(tl.float32), (1, 1, 4, 8))
    else:
        x = tl.reshape(x.to(tl.float32), (1, 1, 4, 4, 1))
    return x


@triton.jit
def _chunk_tile(
    acc,
    x_row,
    w_ptr,
    s_ptr,
    w_off,
    s_off,
    w_step,
    s_step,
    kt,
    K,
    ORDER: tl.constexpr,
    MATH: tl.constexpr,
    MASKED: tl.constexpr,
    SCALE_SHIFT: tl.constexpr,
):
    """``acc`` ``[blocks, 8 g, 4 t, words, 2 c]`` plus K tile ``kt``'s products: each word's 8 values times x's codes
    (mma2: words as (4 q, 2 c), all 8 values of row 8 c + g; wgmma: 8 s, values 0-3 of row g into c = 0, 4-7 of row
    g + 8 into c = 1)."""
    BLOCKS: tl.constexpr = acc.shape[0]
    lane = tl.arange(0, 32)[None, :, None]
    wo = w_off[:, None, None] + kt * w_step
    sc = chunk_lane_scales(s_ptr, s_off[:, None, None] + kt * s_step, lane)
    sc = shift_scales(sc, SCALE_SHIFT)
    v0, v1, v2, v3, v4, v5, v6, v7 = chunk_word_values(w_ptr, wo, lane, sc, ORDER, MATH)
    if ORDER == "wgmma":
        x0 = _x_codes(x_row, kt, 0, K, ORDER, MASKED)
        x1 = _x_codes(x_row, kt, 1, K, ORDER, MASKED)
        x8 = _x_codes(x_row, kt, 8, K, ORDER, MASKED)
        x9 = _x_codes(x_row, kt, 9, K, ORDER, MASKED)
        shape: tl.constexpr = (BLOCKS, 8, 4, 8)
        row_g = tl.reshape(v0, shape) * x0 + tl.reshape(v1, shape) * x1
        row_g += tl.reshape(v2, shape) * x8 + tl.reshape(v3, shape) * x9
        row_g8 = tl.reshape(v4, shape) * x0 + tl.reshape(v5, shape) * x1
        row_g8 += tl.reshape(v6, shape) * x8 + tl.reshape(v7, shape) * x9
        part = tl.join(row_g, row_g8)
    else:
        shape: tl.constexpr = (BLOCKS, 8, 4, 4, 2)
        part = tl.reshape(v0, shape) * _x_codes(x_row, kt, 0, K, ORDER, MASKED)
        part += tl.reshape(v1, shape) * _x_codes(x_row, kt, 1, K, ORDER, MASKED)
        part += tl.reshape(v2, shape) * _x_codes(x_row, kt, 2, K, ORDER, MASKED)
        part += tl.reshape(v3, shape) * _x_codes(x_row, kt, 3, K, ORDER, MASKED)
        part += tl.reshape(v4, shape) * _x_codes(x_row, kt, 4, K, ORDER, MASKED)
        part += tl.reshape(v5, shape) * _x_codes(x_row, kt, 5, K, ORDER, MASKED)
        part += tl.reshape(v6, shape) * _x_codes(x_row, kt, 6, K, ORDER, MASKED)
        part += tl.reshape(v7, shape) * _x_codes(x_row, kt, 7, K, ORDER, MASKED)
    return acc + part


@triton.jit
def gemv_chunks(
    x_row,
    w_ptr,
    s_ptr,
    w_off,
    s_off,
    w_step,
    s_step,
    K,
    BLOCKS: tl.constexpr,
    ORDER: tl.constexpr,
    MATH: tl.constexpr,
    SCALE_SHIFT: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    """``W @ x`` ``[16 BLOCKS]`` (row 16 b + r of block b) for ``BLOCKS`` 16-row blocks of W in a chunk order of the
    strided layout (``ORDER`` "mma2" or "wgmma"): block b's weight chunk and scale piece of K tile 0 at byte offsets
    ``w_off[b]`` / ``s_off[b]``, each K tile ``w_step`` / ``s_step`` further; x one row (bf16) of ``K`` codes (W's
    columns past K zero codes to its padded width). The whole K tiles read x unmasked, a partial last one masked after
    them (a mask in the loop, on its 8 slices a tile, took 56 instructions a word on sm_121a where the unmasked loop
    takes 45). Each word's 8 values (``chunk_word_values``) times their x accumulate per (block, lane, word, row)
    across the K tiles, reduced once after them: no shuffle in the loop (``benchmarks/experiments/
    mma2_gemv_probe.py``). ``SCALE_SHIFT``: the scales read lowered by it, the sums multiplied back
    (:func:`dequant_mxfp4.fold_shift`). ``PDL``: x is written by the kernel launched before this one, which may still
    run: wait for it first."""
    WORDS: tl.constexpr = 8 if ORDER == "wgmma" else 4  # accumulators a lane's row pair: words (wgmma) or groups q
    acc = tl.zeros((BLOCKS, 8, 4, WORDS, 2), dtype=tl.float32)  # block, g, t, word, c
    if PDL:
        gdc_wait()
    n_full = K // 128
    for kt in range(0, n_full):
        acc = _chunk_tile(
            acc, x_row, w_ptr, s_ptr, w_off, s_off, w_step, s_step, kt, K, ORDER, MATH, False, SCALE_SHIFT
        )
    if n_full * 128 < K:
        acc = _chunk_tile(
            acc, x_row, w_ptr, s_ptr, w_off, s_off, w_step, s_step, n_full, K, ORDER, MATH, True, SCALE_SHIFT
        )
    y = unshift(tl.sum(tl.sum(acc, axis=3), axis=2), SCALE_SHIFT)  # [block, g, c]: row 8 c + g
    return tl.reshape(tl.permute(y, (0, 2, 1)), (16 * BLOCKS,))


@triton.jit
def gemv_rows_f16x2(
    xp_ptr,
    xe_ptr,
    w_ptr,
    ws_ptr,
    rn,
    K,
    stride_wn,
    stride_wsn,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MATH: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr = 0,
    TILE_ROWS: tl.constexpr = 0,
    ROWS: tl.constexpr = 0,
    stride_pm=0,
    stride_em=0,
):
    """``W[rn, :K] @ x[:K]`` like :func:`gemv_rows` (the partial K tile first), from one row of prepared
    activations (xp, xe). ``PDL``: the activations are written by the kernel launched before this one, which
    may still run; wait for it once the first weight tiles are requested (:class:`GemvConfig`).
    ``TILE_ROWS``: as in :func:`gemv_rows`. ``ROWS`` > 0: ``xp_ptr``/``xe_ptr`` are the first of ROWS prepared rows
    ``stride_pm``/``stride_em`` apart, each weight is decoded once for all of them, and the result is a tuple of ROWS
    ``[BLOCK_N]`` rows."""
    G: tl.constexpr = BLOCK_K // 32
    rg = tl.arange(0, G)
    # words from one K tile to the next (tiled: BLOCK_K // 128 whole 64-byte tiles of TILE_ROWS rows)
    W_STEP: tl.constexpr = (BLOCK_K // 128) * TILE_ROWS * 16 if TILE_ROWS else BLOCK_K // 8
    # The scales and group factors are one value per (row, group): read them as the thread that holds the
    # group's words needs them. Seen contiguous, Triton would load them two or four to a thread and move
    # every group's sum through shared memory with a barrier, each K step; an index it cannot see through
    # (xor with a zero it cannot prove) keeps them one to a thread, in the words' distribution.
    rg_1 = rg ^ (tl.program_id(0) >> 31)
    ptrs = (
        _weight_ptrs(w_ptr, rn, stride_wn, G, TILE_ROWS),
        ws_ptr + rn[:, None] * stride_wsn + rg_1[None, :],
        xp_ptr + rg[None, :, None] * 16 + tl.arange(0, 4)[None, None, :],  # + 4s: slot s of words 0..3
        xe_ptr + rg_1[None, :],
    )
    if ROWS:
        acc = ()
        for _ in tl.static_range(ROWS):
            acc = acc + (tl.zeros((BLOCK_N, G), dtype=tl.float32),)
    else:
        acc = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    n_full = K // BLOCK_K
    k_full = n_full * BLOCK_K
    g_ok = rg < (K - k_full) // 32  # the partial tile's whole groups (none when BLOCK_K divides K)
    tail = _load_tile_f16x2(ptrs, n_full, g_ok, True, W_STEP, G)  # first
    # The weights and scales of the next PREFETCH tiles are in flight while a tile is multiplied (the
    # activations come from L1/L2 and are loaded when used): at M = 1 the kernel is bound by how many weight
    # bytes are in flight per SM, not by its instructions.
    if PREFETCH == 2 and n_full >= 2:
        a = _load_tile_f16x2(ptrs, 0, g_ok, False, W_STEP, G)
        b = _load_tile_f16x2(ptrs, 1, g_ok, False, W_STEP, G)
        if PDL:
            gdc_wait()
        if k_full < K:
            acc = _step_f16x2(acc, tail, ptrs, n_full, g_ok, True, BLOCK_N, G, MATH, ROWS, stride_pm, stride_em)
        for t in range(2, n_full):
            c = _load_tile_f16x2(ptrs, t, g_ok, False, W_STEP, G)
            acc = _step_f16x2(acc, a, ptrs, t - 2, g_ok, False, BLOCK_N, G, MATH, ROWS, stride_pm, stride_em)
            a, b = b, c
        acc = _step_f16x2(acc, a, ptrs, n_full - 2, g_ok, False, BLOCK_N, G, MATH, ROWS, stride_pm, stride_em)
        acc = _step_f16x2(acc, b, ptrs, n_full - 1, g_ok, False, BLOCK_N, G, MATH, ROWS, stride_pm, stride_em)
    elif n_full > 0:
        a = _load_tile_f16x2(ptrs, 0, g_ok, False, W_STEP, G)
        if PDL:
            gdc_wait()
        if k_full < K:
            acc = _step_f16x2(acc, tail, ptrs, n_full, g_ok, True, BLOCK_N, G, MATH, ROWS, stride_pm, stride_em)
        for t in range(1, n_full):
            b = _load_tile_f16x2(ptrs, t, g_ok, False, W_STEP, G)
            acc = _step_f16x2(acc, a, ptrs, t - 1, g_ok, False, BLOCK_N, G, MATH, ROWS, stride_pm, stride_em)
            a = b
        acc = _step_f16x2(acc, a, ptrs, n_full - 1, g_ok, False, BLOCK_N, G, MATH, ROWS, stride_pm, stride_em)
    else:
        if PDL:
            gdc_wait()
        if k_full < K:
            acc = _step_f16x2(acc, tail, ptrs, 0, g_ok, True, BLOCK_N, G, MATH, ROWS, stride_pm, stride_em)
    if ROWS:
        y = ()
        for r in tl.static_range(ROWS):
            y = y + (tl.sum(acc[r], axis=1),)
    else:
        y = tl.sum(acc, axis=1)
    return y


@triton.jit
def _gemv_f16x2_kernel(
    xp_ptr,
    xe_ptr,
    w_ptr,
    ws_ptr,
    b_ptr,
    y_ptr,
    N,
    K,
    stride_pm,
    stride_em,
    stride_wn,
    stride_wsn,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MATH: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
    ROWS: tl.constexpr,
    M,
):
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_load = tl.minimum(rn, N - 1)
    if ROWS:  # ROWS rows of x per program, each weight decoded once for all of them
        m0 = tl.minimum(tl.program_id(0) * ROWS, M - ROWS)  # the last block shifted back to end at M (M >= ROWS)
    else:  # one row of x per program
        m0 = tl.program_id(0)
    y = gemv_rows_f16x2(
        xp_ptr + m0 * stride_pm,
        xe_ptr + m0 * stride_em,
        w_ptr,
        ws_ptr,
        rn_load,
        K,
        stride_wn,
        stride_wsn,
        BLOCK_N,
        BLOCK_K,
        MATH,
        PREFETCH,
        PDL,
        0,
        ROWS,
        stride_pm,
        stride_em,
    )
    if ROWS:
        for r in tl.static_range(ROWS):
            _store_rows(y[r], b_ptr, y_ptr + (m0 + r) * stride_ym, rn, N, HAS_BIAS)
    else:
        _store_rows(y, b_ptr, y_ptr + m0 * stride_ym, rn, N, HAS_BIAS)


# Best of sweeps at M = 1 on H100, confirmed by repeated interleaved timing (benchmarks/experiments/decode_pick.py,
# docs/PERF_LOG.md): wide layers (lm_head) take the f16x2 path, 16 rows x 1024 k and 8 warps (0.1217 ms, 84% of
# the copy roofline, 3.36x cuBLAS BF16); narrow ones (q/k/v/o: 5-8 us) at one row the fp32 path, 8 rows x 512 k,
# which needs no activation-preparing launch (the f16x2 one, with it: qkv 0.0078 vs 0.0072 ms, o 0.0086 vs 0.0070,
# docs/bench/dense_sweep_rows_split_h100_2026-11-26_3a7dae1.json).
WIDE = GemvConfig(16, 1024, 8, 1, "f16x2")
NARROW = GemvConfig(8, 512, 4, 1, "asm")
# Narrow layers at 2 and 4 rows (linear_mxfp4.use_gemv): every row in one program, each weight decoded once, on
# prepared activations (packed fp16 math: the fp32 twin moved each row's activations through shared memory with
# barriers every K tile, and lost to the split-K tile from 4 rows). Same-run sweeps (PERF_LOG stop 26, peers.py
# --sweep-dense 2,4 --sweep-kind rows): qkv M = 2 0.0081 ms vs 0.0112 for the fp32 two-row GEMV shipped before, M = 4
# 0.0113 vs 0.0139 for the split-K tile (H200); weights two K tiles ahead at 2 rows, one at 4 (two: 0.0150). On the
# H100, one machine, one call: qkv M = 4 0.0114 vs 0.0146 (Marlin 0.0115).
NARROW_ROWS = {
    2: GemvConfig(8, 512, 4, 1, "f16x2", prefetch=2, rows=2),
    4: GemvConfig(8, 512, 4, 1, "f16x2", rows=4),
}


def is_wide(N: int, sm_count: int = 132) -> bool:
    """A layer that takes :data:`WIDE` (lm_head): rows enough for 256 per SM."""
    return N >= 256 * sm_count


def fills_with_rows(N: int, sm_count: int = 132) -> bool:
    """Enough programs of the 4-row GEMV (four per SM) on a narrow layer: its programs wait on their activations'
    loads each K tile, and fewer of them lose to the split-K tile (o, 2880 rows: 0.0116-0.0133 ms vs 0.0113; qkv, 5120
    rows: 0.0113 vs 0.0139; H200, the sweeps above)."""
    return not is_wide(N, sm_count) and cdiv(N, NARROW_ROWS[4].block_n) >= 4 * sm_count


def pick_gemv_config(N: int, sm_count: int = 132, cuda: bool = True, M: int = 1) -> GemvConfig:
    """The GEMV for ``M`` rows of x on a layer of ``N`` rows: :data:`WIDE` (lm_head), else :data:`NARROW_ROWS`' at 2 or
    4 rows, else :data:`NARROW` (a program per row of x)."""
    cfg = WIDE if is_wide(N, sm_count) else NARROW_ROWS.get(M, NARROW)
    return cfg if cuda else cfg.portable()


def gemv_mxfp4(
    x: torch.Tensor,
    w_packed: torch.Tensor,
    w_scales: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    config: GemvConfig | None = None,
) -> torch.Tensor:
    """``x [M, K]`` bf16 (M small) times MXFP4 ``W [N, K]`` -> ``out [M, N]``; shapes checked by the caller."""
    M, K = x.shape
    N = w_packed.shape[0]
    # the kernel reads rows as 16-byte-aligned int32 words
    if w_packed.stride(1) != 1 or w_packed.stride(0) % 16:
        w_packed = w_packed.contiguous()
    if w_packed.data_ptr() % 16:
        w_packed = w_packed.clone()  # contiguous() keeps a misaligned storage offset; a copy does not
    # MXREPACK_PDL read only where a configuration asks for PDL: no picked dense GEMV does (WIDE, NARROW, NARROW_ROWS)
    pdl_env = os.environ.get("MXREPACK_PDL") if config is not None and config.pdl else None
    cfg = _launched(config, M, N, x.device, pdl_env)
    x = x.contiguous()
    grid = (cdiv(M, cfg.rows) if cfg.rows else M, cdiv(N, cfg.block_n))
    if cfg.prepared:
        xp, xe = prepare_x(x, pdl=bool(cfg.pdl))
        _LAUNCH_F16X2(
            grid,
            xp,
            xe,
            w_packed,
            w_scales,
            bias if bias is not None else w_scales,
            out,
            N,
            K,
            xp.stride(0),
            xe.stride(0),
            w_packed.stride(0),
            w_scales.stride(0),
            out.stride(0),
            HAS_BIAS=bias is not None,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            MATH=cfg.math,
            PREFETCH=cfg.prefetch,
            PDL=cfg.pdl,
            ROWS=cfg.rows,
            M=M,
            **cfg.launch_options(),
        )
        return out
    _LAUNCH_GEMV(
        grid,
        x,
        w_packed,
        w_scales,
        bias if bias is not None else w_scales,
        out,
        N,
        K,
        x.stride(0),
        w_packed.stride(0),
        w_scales.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        DECODE=cfg.decode,
        **cfg.launch_options(),
    )
    return out


_LAUNCH_F16X2 = Launcher(_gemv_f16x2_kernel)
_LAUNCH_GEMV = Launcher(_gemv_mxfp4_kernel)


@functools.lru_cache(maxsize=1024)  # asked per call; lm_head's runs outside vLLM's graphs, each step
def _launched(config: GemvConfig | None, M: int, N: int, device: torch.device, pdl_env: str | None) -> GemvConfig:
    """The GEMV configuration that runs ``M`` rows of x on ``N`` weight rows on ``device``: ``config`` or the pick,
    without programmatic dependent launch where the GPU has none (sm_8x: launched one after the other) or
    ``MXREPACK_PDL=0`` turns it off (``pdl_env``, its value: part of the cache key), its row block as
    :meth:`GemvConfig.launched`."""
    cfg = config or pick_gemv_config(N, sm_count(device), device.type == "cuda", M)
    if cfg.pdl and not launches_dependents(device):
        cfg = dataclasses.replace(cfg, pdl=0)
    return cfg.launched(M)


@functools.cache
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (132, an H100/H200, off CUDA); cached, as it is asked per launch."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132
