"""Probe for the next `strided` variant: MXFP4 bytes stored in the order of the MMA's A fragments, decoded into one
dot per 128-code K tile. One warpgroup (4 warps x 16 weight rows) times a few tokens, W decoded in registers as the
swapped kernels do. No GPU: the interpreter checks the byte order and the in-kernel reshape against
``mxrepack.quant.dequantize_mxfp4`` (with a portable decode), and the PTX decode is compiled for sm_90a and sm_121a
and its main loop counted (``sass_vs_triton_kernels.loop_counts``).

    TRITON_INTERPRET=1 python benchmarks/experiments/fragment_order_probe.py check
    python benchmarks/experiments/fragment_order_probe.py emulate    # the PTX decode's bit placement, in Python
    python benchmarks/experiments/fragment_order_probe.py sass
    python benchmarks/experiments/fragment_order_probe.py time [OUT.json]   # GPU: against the shipped tiles and GEMV

The order (one 16-row block, one K tile of 64 bytes a row): lane 4 g + t holds, for each k16 step s, the bytes
(g, 8s+t), (g, 8s+t+4), (g+8, 8s+t), (g+8, 8s+t+4), 32 bytes in all: two 16-byte loads. A 32-bit word decodes to the
four bf16 pairs that lane's A fragment holds for step s (low nibble, high nibble of each byte: k and k+1); the
kernel's join, reshape and permute back to [rows, 128] are a relabelling Triton lowers without moving data on
sm_90a. It is wgmma's order (kWidth 2): compiled for sm_121a (mma.sync, kWidth 8) the packed decode receives other
bytes than this order's words, so that build computes the wrong product; ``mma2_order_probe.py`` has the order for
mma.sync and the packing check. The shipped order (``strided`` ``order: wgmma``) is this byte order with each word's
bits then placed for a rotate-and-mask decode (mxrepack 0.2.0, ``strided.WORD_ROTATIONS``); this probe keeps the
byte-wise words and their prmt decode it was written with.

Scales: per lane the 8 bytes (group j, row half c) it needs, index 2 j + c -- repeated for the 4 lanes of a quad
(``scale_order``: 4x the scale bytes, which a layout cannot afford), or read from row-major scales as a layout would
store them today (``SCALES`` "rows": 3x slower on the H100), or in the quad order (``quad_scale_order``, ``SCALES``
"quad": 1x the bytes, 8 contiguous a lane). The GEMV a layout would also need (T <= 32 reads the same bytes):
:func:`frag_gemv_kernel`, two rows per lane word, the quad's lanes summed after the K loop.

GEMVs on these bytes, timed at M = 1 over lm_head-sized weights (H100, 2026-11-26, docs/bench/
fragment_order_time_h100_2026-11-26_*.json; the shipped f16x2 GEMV 0.1336-0.1343 ms in each run, its activation-
preparing launch included): what decides is whether a warp's load covers whole 128-byte lines. Threads mapped to
scale groups (:func:`frag_gemv_group_kernel`, one scale per 32 codes) take 0.2111 ms on the lane order (8-byte pieces
of 8 lines a load) and 0.1362 on :func:`group_order`, whose tile is 1.3-1.7x slower than the lane order's; threads
mapped to lanes with 16-byte loads (``frag_gemv_lane_kernel``, a scale every 8 codes; gone with the product's
``gemv_rows_wgmma`` after e98e4de: run the probe at e98e4de for it) 0.1471; on
:func:`k_permuted` bytes (a lane = a scale group) 0.1429 (:func:`frag_gemv_kperm_kernel`, and its half-lane twin
0.1430), whose tile as written here computes the wrong product on the GPU (2-byte scale loads: not copied
asynchronously, and a layout for which the packed decode's assumption breaks).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mxrepack.kernels.dequant_mxfp4 import e2m1_to_fp32, e8m0_to_bf16_folded, e8m0_to_fp32  # noqa: E402
from mxrepack.kernels.gemv_mxfp4 import _decode, _decode_ops, _fp16_half, _split4  # noqa: E402

ROWS = 64  # weight rows per program: 4 warps x 16


def fragment_order(w: torch.Tensor) -> torch.Tensor:
    """Packed bytes ``[N, K/2]`` (N % 16 == 0, K % 128 == 0) -> ``[N/16, K/128, 32 lanes, 32 bytes]``."""
    N, KH = w.shape
    x = w.reshape(N // 16, 2, 8, KH // 64, 8, 2, 4)  # block, row half c, g, K tile, s, kh (+4 bytes), t
    return x.permute(0, 3, 2, 6, 4, 1, 5).reshape(N // 16, KH // 64, 32, 32).contiguous()


def group_order(w: torch.Tensor) -> torch.Tensor:
    """The fragment order's words regrouped by scale group: per 16-row block and K tile, ``[4 j, 8 g, 4 t, 2 odd, 4]``
    bytes (word ``2 j + odd`` of lane ``4 g + t``), so that the 8 words of rows (g, g + 8) over group j -- a GEMV
    element's -- are 32 contiguous bytes; an MMA lane's then come as four 8-byte pieces 256 bytes apart."""
    f = fragment_order(w)
    B, T = f.shape[:2]
    return f.view(B, T, 8, 4, 4, 2, 4).permute(0, 1, 4, 2, 3, 5, 6).reshape(B, T, 32, 32).contiguous()


def k_permuted(w: torch.Tensor) -> torch.Tensor:
    """Packed bytes ``[N, K/2]`` with each 128-code K tile's bytes permuted so that the fragment order puts a whole
    scale group in each lane: MMA byte ``8 s + 4 kh + t`` (k16 step s, +8 half kh, lane t of the quad) holds the
    natural byte ``16 t + 2 s + kh``. The MMA sums over K, so permuting K in the weights and the activations alike
    (:func:`k_permuted_x`) leaves the product unchanged; lane 4 g + t then holds rows g and g + 8 of scale group t, 16
    natural bytes each -- one scale per row and lane, and a GEMV thread can take a lane's 32 bytes whole."""
    N, KH = w.shape
    return w.view(N, KH // 64, 4, 8, 2).permute(0, 1, 3, 4, 2).reshape(N, KH).contiguous()


def k_permuted_x(x: torch.Tensor) -> torch.Tensor:
    """Activations ``[M, K]`` in :func:`k_permuted`'s K order: MMA k ``16 s + 8 kh + 2 t + n`` holds natural
    ``32 t + 4 s + 2 kh + n`` (pairs of activations stay together)."""
    M, K = x.shape
    return x.view(M, K // 128, 4, 8, 2, 2).permute(0, 1, 3, 4, 2, 5).reshape(M, K).contiguous()


def quad_scale_order(ws: torch.Tensor) -> torch.Tensor:
    """E8M0 scales ``[N, K/32]`` -> ``[N/16, K/128, 64]``: per 16-row block and K tile, scale (g + 8 c, j) at
    8 g + 2 j + c -- the 8 bytes the 4 lanes of quad g all need, once."""
    N, G = ws.shape
    x = ws.reshape(N // 16, 2, 8, G // 4, 4)  # block, c, g, K tile, j
    return x.permute(0, 3, 2, 4, 1).reshape(N // 16, G // 4, 64).contiguous()


def scale_order(ws: torch.Tensor) -> torch.Tensor:
    """E8M0 scales ``[N, K/32]`` -> ``[N/16, K/128, 32 lanes, 8]``: scale (g + 8 c, j) at 2 j + c."""
    N, G = ws.shape
    x = ws.reshape(N // 16, 2, 8, G // 4, 4)[:, :, :, :, None, :].expand(N // 16, 2, 8, G // 4, 4, 4)
    return x.permute(0, 3, 2, 4, 5, 1).reshape(N // 16, G // 4, 32, 8).contiguous()


# a word (bytes b0..b3) -> $0..$3 = (lo b_i, hi b_i) as bf16 pairs, times the folded scale ($5 for b0/b1, row g; $6
# for b2/b3, row g + 8): prmt puts the byte's low nibble (from the word shifted by 4) at bits 15..12 and its high
# nibble at 31..28, then the decode of dequant_mxfp4.PAIRS_ASM_FOLDED
_WORD = "".join(
    f"""prmt.b32 y, z, $4, {hex(0x4000 + 0x1010 * i)};
and.b32 t, y, 0x70007000;
shr.b32 t, t, 6;
lop3.b32 ${i}, y, t, 0x80008000, 0xEC;
fma.rn.bf16x2 ${i}, ${i}, ${5 + i // 2}, m;
"""
    for i in range(4)
)
WORD_FOLDED = tl.constexpr("{\n.reg .b32 z, y, t, m;\nmov.b32 m, 0x80008000;\nshl.b32 z, $4, 4;\n" + _WORD + "}")


@triton.jit
def _decode_words(wb, sb, BLOCKS: tl.constexpr, ASM: tl.constexpr):
    """Bytes ``[BLOCKS, 32, 32]`` and per-byte folded scales -> (r0, r1): per word, r0 = lo b0, hi b0, lo b1, hi b1
    (row g), r1 the same of b2, b3 (row g + 8)."""
    if ASM:
        return tl.inline_asm_elementwise(
            WORD_FOLDED, "=r,=r,=r,=r,r,r,r", [wb, sb], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4
        )
    w = tl.reshape(wb.to(tl.int32), (BLOCKS, 32, 8, 2, 2))  # word s, row half c, kh
    s = tl.reshape(sb.to(tl.float32), (BLOCKS, 32, 8, 2, 2)) / 8.507059173023462e37
    v = tl.join(e2m1_to_fp32(w & 15) * s, e2m1_to_fp32(w >> 4) * s)
    v = tl.reshape(v, (BLOCKS, 32, 8, 2, 4))  # (kh, nibble) -> 4
    r0, r1 = tl.split(tl.permute(v, (0, 1, 2, 4, 3)))
    return tl.reshape(r0, (BLOCKS, 32, 32)).to(tl.bfloat16), tl.reshape(r1, (BLOCKS, 32, 32)).to(tl.bfloat16)


@triton.jit
def _lane_scales(s_ptr, block0, kt, k_tiles, BLOCKS: tl.constexpr):
    """From row-major E8M0 scales ``[N, K/32]``: per lane 4 g + t of each block, its 8 scales of K tile ``kt`` at
    2 j + c (group j, row g + 8 c), as the fragment order's decode wants them."""
    lane = tl.arange(0, 32)[None, :, None]
    i = tl.arange(0, 8)[None, None, :]
    row = (block0 + tl.arange(0, BLOCKS))[:, None, None] * 16 + lane // 4 + 8 * (i % 2)
    return tl.load(s_ptr + row * (k_tiles * 4) + kt * 4 + i // 2)


@triton.jit
def _w_tile(
    w_ptr,
    s_ptr,
    block0,
    kt,
    k_tiles,
    BLOCKS: tl.constexpr,
    ASM: tl.constexpr,
    SCALES: tl.constexpr,
    ORDER: tl.constexpr,
):
    """W's rows of ``BLOCKS`` 16-row blocks over K tile ``kt`` as bf16 ``[16 BLOCKS, 128]`` in natural order.
    ``SCALES``: "lane", in :func:`scale_order` (each repeated for the 4 lanes that need it: 4x the bytes, 8 contiguous
    a lane the pipeline can copy); "rows", row-major ``[N, K/32]`` (as layouts store them today); "quad", in
    :func:`quad_scale_order` (1x the bytes, the 4 lanes of a quad pointing at the same 8); "group", the same bytes for
    :func:`k_permuted` weights, whose lane t needs only group t's two (2 contiguous bytes a lane)."""
    at = ((block0 + tl.arange(0, BLOCKS))[:, None, None] * k_tiles + kt) * 32 + tl.arange(0, 32)[None, :, None]
    if ORDER == "group":  # byte q of lane l: word q // 4 = 2 j + odd at j * 256 + l * 8 + q % 8
        q = tl.arange(0, 32)[None, None, :]
        tile = ((block0 + tl.arange(0, BLOCKS))[:, None, None] * k_tiles + kt) * 1024
        wb = tl.load(w_ptr + tile + (q // 8) * 256 + tl.arange(0, 32)[None, :, None] * 8 + q % 8)
    else:
        wb = tl.load(w_ptr + at * 32 + tl.arange(0, 32)[None, None, :])
    if SCALES == "rows":
        sc = _lane_scales(s_ptr, block0, kt, k_tiles, BLOCKS)
    elif SCALES == "group":  # k_permuted bytes: lane 4 g + t's codes are all of group t -- scales (g, t), (g + 8, t)
        lane = tl.arange(0, 32)[None, :, None]
        tile = ((block0 + tl.arange(0, BLOCKS))[:, None, None] * k_tiles + kt) * 64
        sc = tl.load(s_ptr + tile + 8 * (lane // 4) + 2 * (lane % 4) + tl.arange(0, 2)[None, None, :])
    elif SCALES == "quad":
        quad = ((block0 + tl.arange(0, BLOCKS))[:, None, None] * k_tiles + kt) * 64 + 8 * (tl.arange(0, 32) // 4)[
            None, :, None
        ]
        sc = tl.load(s_ptr + quad + tl.arange(0, 8)[None, None, :])
    else:
        sc = tl.load(s_ptr + at * 8 + tl.arange(0, 8)[None, None, :])
    if SCALES == "group":
        sf = e8m0_to_bf16_folded(sc)
        sf = tl.broadcast_to(tl.reshape(sf, (BLOCKS, 32, 1, 2, 1)), (BLOCKS, 32, 8, 2, 2))  # s, c, kh
    else:
        sf = e8m0_to_bf16_folded(sc)  # 2^(E - 1): E2M1's 2^126 folded in
        sf = tl.broadcast_to(tl.reshape(sf, (BLOCKS, 32, 4, 1, 2, 1)), (BLOCKS, 32, 4, 2, 2, 2))  # j, s % 2, c, kh
    r0, r1 = _decode_words(wb, tl.reshape(sf, (BLOCKS, 32, 32)), BLOCKS, ASM)
    x = tl.reshape(tl.join(r0, r1), (BLOCKS, 8, 4, 8, 2, 2, 2))  # block, g, t, s, kh, kl, c
    x = tl.permute(x, (0, 6, 1, 3, 4, 2, 5))  # block, c, g | s, kh, t, kl
    return tl.reshape(x, (16 * BLOCKS, 128))


@triton.jit
def probe_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    y_ptr,
    K,
    stride_x,
    M: tl.constexpr,
    BLOCKS: tl.constexpr,
    ASM: tl.constexpr,
    SCALES: tl.constexpr = "lane",
    ORDER: tl.constexpr = "lane",
):
    """``y[rows, M] = W[rows] @ x.T``, W fragment-ordered, one dot per K tile (fp32 operands under the interpreter)."""
    pid = tl.program_id(0)
    k_tiles = K // 128
    rm = tl.arange(0, M)
    acc = tl.zeros((16 * BLOCKS, M), dtype=tl.float32)
    for kt in range(0, k_tiles):
        w = _w_tile(w_ptr, s_ptr, pid * BLOCKS, kt, k_tiles, BLOCKS, ASM, SCALES, ORDER)
        a = tl.load(x_ptr + rm[:, None] * stride_x + kt * 128 + tl.arange(0, 128)[None, :])
        if ASM:
            acc = tl.dot(w, tl.trans(a), acc)
        else:
            acc = tl.dot(w.to(tl.float32), tl.trans(a).to(tl.float32), acc)
    rn = pid * 16 * BLOCKS + tl.arange(0, 16 * BLOCKS)
    tl.store(y_ptr + rn[:, None] * M + rm[None, :], acc)


# The MoE GEMVs (T <= 32) read the same bytes. In the fragment order a lane's 32-bit word s holds bytes (g, kh 0),
# (g, kh 1), (g + 8, kh 0), (g + 8, kh 1) of k16 step s: two rows, one scale group (s // 2), and the activations
# x[16 s + 8 kh + 2 t + (0, 1)] serve both rows. So a GEMV thread keeps two rows' sums per lane and the 4 lanes of a
# quad (t) are summed once, after the K loop.
@triton.jit
def frag_gemv_kernel(x_ptr, w_ptr, s_ptr, y_ptr, K, BLOCKS: tl.constexpr, DECODE: tl.constexpr):
    """``y[rows] = W[rows] @ x`` (one bf16 row ``x``), W fragment-ordered, scales row-major ``[N, K/32]``; ``BLOCKS``
    16-row blocks per program, one 128-code K tile per step, fp32 math (``gemv_mxfp4``'s decode of eight codes)."""
    block0 = tl.program_id(0) * BLOCKS
    k_tiles = K // 128
    lane = tl.arange(0, 32)[None, :, None]
    s = tl.arange(0, 8)[None, None, :]
    t = lane % 4
    words = ((block0 + tl.arange(0, BLOCKS))[:, None, None] * k_tiles) * 256 + lane * 8 + s  # int32 words, K tile 0
    w_ptrs = w_ptr.to(tl.pointer_type(tl.int32)) + words
    x_ptrs = x_ptr + 16 * s + 2 * t  # + 8 kh + nibble
    row = (block0 + tl.arange(0, BLOCKS))[:, None, None] * 16 + lane // 4  # + 8 c
    s_ptrs = s_ptr + row * (k_tiles * 4) + s // 2
    acc0 = tl.zeros((BLOCKS, 32, 8), dtype=tl.float32)
    acc1 = tl.zeros((BLOCKS, 32, 8), dtype=tl.float32)
    for kt in range(0, k_tiles):
        w = tl.load(w_ptrs + kt * 256)
        xk = x_ptrs + kt * 128
        x0, x1, x2, x3 = tl.load(xk), tl.load(xk + 1), tl.load(xk + 8), tl.load(xk + 9)  # (kh, nibble)
        v = _decode(w, DECODE)  # code j at bits 4 j: byte j // 2 = 2 c + kh, nibble j % 2
        d0 = v[0] * x0.to(tl.float32) + v[1] * x1.to(tl.float32) + v[2] * x2.to(tl.float32) + v[3] * x3.to(tl.float32)
        d1 = v[4] * x0.to(tl.float32) + v[5] * x1.to(tl.float32) + v[6] * x2.to(tl.float32) + v[7] * x3.to(tl.float32)
        acc0 += d0 * e8m0_to_fp32(tl.load(s_ptrs + kt * 4).to(tl.int32))
        acc1 += d1 * e8m0_to_fp32(tl.load(s_ptrs + 8 * (k_tiles * 4) + kt * 4).to(tl.int32))
    y0 = tl.sum(tl.reshape(acc0, (BLOCKS, 8, 32)), axis=2) * 16384.0  # over t and s; E2M1 * 2^-14 decoded
    y1 = tl.sum(tl.reshape(acc1, (BLOCKS, 8, 32)), axis=2) * 16384.0
    rows = (block0 + tl.arange(0, BLOCKS))[:, None] * 16 + tl.arange(0, 8)[None, :]
    tl.store(y_ptr + rows, y0)
    tl.store(y_ptr + rows + 8, y1)


# The same in packed fp16, with the shipped f16x2 GEMV's 11-instruction decode (gemv_mxfp4._group_dot_f16x2_asm_text):
# it makes pairs of codes (j, j + 4) of a word, here bytes (c 0, kh) and (c 1, kh) -- the same k of rows g and g + 8.
# Times the activation duplicated into both halves, one fp16 accumulator carries row g in its low half and row g + 8 in
# its high. (Plain pairs (x[k], x[k + 1]) with a per-byte decode took 0.1702 ms on lm_head at M = 1 against this one's
# 0.1538: fragment_order_time_h100_2026-11-25_91700b3_call4.json; removed.)
# GROUP_F16X2_DUP, the PTX of one lane's scale group (rows g and g + 8): the probe's own copy again (from bb75c93 to
# e98e4de it used gemv_mxfp4's, which went with gemv_rows_wgmma).


def _word_pairs_text(word: int) -> list[str]:
    """PTX: word ``$word`` -> p0..p3, the f16x2 pairs (codes 3 - p, 7 - p) of the fragment order's decode."""
    return [
        f"mov.b32 q, ${word};",
        "shr.b32 t, q, 3; and.b32 t, t, 0x0E0E0E0E; lop3.b32 v, q, t, 0x80808080, 0xEC;",
        "and.b32 p0, v, 0xFF00FF00; prmt.b32 p2, v, 0, 0x2404;",
        "shl.b32 t, q, 1; and.b32 t, t, 0x0E0E0E0E; shl.b32 v, q, 4; lop3.b32 v, v, t, 0x80808080, 0xEC;",
        "and.b32 p1, v, 0xFF00FF00; prmt.b32 p3, v, 0, 0x2404;",
    ]


def _group_f16x2_dup_text() -> str:
    """PTX for one scale group of one lane: words $2, $3 (steps 2 j, 2 j + 1), duplicated activations $4..$7 (step 2 j:
    (kh, nibble) = (0, 0), (0, 1), (1, 0), (1, 1)) and $8..$11 (step 2 j + 1) -> $0, $1 rows g and g + 8, unscaled."""
    lines = ["{", ".reg .b32 q, t, v, p0, p1, p2, p3, a;", ".reg .b16 lo, hi;"]
    for word, x in ((2, 4), (3, 8)):
        lines += [
            *_word_pairs_text(word),
        ]
        # pair p holds codes (3 - p, 7 - p): p0 (kh 1, nibble 1), p1 (1, 0), p2 (0, 1), p3 (0, 0)
        for pair, slot in ((3, 0), (2, 1), (1, 2), (0, 3)):
            first = word == 2 and pair == 3
            lines.append(
                f"mul.rn.f16x2 a, p{pair}, ${x + slot};" if first else f"fma.rn.f16x2 a, p{pair}, ${x + slot}, a;"
            )
    lines += ["mov.b32 {lo, hi}, a;", "cvt.f32.f16 $0, lo;", "cvt.f32.f16 $1, hi;", "}"]
    return "\n".join(lines)


GROUP_F16X2_DUP = tl.constexpr(_group_f16x2_dup_text())


@triton.jit
def _word_sums_dup(w, x):
    """Portable twin of one word of :data:`GROUP_F16X2_DUP` (fp32 math); ``x``: [..., 4] duplicated activations."""
    v = _decode_ops(w)
    x00, x01, x10, x11 = _split4(x, x.shape[0], x.shape[1] * x.shape[2])
    a, b, c, d = (_fp16_half(x00, False), _fp16_half(x01, False), _fp16_half(x10, False), _fp16_half(x11, False))
    a = tl.reshape(a, (1, 32, 4))  # broadcast over the blocks
    b = tl.reshape(b, (1, 32, 4))
    c = tl.reshape(c, (1, 32, 4))
    d = tl.reshape(d, (1, 32, 4))
    return v[0] * a + v[1] * b + v[2] * c + v[3] * d, v[4] * a + v[5] * b + v[6] * c + v[7] * d


@triton.jit
def _frag_words(w_ptrs, ONE_LOAD: tl.constexpr):
    """A K tile's words of k16 steps 2 j and 2 j + 1, per lane and j."""
    if ONE_LOAD:
        w0, w1 = tl.split(tl.load(w_ptrs))
    else:
        w0, w1 = tl.load(w_ptrs), tl.load(w_ptrs + 1)
    return w0, w1


@triton.jit
def frag_gemv_dup_kernel(
    xd_ptr,
    xe_ptr,
    w_ptr,
    s_ptr,
    y_ptr,
    K,
    BLOCKS: tl.constexpr,
    MATH: tl.constexpr,
    QUAD_SCALES: tl.constexpr = False,
    AHEAD: tl.constexpr = False,
    ONE_LOAD: tl.constexpr = False,
):
    """:func:`frag_gemv_kernel` with packed fp16 math (:data:`GROUP_F16X2_DUP`) on duplicated, prepared activations
    (:func:`prepare_dup`), as the shipped f16x2 GEMV: per lane and scale group, two words into one accumulator.
    ``QUAD_SCALES``: scales in :func:`quad_scale_order` (one 8-byte load a lane and K tile), else row-major.
    ``AHEAD``: the next K tile's words loaded before this one is multiplied (the shipped GEMV's prefetch: at M = 1 the
    bytes in flight per SM decide the time). ``ONE_LOAD``: a lane's 8 words as one contiguous load split in registers
    (Triton then moves the decode's results through shared memory: 8 STS a step on sm_90a), else as two strided loads of
    the even and the odd words (what call 4 timed)."""
    block0 = tl.program_id(0) * BLOCKS
    k_tiles = K // 128
    j = tl.arange(0, 4)[None, None, :]
    lane_words = ((block0 + tl.arange(0, BLOCKS))[:, None, None] * k_tiles) * 256 + tl.arange(0, 32)[None, :, None] * 8
    if ONE_LOAD:  # a lane's 8 words (k16 steps s = 2 j + odd) as [.., 4, 2]: 32 contiguous bytes, split in registers
        w_ptrs = w_ptr.to(tl.pointer_type(tl.int32)) + tl.reshape(
            lane_words[:, :, :, None] + tl.arange(0, 8), (BLOCKS, 32, 4, 2)
        )
    else:  # the even words; the odd ones are the next
        w_ptrs = w_ptr.to(tl.pointer_type(tl.int32)) + lane_words + 2 * j
    # activation k = 16 s + 8 kh + 2 t + nibble, s = 2 j (+ 1): per lane and group 8 values, (kh, nibble) innermost
    khn = tl.arange(0, 4)[None, None, None, :]
    x_ptrs = xd_ptr + (32 * j + 2 * (tl.arange(0, 32)[None, :, None] % 4))[:, :, :, None] + 8 * (khn // 2) + khn % 2
    row = (block0 + tl.arange(0, BLOCKS))[:, None, None] * 16 + tl.arange(0, 32)[None, :, None] // 4
    s_ptrs = s_ptr + row * (k_tiles * 4) + j
    quad = ((block0 + tl.arange(0, BLOCKS))[:, None, None] * k_tiles) * 64 + 8 * (tl.arange(0, 32)[None, :, None] // 4)
    q_ptrs = s_ptr + quad + tl.arange(0, 8)[None, None, :]  # 2 j + c
    acc0 = tl.zeros((BLOCKS, 32, 4), dtype=tl.float32)
    acc1 = tl.zeros((BLOCKS, 32, 4), dtype=tl.float32)
    w0_next, w1_next = _frag_words(w_ptrs, ONE_LOAD)
    for kt in range(0, k_tiles):
        if AHEAD:
            w0, w1 = w0_next, w1_next
            w0_next, w1_next = _frag_words(w_ptrs + tl.minimum(kt + 1, k_tiles - 1) * 256, ONE_LOAD)  # last: again
        else:
            w0, w1 = _frag_words(w_ptrs + kt * 256, ONE_LOAD)
        xa = tl.load(x_ptrs + kt * 128)  # [1, 32, 4, 4]
        xb = tl.load(x_ptrs + kt * 128 + 16)
        if MATH == "asm":
            xa0, xa1, xa2, xa3 = _split4(xa, 32, 4)
            xb0, xb1, xb2, xb3 = _split4(xb, 32, 4)
            d0, d1 = tl.inline_asm_elementwise(
                GROUP_F16X2_DUP,
                "=r,=r" + ",r" * 10,
                [w0, w1, xa0[None], xa1[None], xa2[None], xa3[None], xb0[None], xb1[None], xb2[None], xb3[None]],
                dtype=(tl.float32, tl.float32),
                is_pure=True,
                pack=1,
            )
        else:
            a0, a1 = _word_sums_dup(w0, xa)
            b0, b1 = _word_sums_dup(w1, xb)
            d0, d1 = a0 + b0, a1 + b1
        f = tl.load(xe_ptr + kt * 4 + j)
        if QUAD_SCALES:
            s0, s1 = tl.split(tl.reshape(tl.load(q_ptrs + kt * 64), (BLOCKS, 32, 4, 2)))
        else:
            s0, s1 = tl.load(s_ptrs + kt * 4), tl.load(s_ptrs + 8 * (k_tiles * 4) + kt * 4)
        acc0 += d0 * (e8m0_to_fp32(s0.to(tl.int32)) * f)
        acc1 += d1 * (e8m0_to_fp32(s1.to(tl.int32)) * f)
    y0 = tl.sum(tl.reshape(acc0, (BLOCKS, 8, 16)), axis=2)
    y1 = tl.sum(tl.reshape(acc1, (BLOCKS, 8, 16)), axis=2)
    rows = (block0 + tl.arange(0, BLOCKS))[:, None] * 16 + tl.arange(0, 8)[None, :]
    tl.store(y_ptr + rows, y0)
    tl.store(y_ptr + rows + 8, y1)


def prepare_dup(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One bf16 row ``[K]`` -> (each activation as fp16, duplicated into both halves of an int32 ``[K]``, each group of
    32 scaled by 2^(14 - e), e the exponent of its largest magnitude; the factors 2^e ``[K/32]`` fp32), as
    ``gemv_mxfp4.prepare_x`` scales them."""
    g = x.float().view(-1, 32)
    e = torch.frexp(g.abs().amax(1))[1] - 1
    h = (g * torch.exp2(14 - e.float())[:, None]).half().view(torch.int16).view(-1).int() & 0xFFFF
    return (h | (h << 16)).contiguous(), torch.exp2(e.float()).contiguous()


# A GEMV on the same bytes with the threads mapped to scale groups instead of MMA lanes: element (block, g, j) takes the
# 8 words of lanes 4 g + t (t = 0..3), k16 steps 2 j and 2 j + 1 -- rows g and g + 8 over the whole of scale group j.
# Its arithmetic is then the shipped f16x2 GEMV's (one scale and one group factor per 32 codes and row, 11 instructions
# a word, 4 packed multiplies), where the lane mapping of frag_gemv_dup_kernel scales every 8 codes. A lane's words
# 2 j, 2 j + 1 are 8 contiguous bytes, so each element loads four 8-byte pieces, one per t.
def _group_f16x2_pair_text(words: int = 8) -> str:
    """PTX for one element: words $2..$9 ((t, odd) for t = 0..3, odd = 0, 1) and its group's 32 duplicated activations
    $10..$41 (word-major as :func:`prepare_group_dup` stores them: (kh, nibble) within a word) -> $0, $1 the group's
    sums
    of rows g and g + 8, unscaled. Four chains (one per t) of 8 packed multiply-adds, summed in pairs in fp16 (16
    products a half, as the shipped GEMV's two chains), then in fp32."""
    lines = [
        "{",
        ".reg .b32 q, t, v, p0, p1, p2, p3, c0, c1, c2, c3;",
        ".reg .b16 lo, hi;",
        ".reg .f32 f0, f1, f2, f3;",
    ]
    for t in range(words // 2):
        for odd in range(2):
            word = 2 + 2 * t + odd
            x = 2 + words + 4 * (2 * t + odd)  # the word's 4 activations, (kh, nibble) = slot
            lines += [
                *_word_pairs_text(word),
            ]
            # pair p holds codes (3 - p, 7 - p): (kh, nibble) slot 3 - p of rows g (lo) and g + 8 (hi)
            for pair in range(4):
                first = odd == 0 and pair == 0
                xs = f"${x + 3 - pair}"
                lines.append(
                    f"mul.rn.f16x2 c{t}, p{pair}, {xs};" if first else f"fma.rn.f16x2 c{t}, p{pair}, {xs}, c{t};"
                )
    if words == 4:  # two chains: summed in fp16 (16 products a half), then the halves to fp32
        return "\n".join(
            lines
            + ["add.rn.f16x2 c0, c0, c1;", "mov.b32 {lo, hi}, c0;", "cvt.f32.f16 $0, lo;", "cvt.f32.f16 $1, hi;", "}"]
        )
    lines += [
        "add.rn.f16x2 c0, c0, c1;",
        "add.rn.f16x2 c2, c2, c3;",
        "mov.b32 {lo, hi}, c0;",
        "cvt.f32.f16 f0, lo;",
        "cvt.f32.f16 f1, hi;",
        "mov.b32 {lo, hi}, c2;",
        "cvt.f32.f16 f2, lo;",
        "cvt.f32.f16 f3, hi;",
        "add.f32 $0, f0, f2;",
        "add.f32 $1, f1, f3;",
        "}",
    ]
    return "\n".join(lines)


GROUP_F16X2_PAIR = tl.constexpr(_group_f16x2_pair_text())
GROUP_F16X2_PAIR4 = tl.constexpr(_group_f16x2_pair_text(4))


@triton.jit
def _group_words(w_ptrs, ok, MASKED: tl.constexpr, ORDER: tl.constexpr):
    """The element's 8 words (t, odd) for t = 0..3: four 8-byte loads (``ORDER`` "lane": the fragment order, lanes'
    words
    8 apart) or two 16-byte loads (``ORDER`` "group": :func:`group_order`, the 8 words contiguous)."""
    out = ()
    if ORDER == "group":
        for half in tl.static_range(2):
            if MASKED:
                w = tl.load(w_ptrs + 4 * half, mask=ok, other=0)
            else:
                w = tl.load(w_ptrs + 4 * half)
            even, odd = tl.split(tl.reshape(w, (w.shape[0], w.shape[1], w.shape[2], w.shape[3], 2, 2)))  # [.., t % 2]
            even0, even1 = tl.split(even)
            odd0, odd1 = tl.split(odd)
            out = out + (even0, odd0, even1, odd1)
    else:
        for t in tl.static_range(4):
            if MASKED:
                w = tl.load(w_ptrs + 8 * t, mask=ok, other=0)
            else:
                w = tl.load(w_ptrs + 8 * t)
            even, odd = tl.split(w)
            out = out + (even, odd)
    return out


@triton.jit
def _group_acts(x_ptrs, ok, MASKED: tl.constexpr):
    """The group's 32 duplicated activations as 32 tensors, from eight 16-byte loads (one per word)."""
    out = ()
    for i in tl.static_range(8):
        if MASKED:
            x = tl.load(x_ptrs + 4 * i, mask=ok, other=0)
        else:
            x = tl.load(x_ptrs + 4 * i)
        even, odd = tl.split(tl.reshape(x, (1, x.shape[1], 1, 4, 2, 2)))  # slot = 2 i + bit: even = 0, 2
        x0, x2 = tl.split(even)
        x1, x3 = tl.split(odd)
        out = out + (x0, x1, x2, x3)
    return out


@triton.jit
def _group_sums(ws, xs, MATH: tl.constexpr):
    """(rows g, rows g + 8) unscaled sums of one element: ``ws`` its 8 words, ``xs`` its 32 activations."""
    if MATH == "asm":
        b = ()
        for i in tl.static_range(32):
            b = b + (tl.broadcast_to(xs[i], ws[0].shape),)
        return tl.inline_asm_elementwise(
            GROUP_F16X2_PAIR,
            "=r,=r" + ",r" * 40,
            [ws[0], ws[1], ws[2], ws[3], ws[4], ws[5], ws[6], ws[7]]
            + [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]
            + [b[16], b[17], b[18], b[19], b[20], b[21], b[22], b[23], b[24], b[25], b[26], b[27], b[28], b[29]]
            + [b[30], b[31]],
            dtype=(tl.float32, tl.float32),
            is_pure=True,
            pack=1,
        )
    lo = tl.zeros(ws[0].shape, dtype=tl.float32)
    hi = tl.zeros(ws[0].shape, dtype=tl.float32)
    for i in tl.static_range(8):
        v = _decode_ops(ws[i])
        for slot in tl.static_range(4):
            a = _fp16_half(xs[4 * i + slot], False)
            lo += v[slot] * a
            hi += v[4 + slot] * a
    return lo, hi


@triton.jit
def _group_sums4(ws, xs, MATH: tl.constexpr):
    """:func:`_group_sums` of 4 words and their 16 activations."""
    if MATH == "asm":
        b = ()
        for i in tl.static_range(16):
            b = b + (tl.broadcast_to(xs[i], ws[0].shape),)
        return tl.inline_asm_elementwise(
            GROUP_F16X2_PAIR4,
            "=r,=r" + ",r" * 20,
            [ws[0], ws[1], ws[2], ws[3]]
            + [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]],
            dtype=(tl.float32, tl.float32),
            is_pure=True,
            pack=1,
        )
    lo = tl.zeros(ws[0].shape, dtype=tl.float32)
    hi = tl.zeros(ws[0].shape, dtype=tl.float32)
    for i in tl.static_range(4):
        v = _decode_ops(ws[i])
        for slot in tl.static_range(4):
            a = _fp16_half(xs[4 * i + slot], False)
            lo += v[slot] * a
            hi += v[4 + slot] * a
    return lo, hi


@triton.jit
def frag_gemv_group_kernel(
    xd_ptr,
    xe_ptr,
    w_ptr,
    s_ptr,
    y_ptr,
    K,
    BLOCKS: tl.constexpr,
    KT: tl.constexpr,
    MATH: tl.constexpr,
    PREFETCH: tl.constexpr = 1,
    ORDER: tl.constexpr = "lane",
):
    """``y[rows] = W[rows] @ x`` on the fragment order, one element per (block, K tile, g, j) as above; ``BLOCKS``
    16-row blocks and ``KT`` K tiles per step (tiles past K masked when ``KT`` does not divide them); scales in
    :func:`quad_scale_order`; activations from :func:`prepare_group_dup`. ``PREFETCH``: the next step's words are
    in flight while this one is multiplied (the shipped GEMV's rule: at M = 1 the bytes in flight decide)."""
    block0 = tl.program_id(0) * BLOCKS
    k_tiles = K // 128
    b = (block0 + tl.arange(0, BLOCKS))[:, None, None, None, None]
    kk = tl.arange(0, KT)[None, :, None, None, None]
    g = tl.arange(0, 8)[None, None, :, None, None]
    j = tl.arange(0, 4)[None, None, None, :, None]
    pair = tl.arange(0, 2)[None, None, None, None, :]
    # int32 word of (block, tile, lane 4 g + t, step 2 j + odd): ((block * k_tiles + tile) * 32 + 4g + t) * 8 + 2j + odd
    if ORDER == "group":  # word (j, g, t, odd) at j * 64 + g * 8 + 2 t + odd: [.., 4] = (t pair, odd) per load
        w_ptrs = w_ptr.to(tl.pointer_type(tl.int32)) + (b * k_tiles + kk) * 256 + j * 64 + g * 8
        w_ptrs = w_ptrs + tl.arange(0, 4)[None, None, None, None, :]
    else:
        w_ptrs = w_ptr.to(tl.pointer_type(tl.int32)) + ((b * k_tiles + kk) * 32 + 4 * g) * 8 + 2 * j + pair
    q_ptrs = (
        s_ptr + (b * k_tiles + kk) * 64 + 8 * g + 2 * j + pair
    )  # quad order: (row g + 8 c, group j) at 8 g + 2 j + c
    x_ptrs = xd_ptr + (kk * 4 + j) * 32 + tl.arange(0, 4)[None, None, None, None, :]  # + 4 word
    kk4 = tl.arange(0, KT)[None, :, None, None]
    e_ptrs = xe_ptr + kk4 * 4 + tl.arange(0, 4)[None, None, None, :]  # group factors, [1, KT, 1, 4]
    acc0 = tl.zeros((BLOCKS, KT, 8, 4), dtype=tl.float32)
    acc1 = tl.zeros((BLOCKS, KT, 8, 4), dtype=tl.float32)
    MASKED: tl.constexpr = KT > 1
    steps = tl.cdiv(k_tiles, KT)
    ok = kk + 0 < k_tiles
    ws_next = _group_words(w_ptrs, ok, MASKED, ORDER)
    for i in range(0, steps):
        ok = kk + i * KT < k_tiles
        if PREFETCH:
            ws = ws_next
            nxt = tl.minimum(i + 1, steps - 1) * KT  # the last step loads itself again
            ws_next = _group_words(w_ptrs + nxt * 256, kk + nxt < k_tiles, MASKED, ORDER)
        else:
            ws = _group_words(w_ptrs + i * KT * 256, ok, MASKED, ORDER)
        xs = _group_acts(x_ptrs + i * KT * 128, ok, MASKED)
        lo, hi = _group_sums(ws, xs, MATH)
        if MASKED:
            sc = tl.load(q_ptrs + i * KT * 64, mask=ok, other=0)
            f = tl.load(e_ptrs + i * KT * 4, mask=kk4 + i * KT < k_tiles, other=0.0)
        else:
            sc = tl.load(q_ptrs + i * KT * 64)
            f = tl.load(e_ptrs + i * KT * 4)
        s0, s1 = tl.split(sc)
        acc0 += lo * (e8m0_to_fp32(s0.to(tl.int32)) * f)
        acc1 += hi * (e8m0_to_fp32(s1.to(tl.int32)) * f)
    y0 = tl.sum(tl.sum(acc0, axis=3), axis=1)
    y1 = tl.sum(tl.sum(acc1, axis=3), axis=1)
    rows = (block0 + tl.arange(0, BLOCKS))[:, None] * 16 + tl.arange(0, 8)[None, :]
    tl.store(y_ptr + rows, y0)
    tl.store(y_ptr + rows + 8, y1)


# The same arithmetic on the lane (fragment) order with 16-byte loads: element (block, g, h) takes half h of the 4
# lanes 4 g + t -- words 4 h .. 4 h + 3 of each, one 16-byte piece per lane -- which are scale groups 2 h and 2 h + 1
# of rows g and g + 8: 16 words, two calls of the group sum. (Elements of one group's lanes, ``frag_gemv_group_kernel``
# on the lane order, load 8-byte pieces 32 bytes apart: 0.2111 ms against 0.1363 on the group order, same run.)
@triton.jit
def frag_gemv_half_kernel(
    xd_ptr,
    xe_ptr,
    w_ptr,
    s_ptr,
    y_ptr,
    K,
    BLOCKS: tl.constexpr,
    MATH: tl.constexpr,
    PREFETCH: tl.constexpr = 1,
):
    """``y[rows] = W[rows] @ x`` on :func:`fragment_order`'s bytes, one element per (block, K tile, g, h); scales in
    :func:`quad_scale_order`, activations from :func:`prepare_group_dup`; ``BLOCKS`` 16-row blocks a program, one K tile
    a step; ``PREFETCH``: the next K tile's words in flight while this one is multiplied."""
    block0 = tl.program_id(0) * BLOCKS
    k_tiles = K // 128
    b = (block0 + tl.arange(0, BLOCKS))[:, None, None, None]
    g = tl.arange(0, 8)[None, :, None, None]
    h = tl.arange(0, 2)[None, None, :, None]
    w_ptrs = w_ptr.to(tl.pointer_type(tl.int32)) + (b * k_tiles * 32 + 4 * g) * 8 + 4 * h + tl.arange(0, 4)  # + lane t
    q_ptrs = s_ptr + b * k_tiles * 64 + 8 * g + 4 * h + tl.arange(0, 4)  # (2 j' + c) of groups 2 h + j'
    x_ptrs = xd_ptr + h * 64 + tl.arange(0, 4)  # + 32 j' + 4 word; [1, 1, 2, 4]
    e_ptrs = xe_ptr + 2 * tl.arange(0, 2)[None, None, :, None] + tl.arange(0, 2)  # groups 2 h + j', [1, 1, 2, 2]
    acc0 = tl.zeros((BLOCKS, 8, 2, 2), dtype=tl.float32)  # [.., h, j'] of row g
    acc1 = tl.zeros((BLOCKS, 8, 2, 2), dtype=tl.float32)  # row g + 8
    nxt = ()
    for t in tl.static_range(4):
        nxt = nxt + (tl.load(w_ptrs + 8 * t),)
    for kt in range(0, k_tiles):
        pieces = nxt
        if PREFETCH:
            nxt = ()
            for t in tl.static_range(4):
                nxt = nxt + (tl.load(w_ptrs + (tl.minimum(kt + 1, k_tiles - 1) * 256 + 8 * t)),)
        else:
            pieces = ()
            for t in tl.static_range(4):
                pieces = pieces + (tl.load(w_ptrs + (kt * 256 + 8 * t)),)
        words = ()  # words[t] = (j'0 even, j'0 odd, j'1 even, j'1 odd) of lane t
        for t in tl.static_range(4):
            words = words + (_split4(tl.reshape(pieces[t], (BLOCKS * 8, 2, 4)), BLOCKS * 8, 2),)
        sums0 = ()
        sums1 = ()
        for jj in tl.static_range(2):
            ws = ()
            for t in tl.static_range(4):
                ws = ws + (words[t][2 * jj], words[t][2 * jj + 1])
            xs = ()
            for i in tl.static_range(8):
                x = tl.load(x_ptrs + kt * 128 + 32 * jj + 4 * i)  # [1, 1, 2, 4]
                x0, x1, x2, x3 = _split4(tl.reshape(x, (1, 2, 4)), 1, 2)
                xs = xs + (x0, x1, x2, x3)
            lo, hi = _group_sums(ws, xs, MATH)  # [BLOCKS * 8, 2]
            sums0 = sums0 + (lo,)
            sums1 = sums1 + (hi,)
        lo = tl.reshape(tl.join(sums0[0], sums0[1]), (BLOCKS, 8, 2, 2))
        hi = tl.reshape(tl.join(sums1[0], sums1[1]), (BLOCKS, 8, 2, 2))
        sc = tl.reshape(tl.load(q_ptrs + kt * 64), (BLOCKS, 8, 2, 2, 2))  # h, j', c
        s0, s1 = tl.split(sc)
        f = tl.load(e_ptrs + kt * 4)
        acc0 += lo * (e8m0_to_fp32(s0.to(tl.int32)) * f)
        acc1 += hi * (e8m0_to_fp32(s1.to(tl.int32)) * f)
    y0 = tl.sum(tl.reshape(acc0, (BLOCKS, 8, 4)), axis=2)
    y1 = tl.sum(tl.reshape(acc1, (BLOCKS, 8, 4)), axis=2)
    rows = (block0 + tl.arange(0, BLOCKS))[:, None] * 16 + tl.arange(0, 8)[None, :]
    tl.store(y_ptr + rows, y0)
    tl.store(y_ptr + rows + 8, y1)


# The lane order read as it lies: element (block, g, t, h) is half h of lane 4 g + t's 32 bytes -- one 16-byte load, a
# warp's 32 loads 512 contiguous bytes -- which holds 8 codes of rows g and g + 8 in each of scale groups 2 h and
# 2 h + 1. Each element scales its own partial sums (rows and groups as the quad order stores them, contiguous), and
# the 4 lanes t of a row are summed once after the K loop. The group- and half-mapped elements above read 16-32 bytes
# of each of 8 lines a load (0.2111 and 0.1716-0.2042 ms on the lane order against 0.1363 on the group order, where a
# warp's load is contiguous): how a warp's load covers whole lines is what decides at M = 1.
# That kernel, frag_gemv_lane_kernel, shipped as gemv_mxfp4.gemv_rows_wgmma (the wgmma order's MoE decode GEMVs) and
# was then a wrapper of it; both were removed after e98e4de, when the wgmma order's scheduled tiles beat those GEMVs
# at every T. Its check and timing need the probe at e98e4de.
LANE_GEMV_GONE = (
    "the lane-mapped GEMV (frag_gemv_lane_kernel, gemv_mxfp4.gemv_rows_wgmma) is gone: run this probe at e98e4de"
)


# On :func:`k_permuted` bytes a lane is a GEMV element as it lies: lane 4 g + t's 32 bytes (two 16-byte loads, a warp's
# loads 512 contiguous bytes each) are rows g and g + 8 of scale group t whole. Word s holds natural bytes 16 t + 2 s,
# + 1 of both rows: codes 32 t + 4 s + (kh, nibble) -- 4 contiguous activations a word, the natural order duplicated.
@triton.jit
def frag_gemv_kperm_kernel(
    xd_ptr,
    xe_ptr,
    w_ptr,
    s_ptr,
    y_ptr,
    K,
    BLOCKS: tl.constexpr,
    MATH: tl.constexpr,
    PREFETCH: tl.constexpr = 1,
):
    """``y[rows] = W[rows] @ x`` on ``fragment_order(k_permuted(w))``, one element per (block, g | t) and K tile (all
    tensors ``[BLOCKS * 8, 4, ..]``); scales in :func:`quad_scale_order`; activations from :func:`prepare_dup`
    (natural order). ``PREFETCH``: the next K tile's words in flight while this one is multiplied."""
    block0 = tl.program_id(0) * BLOCKS
    k_tiles = K // 128
    bg = block0 * 8 + tl.arange(0, BLOCKS * 8)[:, None, None]  # block * 8 + g
    t = tl.arange(0, 4)[None, :, None]
    four = tl.arange(0, 4)[None, None, :]
    w_ptrs = w_ptr.to(tl.pointer_type(tl.int32)) + ((bg // 8) * k_tiles * 32 + 4 * (bg % 8) + t) * 8 + four  # + 4 half
    q_ptrs = s_ptr + (bg // 8) * k_tiles * 64 + 8 * (bg % 8) + 2 * t + tl.arange(0, 2)[None, None, :]  # (g | g + 8, t)
    x_ptrs = xd_ptr + 32 * t + four  # + 4 s
    e_ptrs = xe_ptr + tl.arange(0, 4)[None, :]
    acc0 = tl.zeros((BLOCKS * 8, 4), dtype=tl.float32)  # row g
    acc1 = tl.zeros((BLOCKS * 8, 4), dtype=tl.float32)  # row g + 8
    lo_next, hi_next = tl.load(w_ptrs), tl.load(w_ptrs + 4)
    for kt in range(0, k_tiles):
        if PREFETCH:
            lo_w, hi_w = lo_next, hi_next
            nxt = w_ptrs + tl.minimum(kt + 1, k_tiles - 1) * 256
            lo_next, hi_next = tl.load(nxt), tl.load(nxt + 4)
        else:
            lo_w, hi_w = tl.load(w_ptrs + kt * 256), tl.load(w_ptrs + kt * 256 + 4)
        ws = _split4(lo_w, BLOCKS * 8, 4) + _split4(hi_w, BLOCKS * 8, 4)  # steps s = 0..7
        xs = ()
        for i in tl.static_range(8):
            xs = xs + _split4(tl.load(x_ptrs + kt * 128 + 4 * i), 1, 4)
        lo, hi = _group_sums(ws, xs, MATH)
        sc0, sc1 = tl.split(tl.load(q_ptrs + kt * 64))
        f = tl.load(e_ptrs + kt * 4)
        acc0 += lo * (e8m0_to_fp32(sc0.to(tl.int32)) * f)
        acc1 += hi * (e8m0_to_fp32(sc1.to(tl.int32)) * f)
    y0 = tl.sum(tl.reshape(acc0, (BLOCKS, 8, 4)), axis=2)
    y1 = tl.sum(tl.reshape(acc1, (BLOCKS, 8, 4)), axis=2)
    rows = (block0 + tl.arange(0, BLOCKS))[:, None] * 16 + tl.arange(0, 8)[None, :]
    tl.store(y_ptr + rows, y0)
    tl.store(y_ptr + rows + 8, y1)


# The same with one 16-byte load an element, a warp's load 512 contiguous bytes (the lane-whole elements above load
# 16 of every 32 bytes of 1 KB twice): element (block, g | t, h) is half h of lane 4 g + t, rows g and g + 8 over 16
# codes of group t each; the two halves' sums are scaled apart and meet after the K loop.
@triton.jit
def frag_gemv_kperm_half_kernel(
    xd_ptr,
    xe_ptr,
    w_ptr,
    s_ptr,
    y_ptr,
    K,
    BLOCKS: tl.constexpr,
    MATH: tl.constexpr,
    PREFETCH: tl.constexpr = 1,
):
    """:func:`frag_gemv_kperm_kernel` with an element per half lane (tensors ``[BLOCKS * 8, 8 (t, h), ..]``)."""
    block0 = tl.program_id(0) * BLOCKS
    k_tiles = K // 128
    bg = block0 * 8 + tl.arange(0, BLOCKS * 8)[:, None, None]  # block * 8 + g
    th = tl.arange(0, 8)[None, :, None]  # 2 t + h
    four = tl.arange(0, 4)[None, None, :]
    w_ptrs = w_ptr.to(tl.pointer_type(tl.int32)) + ((bg // 8) * k_tiles * 32 + 4 * (bg % 8)) * 8 + 4 * th + four
    q_ptrs = s_ptr + (bg // 8) * k_tiles * 64 + 8 * (bg % 8) + 2 * (th // 2) + tl.arange(0, 2)[None, None, :]
    x_ptrs = xd_ptr + 16 * th + four  # group t's half h: 32 t + 16 h = 16 (2 t + h); + 4 s'
    e_ptrs = xe_ptr + tl.arange(0, 8)[None, :] // 2
    acc0 = tl.zeros((BLOCKS * 8, 8), dtype=tl.float32)  # row g
    acc1 = tl.zeros((BLOCKS * 8, 8), dtype=tl.float32)  # row g + 8
    w_next = tl.load(w_ptrs)
    for kt in range(0, k_tiles):
        if PREFETCH:
            w = w_next
            w_next = tl.load(w_ptrs + tl.minimum(kt + 1, k_tiles - 1) * 256)
        else:
            w = tl.load(w_ptrs + kt * 256)
        ws = _split4(w, BLOCKS * 8, 8)  # steps 4 h + s'
        xs = ()
        for i in tl.static_range(4):
            xs = xs + _split4(tl.load(x_ptrs + kt * 128 + 4 * i), 1, 8)
        lo, hi = _group_sums4(ws, xs, MATH)
        sc0, sc1 = tl.split(tl.load(q_ptrs + kt * 64))
        f = tl.load(e_ptrs + kt * 4)
        acc0 += lo * (e8m0_to_fp32(sc0.to(tl.int32)) * f)
        acc1 += hi * (e8m0_to_fp32(sc1.to(tl.int32)) * f)
    y0 = tl.sum(tl.reshape(acc0, (BLOCKS, 8, 8)), axis=2)
    y1 = tl.sum(tl.reshape(acc1, (BLOCKS, 8, 8)), axis=2)
    rows = (block0 + tl.arange(0, BLOCKS))[:, None] * 16 + tl.arange(0, 8)[None, :]
    tl.store(y_ptr + rows, y0)
    tl.store(y_ptr + rows + 8, y1)


def prepare_group_dup(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`prepare_dup` with each group's 32 activations in :func:`frag_gemv_group_kernel`'s word order: position
    8 t + 4 odd + 2 kh + nibble of group j (word 2 t + odd, slot (kh, nibble)) holds activation
    32 j + 16 odd + 2 t + 8 kh + nibble."""
    xd, xe = prepare_dup(x)
    perm = xd.view(-1, 2, 2, 4, 2).permute(0, 3, 1, 2, 4)  # group, odd, kh, t, nibble -> group, t, odd, kh, nibble
    return perm.reshape(-1).contiguous(), xe


def check() -> None:
    from mxrepack.quant import dequantize_mxfp4

    torch.manual_seed(0)
    N, K, M = 128, 256, 16
    w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8)
    ws = torch.randint(119, 124, (N, K // 32), dtype=torch.uint8)
    x = torch.randn(M, K).to(torch.bfloat16)
    ref = x.float() @ dequantize_mxfp4(w, ws, torch.float32).T
    y = torch.empty(N, M, dtype=torch.float32)
    grid = (N // ROWS,)
    probe_kernel[grid](x, fragment_order(w), scale_order(ws), y, K, x.stride(0), M=M, BLOCKS=ROWS // 16, ASM=False)
    print(f"relative error against dequantize_mxfp4: {((y.T - ref).norm() / ref.norm()).item():.2e}")
    y = torch.empty(N, M, dtype=torch.float32)
    probe_kernel[grid](x, fragment_order(w), ws, y, K, x.stride(0), M=M, BLOCKS=ROWS // 16, ASM=False, SCALES="rows")
    print(f"row-major scales, relative error: {((y.T - ref).norm() / ref.norm()).item():.2e}")
    probe_kernel[grid](
        x, fragment_order(w), quad_scale_order(ws), y, K, x.stride(0), M=M, BLOCKS=ROWS // 16, ASM=False, SCALES="quad"
    )
    print(f"quad-ordered scales, relative error: {((y.T - ref).norm() / ref.norm()).item():.2e}")
    yg = torch.empty(N, dtype=torch.float32)
    frag_gemv_kernel[(N // 32,)](x[0], fragment_order(w), ws, yg, K, BLOCKS=2, DECODE="ops")
    print(f"GEMV, relative error: {((yg - ref[0]).norm() / ref[0].norm()).item():.2e}")
    xd, xe = prepare_dup(x[0])
    frag_gemv_dup_kernel[(N // 32,)](xd, xe, fragment_order(w), ws, yg, K, BLOCKS=2, MATH="ops")
    err = ((yg - ref[0]).norm() / ref[0].norm()).item()
    print(f"f16x2 GEMV, duplicated activations (portable twin), relative error: {err:.2e}")
    frag_gemv_dup_kernel[(N // 32,)](
        xd, xe, fragment_order(w), quad_scale_order(ws), yg, K, BLOCKS=2, MATH="ops", QUAD_SCALES=True, AHEAD=True
    )
    err = ((yg - ref[0]).norm() / ref[0].norm()).item()
    print(f"the same, quad-ordered scales, words loaded a K tile ahead, relative error: {err:.2e}")
    xg, xe = prepare_group_dup(x[0])
    for blocks, kt in ((2, 1), (1, 2), (2, 4)):
        yg = torch.empty(N, dtype=torch.float32)
        frag_gemv_group_kernel[(N // (16 * blocks),)](
            xg, xe, fragment_order(w), quad_scale_order(ws), yg, K, BLOCKS=blocks, KT=kt, MATH="ops"
        )
        err = ((yg - ref[0]).norm() / ref[0].norm()).item()
        print(
            f"group-mapped f16x2 GEMV, {blocks} blocks x {kt} K tiles a step (portable twin), relative error: {err:.2e}"
        )
    for blocks, kt in ((2, 1), (2, 4)):
        yg = torch.empty(N, dtype=torch.float32)
        frag_gemv_group_kernel[(N // (16 * blocks),)](
            xg, xe, group_order(w), quad_scale_order(ws), yg, K, BLOCKS=blocks, KT=kt, MATH="ops", ORDER="group"
        )
        err = ((yg - ref[0]).norm() / ref[0].norm()).item()
        print(f"the same on group_order, {blocks} blocks x {kt} K tiles (portable twin), relative error: {err:.2e}")
    for blocks in (1, 2):
        yg = torch.empty(N, dtype=torch.float32)
        frag_gemv_half_kernel[(N // (16 * blocks),)](
            xg, xe, fragment_order(w), quad_scale_order(ws), yg, K, BLOCKS=blocks, MATH="ops"
        )
        err = ((yg - ref[0]).norm() / ref[0].norm()).item()
        print(f"half-mapped GEMV on the fragment order, {blocks} blocks (portable twin), relative error: {err:.2e}")
    print(f"skipped: {LANE_GEMV_GONE}")
    wk = fragment_order(k_permuted(w))
    for blocks in (1, 2):
        yg = torch.empty(N, dtype=torch.float32)
        frag_gemv_kperm_kernel[(N // (16 * blocks),)](
            xd, xe, wk, quad_scale_order(ws), yg, K, BLOCKS=blocks, MATH="ops"
        )
        err = ((yg - ref[0]).norm() / ref[0].norm()).item()
        print(f"GEMV on k_permuted fragment order, {blocks} blocks (portable twin), relative error: {err:.2e}")
        frag_gemv_kperm_half_kernel[(N // (16 * blocks),)](
            xd, xe, wk, quad_scale_order(ws), yg, K, BLOCKS=blocks, MATH="ops"
        )
        err = ((yg - ref[0]).norm() / ref[0].norm()).item()
        print(f"the same, an element per half lane, {blocks} blocks (portable twin), relative error: {err:.2e}")
    y = torch.empty(N, M, dtype=torch.float32)
    probe_kernel[grid](
        k_permuted_x(x), wk, quad_scale_order(ws), y, K, x.stride(0), M=M, BLOCKS=ROWS // 16, ASM=False, SCALES="group"
    )
    err = ((y.T - ref).norm() / ref.norm()).item()
    print(f"tile on k_permuted fragment order, group scales, relative error: {err:.2e}")
    y = torch.empty(N, M, dtype=torch.float32)
    probe_kernel[grid](
        x,
        group_order(w),
        quad_scale_order(ws),
        y,
        K,
        x.stride(0),
        M=M,
        BLOCKS=ROWS // 16,
        ASM=False,
        SCALES="quad",
        ORDER="group",
    )
    print(f"tile on group_order, quad scales, relative error: {((y.T - ref).norm() / ref.norm()).item():.2e}")


def emulate(trials: int = 20000) -> None:
    """The PTX decode's byte selection and bit placement, emulated on random words: each of its four outputs must be
    (low nibble, high nibble) of byte i as bf16 codes (times 2^-126, before the scale). The GEMV's decode is the shipped
    f16x2 GEMV's, tested there."""
    import random
    import struct

    fp4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]

    def prmt(a: int, b: int, sel: int) -> int:
        pool = [(a >> 8 * i) & 0xFF for i in range(4)] + [(b >> 8 * i) & 0xFF for i in range(4)]
        return sum(pool[(sel >> 4 * i) & 7] << 8 * i for i in range(4))

    def value(half: int) -> float:  # a bf16 code pattern times 2^126
        return struct.unpack("<f", struct.pack("<I", half << 16))[0] * 2.0**126

    wrong = 0
    for _ in range(trials):
        word = random.getrandbits(32)
        shifted = (word << 4) & 0xFFFFFFFF
        for i in range(4):
            y = prmt(shifted, word, 0x4000 + 0x1010 * i)
            out = (y & 0x80008000) | ((y & 0x70007000) >> 6)
            byte = (word >> 8 * i) & 0xFF
            want = [(-1 if c & 8 else 1) * fp4[c & 7] for c in (byte & 15, byte >> 4)]
            wrong += [value(out & 0xFFFF), value(out >> 16)] != want
    print(f"{trials} words: {wrong} of {4 * trials} outputs differ")


def sass() -> None:
    from sass_vs_triton_kernels import loop_counts
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from mxrepack.kernels import check as kcheck

    sig = {"x_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "y_ptr": "*fp32", "K": "i32", "stride_x": "i32"}
    sig |= {"M": "constexpr", "BLOCKS": "constexpr", "ASM": "constexpr"}
    for cap in (90, 121):
        src = kcheck.specialized(ASTSource(probe_kernel, sig, {"M": 16, "BLOCKS": ROWS // 16, "ASM": True}))
        k = triton.compile(src, target=GPUTarget("cuda", cap, 32), options={"num_warps": 4, "num_stages": 3})
        waits = [
            line.split()[0].split(".")[1] + (" " + line.split()[-1] if "wait" in line else "")
            for line in (raw.strip() for raw in k.asm["ptx"].splitlines())
            if line.startswith("wgmma.") and "group" in line
        ]
        c = loop_counts(k.asm["cubin"])
        print(
            f"sm_{cap}a: loop {c['loop']} instructions for 64 codes a thread, {c['registers']} registers, stack "
            f"{c['stack_bytes']}, wgmma groups {waits}, top {list(c['loop_ops'].items())[:10]}",
            flush=True,
        )


# Timed 2026-11-26 on the fragment order (lane order): 0.2126-0.3446 ms against the shipped 0.1339 (the 8-byte
# pieces 32 bytes apart); the group order gives the same elements 16-byte loads.
GROUP_GEMV_SHAPES = (  # (blocks, K tiles, warps, prefetch, byte order); others 0.1384-0.1851 ms, same day
    (8, 1, 8, 1, "lane"),
    (8, 1, 8, 1, "group"),
)
HALF_GEMV_SHAPES = ((32, 8, 1),)  # (blocks, warps, prefetch); 4-16 blocks 0.1855-0.2042 ms, 2026-11-26
# the lane GEMV (gone, LANE_GEMV_GONE) ran 4 blocks, 8 warps, prefetch 1; others (2-16 blocks, 4-8 warps, prefetch
# 0/1): 0.1506-0.1802 ms, 2026-11-26
# group order tiles 0.263-0.399 ms against 0.156-0.310 on the lane order, M = 32-128, 2026-11-26
TILE_SHAPES = (  # ((blocks, warps), scale order, byte order)
    ((4, 4), "quad", "lane"),
    ((8, 8), "quad", "lane"),
    ((4, 4), "group", "kperm"),
    ((8, 8), "group", "kperm"),
)
# (blocks, warps, prefetch); 8 blocks on 4 warps, 16 blocks, no prefetch: 0.1712-0.1790 ms, 2026-11-26
KPERM_GEMV_SHAPES = ((4, 4, 1), (8, 8, 1))
KPERM_HALF_GEMV_SHAPES = ((2, 4, 1), (4, 8, 1), (4, 4, 1), (8, 8, 1), (2, 4, 0), (4, 8, 0), (8, 4, 1), (16, 8, 1))


def time(out: str | None = None, what: str = "all") -> None:
    """GPU. (1) A dense stand-in for the MoE's gate_up at T >= 512 (tokens per expert M = 32-128 against many 64-128
    row weight tiles, K = 2944): the probe (fragment order, one dot per K tile, no masks) with its scales repeated per
    lane, in the quad order or row-major, against ``linear_mxfp4``'s swapped tiles on the same weights in natural
    order, folded as shipped. (2) One token (M = 1) over lm_head-sized weights: :func:`frag_gemv_kernel`,
    and :func:`frag_gemv_dup_kernel` (row-major or quad-ordered scales) against the
    shipped GEMVs on the same weights in natural order (the dispatch's choice, f16x2, and its fp32 "asm" twin)."""
    import dataclasses
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from common import deq, measure_candidate, rand_mx

    from mxrepack.kernels.gemv_mxfp4 import pick_gemv_config, sm_count
    from mxrepack.kernels.linear_mxfp4 import LinearConfig, linear_mxfp4

    def measure(rows, label, run, view, ref, flops, M):
        rec = measure_candidate({"M": M, "candidate": label}, run, view, ref, flops)
        rows.append(rec)
        if out:  # after every row: a run stopped at its time limit keeps what it measured
            meta = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "K": K}
            Path(out).write_text(json.dumps({**meta, "rows": rows}, indent=1))
        shown = (
            f"{rec['ms']:.4f} ms {rec['tflops']:6.1f} TFLOP/s err {rec['rel_err']:.1e}" if "ms" in rec else rec["error"]
        )
        print(f"M={M:4d} {label:44s} {shown}", flush=True)

    torch.manual_seed(0)
    rows = []
    N, K = 5760 * 32, 2944  # 32 experts' gate_up rows: 265 MB of codes, past L2
    w, ws = rand_mx(N, K)
    ws.clamp_(max=128)  # the folded decode's precondition (fits_fold)
    wf, sf, sq, wg = fragment_order(w), scale_order(ws), quad_scale_order(ws), group_order(w)
    wk = fragment_order(k_permuted(w))
    for M in (16, 32, 64, 128) if what in ("all", "tile") else ():
        x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        xk = k_permuted_x(x)  # not timed: a MoE would write it so (the gate_up epilogue) or permute in its load
        ref = x.float() @ deq(w[:4096], ws[:4096]).T  # the first rows: enough to see a wrong order
        for (blocks, warps), order, byte_order in TILE_SHAPES:
            y = torch.empty(N, M, dtype=torch.float32, device="cuda")

            def run(y=y, blocks=blocks, warps=warps, order=order, byte_order=byte_order):
                probe_kernel[(N // (16 * blocks),)](
                    xk if order == "group" else x,
                    {"group": wg, "lane": wf, "kperm": wk}[byte_order],
                    {"lane": sf, "quad": sq, "rows": ws, "group": sq}[order],
                    y,
                    K,
                    x.stride(0),
                    M=M,
                    BLOCKS=blocks,
                    ASM=True,
                    SCALES=order,
                    ORDER="group" if byte_order == "group" else "lane",
                    num_warps=warps,
                    num_stages=3,
                )
                return y

            label = f"probe rows{16 * blocks} w{warps} st3 {order} scales {byte_order} order"
            measure(rows, label, run, lambda y: y.T[:, :4096], ref, 2 * M * N * K, M)
        for bn, warps in ((64, 4), (128, 8)):
            cfg = LinearConfig(M, bn, 128, 1, warps, 4 if M == 16 else 3, swap_ab=True, fold_scale=True)
            run = functools.partial(linear_mxfp4, x, w, ws, None, "w4a16", cfg, fold_scale=True)
            measure(rows, f"shipped kernel {cfg.name()}", run, lambda y: y[:, :4096].float(), ref, 2 * M * N * K, M)
    N = 201088  # lm_head's rows, K padded to whole 128-code tiles
    w, ws = rand_mx(N, K)
    wf = fragment_order(w)
    x = torch.randn(1, K, device="cuda").to(torch.bfloat16)
    ref = x.float() @ deq(w[:4096], ws[:4096]).T
    y = torch.empty(N, dtype=torch.float32, device="cuda")
    for blocks, warps in ((4, 4),):

        def run(blocks=blocks, warps=warps):
            frag_gemv_kernel[(N // (16 * blocks),)](x, wf, ws, y, K, BLOCKS=blocks, DECODE="asm", num_warps=warps)
            return y

        measure(rows, f"fragment GEMV blocks{blocks} w{warps}", run, lambda y: y[None, :4096], ref, 2 * N * K, 1)
    xd, xe = prepare_dup(x[0])  # not timed (the shipped f16x2 GEMV's timed call includes its prepare_x launch)
    sq = quad_scale_order(ws)
    dup = (((4, 4), True, False, False),)
    for (blocks, warps), quad, ahead, one in dup:

        def run(blocks=blocks, warps=warps, quad=quad, ahead=ahead, one=one):
            frag_gemv_dup_kernel[(N // (16 * blocks),)](
                xd,
                xe,
                wf,
                sq if quad else ws,
                y,
                K,
                BLOCKS=blocks,
                MATH="asm",
                QUAD_SCALES=quad,
                AHEAD=ahead,
                ONE_LOAD=one,
                num_warps=warps,
            )
            return y

        label = f"fragment GEMV f16x2 dup blocks{blocks} w{warps} " + ("quad" if quad else "rows") + " scales"
        label += (" ahead" if ahead else "") + (" one load" if one else "")
        measure(rows, label, run, lambda y: y[None, :4096], ref, 2 * N * K, 1)
    xg, xe = prepare_group_dup(x[0])
    wg = group_order(w)
    for blocks, kt, warps, prefetch, byte_order in GROUP_GEMV_SHAPES:

        def run(blocks=blocks, kt=kt, warps=warps, prefetch=prefetch, byte_order=byte_order):
            frag_gemv_group_kernel[(N // (16 * blocks),)](
                xg,
                xe,
                wg if byte_order == "group" else wf,
                sq,
                y,
                K,
                BLOCKS=blocks,
                KT=kt,
                MATH="asm",
                PREFETCH=prefetch,
                ORDER=byte_order,
                num_warps=warps,
            )
            return y

        label = f"group GEMV blocks{blocks} kt{kt} w{warps} prefetch{prefetch} {byte_order} order"
        measure(rows, label, run, lambda y: y[None, :4096], ref, 2 * N * K, 1)
    for blocks, warps, prefetch in HALF_GEMV_SHAPES:

        def run(blocks=blocks, warps=warps, prefetch=prefetch):
            frag_gemv_half_kernel[(N // (16 * blocks),)](
                xg, xe, wf, sq, y, K, BLOCKS=blocks, MATH="asm", PREFETCH=prefetch, num_warps=warps
            )
            return y

        label = f"half GEMV blocks{blocks} w{warps} prefetch{prefetch} lane order"
        measure(rows, label, run, lambda y: y[None, :4096], ref, 2 * N * K, 1)
    print(f"skipped: {LANE_GEMV_GONE}", flush=True)
    wk = fragment_order(k_permuted(w))
    for blocks, warps, prefetch in KPERM_GEMV_SHAPES:

        def run(blocks=blocks, warps=warps, prefetch=prefetch):
            frag_gemv_kperm_kernel[(N // (16 * blocks),)](
                xd, xe, wk, sq, y, K, BLOCKS=blocks, MATH="asm", PREFETCH=prefetch, num_warps=warps
            )
            return y

        label = f"kperm GEMV blocks{blocks} w{warps} prefetch{prefetch}"
        measure(rows, label, run, lambda y: y[None, :4096], ref, 2 * N * K, 1)
    for blocks, warps, prefetch in KPERM_HALF_GEMV_SHAPES:

        def run(blocks=blocks, warps=warps, prefetch=prefetch):
            frag_gemv_kperm_half_kernel[(N // (16 * blocks),)](
                xd, xe, wk, sq, y, K, BLOCKS=blocks, MATH="asm", PREFETCH=prefetch, num_warps=warps
            )
            return y

        label = f"kperm half GEMV blocks{blocks} w{warps} prefetch{prefetch}"
        measure(rows, label, run, lambda y: y[None, :4096], ref, 2 * N * K, 1)
    shipped = pick_gemv_config(N, sm_count(x.device))
    for cfg in (shipped, dataclasses.replace(shipped, decode="asm", prefetch=1, pdl=0)):
        run = functools.partial(linear_mxfp4, x, w, ws, None, "w4a16", cfg)
        measure(rows, f"shipped GEMV {cfg.name()}", run, lambda y: y[:, :4096].float(), ref, 2 * N * K, 1)


if __name__ == "__main__":
    {"check": check, "emulate": emulate, "sass": sass, "time": time}[sys.argv[1]](*sys.argv[2:])
