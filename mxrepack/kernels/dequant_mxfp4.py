"""MXFP4 -> BF16 dequantization on the GPU, and the W4A16 prefill built on it: dequantize a slab of rows,
multiply it with cuBLAS.

Why a prefill goes this way: at thousands of rows a W4A16 GEMM is bound by tensor-core math, not by
weight bytes, and Hopper has no BF16 x E2M1 MMA: every tensor-core kernel must first turn W into BF16.
Done inside our Triton tile loop that conversion competes with the MMA for issue slots and registers
(0.35-0.47x cuBLAS BF16 on H100/H200, docs/PERF_LOG.md). Done once per weight slab here, it costs one
streaming pass (~4.5 bytes per weight) that an M = 2048 GEMM amortises over 2048 rows, and the GEMM
itself is cuBLAS's. The slab is bounded (``chunk_bytes``, default 32 MB, about H100's L2) so the
scratch memory stays small and the GEMM mostly reads the slab back from L2.

Dequantization is exact: every E2M1 value times a power of two 2^-127..2^127 is a BF16 value.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mxrepack.kernels import cdiv
from mxrepack.kernels.launch import Launcher
from mxrepack.layouts.strided import WORD_DECODED_BITS, WORD_ROTATIONS


@dataclass(frozen=True)
class DequantConfig:
    # 8 rows x 1024 columns per program: the best of 9 tiles on lm_head, H100, 86% of the copy roofline
    # in bytes read + written (docs/PERF_LOG.md); wide rows give each thread long contiguous stores.
    block_n: int = 8
    block_k: int = 1024
    num_warps: int = 4
    chunk_bytes: int = 32 << 20  # BF16 scratch per slab of rows

    def name(self) -> str:
        return f"n{self.block_n}k{self.block_k}w{self.num_warps}c{self.chunk_bytes >> 20}M"


DEQUANT = DequantConfig()


@triton.jit
def e8m0_to_fp32(s):
    """E8M0 scale bytes (int32) -> 2^(s - 127) in fp32; byte 0 is the subnormal 2^-127, not (0 << 23)."""
    return tl.where(s == 0, 5.877471754111438e-39, (s << 23).to(tl.float32, bitcast=True))


@triton.jit
def e2m1_to_fp32(code):
    """E2M1 codes (int32) -> their fp32 values: the sign and 3 exponent/mantissa bits placed at fp32 bits 31 and
    22-24 read as ``value * 2^-126`` (code 1 -> subnormal 0.5 * 2^-126 too), times 2^126."""
    return (((code & 8) << 28) | ((code & 7) << 22)).to(tl.float32, bitcast=True) * 8.507059173023462e37


@triton.jit
def dequant_tile_bf16(w, ws, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Packed E2M1 bytes ``[BLOCK_N, BLOCK_K/2]`` and E8M0 scales ``[BLOCK_N, BLOCK_K/32]`` -> bf16
    ``[BLOCK_N, BLOCK_K]`` with integer ops (:func:`e2m1_to_fp32`), times the scale."""
    w = w.to(tl.int32)
    codes = tl.reshape(tl.join(w & 15, w >> 4), (BLOCK_N, BLOCK_K))
    f = e2m1_to_fp32(codes)
    mult = e8m0_to_fp32(ws.to(tl.int32))
    f = tl.reshape(tl.reshape(f, (BLOCK_N, BLOCK_K // 32, 32)) * mult[:, :, None], (BLOCK_N, BLOCK_K))
    return f.to(tl.bfloat16)


@triton.jit
def dot_bf16_mxfp4(
    a, w, ws, acc, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MANUAL_DEQUANT: tl.constexpr, INTERPRETER: tl.constexpr
):
    """``acc + a @ W.T`` for bf16 ``a [M, BLOCK_K]`` and the packed tile ``w [BLOCK_N, BLOCK_K/2]`` + scales ``ws``:
    ``tl.dot_scaled`` (Triton upcasts W), or with ``MANUAL_DEQUANT`` W dequantized by :func:`dequant_tile_bf16` and
    ``tl.dot`` (faster on Hopper where the tile sweeps say so). The dense and MoE kernels' shared inner step."""
    if MANUAL_DEQUANT:
        wd = tl.trans(dequant_tile_bf16(w, ws, BLOCK_N, BLOCK_K))
        if INTERPRETER:  # Triton 3.9's interpreter mis-multiplies a bf16 operand made by a cast
            return tl.dot(a.to(tl.float32), wd.to(tl.float32), acc)
        return tl.dot(a, wd, acc)
    return tl.dot_scaled(a, None, "bf16", w.T, ws, "e2m1", acc)


# Packed bytes -> the bf16 pairs of an MMA's A operand, two codes of a byte at a time (``dequant_pairs``):
# prmt puts bytes i and i+1 at bits 15..8 and 31..24, so each half's top nibble is a high (odd-k) code; then
# ``(y & 0x80008000) | ((y & 0x70007000) >> 6)`` is the bf16 pair ``value * 2^-126`` (E2M1's 0.5 is bf16's
# subnormal 2^-127), as Marlin decodes FP4; ``y << 4`` brings the low (even-k) codes up.
_DECODE_PAIRS = """
prmt.b32 y, $2, 0, 0x1404;
and.b32 t, y, 0x70007000;
shr.b32 t, t, 6;
lop3.b32 $1, y, t, 0x80008000, 0xEC;
shl.b32 u, y, 4;
and.b32 t, u, 0x70007000;
shr.b32 t, t, 6;
lop3.b32 $0, u, t, 0x80008000, 0xEC;
"""
# Then two exact packed multiplies (fma with -0, which keeps a -0 code's sign) make it the value (x 2^126) times the
# scale (bf16 2^(E-127), also subnormal at E = 0): 12 instructions per 4 codes; the portable twin is ``_pairs_ops``.
PAIRS_ASM = tl.constexpr(
    "{\n.reg .b32 y, u, t, c, z;\nmov.b32 c, 0x7e807e80;\nmov.b32 z, 0x80008000;"
    + _DECODE_PAIRS
    + """fma.rn.bf16x2 $0, $0, c, z;
fma.rn.bf16x2 $1, $1, c, z;
fma.rn.bf16x2 $0, $0, $3, z;
fma.rn.bf16x2 $1, $1, $3, z;
}
"""
)
# The same with E2M1's 2^126 folded into the scale (``MATH="asm-fold"``): one packed multiply per code pair instead of
# two (10 instructions per 4 codes), by the bf16 scale 2^(E-1), which exists for E <= 128 only (block scales up to 2;
# past it the folded scale's bits wrap: 129 is inf, 130 -0, 131-255 negative): the weights must have no larger scale
# (:func:`fits_fold`, asked once per weight where it is loaded, chooses it; a folded config passed by hand is checked
# per call outside CUDA graph capture: :func:`check_fold_scale`). The MoE kernels also fold larger scales, read lowered
# by a per-layer shift (:func:`fold_shift`). Exact, and
# the same bits: both round nothing (powers of two; the smallest product, 0.5 * 2^-127, is a bf16 subnormal).
PAIRS_ASM_FOLDED = tl.constexpr(
    "{\n.reg .b32 y, u, t, z;\nmov.b32 z, 0x80008000;"
    + _DECODE_PAIRS
    + """fma.rn.bf16x2 $0, $0, $3, z;
fma.rn.bf16x2 $1, $1, $3, z;
}
"""
)


@triton.jit
def e8m0_to_bf16_folded(s):
    """E8M0 scale bytes s <= 128 -> bf16 2^(s - 1): the scale times E2M1's 2^126 (:data:`PAIRS_ASM_FOLDED`; larger s
    wrap to inf, -0 and negative values)."""
    return ((s.to(tl.int16) + 126) << 7).to(tl.bfloat16, bitcast=True)


@triton.jit
def e8m0_to_bf16(s):
    """E8M0 scale bytes -> bf16 2^(s - 127) (byte 0: the subnormal 2^-127, bits 0x0040)."""
    s = s.to(tl.int16)
    return ((s << 7) | ((s == 0).to(tl.int16) << 6)).to(tl.bfloat16, bitcast=True)


@triton.jit
def _code_times_scale(code, scale):
    """E2M1 codes (int32) times fp32 scales, as bf16: the fp32 product (exact: at most two significant bits), then
    its top 16 bits -- exact for subnormal results too, where a float cast may flush them (Triton 3.9's interpreter
    does)."""
    return _bf16_bits(e2m1_to_fp32(code) * scale).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _bf16_bits(v):
    """fp32 values exact in bf16 -> their bf16 bits (int32, 0-0xFFFF): the top 16 bits, kept for subnormals too."""
    return (v.to(tl.int32, bitcast=True) >> 16) & 0xFFFF


@triton.jit
def _pairs_ops(w, s):
    """Portable twin of ``PAIRS_ASM`` (runs under the interpreter), from the E8M0 bytes ``s``."""
    w = w.to(tl.int32)
    scale = e8m0_to_fp32(s.to(tl.int32))
    return _code_times_scale(w & 15, scale), _code_times_scale(w >> 4, scale)


@triton.jit
def dequant_pairs(w, ws, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MATH: tl.constexpr):
    """Packed E2M1 bytes ``[BLOCK_N, BLOCK_K/2]`` and E8M0 scales ``[BLOCK_N, BLOCK_K/32]`` -> two bf16 tiles
    ``[BLOCK_N, BLOCK_K/2]``: the even-k codes (each byte's low nibble) and the odd-k codes (high nibble), exact.
    Elementwise on the bytes, so Triton may decode them in whatever register layout the MMA operand has (no
    shuffle): the activations come split to match (:func:`dot_w_mxfp4`). ``MATH``: "asm" (PTX), "asm-fold" (PTX,
    scales <= 2 only: :data:`PAIRS_ASM_FOLDED`) or "ops"."""
    if MATH == "asm":  # converted per group, then spread to its 16 bytes
        s = _per_byte(e8m0_to_bf16(ws), BLOCK_N, BLOCK_K)
        even, odd = tl.inline_asm_elementwise(
            PAIRS_ASM, "=r,=r,r,r", [w, s], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=2
        )
    elif MATH == "asm-fold":
        s = _per_byte(e8m0_to_bf16_folded(ws), BLOCK_N, BLOCK_K)
        even, odd = tl.inline_asm_elementwise(
            PAIRS_ASM_FOLDED, "=r,=r,r,r", [w, s], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=2
        )
    else:
        tl.static_assert(MATH == "ops", "dequant_pairs: MATH is asm, asm-fold or ops")
        even, odd = _pairs_ops(w, _per_byte(ws, BLOCK_N, BLOCK_K))
    return even, odd


@triton.jit
def _per_byte(s, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Per-group values ``[BLOCK_N, BLOCK_K/32]`` -> one per packed byte ``[BLOCK_N, BLOCK_K/2]`` (16 bytes a group)."""
    return tl.reshape(tl.broadcast_to(s[:, :, None], (BLOCK_N, BLOCK_K // 32, 16)), (BLOCK_N, BLOCK_K // 2))


@triton.jit
def dot_w_mxfp4(
    w,
    ws,
    a_even,
    a_odd,
    acc,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MATH: tl.constexpr,
    INTERPRETER: tl.constexpr,
    WAIT_MMA: tl.constexpr = False,
):
    """``acc + W @ a.T`` as ``[BLOCK_N, M]``: the weights are the MMA's first operand, decoded in registers
    (:func:`dequant_pairs`), the activations the second, given as their even-k and odd-k columns ``[M, BLOCK_K/2]``
    each. With few rows per expert this puts the wide dimension (weight rows) where the MMA wants 64, the tokens
    where 8-16 suffice, and on Hopper lets ``wgmma`` read W from registers, so decoded weights never go through
    shared memory (the leaders' approach: Marlin decodes into MMA fragments). ``WAIT_MMA`` (Hopper: :func:`mma_done`,
    set by :func:`mma_reads_registers_async`) waits for the step's MMAs before the next decode."""
    even, odd = dequant_pairs(w, ws, BLOCK_N, BLOCK_K, MATH)
    if INTERPRETER:  # Triton 3.9's interpreter mis-multiplies a bf16 operand made by a cast
        acc = tl.dot(even.to(tl.float32), tl.trans(a_even).to(tl.float32), acc)
        return tl.dot(odd.to(tl.float32), tl.trans(a_odd).to(tl.float32), acc)
    acc = tl.dot(even, tl.trans(a_even), acc)
    acc = tl.dot(odd, tl.trans(a_odd), acc)
    if WAIT_MMA:
        acc = mma_done(acc)
    return acc


@triton.jit
def mma_done(acc):
    """``acc`` unchanged, read by an opaque op, so Triton's Hopper pipeliner must wait for the MMA that made it
    before the next op (it keeps a ``wgmma`` in flight only when nothing but the next MMA reads its result). Why:
    W's decoded registers are ``wgmma``'s A operand, and an MMA left in flight lets the next decode overwrite them
    (triton-lang/triton#9433: 3.6 and 3.9 put no wait between the second dot of a step and the next decode). The
    loads stay pipelined (``num_stages``); only the MMA is synchronous. Hopper only: ``mma.sync`` (sm_8x, sm_12x) is
    synchronous anyway, and Blackwell's ``tcgen05`` reads its operands from shared or tensor memory, not registers,
    so there it would only take away the MMA's overlap with the next step."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [acc], dtype=tl.float32, is_pure=True, pack=1)


# The ``strided`` layout's wgmma order (``mxrepack.layouts.strided``, ``order: wgmma``): in each 1 KB chunk of 16
# stored rows and one 128-code K tile, lane 4 g + t of a warp holds 32 bytes, whose word s (k16 step s) holds the
# bytes (g, 8s+t), (g, 8s+t+4), (g+8, 8s+t), (g+8, 8s+t+4): the four bf16 pairs of that lane's register A fragment
# of Hopper's wgmma for step s (Triton's kWidth 2), their bits placed for this decode (``strided.WORD_ROTATIONS``):
# pair p is the word rotated left and masked to each half's sign and three value bits (bf16 value x 2^-126), then
# the scale multiply(s); rows g and g + 8 take their own scale ($5, $6). 13 instructions a word, folded (the
# byte-wise decode took 21). With every lane's bytes in its own fragment, a K tile's W is one MMA operand that needs
# no shuffle (the swapped step on the rows order decodes even and odd codes into two dots); the tiles to 48 rows per
# expert wait for it before the next decode (:func:`mma_done`), the wider ones keep it in flight with the operand
# copied (:func:`fresh_operand`; ``MoeConfig.wait_mma``). On sm_12x (``mma.sync``, kWidth 8)
# a lane's fragment is other bytes: these kernels are sm_90's.
def _word_masks(pair: int) -> dict[int, int]:
    """Pair ``pair``'s decode: {left rotation of the word: mask of the bits it brings into place}."""
    masks: dict[int, int] = {}
    for j, r in enumerate(WORD_ROTATIONS[pair]):
        for half in range(2):
            masks[r] = masks.get(r, 0) | 1 << (16 * half + WORD_DECODED_BITS[j])
    return masks


def _word_asm(multiplies: str) -> str:
    lines = ["{", ".reg .b32 t, m, c;", "mov.b32 m, 0x80008000;"]
    lines += ["mov.b32 c, 0x7e807e80;"] if ", c," in multiplies else []
    for i in range(4):
        out = f"${i}"
        for n, (r, mask) in enumerate(sorted(_word_masks(i).items(), key=lambda rm: rm[0] != 0)):
            src = "$4" if r == 0 else "t"
            if r:
                lines.append(f"shf.l.wrap.b32 t, $4, $4, {r};")
            if n == 0:
                lines.append(f"and.b32 {out}, {src}, {hex(mask)};")
            else:  # (src & mask) | out
                lines.append(f"lop3.b32 {out}, {src}, {hex(mask)}, {out}, 0xEA;")
        lines += [line.format(out=out, scale=f"${5 + i // 2}") for line in multiplies.splitlines()]
    return "\n".join(lines + ["}"])


# unfolded: times E2M1's 2^126 (c), then the scale (bf16 2^(E-127)); folded: times the scale 2^(E-1) (E <= 128)
WORD_ASM = tl.constexpr(_word_asm("fma.rn.bf16x2 {out}, {out}, c, m;\nfma.rn.bf16x2 {out}, {out}, {scale}, m;"))
WORD_ASM_FOLDED = tl.constexpr(_word_asm("fma.rn.bf16x2 {out}, {out}, {scale}, m;"))
# the portable twin's bits, as constants Triton can read (the layout's table, pair 3 apart: see _word_masks). The
# twin is written for the table's shape: pairs 0-2 rotated whole, pair 3 in place but for one rotation, each half's
# bits at 6, 7, 8 and 15 (the mask 0x81C081C0 and the byte extraction in _fragment_bytes)
assert WORD_DECODED_BITS == (6, 7, 8, 15) and all(len(_word_masks(p)) == 1 for p in range(3))
assert sorted(_word_masks(3)) == [0, max(WORD_ROTATIONS[3])] and 0 not in (
    r for p in range(3) for r in WORD_ROTATIONS[p]
)
_ROT0, _ROT1, _ROT2 = (tl.constexpr(WORD_ROTATIONS[p][0]) for p in range(3))
_ROT3 = tl.constexpr(max(WORD_ROTATIONS[3]))
_MASK3_ROTATED = tl.constexpr(_word_masks(3)[max(WORD_ROTATIONS[3])])
_MASK3_IN_PLACE = tl.constexpr(_word_masks(3)[0])


@triton.jit
def _rotl(x, r: tl.constexpr):
    return (x << r) | (x >> (32 - r))


@triton.jit
def _fragment_bytes(wb, BLOCKS: tl.constexpr):
    """Stored chunk-order bytes ``[BLOCKS, 32, 32]`` (wgmma or mma2: the same word bits) -> the fragment bytes before
    the word-bit placement (the portable twin of the PTX decode's rotations and masks): per word, each pair's two codes
    back in one byte."""
    sh = (8 * tl.arange(0, 4)).to(tl.uint32)
    word = tl.sum(tl.reshape(wb.to(tl.uint32), (BLOCKS, 32, 8, 4)) << sh[None, None, None, :], axis=3)
    p = tl.arange(0, 4)[None, None, None, :]
    x = word[:, :, :, None]
    full = 0x81C081C0  # each half's sign and value bits, where the decode puts them
    v = tl.where(p == 0, _rotl(x, _ROT0), tl.where(p == 1, _rotl(x, _ROT1), _rotl(x, _ROT2))) & full
    v = tl.where(p == 3, (x & _MASK3_IN_PLACE) | (_rotl(x, _ROT3) & _MASK3_ROTATED), v)
    byte = ((v >> 6) & 7) | ((v >> 12) & 8) | ((v >> 18) & 0x70) | ((v >> 24) & 0x80)
    return tl.reshape(byte, (BLOCKS, 32, 32)).to(tl.uint8)


@triton.jit
def _decode_words_asm(wb, sf, MATH: tl.constexpr):
    """The PTX decode of stored words ``wb`` (bytes, 4 per word) with one bf16 scale per byte ``sf``: per word, r0 the
    bf16 pairs of its bytes 0 and 1 (low code first), r1 of bytes 2 and 3 (:data:`WORD_ASM`)."""
    tl.static_assert(MATH == "asm" or MATH == "asm-fold", "the chunk orders' PTX decode: MATH is asm or asm-fold")
    if MATH == "asm-fold":
        r0, r1 = tl.inline_asm_elementwise(
            WORD_ASM_FOLDED, "=r,=r,=r,=r,r,r,r", [wb, sf], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4
        )
    else:
        r0, r1 = tl.inline_asm_elementwise(
            WORD_ASM, "=r,=r,=r,=r,r,r,r", [wb, sf], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4
        )
    return r0, r1


@triton.jit
def _scale_bf16(sc, MATH: tl.constexpr):
    """E8M0 scale bytes as the PTX decode multiplies by them (folded: 2^(E-1); else 2^(E-127))."""
    if MATH == "asm-fold":
        s = e8m0_to_bf16_folded(sc)
    else:
        s = e8m0_to_bf16(sc)
    return s


@triton.jit
def _wgmma_words(wb, sc, BLOCKS: tl.constexpr, MATH: tl.constexpr):
    """Lane bytes ``[BLOCKS, 32, 32]`` and the lane's E8M0 scales ``[BLOCKS, 32, 8]`` (at 2 j + c: group j, row
    g + 8 c) -> (r0, r1) bf16 ``[BLOCKS, 32, 32]``: per word, r0 = (low, high code) of its bytes 0 and 1 (row g), r1
    of bytes 2 and 3 (row g + 8)."""
    if MATH == "ops":  # the portable twin: fp32 values, the same arrangement
        w = tl.reshape(_fragment_bytes(wb, BLOCKS).to(tl.int32), (BLOCKS, 32, 4, 2, 2, 2))  # j, s % 2, c, kh
        s = e8m0_to_fp32(tl.reshape(sc.to(tl.int32), (BLOCKS, 32, 4, 1, 2, 1)))
        v = tl.join(e2m1_to_fp32(w & 15) * s, e2m1_to_fp32(w >> 4) * s)  # [.., j, s % 2, c, kh, nibble]
        v = tl.reshape(v, (BLOCKS, 32, 8, 2, 4))  # s, c, (kh, nibble)
        r0, r1 = tl.split(tl.permute(v, (0, 1, 2, 4, 3)))
        r0, r1 = tl.reshape(r0, (BLOCKS, 32, 32)), tl.reshape(r1, (BLOCKS, 32, 32))
    else:  # one scale per byte, in the lane's byte order 4 s + 2 c + kh (s = 2 j + s % 2)
        r0, r1 = _decode_words_asm(wb, _per_lane_byte(_scale_bf16(sc, MATH), BLOCKS), MATH)
    return r0, r1


@triton.jit
def _mma2_words(wb, sc, BLOCKS: tl.constexpr, MATH: tl.constexpr):
    """Lane bytes ``[BLOCKS, 32, 32]`` in the mma2 order and the lane's E8M0 scales ``[BLOCKS, 32, 8]`` (at 2 q + c:
    group q, row g + 8 c, the scale of its word 2 q + c) -> (r0, r1) bf16 ``[BLOCKS, 32, 32]``: per word, r0 its codes
    0-3 (bytes 0 and 1), r1 its codes 4-7 (bytes 2 and 3), all of one row and one scale group."""
    if MATH == "ops":  # the portable twin: fp32 values, the same arrangement
        w = tl.reshape(_fragment_bytes(wb, BLOCKS).to(tl.int32), (BLOCKS, 32, 8, 2, 2))  # word, J, byte of J
        s = e8m0_to_fp32(tl.reshape(sc.to(tl.int32), (BLOCKS, 32, 8, 1, 1)))
        v = tl.join(e2m1_to_fp32(w & 15) * s, e2m1_to_fp32(w >> 4) * s)  # [.., word, J, byte, nibble]
        r0, r1 = tl.split(tl.permute(v, (0, 1, 2, 4, 5, 3)))
        r0, r1 = tl.reshape(r0, (BLOCKS, 32, 32)), tl.reshape(r1, (BLOCKS, 32, 32))
    else:  # the word's scale for each of its 4 bytes
        sf = tl.broadcast_to(tl.reshape(_scale_bf16(sc, MATH), (BLOCKS, 32, 8, 1)), (BLOCKS, 32, 8, 4))
        r0, r1 = _decode_words_asm(wb, tl.reshape(sf, (BLOCKS, 32, 32)), MATH)
    return r0, r1


@triton.jit
def _per_lane_byte(s, BLOCKS: tl.constexpr):
    """A lane's 8 scales ``[BLOCKS, 32, 8]`` (2 j + c) -> one per byte ``[BLOCKS, 32, 32]`` (4 s + 2 c + kh)."""
    s = tl.broadcast_to(tl.reshape(s, (BLOCKS, 32, 4, 1, 2, 1)), (BLOCKS, 32, 4, 2, 2, 2))
    return tl.reshape(s, (BLOCKS, 32, 32))


# A chunk order's decode for a GEMV or the prefill's dequantizer: WORD_ASM's rotations and masks, taking one int32 word
# at a time. Elementwise over words, so no layout Triton picks can hand it another word's bytes: the tiles' byte form
# (pack = 4) relies on the layout of the MMA operand it feeds, which neither has (their builds fail
# :func:`wgmma_words_packed`). Outputs: the word's 4 bf16 pairs, pair p = byte p's codes (low half first). A wgmma word
# holds two rows (pairs 0, 1 row g; 2, 3 row g + 8), each with its own scale; an mma2 word is 8 codes of one row in one
# scale group: its scale is passed as both.


@triton.jit
def _bf16_pair_values(pair):
    """A bf16 pair in an int32 -> (low, high) as fp32."""
    return (pair << 16).to(tl.float32, bitcast=True), (pair & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _pair_scale(sc, MATH: tl.constexpr):
    """E8M0 bytes -> the PTX decode's scale operand: the bf16 scale in both halves of an int32."""
    s16 = _scale_bf16(sc, MATH).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return s16 | (s16 << 16)


@triton.jit
def _word_scales(sc, ORDER: tl.constexpr):
    """A lane's 8 E8M0 scales ``[BLOCKS, 32, 8]`` (at 2 j + c: group j, row g + 8 c) -> (scale of pairs 0 and 1,
    scale of pairs 2 and 3) of each of its 8 words: mma2 word 2 q + c is one row and group (sc itself, twice); wgmma
    word s is group s // 2 of rows g (pairs 0, 1) and g + 8 (pairs 2, 3)."""
    if ORDER == "wgmma":
        blocks: tl.constexpr = sc.shape[0]
        g_lo, g_hi = tl.split(tl.reshape(sc, (blocks, 32, 4, 2)))
        lo = tl.reshape(tl.broadcast_to(tl.reshape(g_lo, (blocks, 32, 4, 1)), (blocks, 32, 4, 2)), (blocks, 32, 8))
        hi = tl.reshape(tl.broadcast_to(tl.reshape(g_hi, (blocks, 32, 4, 1)), (blocks, 32, 4, 2)), (blocks, 32, 8))
    else:
        tl.static_assert(ORDER == "mma2", "chunk orders: wgmma or mma2")
        lo = sc
        hi = sc
    return lo, hi


@triton.jit
def chunk_lane_scales(s_ptr, s_off, lane):
    """The E8M0 scales of each lane ``lane`` ``[1, 32, 1]`` of chunks whose 64-byte scale pieces start at ``s_off``
    ``[BLOCKS, 1, 1]``: ``[BLOCKS, 32, 8]``, lane 4 g + t's 8 bytes at 2 j + c (group j, row 8 c + g), as
    :func:`chunk_word_values` takes them."""
    return tl.load(s_ptr + s_off + 8 * (lane // 4) + tl.arange(0, 8)[None, None, :])


@triton.jit
def _word_values_ops(w_ptr, w_off, lane, s_lo, s_hi):
    """The portable twin of :func:`_word_pairs_asm` as fp32 values: the words' bytes back in fragment order, then each
    nibble."""
    wb = tl.load(w_ptr + w_off + lane * 32 + tl.arange(0, 32)[None, None, :])
    blocks: tl.constexpr = wb.shape[0]
    b = tl.reshape(_fragment_bytes(wb, blocks).to(tl.int32), (blocks, 32, 8, 2, 2))  # byte 2 p1 + p0
    f_lo = e8m0_to_fp32(s_lo.to(tl.int32))
    f_hi = e8m0_to_fp32(s_hi.to(tl.int32))
    b01, b23 = tl.split(tl.permute(b, (0, 1, 2, 4, 3)))  # p1 = 0, 1
    b0, b1 = tl.split(b01)
    b2, b3 = tl.split(b23)
    v0, v1 = e2m1_to_fp32(b0 & 15) * f_lo, e2m1_to_fp32(b0 >> 4) * f_lo
    v2, v3 = e2m1_to_fp32(b1 & 15) * f_lo, e2m1_to_fp32(b1 >> 4) * f_lo
    v4, v5 = e2m1_to_fp32(b2 & 15) * f_hi, e2m1_to_fp32(b2 >> 4) * f_hi
    v6, v7 = e2m1_to_fp32(b3 & 15) * f_hi, e2m1_to_fp32(b3 >> 4) * f_hi
    return v0, v1, v2, v3, v4, v5, v6, v7


@triton.jit
def _word_pairs_asm(w_ptr, w_off, lane, s_lo, s_hi, ORDER: tl.constexpr, MATH: tl.constexpr):
    """The PTX word decode (:data:`WORD_ASM`): each word's 4 bf16 pairs (int32, low code first)."""
    tl.static_assert(MATH == "asm" or MATH == "asm-fold", "the chunk word decode: MATH is asm, asm-fold or ops")
    words = tl.load(w_ptr.to(tl.pointer_type(tl.int32)) + w_off // 4 + lane * 8 + tl.arange(0, 8)[None, None, :])
    pair_lo = _pair_scale(s_lo, MATH)
    pair_hi = _pair_scale(s_hi, MATH) if ORDER == "wgmma" else pair_lo  # an mma2 word: one scale, passed twice
    if MATH == "asm-fold":
        p0, p1, p2, p3 = tl.inline_asm_elementwise(
            WORD_ASM_FOLDED, "=r,=r,=r,=r,r,r,r", [words, pair_lo, pair_hi], dtype=(tl.int32,) * 4, is_pure=True, pack=1
        )
    else:
        p0, p1, p2, p3 = tl.inline_asm_elementwise(
            WORD_ASM, "=r,=r,=r,=r,r,r,r", [words, pair_lo, pair_hi], dtype=(tl.int32,) * 4, is_pure=True, pack=1
        )
    return p0, p1, p2, p3


@triton.jit
def chunk_word_values(w_ptr, w_off, lane, sc, ORDER: tl.constexpr, MATH: tl.constexpr):
    """The 8 codes' values (fp32, each ``[BLOCKS, 32, 8]``: block, lane ``4g + t``, word) of a chunk order's chunks at
    byte offsets ``w_off`` ``[BLOCKS, 1, 1]`` (``lane`` ``[1, 32, 1]``), times their scales ``sc`` (E8M0 bytes
    ``[BLOCKS, 32, 8]`` at 2 j + c: group j, row 8 c + g). Value j of word w, mma2 (w = 2 q + c): code 32 q + 8 t + j
    of row 8 c + g; wgmma (w = s, the k16 step): code 16 s + 2 t + (0, 1, 8, 9)[j % 4] of row g (j < 4) or g + 8."""
    s_lo, s_hi = _word_scales(sc, ORDER)
    if MATH == "ops":
        v0, v1, v2, v3, v4, v5, v6, v7 = _word_values_ops(w_ptr, w_off, lane, s_lo, s_hi)
    else:
        p0, p1, p2, p3 = _word_pairs_asm(w_ptr, w_off, lane, s_lo, s_hi, ORDER, MATH)
        v0, v1 = _bf16_pair_values(p0)
        v2, v3 = _bf16_pair_values(p1)
        v4, v5 = _bf16_pair_values(p2)
        v6, v7 = _bf16_pair_values(p3)
    return v0, v1, v2, v3, v4, v5, v6, v7


@triton.jit
def _bf16_pair(lo, hi):
    """Two fp32 values exact in bf16 (codes times E8M0 scales) as a bf16 pair in an int32, low half first
    (:func:`_bf16_bits`)."""
    return _bf16_bits(lo) | (_bf16_bits(hi) << 16)


@triton.jit
def chunk_word_pairs(w_ptr, w_off, lane, sc, ORDER: tl.constexpr, MATH: tl.constexpr):
    """:func:`chunk_word_values` as each word's 4 bf16 pairs (int32, low code first): pair p holds values 2 p and
    2 p + 1, two neighbouring codes of one row."""
    s_lo, s_hi = _word_scales(sc, ORDER)
    if MATH == "ops":
        v0, v1, v2, v3, v4, v5, v6, v7 = _word_values_ops(w_ptr, w_off, lane, s_lo, s_hi)
        p0, p1, p2, p3 = _bf16_pair(v0, v1), _bf16_pair(v2, v3), _bf16_pair(v4, v5), _bf16_pair(v6, v7)
    else:
        p0, p1, p2, p3 = _word_pairs_asm(w_ptr, w_off, lane, s_lo, s_hi, ORDER, MATH)
    return p0, p1, p2, p3


@triton.jit
def chunk_tile(
    w_ptr, s_ptr, w_off, s_off, BLOCKS: tl.constexpr, MATH: tl.constexpr, ORDER: tl.constexpr, SCALE_SHIFT: tl.constexpr
):
    """W's rows of ``BLOCKS`` 16-row blocks over one K tile, in a chunk order (``ORDER`` "wgmma" or "mma2"), as
    ``[16 BLOCKS, 128]`` in natural order (row 16 i + r of block i, code k): ``w_off`` / ``s_off`` ``[BLOCKS]``, the
    byte offsets of each block's 1 KB weight chunk and 64-byte scale piece (scales ``[g][j][c]``, the 8 a quad of
    lanes needs contiguous). The decoded pairs are relabelled to natural order by a join, reshape and permute that
    Triton lowers without moving data where the order is the MMA's operand (each lane's values are its own fragment:
    wgmma's on sm_90a, mma.sync's kWidth 8 on sm_12x / sm_8x). ``SCALE_SHIFT``: the scales read lowered by it
    (:func:`shift_scales`), the caller's sums multiplied back (:func:`unshift`)."""
    # Loaded as one row per block (its 1 KB chunk; its scales, lane l's 8 bytes at l // 4 of the piece), then viewed
    # as [BLOCKS, 32 lanes, bytes]: the pipeline's copies into shared memory then run along a row. Loaded as
    # [BLOCKS, 32, bytes], Triton put a warp's threads across the blocks, 1 KB / 256 bytes apart in shared memory:
    # every copy bank-conflicted (4x and 16x the ideal shared-memory wavefronts on the H100 under ncu, PERF_LOG stop
    # 37). The scale copies still take 3.7x: the 4 lanes of a quad copy the same 8 source bytes.
    i = tl.arange(0, 1024)[None, :]
    wb = tl.reshape(tl.load(w_ptr + w_off[:, None] + i), (BLOCKS, 32, 32))
    j = tl.arange(0, 256)[None, :]
    sc = tl.reshape(tl.load(s_ptr + s_off[:, None] + 8 * (j // 32) + j % 8), (BLOCKS, 32, 8))
    sc = shift_scales(sc, SCALE_SHIFT)
    if ORDER == "mma2":
        r0, r1 = _mma2_words(wb, sc, BLOCKS, MATH)
        # r_J at (block, 4 g + t, 8 q + 4 c + e) = code 32 q + 8 t + 4 J + e of row 8 c + g
        x = tl.reshape(tl.join(r0, r1), (BLOCKS, 8, 4, 4, 2, 4, 2))  # block, g, t, q, c, e, J
        x = tl.permute(x, (0, 4, 1, 3, 2, 6, 5))  # block, c, g | q, t, J, e
    else:
        tl.static_assert(ORDER == "wgmma", "chunk orders: wgmma or mma2")
        r0, r1 = _wgmma_words(wb, sc, BLOCKS, MATH)
        x = tl.reshape(tl.join(r0, r1), (BLOCKS, 8, 4, 8, 2, 2, 2))  # block, g, t, s, kh, kl, c
        x = tl.permute(x, (0, 6, 1, 3, 4, 2, 5))  # block, c, g | s, kh, t, kl
    return tl.reshape(x, (16 * BLOCKS, 128))


@triton.jit
def fresh_operand(w):
    """``w`` copied value by value (a ``mov`` that ptxas removes), for a wgmma kept in flight. Triton 3.6 makes a
    decoded tile's own registers the wgmma operand and issues each k16 step as a group waited to depth 7, so the next
    K tile's decode writes registers up to 7 pending groups still read (undefined in PTX). From copies, the lowering
    packs each step's operand just before its own wgmma, where the depth-7 waits have retired that step's previous
    group, and the decode writes other registers: no such write is left (``wgmma_register_hazards``), as in
    triton_kernels' Hopper matmul, whose operand is packed the same way. Triton 3.9 splits the dot in two, each with
    registers of its own, and needs no copy."""
    return tl.inline_asm_elementwise("mov.b16 $0, $1;", "=h,h", [w], dtype=tl.bfloat16, is_pure=True, pack=1)


@triton.jit
def dot_w_tile(w, a, acc, INTERPRETER: tl.constexpr, WAIT_MMA: tl.constexpr = False, IN_FLIGHT: tl.constexpr = False):
    """``acc + w @ a.T`` for a decoded K tile ``w`` ``[R, 128]`` and activations ``a`` ``[M, 128]``; ``WAIT_MMA``: the
    wgmma waited for (:func:`mma_done`), ``IN_FLIGHT``: left in flight, its operand copied (:func:`fresh_operand`)."""
    if INTERPRETER:  # fp32 operands: Triton 3.9's interpreter mis-multiplies a bf16 operand made by a cast
        return tl.dot(w.to(tl.float32), tl.trans(a).to(tl.float32), acc)
    if IN_FLIGHT:
        w = fresh_operand(w)
    acc = tl.dot(w, tl.trans(a), acc)
    if WAIT_MMA:
        acc = mma_done(acc)
    return acc


@triton.jit
def chunk_rows(order_ptr, start, end, part, MS: tl.constexpr, TOPK, GATHER: tl.constexpr):
    """Rows of the ``part``-th ``MS`` sorted positions of a block: the token each is (``GATHER``: x's rows) or the
    position itself (the intermediate's rows), and whether it is one of the block's."""
    pos = start + part * MS + tl.arange(0, MS)
    ok = pos < end
    if GATHER:
        return tl.load(order_ptr + pos, mask=ok, other=0) // TOPK, ok
    return pos, ok


@triton.jit
def _load_part(a_ptr, rows, ok, rk, K, stride_a, MASK_K: tl.constexpr):
    """Rows ``rows`` (where ``ok``) of a K tile of ``a``; columns past ``K`` zero where ``MASK_K`` (x's hidden width
    is not padded; the intermediate's is)."""
    if MASK_K:
        mask = ok[:, None] & (rk < K)[None, :]
    else:
        mask = ok[:, None]
    return tl.load(a_ptr + rows[:, None] * stride_a + rk[None, :], mask=mask, other=0.0)


@triton.jit
def chunk_dots(
    a_ptr,
    order_ptr,
    start,
    end,
    TOPK,
    K,
    stride_a,
    w_e,
    s_e,
    w_off,
    s_off,
    w_step,
    s_step,
    k_tiles,
    BLOCKS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    DOTS: tl.constexpr,
    GATHER: tl.constexpr,
    MATH: tl.constexpr,
    ORDER: tl.constexpr,
    INTERPRETER: tl.constexpr,
    WAIT_MMA: tl.constexpr,
    SCALE_SHIFT: tl.constexpr,
    MASK_K: tl.constexpr,
):
    """``W @ a.T`` ``[16 BLOCKS, BLOCK_M]`` over ``k_tiles`` K tiles for W in a chunk order (wgmma, mma2): each K
    tile's W decoded once (``chunk_tile``) and fed to ``DOTS`` dots of ``BLOCK_M / DOTS`` tokens (``MoeConfig.
    token_dots``); a's rows (``chunk_rows``), gathered by token (``GATHER``: x) or by position (the intermediate),
    masked past ``K`` where ``MASK_K`` (x, whose hidden width is not padded). W's block offsets ``w_off`` / ``s_off``
    step by ``w_step`` / ``s_step`` bytes per K tile."""
    MS: tl.constexpr = BLOCK_M // DOTS
    rows0, ok0 = chunk_rows(order_ptr, start, end, 0, MS, TOPK, GATHER)
    rows1, ok1 = chunk_rows(order_ptr, start, end, 1 % DOTS, MS, TOPK, GATHER)
    rows2, ok2 = chunk_rows(order_ptr, start, end, 2 % DOTS, MS, TOPK, GATHER)
    rows3, ok3 = chunk_rows(order_ptr, start, end, 3 % DOTS, MS, TOPK, GATHER)
    acc0 = tl.zeros((16 * BLOCKS, MS), dtype=tl.float32)
    acc1 = tl.zeros((16 * BLOCKS, MS), dtype=tl.float32)
    acc2 = tl.zeros((16 * BLOCKS, MS), dtype=tl.float32)
    acc3 = tl.zeros((16 * BLOCKS, MS), dtype=tl.float32)
    FLY: tl.constexpr = ORDER == "wgmma" and not WAIT_MMA  # on Hopper: the wgmmas kept in flight (MoeConfig.wait_mma)
    for kt in range(0, k_tiles):  # kt, not k0 // 128: see _load_w
        rk = kt * 128 + tl.arange(0, 128)
        a = _load_part(a_ptr, rows0, ok0, rk, K, stride_a, MASK_K)
        w = chunk_tile(w_e, s_e, w_off + kt * w_step, s_off + kt * s_step, BLOCKS, MATH, ORDER, SCALE_SHIFT)
        acc0 = dot_w_tile(w, a, acc0, INTERPRETER, WAIT_MMA, FLY)
        if DOTS >= 2:
            a = _load_part(a_ptr, rows1, ok1, rk, K, stride_a, MASK_K)
            acc1 = dot_w_tile(w, a, acc1, INTERPRETER, WAIT_MMA, FLY)
        if DOTS >= 4:
            a = _load_part(a_ptr, rows2, ok2, rk, K, stride_a, MASK_K)
            acc2 = dot_w_tile(w, a, acc2, INTERPRETER, WAIT_MMA, FLY)
            a = _load_part(a_ptr, rows3, ok3, rk, K, stride_a, MASK_K)
            acc3 = dot_w_tile(w, a, acc3, INTERPRETER, WAIT_MMA, FLY)
    tl.static_assert(DOTS == 1 or DOTS == 2 or DOTS == 4, "one, two or four token dots")
    if DOTS == 2:  # token d * MS + m at column (d, m)
        acc0 = tl.reshape(tl.permute(tl.join(acc0, acc1), (0, 2, 1)), (16 * BLOCKS, BLOCK_M))
    elif DOTS == 4:
        both = tl.join(tl.join(acc0, acc1), tl.join(acc2, acc3))  # [rows, m, d % 2, d // 2]
        acc0 = tl.reshape(tl.permute(both, (0, 3, 2, 1)), (16 * BLOCKS, BLOCK_M))
    return unshift(acc0, SCALE_SHIFT)


@triton.jit
def wgmma_chunks(r0, stride_wn, stride_wsn, TILE_ROWS: tl.constexpr):
    """For 16-row blocks starting at stored rows ``r0`` of a K-tiled matrix (``TILE_ROWS`` rows per row tile, row
    strides ``stride_wn`` bytes of weights and ``stride_wsn`` of scales): the offsets of their weight chunks and scale
    pieces in K tile 0; K tile kt adds ``kt * TILE_ROWS * 64`` and ``kt * TILE_ROWS * 4``."""
    local = r0 % TILE_ROWS
    return (r0 - local) * stride_wn + local * 64, (r0 - local) * stride_wsn + local * 4


def wgmma_words_packed(ttgir: str) -> bool:
    """Whether every inline-asm decode of bytes (``tt.elementwise_inline_asm`` on an i8 tensor) in a compiled kernel's
    TTGIR receives bytes 0..3 of one 32-bit memory word in its registers 0..3 (its layout's first two register bases
    step the innermost dimension by 1 and 2, and no other basis moves a byte within its word), as :data:`WORD_ASM`'s
    ``pack=4`` assumes. Triton derives that layout from the MMA operand: true of wgmma's (kWidth 2) fed by the wgmma
    order and of ``mma.sync``'s (kWidth 8) fed by the mma2 order; false of either fed by the other order's relabel
    (the wgmma order on sm_12x, the mma2 order on sm_90), and of a consumer that is no MMA operand (a GEMV's reduction:
    ``benchmarks/experiments/mma2_gemv_probe.py``). False for a layout it cannot read, and for a kernel with no such
    decode."""
    layouts = {m.group(1): m.group(2) for m in re.finditer(r"^(#[\w.]+) = (.*)$", ttgir, re.M)}
    found = False
    for line in ttgir.splitlines():
        if "tt.elementwise_inline_asm" not in line:
            continue
        m = re.search(r":\s*\(?tensor<([0-9x]+)xi8, (#[\w.]+)", line.split('"')[-1])
        if m is None:
            continue
        found = True
        rank, enc = len(m.group(1).split("x")), layouts.get(m.group(2), "")
        if "ttg.linear" in enc:
            bases = {k: re.search(k + r" = (\[.*?\]\]|\[\])", enc) for k in ("register", "lane", "warp")}
            if not all(bases.values()):
                return False
            bases = {k: json.loads(v.group(1)) for k, v in bases.items()}
            unit = [[0] * (rank - 1) + [1], [0] * (rank - 1) + [2]]
            rest = bases["register"][2:] + bases["lane"] + bases["warp"]
            if bases["register"][:2] != unit or any(b[-1] % 4 for b in rest):
                return False
        elif "ttg.blocked" in enc:
            size = re.search(r"sizePerThread = (\[[^\]]*\])", enc)
            order = re.search(r"order = (\[[^\]]*\])", enc)
            if not (size and order):
                return False
            size, order = json.loads(size.group(1)), json.loads(order.group(1))
            if size[-1] < 4 or size[-1] % 4 or order[0] != rank - 1:
                return False
        else:
            return False
    return found


_BUILDS_CHECKED: dict[str, tuple[bool, str | None]] = {}  # per build: words packed, its first register hazard


_PTX_INSTR = re.compile(r"^\s*(?:@!?%?\w+\s+)?([a-z][\w.:]*)\s*(.*?);\s*$")
_PTX_LABEL = re.compile(r"^\s*(\$L__\w+):")
_PTX_REG = re.compile(r"%[rf]\d+\b")  # 32-bit registers: a wgmma's A fragments (b32) and accumulators (f32 or b32)


def wgmma_register_hazards(ptx: str) -> list[str]:
    """What a build's PTX does with the registers its ``wgmma.mma_async`` read (the A fragments and the accumulator),
    against PTX's rules for them: a write by another instruction while a wgmma reading it is in flight (from its issue
    until a ``wgmma.wait_group N`` leaves fewer groups pending than its group's place; groups end at
    ``wgmma.commit_group``), a read of an in-flight accumulator, and a wgmma reading a register written since the last
    ``wgmma.fence``. Each is undefined; the first is triton-lang/triton#9433 (Triton's pipeliner once left a group in
    flight at a loop's back edge while the next iteration's decode rewrote its A registers, and the H100 gave
    non-finite outputs). Walked in text order, each loop's body twice (again from its back edge), so that a group still
    pending at the back edge meets the next iteration's code; a wgmma may write the accumulator a pending one reads
    (chained MMAs). Limits: forward branches are walked as if taken in text order (a wait on a skipped path would
    count), and an inner loop is walked twice per pass of the outer one. Raises on a wgmma whose operands it cannot
    read, so that a change of Triton's PTX fails loudly instead of finding nothing."""
    lines = [ln.split("//")[0] for ln in ptx.splitlines()]
    labels = {m.group(1): i for i, ln in enumerate(lines) if (m := _PTX_LABEL.match(ln))}
    order = list(range(len(lines)))
    for i, ln in enumerate(lines):  # each loop's body once more after its back edge
        m = re.search(r"\bbra(?:\.uni)?\s+(\$L__\w+)", ln)
        if m and labels.get(m.group(1), i) < i:
            at = order.index(i) + 1
            order[at:at] = range(labels[m.group(1)], i + 1)
    pending: list[tuple[set[str], set[str]]] = []  # per committed group in flight: registers read, accumulators
    group: tuple[set[str], set[str]] = (set(), set())  # those of the group being issued
    unfenced: set[str] = set()  # registers written since the last wgmma.fence
    found = []
    for i in order:
        m = _PTX_INSTR.match(lines[i])
        if not m:
            continue
        opcode, operands = m.groups()
        at = f"line {i + 1}: {opcode}"
        if opcode.startswith("wgmma.mma_async"):
            acc_list, _, rest = operands.partition("}")
            acc = set(_PTX_REG.findall(acc_list))
            a_op = rest.split(",", 1)[1].strip() if "," in rest else ""
            a = set(_PTX_REG.findall(a_op.partition("}")[0])) if a_op.startswith("{") else set()
            if not acc or (a_op.startswith("{") and not a):
                raise ValueError(f"{at}: cannot read this wgmma's registers ({operands[:80]})")
            if (a | acc) & unfenced:
                found.append(f"{at} reads {sorted((a | acc) & unfenced)[0]}, written after the last wgmma.fence")
            group = (group[0] | a | acc, group[1] | acc)
            continue
        if opcode.startswith("wgmma.commit_group"):
            pending.append(group)
            group = (set(), set())
            continue
        if opcode.startswith("wgmma.wait_group"):
            keep = int(operands)
            pending = pending[len(pending) - keep :] if keep else []
            continue
        if opcode.startswith("wgmma.fence"):
            unfenced = set()
            continue
        no_dest = opcode.startswith(("st.", "red.", "bar", "bra", "wgmma.", "cp.", "fence", "membar", "ret"))
        dest = "" if no_dest else (operands.partition("}")[0] if operands.startswith("{") else operands.split(",")[0])
        written = set(_PTX_REG.findall(dest))
        read = set(_PTX_REG.findall(operands[len(dest) :]))
        unfenced |= written
        busy = set().union(group[0], *(g[0] for g in pending))
        busy_acc = set().union(group[1], *(g[1] for g in pending))
        if written & busy:
            found.append(f"{at} writes {sorted(written & busy)[0]} while a wgmma reading it is in flight")
        elif read & busy_acc:
            found.append(f"{at} reads {sorted(read & busy_acc)[0]}, the accumulator of a wgmma in flight")
    return found


# Triton releases whose builds of the wgmma order's in-flight tiles were walked (:func:`wgmma_register_hazards`): 3.6
# with the operand copy (:func:`fresh_operand`), 3.9 with or without it. Under any other release those tiles wait for
# each wgmma (:func:`in_flight_allowed`).
IN_FLIGHT_TRITONS = ((3, 6), (3, 9))


@functools.cache  # asked at every MoE launch
def in_flight_allowed() -> bool:
    """Whether the installed Triton is one whose in-flight wgmma builds were checked (:data:`IN_FLIGHT_TRITONS`)."""
    return tuple(int(p) for p in triton.__version__.split(".")[:2]) in IN_FLIGHT_TRITONS


def check_chunk_build(compiled) -> None:
    """Raise if a launched chunk-order tile's decode does not receive whole words (:func:`wgmma_words_packed`), or if
    its PTX writes a register a wgmma in flight reads (:func:`wgmma_register_hazards`): once per compiled kernel, so
    that a config Triton lowers to another MMA fails loudly instead of multiplying the wrong bytes, and a Triton that
    lowers the in-flight tiles otherwise than the checked ones fails instead of racing. ``compiled``: what a Triton
    launch returns."""
    key = compiled.hash
    if key not in _BUILDS_CHECKED:
        hazards = wgmma_register_hazards(compiled.asm["ptx"])
        _BUILDS_CHECKED[key] = (wgmma_words_packed(compiled.asm["ttgir"]), hazards[0] if hazards else None)
    packed, hazard = _BUILDS_CHECKED[key]
    if not packed:
        raise RuntimeError(
            f"{compiled.name}: a chunk order's (wgmma, mma2) decode does not receive whole memory words in this build "
            "(Triton chose another MMA layout, e.g. for an operand under 64 rows): it would decode the wrong bytes"
        )
    if hazard:
        raise RuntimeError(
            f"{compiled.name}: this build writes a register a wgmma in flight reads ({hazard}; Triton "
            f"{triton.__version__}): set the tile's wait_mma or use a Triton of {IN_FLIGHT_TRITONS}"
        )


def largest_scale(*scales: torch.Tensor) -> int:
    """The largest E8M0 byte of ``scales`` (0 for none): one reduction and one synchronization per tensor."""
    return max((int(s.view(torch.uint8).max()) for s in scales if s.numel()), default=0)


def fits_fold(*scales: torch.Tensor) -> bool:
    """Whether weights with these E8M0 scales take ``fold_scale``'s decode (:data:`PAIRS_ASM_FOLDED`): every scale
    <= 128, i.e. block scales up to 2. Asked once per weight, where it is loaded (it synchronizes): the kernels'
    ``fold_scale`` arguments take the answer."""
    return largest_scale(*scales) <= 128


# The largest scale shift the kernels take: their outputs are multiplied by 2^shift as an int32 constant.
MAX_SCALE_SHIFT = 30


def fold_shift(*scales: torch.Tensor) -> int | None:
    """The power-of-two shift with which weights with these E8M0 scales take the folded decode, or None where none
    serves: 0 where every scale is <= 128 (:func:`fits_fold`); else ``largest - 128``, which the MoE kernels that fold
    (``moe_mxfp4``'s ``scale_shift``) subtract from every scale byte before the decode and give back as a factor
    2^shift on their fp32 sums: both steps exact powers of two, so the same bits as the unfolded decode. It serves
    where the shift is at most :data:`MAX_SCALE_SHIFT` and every scale byte is either 0 or at least the shift (a
    smaller one would underflow). A 0 byte reads as 0 too (:func:`shift_scales`): the layouts write it for their
    padding, whose codes are 0; a real block of scale 2^-127 holds values under 2^-124, which no bf16 sum of the
    layer's size can show, and is then decoded 2^shift too large. "The same bits" holds while the fp32 products and
    partial sums stay normal: lowered by 2^shift, one near 2^-126 could round as a subnormal (a scale byte near the
    shift times activations near 2^-100; no real layer's). A checkpoint's scales pass 128 where a block's
    largest weight is 16 or more: the 12-layer fixture's tail reaches 129, and its MoE layers decoded unfolded in vLLM
    (the decode GEMV's gate_up 34 us against 25 folded, H100). Asked once per layer where it is loaded (it
    synchronizes)."""
    largest = largest_scale(*scales)
    if largest <= 128:
        return 0
    shift = largest - 128
    # the smallest byte but 0 (the largest is over 128, so some tensor has bytes)
    smallest = min(int(torch.where(b > 0, b, 255).min()) for b in (s.view(torch.uint8) for s in scales if s.numel()))
    return shift if shift <= MAX_SCALE_SHIFT and smallest >= shift else None


@triton.jit
def shift_scales(s, SCALE_SHIFT: tl.constexpr):
    """E8M0 bytes ``s`` lowered by ``SCALE_SHIFT`` (:func:`fold_shift`), as the folded decode reads them; a byte under
    the shift (0: the layouts' padding) reads as 0, a finite scale."""
    if SCALE_SHIFT:
        s = tl.maximum(s, SCALE_SHIFT) - SCALE_SHIFT
    return s


@triton.jit
def unshift(acc, SCALE_SHIFT: tl.constexpr):
    """fp32 sums of weights decoded with scales lowered by ``SCALE_SHIFT`` (:func:`shift_scales`), times 2^shift:
    exact, so the same bits as the unshifted decode's."""
    if SCALE_SHIFT:
        acc = acc * (1 << SCALE_SHIFT)
    return acc


def without_fold(cfg):
    """``cfg`` with the scale unfolded (its remainder tile too): the twin a folded config's bits are compared with."""
    if getattr(cfg, "remainder", None) is not None:
        return dataclasses.replace(
            cfg, fold_scale=False, remainder=dataclasses.replace(cfg.remainder, fold_scale=False)
        )
    return dataclasses.replace(cfg, fold_scale=False)


def with_fold(cfg, bf16_activations: bool, scales_fit: bool):
    """A tile config (``LinearConfig`` / ``MoeConfig``) as the dispatch runs it: folded where it decodes W in
    registers (``swap_ab``) for BF16 activations and the weights' scales fit (:func:`fits_fold`'s answer); the
    config itself otherwise. A MoE tile's ``remainder`` (same operand form) folds with it."""
    if not (scales_fit and bf16_activations and cfg.swap_ab):
        return cfg
    if getattr(cfg, "remainder", None) is not None:
        return dataclasses.replace(cfg, fold_scale=True, remainder=dataclasses.replace(cfg.remainder, fold_scale=True))
    return dataclasses.replace(cfg, fold_scale=True)


def check_fold_scale(*scales: torch.Tensor) -> None:
    """``fold_scale``'s precondition, for a folded config chosen by hand (a caller's ``fold_scale`` argument is its
    own answer from :func:`fits_fold`). Not while a CUDA graph is captured: the timed replays of a checked call."""
    if any(s.is_cuda for s in scales) and torch.cuda.is_current_stream_capturing():
        return
    if (largest := largest_scale(*scales)) > 128:
        raise ValueError(f"fold_scale needs E8M0 scales <= 128 (block scales up to 2), got {largest}")


@functools.cache
@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def device_capability(device: torch.device) -> tuple[int, int]:
    """A CUDA device's compute capability, asked once per device (the kernels' entry points ask it every call)."""
    return _capability(device.index if device.index is not None else torch.cuda.current_device())


def launches_dependents(device: torch.device) -> bool:
    """Whether kernels on ``device`` may use programmatic dependent launch (``griddepcontrol``, ``launch_pdl``):
    sm_90 and newer (ptxas refuses the instruction below sm_90, and the strided layout's kernels build for sm_80+),
    unless ``MXREPACK_PDL=0``: the launches then go one after the other, the same math. A way out if an engine's CUDA
    graph capture rejects the launch attribute on a GPU it was not tried on (one report on sm_120 in another engine,
    sgl-project/sglang#18596; mxrepack's PDL launches were captured in vLLM 0.26's graphs on an H100 only)."""
    if os.environ.get("MXREPACK_PDL", "1") == "0":
        return False
    return device.type == "cuda" and device_capability(device)[0] >= 9


def mma_reads_registers_async(device: torch.device) -> bool:
    """Whether the swapped-operand step must wait for its MMAs (:func:`mma_done`): Hopper (sm_90), whose ``wgmma``
    reads the decoded W from registers asynchronously; not under Triton's ``DISABLE_MMA_V3``, where Hopper builds the
    synchronous ``mma.sync`` as sm_12x does (so that the H100 stand-in runs sm_12x's code, wait included)."""
    return device.type == "cuda" and builds_wgmma(device_capability(device)[0])


def builds_wgmma(major: int) -> bool:
    """Whether Triton builds Hopper's ``wgmma`` for a GPU of compute capability ``major``: sm_90, not under its
    ``DISABLE_MMA_V3`` (:func:`mma_v3_disabled`)."""
    return major == 9 and not mma_v3_disabled()


def interpreting() -> bool:
    """Triton's interpreter runs the kernels (``TRITON_INTERPRET=1``): no PTX, so the portable decode."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def runs_ptx(device: torch.device) -> bool:
    """Whether kernels on ``device`` are compiled for a GPU (CUDA, not the interpreter): the PTX decode, PDL and the
    build checks apply; else the portable decode."""
    return device.type == "cuda" and not interpreting()


def mma_v3_disabled() -> bool:
    """Triton's ``DISABLE_MMA_V3`` is on: Hopper builds take ``mma.sync`` as sm_12x's do (an H100 then runs sm_12x's
    code path: ``benchmarks/experiments/mma_v2_proxy.py``)."""
    return os.environ.get("DISABLE_MMA_V3", "").lower() in ("1", "true", "on")


def split_pairs(x: torch.Tensor, width: int) -> torch.Tensor:
    """Activations ``[T, K]`` -> ``[T, width]`` (zero-padded to ``width``, a multiple of 128) with each 128-column
    K tile as its 64 even columns then its 64 odd ones: the order :func:`dot_w_mxfp4` reads. One launch through a
    :class:`~mxrepack.kernels.launch.Launcher`: lm_head's swapped tile runs outside vLLM's graphs, and torch's pad and
    copy took two launches' host time a call (PERF_LOG stop 49)."""
    T, K = x.shape
    if width % 128 or width < K:
        raise ValueError(f"split width {width} must be a multiple of 128 and at least {K}")
    out = torch.empty(T, width, dtype=x.dtype, device=x.device)
    if T:
        grid = (T, cdiv(width // 128, SPLIT_TILES))
        _LAUNCH_SPLIT(
            grid, x, out, K, width, x.stride(0), x.stride(1), TILES=SPLIT_TILES, num_warps=SPLIT_WARPS, num_stages=1
        )
    return out


# 128-column tiles of one row per program of split_pairs' kernel, and its warps: 4 and 2 took 1.5 / 3.7 / 20.1 us at 16
# / 512 / 4096 rows of gpt-oss's 2880 columns, 8 and 4 1.5 / 4.1 / 23.9, one tile on one warp 1.5 / 8.1 / 58.0, torch's
# pad and copy 5.7 / 11.0 / 66.7 (H200, CUDA graphs, docs/bench/split_pairs_probe_h200_2026-11-29_bbef56d.json)
SPLIT_TILES, SPLIT_WARPS = 4, 2


@triton.jit
def _split_pairs_kernel(x_ptr, out_ptr, K, width, stride_xm, stride_xk, TILES: tl.constexpr):
    """``TILES`` 128-column tiles of one row of :func:`split_pairs`: each tile's even columns, then its odd ones, zero
    past K."""
    row = tl.program_id(0)
    j = tl.program_id(1) * TILES + tl.arange(0, TILES)[:, None]  # the tiles
    i = tl.arange(0, 64)[None, :]  # the pairs of a tile
    even = j * 128 + 2 * i
    ok = even < width
    src = x_ptr + row.to(tl.int64) * stride_xm + even.to(tl.int64) * stride_xk  # a strided view can pass 2^31
    dst = out_ptr + row.to(tl.int64) * width + j * 128 + i
    tl.store(dst, tl.load(src, mask=even < K, other=0.0), mask=ok)
    tl.store(dst + 64, tl.load(src + stride_xk, mask=even + 1 < K, other=0.0), mask=ok)


_LAUNCH_SPLIT = Launcher(_split_pairs_kernel)


@triton.jit
def load_split(a_ptr, rows, row_ok, k0, stride_a, BLOCK_K: tl.constexpr):
    """The even and odd columns ``[rows, BLOCK_K/2]`` of one K tile of activations in split order (:func:`split_pairs`):
    two contiguous halves, so both load as whole rows; no K mask (split order is padded to whole tiles)."""
    r = rows[:, None] * stride_a + k0 + tl.arange(0, BLOCK_K // 2)[None, :]
    return (
        tl.load(a_ptr + r, mask=row_ok[:, None], other=0.0),
        tl.load(a_ptr + r + BLOCK_K // 2, mask=row_ok[:, None], other=0.0),
    )


@triton.jit
def split_column(n):
    """Column of value ``n`` in split order: per 128-column tile, the even columns then the odd (for a kernel that
    writes what the next one reads with :func:`load_split`)."""
    return (n // 128) * 128 + (n % 2) * 64 + (n % 128) // 2


@triton.jit
def _dequant_mxfp4_kernel(
    w_ptr, ws_ptr, out_ptr, N, K, stride_wn, stride_wsn, stride_on, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr
):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    rkb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    rks = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    rk = k0 + tl.arange(0, BLOCK_K)
    n_ok = rn < N
    w = tl.load(w_ptr + rn[:, None] * stride_wn + rkb[None, :], mask=n_ok[:, None] & (rkb < K // 2)[None, :], other=0)
    ws = tl.load(
        ws_ptr + rn[:, None] * stride_wsn + rks[None, :], mask=n_ok[:, None] & (rks < K // 32)[None, :], other=127
    )
    tl.store(
        out_ptr + rn[:, None] * stride_on + rk[None, :],
        dequant_tile_bf16(w, ws, BLOCK_N, BLOCK_K),
        mask=n_ok[:, None] & (rk < K)[None, :],
    )


def dequantize_mxfp4_rows(
    w_packed: torch.Tensor, w_scales: torch.Tensor, out: torch.Tensor | None = None, config: DequantConfig = DEQUANT
) -> torch.Tensor:
    """MXFP4 ``[N, K/2]`` packed + ``[N, K/32]`` E8M0 -> BF16 ``[N, K]`` (into ``out`` when given)."""
    N, K = w_packed.shape[0], w_packed.shape[1] * 2
    if w_scales.shape != (N, K // 32):
        raise ValueError(f"scales {tuple(w_scales.shape)} do not fit packed weights {tuple(w_packed.shape)}")
    if out is None:
        out = torch.empty(N, K, dtype=torch.bfloat16, device=w_packed.device)
    grid = (cdiv(N, config.block_n), cdiv(K, config.block_k))
    _dequant_mxfp4_kernel[grid](
        w_packed,
        w_scales,
        out,
        N,
        K,
        w_packed.stride(0),
        w_scales.stride(0),
        out.stride(0),
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        num_warps=config.num_warps,
    )
    return out


@triton.jit
def _dequant_chunks_kernel(
    w_ptr, s_ptr, out_ptr, N, K, stride_wn, stride_wsn, stride_on, ORDER: tl.constexpr, MATH: tl.constexpr
):
    """Program (i, kt): rows ``64 i ..`` of W in a chunk order (row tiles of 16, K-tiled) over K tile ``kt`` -> BF16 in
    natural order, ``out_ptr`` read as int32 (a bf16 pair each, row stride ``stride_on`` pairs). Each word is decoded
    on its own into its 4 bf16 pairs (:func:`chunk_word_pairs`: elementwise, so the PTX decode too, whatever lanes
    Triton gives the words), and the pairs are relabelled to natural order once before a coalesced store. Relabelling
    fp32 values instead (the GEMM tiles' decode: three layout conversions) made this dequantizer a third slower than
    the plain order's (PERF_LOG stop 42); storing each pair where it goes, without a relabel, made the prefill 12-33%
    slower (stop 41)."""
    r0 = tl.program_id(0) * 64
    kt = tl.program_id(1)
    w_off, s_off = wgmma_chunks(tl.minimum(r0 + 16 * tl.arange(0, 4), N - 16), stride_wn, stride_wsn, 16)
    lane = tl.arange(0, 32)[None, :, None]
    sc = chunk_lane_scales(s_ptr, s_off[:, None, None] + kt * 64, lane)
    p0, p1, p2, p3 = chunk_word_pairs(w_ptr, w_off[:, None, None] + kt * 1024, lane, sc, ORDER, MATH)
    x = tl.join(tl.join(p0, p1), tl.join(p2, p3))  # [block, lane 4 g + t, word, p % 2, p // 2]
    if ORDER == "wgmma":  # word s, pair p: row 8 (p // 2) + g, pair column 8 s + 4 (p % 2) + t
        x = tl.permute(tl.reshape(x, (4, 8, 4, 8, 2, 2)), (0, 5, 1, 3, 4, 2))  # block, p // 2, g | s, p % 2, t
    else:  # word 2 q + c, pair p: row 8 c + g, pair column 16 q + 4 t + p
        tl.static_assert(ORDER == "mma2", "chunk orders: wgmma or mma2")
        x = tl.permute(tl.reshape(x, (4, 8, 4, 4, 2, 2, 2)), (0, 4, 1, 3, 2, 6, 5))  # block, c, g | q, t, p
    rn = r0 + tl.arange(0, 64)
    rp = kt * 64 + tl.arange(0, 64)
    tl.store(
        out_ptr + rn[:, None] * stride_on + rp[None, :],
        tl.reshape(x, (64, 64)),
        mask=(rn < N)[:, None] & (rp < K // 2)[None, :],
    )


def dequantize_chunks(w: torch.Tensor, s: torch.Tensor, K: int, order: str, out: torch.Tensor | None = None):
    """MXFP4 in a chunk order (``order`` "wgmma" or "mma2"; ``[Np, Kp/2]`` bytes in row tiles of 16, K-tiled, and
    ``[Np, Kp/32]`` quad-ordered scales: ``mxrepack.layouts.dense`` with that order) -> BF16 ``[Np, K]`` in natural
    order (into ``out`` when given: bf16 ``[Np, K]`` with unit column stride and an even row stride and offset, written
    as bf16 pairs)."""
    N, Kp = w.shape[0], w.shape[1] * 2
    if N % 16 or Kp % 128 or s.shape != (N, Kp // 32) or not 0 < K <= Kp or K % 32:
        raise ValueError(
            f"{order}-order weights {tuple(w.shape)} / scales {tuple(s.shape)} for K={K}: expected [16 r, 64 t] bytes "
            f"and [16 r, 4 t] scales with 128 t >= K, K a multiple of 32"
        )
    if out is None:
        out = torch.empty(N, K, dtype=torch.bfloat16, device=w.device)
    if (
        tuple(out.shape) != (N, K)
        or out.dtype != torch.bfloat16
        or out.stride(1) != 1
        or out.stride(0) % 2
        or out.storage_offset() % 2
    ):
        raise ValueError(  # written as bf16 pairs (int32)
            f"out {out.dtype} {tuple(out.shape)} strides {out.stride()} offset {out.storage_offset()}: expected "
            f"bfloat16 [{N}, {K}] with unit column stride, an even row stride and an even offset"
        )
    ptx = runs_ptx(w.device)
    _dequant_chunks_kernel[(cdiv(N, 64), Kp // 128)](
        w,
        s,
        out.view(torch.int32),
        N,
        K,
        w.stride(0),
        s.stride(0),
        out.stride(0) // 2,
        ORDER=order,
        MATH="asm" if ptx else "ops",
        num_warps=4,
    )
    return out


def linear_dequant_gemm(
    x: torch.Tensor,
    w_packed: torch.Tensor,
    w_scales: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    config: DequantConfig = DEQUANT,
    order: str = "rows",
) -> torch.Tensor:
    """``out = x @ W.T + bias`` for BF16 ``x [M, K]``: W dequantized slab by slab of rows into one reused
    BF16 scratch, each slab multiplied by cuBLAS straight into its columns of ``out``. ``order``: W's byte order,
    "rows" (plain ``[N, K/2]``) or a chunk order (:func:`dequantize_chunks`; ``out``'s N columns may be fewer than
    W's padded rows)."""
    N, K = out.shape[1], x.shape[1]
    if out.dtype != x.dtype:  # cuBLAS writes x's dtype: a float32 out would fail inside torch.mm, naming no tensor
        raise ValueError(f"out is {out.dtype}: the dequantize + cuBLAS path (past 64 rows) writes x's {x.dtype}")
    rows = max(128, config.chunk_bytes // (2 * K) // 128 * 128)
    rows = min(rows, N)
    scratch = torch.empty(-(-rows // 16) * 16, K, dtype=torch.bfloat16, device=x.device)  # whole row tiles
    # no autograd, as the Triton kernels record none: torch's mm(out=) refuses an operand that requires grad, and vLLM's
    # linear layers leave their bias requiring it (their forward runs in inference mode; the plugin's warm-up at load
    # does not)
    x = x.detach()
    b = None if bias is None else bias.detach().to(torch.bfloat16)
    for n0 in range(0, N, rows):
        n1 = min(N, n0 + rows)
        if order == "rows":
            w = dequantize_mxfp4_rows(w_packed[n0:n1], w_scales[n0:n1], scratch[: n1 - n0], config)
        else:  # whole row tiles (slabs are multiples of 128 rows), the last one's padding rows beyond N dropped
            hi = min(w_packed.shape[0], -(-n1 // 16) * 16)
            w = dequantize_chunks(w_packed[n0:hi], w_scales[n0:hi], K, order, scratch[: hi - n0])[: n1 - n0]
        if b is None:
            torch.mm(x, w.T, out=out[:, n0:n1])
        else:
            torch.addmm(b[n0:n1], x, w.T, out=out[:, n0:n1])
    return out


def native_order(device: torch.device) -> str:
    """The chunk order whose bytes are the MMA operand Triton builds on ``device``: "wgmma" on sm_90, "mma2" where it
    builds ``mma.sync`` (sm_8x, sm_12x, and sm_90 under ``DISABLE_MMA_V3``); "rows" on sm_100, where only the rows
    order runs (:func:`check_order`), and off CUDA, where every order runs on the portable decode and none is native."""
    if device.type != "cuda":
        return "rows"
    major, _ = device_capability(device)
    if builds_wgmma(major):
        return "wgmma"
    return "mma2" if major in (8, 9, 12) else "rows"


def check_order(order: str, activations: str, device: torch.device) -> None:
    """Whether weights in byte ``order`` can run here: "rows" anywhere; the chunk orders with BF16 activations, on the
    GPUs whose MMA operand the order is, or off CUDA (the interpreter's portable decode): "wgmma" where Triton builds
    wgmma (sm_90, not under its ``DISABLE_MMA_V3``: ``mma.sync`` would decode other bytes), "mma2" where it builds
    ``mma.sync`` (sm_8x, sm_12x; on sm_90 only under ``DISABLE_MMA_V3``, the H100 stand-in for sm_12x's code path)."""
    if order not in ("rows", "wgmma", "mma2"):
        raise ValueError(f"order must be rows, wgmma or mma2, got {order!r}")
    if order == "rows":
        return
    if activations != "bf16":
        raise ValueError(f"the {order} order is read with BF16 activations only, got {activations}")
    if device.type != "cuda":
        return
    major, minor = device_capability(device)
    wgmma = builds_wgmma(major)
    if order == "wgmma" and not wgmma:
        raise ValueError(
            f"the wgmma order is Hopper's (sm_90) wgmma fragment; this GPU builds mma.sync (sm_{major}{minor}"
            f"{', DISABLE_MMA_V3' if major == 9 else ''}), where it would decode the wrong bytes: repack with "
            "target sm121-strided (the mma2 order, sm_12x / sm_8x) or a recipe with the strided order rows"
        )
    if order == "mma2" and not (major in (8, 12) or (major == 9 and not wgmma)):
        raise ValueError(
            f"the mma2 order is mma.sync's operand (sm_8x, sm_12x); this GPU is sm_{major}{minor}, where Triton "
            "builds another MMA: repack with target sm90-strided (the wgmma order) on sm_90, or a recipe with the "
            "strided order rows"
        )
