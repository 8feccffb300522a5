"""Where the rows order's swapped MoE tiles (``moe_mxfp4._gate_up_kernel`` / ``_down_kernel``, SWAP_AB, ORDER "rows",
``dequant_mxfp4.dot_w_mxfp4``) move the weight bytes on their way to wgmma's register A operand, and decode variants
that move them less. ``sass`` and ``check`` run offline (CPU, ``triton.compile`` for sm_90a); ``time`` on a GPU.

    python benchmarks/experiments/rows_operand_probe.py sass VARIANT [OUT.json]      # one variant a process
    TRITON_INTERPRET=1 python benchmarks/experiments/rows_operand_probe.py check      # the variants' sums, CPU

VARIANT: ``rows`` (shipped), ``wgmma`` (the wgmma order's tile of the same shape, ``order="wgmma"``), ``kperm``,
``kperm-words``. Each is built for the shipped folded rows tiles MoeConfig(64, 128, 128, 4 warps, 3 stages) and
MoeConfig(16, 64, 128, 4 warps, 4 stages), both kernels; per build: every ``convert_layout`` / ``local_alloc`` /
``local_load`` / ``local_store`` inside the K loop (source and destination layout, element type, shape) and the K
loop's SASS by opcode (the longest backward branch: ``sass_vs_triton_kernels.loop_counts``).

Finding (Triton 3.9 and 3.6 alike): the shipped decode converts nothing decoded. Each [BLOCK_N, 64] byte tile is
copied to shared memory by the pipeline (cp.async) and ``local_load``-ed straight into the wgmma operand layout
(``dot_op<opIdx 0, kWidth 2>`` of i8), where lane 4 g + t holds bytes 2 t, 2 t + 1 (+ 8, + 16 s) of rows g, g + 8:
runs of 2 bytes, so 32 ``LDS.U16`` per thread per 128 x 64-byte tile where the wgmma order takes 4 ``LDS.128``. The
E8M0 scales are a synchronous ``LDG.E.U8`` per byte (scale rows 90/92 bytes apart: no cp.async) and a
``convert_layout`` [BLOCK_N, 4] i8 #blocked -> slice of the operand's layout through shared memory (STS, BAR, LDS).

``kperm``: each 128-code K tile taken by ONE dot, its codes in order P (k = 16 u + 8 J + 2 t + i holds code
32 t + 4 u + 2 i + J), so that lane 4 g + t's operand registers are the 16 contiguous bytes 16 t .. 16 t + 15 of rows
g and g + 8 (one scale group, t), decoded by the shipped ``PAIRS_ASM_FOLDED``. The activations come in order P
instead of split order (``split_pairs`` is its own kernel: any order within a tile costs it the same; gate_up stores
the intermediate in order P for down). Triton then loads the bytes with LDS.128 but repacks them into 16-bit pairs
(PRMT / IMAD.SHL / LOP3 per pair): longer loops. ``kperm-words``: the same lane bytes loaded as int32 words and
decoded a word at a time (:data:`WORD_ROWS_ASM_FOLDED`: the shipped pair decode twice, its bf16x2 results split into
halves that Triton joins straight back into operand registers), codes in order Q (:func:`q_order`): no repacking.
``check`` runs the relabellings (portable decode: the asm is elementwise, the same values per byte) against torch and
the shipped decode; the word asm itself is the shipped pair decode with prmt selectors 0x1404 / 0x3424 (bytes 0, 1 /
2, 3 of the word), which only ``time`` runs (on the GPU, below).

K-loop SASS instructions (Triton 3.9; 3.6 within 5%), rows / kperm / kperm-words / wgmma order:
gate_up 64 x 128 1045 / 1191 / 937 / 760 (LDS 66 / 10 / 10 / 12, PRMT 100 / 206 / 78 / 32, LDL 39 / 21 / 19 / 0);
down 64 x 128 549 / 633 / 519 / 384; gate_up 16 x 64 544 / 615 / 491 / 360; down 16 x 64 309 / 349 / 288 / 218.

    python benchmarks/experiments/rows_operand_probe.py time rows|kperm|kperm-words [OUT.json] [T,T,...]   # GPU

Timed (H200, Triton 3.6.0, 86bbbe0, one draw a T, the two runs back to back on one machine; records
``rows_operand_probe_time_{rows,kperm_words}_h200_2026-11-29_86bbbe0.json``), ms at T = 32 / 128 / 1024 / 4096:
rows 0.512 / 0.802 / 1.285 / 3.489, kperm-words 0.553 / 0.789 / 1.329 / 3.668 (+8%, -2%, +3%, +5%; both within
2.4e-3 of the fp32 reference, so the word asm decodes right on the GPU). The shorter loop did not make a faster
kernel: not shipped. What it leaves against the wgmma order (the plain-byte decode's ~20 instructions per 8 codes
against 13, the scales' synchronous byte loads and their convert through shared memory, gate_up's spills) is what
the wgmma order's bytes remove.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mxrepack.kernels.dequant_mxfp4 as dq  # noqa: E402
import mxrepack.kernels.moe_mxfp4 as moe  # noqa: E402
from mxrepack.kernels.dequant_mxfp4 import (  # noqa: E402
    PAIRS_ASM_FOLDED,
    _code_times_scale,
    _pairs_ops,
    e8m0_to_bf16_folded,
    e8m0_to_fp32,
    mma_done,
)

# --------------------------------------------------------------------------------------------------------------------
# kperm: one dot per K tile, the codes in order P


def p_order():
    """P as a list: position k of a K tile's dot -> the code it holds (k = 16 u + 8 J + 2 t + i: code 32 t + 4 u + 2 i
    + J). Lane 4 g + t's fragment (k = 16 s + 2 t + {0, 1, 8, 9}) is then byte 16 t + 2 s + {0, 1} of its rows."""
    return [32 * t + 4 * u + 2 * i + J for u in range(8) for J in range(2) for t in range(4) for i in range(2)]


@triton.jit
def p_column(n):
    """Column of value ``n`` in order P (per 128-column tile): what the gate_up kernel stores for down."""
    c = n % 128
    t = c // 32
    u = (c % 32) // 4
    i = (c % 4) // 2
    J = c % 2
    return (n // 128) * 128 + 16 * u + 8 * J + 2 * t + i


@triton.jit
def load_tile(a_ptr, rows, row_ok, k0, stride_a, BLOCK_K: tl.constexpr):
    """One K tile of activations stored in the variant's order (P or Q) ``[rows, 128]``, twice (the kernels' second
    split half, unused, is dead code)."""
    a = tl.load(a_ptr + rows[:, None] * stride_a + k0 + tl.arange(0, BLOCK_K)[None, :], mask=row_ok[:, None], other=0.0)
    return a, a


@triton.jit
def decode_p(w, ws, BLOCK_N: tl.constexpr, MATH: tl.constexpr):
    """Packed bytes ``[BLOCK_N, 64]`` and E8M0 scales ``[BLOCK_N, 4]`` -> ``[BLOCK_N, 128]`` bf16 in order P: the
    shipped byte decode (pack 2: a lane's register holds 2 neighbouring bytes), relabelled by a join, reshape and
    permute."""
    s = tl.reshape(tl.broadcast_to(ws[:, :, None], (BLOCK_N, 4, 16)), (BLOCK_N, 64))
    if MATH == "ops":
        lo, hi = _pairs_ops(w, s)
    else:
        tl.static_assert(MATH == "asm-fold", "kperm probes the folded decode")
        lo, hi = tl.inline_asm_elementwise(
            PAIRS_ASM_FOLDED,
            "=r,=r,r,r",
            [w, e8m0_to_bf16_folded(s)],
            dtype=(tl.bfloat16, tl.bfloat16),
            is_pure=True,
            pack=2,
        )
    x = tl.reshape(tl.join(lo, hi), (BLOCK_N, 4, 8, 2, 2))  # row | t, u, i, J (byte 16 t + 2 u + i, nibble J)
    return tl.reshape(tl.permute(x, (0, 2, 4, 1, 3)), (BLOCK_N, 128))  # row | u, J, t, i


@triton.jit
def dot_p(
    w,
    ws,
    a,
    a_unused,
    acc,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MATH: tl.constexpr,
    INTERPRETER: tl.constexpr,
    WAIT_MMA: tl.constexpr = False,
):
    """``dot_w_mxfp4``'s place: ``acc + W @ a.T`` for ``a`` ``[M, 128]`` in order P, one dot."""
    return _one_dot(decode_p(w, ws, BLOCK_N, MATH), a, acc, INTERPRETER, WAIT_MMA)


@triton.jit
def _one_dot(wd, a, acc, INTERPRETER: tl.constexpr, WAIT_MMA: tl.constexpr):
    """``acc + wd @ a.T``: a decoded K tile's one dot, waited for as ``dot_w_mxfp4``'s two are."""
    if INTERPRETER:
        return tl.dot(wd.to(tl.float32), tl.trans(a).to(tl.float32), acc)
    acc = tl.dot(wd, tl.trans(a), acc)
    if WAIT_MMA:
        acc = mma_done(acc)
    return acc


def install_kperm() -> None:
    """Swap the kperm pieces into the module before anything compiles (the JIT reads them from its globals)."""
    moe.load_split = load_tile
    moe.dot_w_mxfp4 = dot_p
    moe.split_column = p_column


# --------------------------------------------------------------------------------------------------------------------
# kperm-words: the same lane bytes taken as int32 words (one asm per word, no byte repacking), the codes in order Q

# A rows-order word (bytes b0..b3, codes 2 b + nibble) -> 8 bf16 values: the shipped pair decode twice (bytes 0, 1 then
# 2, 3: PAIRS_ASM_FOLDED's 8 instructions + 2 fma each), each bf16x2 result split into its halves, so that Triton
# joins them straight back into the operand's 32-bit registers. Output j holds code 8 w + (0, 2, 1, 3, 4, 6, 5, 7)[j].
_HALF = """prmt.b32 y, $8, 0, {sel};
and.b32 t, y, 0x70007000;
shr.b32 t, t, 6;
lop3.b32 q, y, t, 0x80008000, 0xEC;
shl.b32 u, y, 4;
and.b32 t, u, 0x70007000;
shr.b32 t, t, 6;
lop3.b32 p, u, t, 0x80008000, 0xEC;
fma.rn.bf16x2 p, p, s, z;
fma.rn.bf16x2 q, q, s, z;
mov.b32 {{${a}, ${b}}}, p;
mov.b32 {{${c}, ${d}}}, q;
"""
WORD_ROWS_ASM_FOLDED = tl.constexpr(
    "{\n.reg .b32 y, u, t, z, s, p, q;\nmov.b32 z, 0x80008000;\nmov.b32 s, {$9, $9};\n"
    + _HALF.format(sel="0x1404", a=0, b=1, c=2, d=3)
    + _HALF.format(sel="0x3424", a=4, b=5, c=6, d=7)
    + "}"
)
WORD_PERM = (0, 2, 1, 3, 4, 6, 5, 7)  # output j of a word: code 8 w + WORD_PERM[j]


def q_order():
    """Q: position k of a K tile's dot -> code. Lane 4 g + t holds words 4 t + v (v < 4) of its rows; word v's pair
    (outputs 2 q', 2 q' + 1) is fragment register (k16 step 2 v + q' // 2, half q' % 2): k = 32 v + 8 q' + 2 t + i
    holds code 32 t + 8 v + WORD_PERM[2 q' + i]."""
    return [
        32 * t + 8 * v + WORD_PERM[2 * q + i] for v in range(4) for q in range(4) for t in range(4) for i in range(2)
    ]


@triton.jit
def q_column(n):
    """Column of value ``n`` in order Q (per 128-column tile)."""
    c = n % 128
    t = c // 32
    v = (c % 32) // 8
    r = c % 8
    j = tl.where(r == 1, 2, tl.where(r == 2, 1, tl.where(r == 5, 6, tl.where(r == 6, 5, r))))  # WORD_PERM^-1
    return (n // 128) * 128 + 32 * v + 8 * (j // 2) + 2 * t + j % 2


@triton.jit
def load_w_words(w_ptr, ws_ptr, rn, k0, Kp, stride_wn, stride_wsn, BLOCK_K: tl.constexpr, TILE_ROWS: tl.constexpr):
    """``moe_mxfp4._load_w`` (one K tile) with the weights as int32 words ``[BLOCK_N, 16]``."""
    r_local = rn % TILE_ROWS
    row_base = (rn - r_local) * (stride_wn // 4) + r_local * 16
    wi = k0 // 8 + tl.arange(0, 16)  # words (4 bytes): the shipped mask, per word
    off = k0 * (TILE_ROWS // 8) + tl.arange(0, 16)
    w = tl.load(
        w_ptr.to(tl.pointer_type(tl.int32)) + row_base[:, None] + off[None, :], mask=(wi < Kp // 8)[None, :], other=0
    )
    rs = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    s = tl.load(ws_ptr + rn[:, None] * stride_wsn + rs[None, :], mask=(rs < Kp // 32)[None, :], other=127)
    return w, s


@triton.jit
def _word_value(w, sh: tl.constexpr, scale):
    return _code_times_scale((w >> sh) & 15, scale)


@triton.jit
def decode_q(w, ws, BLOCK_N: tl.constexpr, MATH: tl.constexpr):
    """Words ``[BLOCK_N, 16]`` and E8M0 scales ``[BLOCK_N, 4]`` -> ``[BLOCK_N, 128]`` bf16 in order Q."""
    s = tl.reshape(tl.broadcast_to(ws[:, :, None], (BLOCK_N, 4, 4)), (BLOCK_N, 16))  # word 4 t + v: group t
    if MATH == "ops":  # the portable twin (fp32 scale, exact products)
        f = e8m0_to_fp32(s.to(tl.int32))
        o0, o1, o2, o3 = _word_value(w, 0, f), _word_value(w, 8, f), _word_value(w, 4, f), _word_value(w, 12, f)
        o4, o5, o6, o7 = _word_value(w, 16, f), _word_value(w, 24, f), _word_value(w, 20, f), _word_value(w, 28, f)
    else:
        tl.static_assert(MATH == "asm-fold", "kperm-words probes the folded decode")
        o0, o1, o2, o3, o4, o5, o6, o7 = tl.inline_asm_elementwise(
            WORD_ROWS_ASM_FOLDED,
            "=h,=h,=h,=h,=h,=h,=h,=h,r,h",
            [w, e8m0_to_bf16_folded(s)],
            dtype=(tl.bfloat16,) * 8,
            is_pure=True,
            pack=1,
        )
    x = tl.join(tl.join(tl.join(o0, o1), tl.join(o2, o3)), tl.join(tl.join(o4, o5), tl.join(o6, o7)))
    x = tl.reshape(x, (BLOCK_N, 4, 4, 2, 2, 2))  # row | t, v, i, j1, j2  (j = 4 j2 + 2 j1 + i; join appends)
    return tl.reshape(tl.permute(x, (0, 2, 5, 4, 1, 3)), (BLOCK_N, 128))  # row | v, j2, j1, t, i


@triton.jit
def dot_q(
    w,
    ws,
    a,
    a_unused,
    acc,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MATH: tl.constexpr,
    INTERPRETER: tl.constexpr,
    WAIT_MMA: tl.constexpr = False,
):
    """``acc + W @ a.T`` for words ``w`` and ``a`` ``[M, 128]`` in order Q, one dot."""
    return _one_dot(decode_q(w, ws, BLOCK_N, MATH), a, acc, INTERPRETER, WAIT_MMA)


def install_words() -> None:
    moe.load_split = load_tile  # a contiguous [M, 128] tile, here in order Q
    moe._load_w = load_w_words
    moe.dot_w_mxfp4 = dot_q
    moe.split_column = q_column


# --------------------------------------------------------------------------------------------------------------------
# check (TRITON_INTERPRET=1): the variants' relabelling, with the portable decode (MATH "ops": the same values per byte
# as the asm, which is elementwise), against the shipped decode and torch


@triton.jit
def _check_kernel(x_ptr, w_ptr, s_ptr, y_ptr, K, N: tl.constexpr, M: tl.constexpr, VARIANT: tl.constexpr):
    """``y = W @ x.T`` ``[N, M]`` for plain rows-order W ``[N, K/2]`` bytes, scales ``[N, K/32]``; x ``[M, K]`` in the
    variant's order (split order for the shipped decode, P for kperm, Q for kperm-words)."""
    rn = tl.arange(0, N)
    rm = tl.arange(0, M)
    acc = tl.zeros((N, M), dtype=tl.float32)
    for k0 in range(0, K, 128):
        s = tl.load(s_ptr + rn[:, None] * (K // 32) + k0 // 32 + tl.arange(0, 4)[None, :])
        if VARIANT == "kperm-words":
            w = tl.load(
                w_ptr.to(tl.pointer_type(tl.int32)) + rn[:, None] * (K // 8) + k0 // 8 + tl.arange(0, 16)[None, :]
            )
        else:
            w = tl.load(w_ptr + rn[:, None] * (K // 2) + k0 // 2 + tl.arange(0, 64)[None, :])
        if VARIANT == "rows":
            a_e = tl.load(x_ptr + rm[:, None] * K + k0 + tl.arange(0, 64)[None, :])
            a_o = tl.load(x_ptr + rm[:, None] * K + k0 + 64 + tl.arange(0, 64)[None, :])
            acc = dq.dot_w_mxfp4(w, s, a_e, a_o, acc, N, 128, "ops", True)
        else:
            a = tl.load(x_ptr + rm[:, None] * K + k0 + tl.arange(0, 128)[None, :])
            if VARIANT == "kperm":
                acc = dot_p(w, s, a, a, acc, N, 128, "ops", True)
            else:
                acc = dot_q(w, s, a, a, acc, N, 128, "ops", True)
    tl.store(y_ptr + rn[:, None] * M + rm[None, :], acc)


@triton.jit
def _columns_kernel(out_ptr, K: tl.constexpr, VARIANT: tl.constexpr):
    n = tl.arange(0, K)
    if VARIANT == "kperm":
        tl.store(out_ptr + n, p_column(n))
    else:
        tl.store(out_ptr + n, q_column(n))


def check() -> None:
    import torch

    from mxrepack.quant.mx import dequantize_mxfp4

    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    assert sorted(p_order()) == list(range(128)) and sorted(q_order()) == list(range(128))
    torch.manual_seed(0)
    N, M, K = 32, 16, 256
    w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8)
    s = torch.randint(118, 131, (N, K // 32), dtype=torch.uint8)
    x = torch.randn(M, K).to(torch.bfloat16)
    ref = dequantize_mxfp4(w, s).float() @ x.float().T  # [N, M]
    tiles = x.view(M, K // 128, 128)
    orders = {
        "rows": torch.cat([tiles[:, :, 0::2], tiles[:, :, 1::2]], dim=2),  # split order
        "kperm": tiles[:, :, p_order()],
        "kperm-words": tiles[:, :, q_order()],
    }
    # the gate_up kernel's stores: column p_column / q_column of value n must read it back at n
    n = torch.arange(K)
    for name, order in (("kperm", p_order()), ("kperm-words", q_order())):
        cols = torch.empty(K, dtype=torch.int32)
        _columns_kernel[(1,)](cols, K, name)
        assert torch.equal((cols // 128) * 128 + torch.tensor(order)[cols.long() % 128], n), name
    out = {}
    for name, xo in orders.items():
        y = torch.empty(N, M)
        _check_kernel[(1,)](xo.reshape(M, K).contiguous(), w, s, y, K, N, M, name)
        out[name] = y
        err = float((y - ref).abs().max() / ref.abs().max())
        print(f"{name}: max |y - ref| / max |ref| = {err:.2e}; equal to shipped: {torch.equal(y, out['rows'])}")
        assert err < 1e-5, name


# --------------------------------------------------------------------------------------------------------------------
# counting


def loop_ops(ttgir: str) -> list[str]:
    """The layout moves inside the K loop (the scf.for holding a warp_group_dot): each as 'op: src -> dst', layouts
    spelled out."""
    defs = dict(re.findall(r"^(#[\w]+) = (#ttg\.[^\n]*)$", ttgir, re.M))
    out = []
    depth, inside = 0, False
    for line in ttgir.splitlines():
        if "scf.for" in line and not inside:
            inside, depth, body = True, 0, []
        if inside:
            body.append(line)
            depth += line.count("{") - line.count("}")
            if depth <= 0 and len(body) > 1 and line.strip().startswith("}"):
                inside = False
                if any("warp_group_dot " in b or "tt.dot " in b for b in body):
                    for b in body:
                        m = re.search(
                            r"(ttg\.(?:convert_layout|local_alloc|local_load|local_store))\s[^:]*:\s*(.*?)\s*loc\(", b
                        )
                        if m:
                            sig = re.sub(
                                r"#\w+",
                                lambda x: x.group(0) + (f"={defs[x.group(0)]}" if x.group(0) in defs else ""),
                                m.group(2),
                            )
                            out.append(f"{m.group(1).split('.')[1]}: {sig}")
    return out


def sass_loop(cubin: bytes) -> dict:
    """The K loop's SASS: opcodes with modifiers for memory and shuffle ops, base opcodes for the rest."""
    from sass_vs_triton_kernels import loop_counts

    lc = loop_counts(cubin, modifiers=True)
    mem = {
        k: v for k, v in sorted(lc["loop_ops_modifiers"].items()) if re.match(r"(LD|ST|SHFL|BAR|HGMMA|WARPGROUP)", k)
    }
    return {
        "loop": lc["loop"],
        "registers": lc["registers"],
        "stack": lc["stack_bytes"],
        "ops": lc["loop_ops"],
        "mem": mem,
    }


def configs():
    return {
        "m64n128k128w4st3sf": moe.MoeConfig(64, 128, 128, num_warps=4, num_stages=3, swap_ab=True, fold_scale=True),
        "m16n64k128w4st4sf": moe.MoeConfig(16, 64, 128, num_warps=4, num_stages=4, swap_ab=True, fold_scale=True),
    }


def sass(variant: str, out: str | None = None) -> None:
    import dataclasses

    from triton.backends.compiler import GPUTarget

    from mxrepack.kernels import check

    os.environ.setdefault("TRITON_ALWAYS_COMPILE", "1")
    if variant not in ("rows", "wgmma", "kperm", "kperm-words"):
        raise SystemExit("variant: rows, wgmma, kperm, kperm-words")
    if variant == "kperm-words":
        install_words()
    if variant == "kperm":
        install_kperm()
    rows = {}
    for name, cfg in configs().items():
        if variant == "wgmma":
            cfg = dataclasses.replace(cfg, order="wgmma")
        for kernel, src in check._moe_sources("bf16", cfg).items():
            src = check.specialized(check.for_arch(src, 90))
            c = triton.compile(
                src,
                target=GPUTarget("cuda", 90, 32),
                options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages},
            )
            key = f"{kernel} {name}"
            rows[key] = {
                "shared": c.metadata.shared,
                **sass_loop(c.asm["cubin"]),
                "ttgir_loop": loop_ops(c.asm["ttgir"]),
            }
            if os.environ.get("PROBE_DUMP"):
                Path(os.environ["PROBE_DUMP"], f"{variant}_{kernel}_{name}.ttgir").write_text(c.asm["ttgir"])
            r = rows[key]
            print(
                key,
                variant,
                triton.__version__,
                json.dumps({k: r[k] for k in ("shared", "loop", "registers", "stack", "mem")}),
                flush=True,
            )
            for op in r["ttgir_loop"]:
                print("   ", op, flush=True)
    if out:
        meta = {"variant": variant, "triton": triton.__version__, "machine": "cpu (triton.compile only, sm_90a)"}
        Path(out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


# --------------------------------------------------------------------------------------------------------------------
# time (a Hopper GPU; one variant a process: the JIT reads the swapped-in pieces once)


def time(variant: str, out: str | None = None, ts: str = "32,64,128,512,1024,4096") -> None:
    """The rows order's dispatch (``pick_moe_config``, folded, 128 experts, top-4) at each T, the shipped decode
    (``rows``) or a variant: each checked once against the fp32 reference with the activations permuted in torch to
    the variant's order, then timed (``common.interleaved_ms``, 3 rounds of CUDA-graph replays) with the shipped
    ``split_pairs`` kernel, whose cost is that of any permutation within a K tile. Compare two runs, one per
    variant, on one machine."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from common import interleaved_ms, moe_decode_inputs, moe_reference, moe_weights

    order = {"rows": None, "kperm": p_order(), "kperm-words": q_order()}[variant]
    if variant == "kperm":
        install_kperm()
    elif variant == "kperm-words":
        install_words()

    def split_in_order(x, width):
        xp = torch.nn.functional.pad(x, (0, width - x.shape[1])).view(x.shape[0], width // 128, 128)
        return xp[:, :, torch.tensor(order, device=x.device)].reshape(x.shape[0], width).contiguous()

    W = moe_weights()
    fold = dq.fits_fold(W["w13_weight_scale"], W["w2_weight_scale"])
    rows = []
    for T in map(int, ts.split(",")):
        cfg = moe.pick_moe_config(T, 4, 128, fold_scale=fold)
        x, ids, wts = moe_decode_inputs(T)
        ref = moe_reference(x, ids, wts, W)
        if order is not None:
            moe.split_pairs = split_in_order
        try:
            y = moe.moe_mxfp4(x, ids, wts, W, config=cfg, fold_scale=fold)
        finally:
            moe.split_pairs = dq.split_pairs
        err = float((y.float() - ref).norm() / ref.norm())
        o = torch.empty(T, 2880, device="cuda", dtype=torch.bfloat16)
        ms = interleaved_ms({variant: lambda: moe.moe_mxfp4(x, ids, wts, W, config=cfg, out=o, fold_scale=fold)}, 3)
        rec = {"variant": variant, "T": T, "config": cfg.name(), "rel_err": err, "ms": ms[variant]}
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    if out:
        meta = {"variant": variant, "triton": triton.__version__, "gpu": torch.cuda.get_device_name()}
        Path(out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    {"sass": sass, "check": check, "time": time}[sys.argv[1]](*sys.argv[2:])
