"""Probe for the next `strided` variant: MXFP4 bytes stored in the order of the MMA's A fragments, decoded into one
dot per 128-code K tile. One warpgroup (4 warps x 16 weight rows) times a few tokens, W decoded in registers as the
swapped kernels do. No GPU: the interpreter checks the byte order and the in-kernel reshape against
``mxrepack.quant.dequantize_mxfp4`` (with a portable decode), and the PTX decode is compiled for sm_90a and sm_121a
and its main loop counted (``sass_vs_triton_kernels.loop_counts``).

    TRITON_INTERPRET=1 python benchmarks/experiments/fragment_order_probe.py check
    python benchmarks/experiments/fragment_order_probe.py emulate    # the PTX decode's bit placement, in Python
    python benchmarks/experiments/fragment_order_probe.py sass
    python benchmarks/experiments/fragment_order_probe.py time [OUT.json]   # GPU: against the shipped swapped tiles

The order (one 16-row block, one K tile of 64 bytes a row): lane 4 g + t holds, for each k16 step s, the bytes
(g, 8s+t), (g, 8s+t+4), (g+8, 8s+t), (g+8, 8s+t+4), 32 bytes in all: two 16-byte loads. A 32-bit word decodes to the
four bf16 pairs that lane's A fragment holds for step s (low nibble, high nibble of each byte: k and k+1); the
kernel's join, reshape and permute back to [rows, 128] are a relabelling Triton lowers without moving data on
sm_90a. Scales: per lane the 8 bytes (group j, row half c) it needs, index 2 j + c.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mxrepack.kernels.dequant_mxfp4 import e2m1_to_fp32, e8m0_to_bf16_folded  # noqa: E402

ROWS = 64  # weight rows per program: 4 warps x 16
NATURAL = False  # time: also overlap_probe's natural-order loops (they lost: fragment_order_time_h100_..._call2.json)


def fragment_order(w: torch.Tensor) -> torch.Tensor:
    """Packed bytes ``[N, K/2]`` (N % 16 == 0, K % 128 == 0) -> ``[N/16, K/128, 32 lanes, 32 bytes]``."""
    N, KH = w.shape
    x = w.reshape(N // 16, 2, 8, KH // 64, 8, 2, 4)  # block, row half c, g, K tile, s, kh (+4 bytes), t
    return x.permute(0, 3, 2, 6, 4, 1, 5).reshape(N // 16, KH // 64, 32, 32).contiguous()


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
def _w_tile(w_ptr, s_ptr, block0, kt, k_tiles, BLOCKS: tl.constexpr, ASM: tl.constexpr):
    """W's rows of ``BLOCKS`` 16-row blocks over K tile ``kt`` as bf16 ``[16 BLOCKS, 128]`` in natural order."""
    at = ((block0 + tl.arange(0, BLOCKS))[:, None, None] * k_tiles + kt) * 32 + tl.arange(0, 32)[None, :, None]
    wb = tl.load(w_ptr + at * 32 + tl.arange(0, 32)[None, None, :])
    sc = tl.load(s_ptr + at * 8 + tl.arange(0, 8)[None, None, :])
    sf = e8m0_to_bf16_folded(sc)  # 2^(E - 1): E2M1's 2^126 folded in
    sf = tl.broadcast_to(tl.reshape(sf, (BLOCKS, 32, 4, 1, 2, 1)), (BLOCKS, 32, 4, 2, 2, 2))  # j, s % 2, c, kh
    r0, r1 = _decode_words(wb, tl.reshape(sf, (BLOCKS, 32, 32)), BLOCKS, ASM)
    x = tl.reshape(tl.join(r0, r1), (BLOCKS, 8, 4, 8, 2, 2, 2))  # block, g, t, s, kh, kl, c
    x = tl.permute(x, (0, 6, 1, 3, 4, 2, 5))  # block, c, g | s, kh, t, kl
    return tl.reshape(x, (16 * BLOCKS, 128))


@triton.jit
def probe_kernel(x_ptr, w_ptr, s_ptr, y_ptr, K, stride_x, M: tl.constexpr, BLOCKS: tl.constexpr, ASM: tl.constexpr):
    """``y[rows, M] = W[rows] @ x.T``, W fragment-ordered, one dot per K tile (fp32 operands under the interpreter)."""
    pid = tl.program_id(0)
    k_tiles = K // 128
    rm = tl.arange(0, M)
    acc = tl.zeros((16 * BLOCKS, M), dtype=tl.float32)
    for kt in range(0, k_tiles):
        w = _w_tile(w_ptr, s_ptr, pid * BLOCKS, kt, k_tiles, BLOCKS, ASM)
        a = tl.load(x_ptr + rm[:, None] * stride_x + kt * 128 + tl.arange(0, 128)[None, :])
        if ASM:
            acc = tl.dot(w, tl.trans(a), acc)
        else:
            acc = tl.dot(w.to(tl.float32), tl.trans(a).to(tl.float32), acc)
    rn = pid * 16 * BLOCKS + tl.arange(0, 16 * BLOCKS)
    tl.store(y_ptr + rn[:, None] * M + rm[None, :], acc)


# The group order: a per-row permutation of each 64-byte K tile, p' = 16 j + 4 t + 2 s' + kh holding natural byte
# 16 j + 8 s' + 4 kh + t (group j, quad lane t, k16 step 2 j + s', k half kh). A group's 16 bytes stay together (one
# scale, as a GEMV wants them), and lane t of a quad finds its fragment bytes of group j in one 32-bit word.
# Right under the interpreter, wrong on the GPU (relative error 1.2, fragment_order_time_h100_..._call3.json): an
# inline-asm call with pack=4 gets four consecutive *registers*, and in the layout Triton derives from the MMA operand
# register bit 1 is row + 8, so a call sees bytes (g, kh 0), (g, kh 1), (g + 8, kh 0), (g + 8, kh 1) -- the fragment
# order's word, not this one's. Any order fed to a packed asm decode must be the operand layout's register order.
def group_order(w: torch.Tensor) -> torch.Tensor:
    """Packed bytes ``[N, K/2]`` (K % 128 == 0) -> the same shape, each row's 64-byte K tiles in the group order."""
    N, KH = w.shape
    x = w.reshape(N, KH // 64, 4, 2, 2, 4)  # K tile, j, s', kh, t
    return x.permute(0, 1, 2, 5, 3, 4).reshape(N, KH).contiguous()


@triton.jit
def _decode_row_words(wb, sb, R: tl.constexpr, ASM: tl.constexpr):
    """Bytes ``[R, 64]`` (words of bytes (s', kh) = (0, 0), (0, 1), (1, 0), (1, 1)) and per-byte folded scales ->
    (r0, r1) ``[R, 64]``: per word, r0 = lo, hi of its bytes 0 and 1 (s' = 0), r1 of bytes 2 and 3 (s' = 1)."""
    if ASM:
        return tl.inline_asm_elementwise(
            WORD_FOLDED, "=r,=r,=r,=r,r,r,r", [wb, sb], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4
        )
    w = tl.reshape(wb.to(tl.int32), (R, 16, 2, 2))  # word, s', kh
    s = tl.reshape(sb.to(tl.float32), (R, 16, 2, 2)) / 8.507059173023462e37
    v = tl.join(e2m1_to_fp32(w & 15) * s, e2m1_to_fp32(w >> 4) * s)  # word, s', kh, nibble
    r0, r1 = tl.split(tl.permute(v, (0, 1, 3, 4, 2)))
    return tl.reshape(r0, (R, 64)).to(tl.bfloat16), tl.reshape(r1, (R, 64)).to(tl.bfloat16)


@triton.jit
def group_probe_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    y_ptr,
    K,
    stride_x,
    M: tl.constexpr,
    R: tl.constexpr,
    ASM: tl.constexpr,
    AHEAD: tl.constexpr = 0,
):
    """``y[rows, M] = W[rows] @ x.T``, W's rows in the group order, one dot per K tile. ``AHEAD``: the scales are
    loaded one K tile ahead by hand (the pipeline does not copy them: 2 bytes a thread)."""
    rn = tl.program_id(0) * R + tl.arange(0, R)
    rm = tl.arange(0, M)
    acc = tl.zeros((R, M), dtype=tl.float32)
    s_ptrs = s_ptr + tl.multiple_of(rn * (K // 32), 4)[:, None] + tl.arange(0, 4)[None, :]
    sc_next = tl.load(s_ptrs)
    for kt in range(0, K // 128):
        wb = tl.load(w_ptr + rn[:, None] * (K // 2) + kt * 64 + tl.arange(0, 64)[None, :])
        if AHEAD:
            sc = sc_next
            sc_next = tl.load(s_ptrs + (kt + 1) * 4, mask=kt + 1 < K // 128, other=0)
        else:
            sc = tl.load(s_ptrs + kt * 4)
        sf = tl.reshape(tl.broadcast_to(e8m0_to_bf16_folded(sc)[:, :, None], (R, 4, 16)), (R, 64))
        r0, r1 = _decode_row_words(wb, sf, R, ASM)
        v = tl.reshape(tl.join(r0, r1), (R, 4, 4, 2, 2, 2))  # j, t, kh, nibble, s'
        w = tl.reshape(tl.permute(v, (0, 1, 5, 3, 2, 4)), (R, 128))  # j, s', kh, t, nibble: natural K
        a = tl.load(x_ptr + rm[:, None] * stride_x + kt * 128 + tl.arange(0, 128)[None, :])
        if ASM:
            acc = tl.dot(w, tl.trans(a), acc)
        else:
            acc = tl.dot(w.to(tl.float32), tl.trans(a).to(tl.float32), acc)
    tl.store(y_ptr + rn[:, None] * M + rm[None, :], acc)


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
    group_probe_kernel[(N // 32,)](x, group_order(w), ws, y, K, x.stride(0), M=M, R=32, ASM=False)
    print(f"group order, relative error against dequantize_mxfp4: {((y.T - ref).norm() / ref.norm()).item():.2e}")


def emulate(trials: int = 20000) -> None:
    """The PTX decode's byte selection and bit placement, emulated on random words: each of its four outputs must be
    (low nibble, high nibble) of byte i as bf16 codes (times 2^-126, before the scale)."""
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
    print(f"{trials} words: {wrong} outputs differ")


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


def time(out: str | None = None) -> None:
    """GPU. A dense stand-in for the MoE's gate_up at T >= 512 (tokens per expert M = 32-128 against many 64-128 row
    weight tiles, K = 2944): the probe (fragment order, one dot per K tile, no masks) against ``linear_mxfp4``'s
    swapped tiles on the same weights in natural order, folded as shipped, and overlap_probe's natural-order loops (its
    variants: 0 the shipped two dots + mma_done, 2 and 4 one dot per K tile; no masks either). All read W once per token
    tile."""
    import itertools
    import json

    import overlap_probe  # beside this script: the natural-order loops (two dots, or one per K tile)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from common import deq, rand_mx
    from triton.testing import do_bench

    from mxrepack.kernels.linear_mxfp4 import LinearConfig, linear_mxfp4

    torch.manual_seed(0)
    N, K = 5760 * 32, 2944  # 32 experts' gate_up rows: 265 MB of codes, past L2
    w, ws = rand_mx(N, K)
    ws.clamp_(max=128)  # the folded decode's precondition (fits_fold)
    wf, sf, wg = fragment_order(w), scale_order(ws), group_order(w)
    rows = []
    for M in (32, 64, 128):
        x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        ref = x.float() @ deq(w[:4096], ws[:4096]).T  # the first rows: enough to see a wrong order
        flops = 2 * M * N * K
        cands = {}
        for blocks, warps, stages in ((4, 4, 3), (8, 8, 3)):
            y = torch.empty(N, M, dtype=torch.float32, device="cuda")

            def run(y=y, blocks=blocks, warps=warps, stages=stages):
                probe_kernel[(N // (16 * blocks),)](
                    x, wf, sf, y, K, x.stride(0), M=M, BLOCKS=blocks, ASM=True, num_warps=warps, num_stages=stages
                )
                return y

            cands[f"probe rows{16 * blocks} w{warps} st{stages}"] = (run, lambda y: y.T[:, :4096])
        for variant, (bn, warps) in itertools.product((0, 2, 4), ((64, 4), (128, 4), (128, 8))):
            if not NATURAL:
                break
            y = torch.empty(N, M, dtype=torch.float32, device="cuda")

            def run(y=y, variant=variant, bn=bn, warps=warps):  # natural order: overlap_probe's loop
                overlap_probe.probe[(N // bn,)](
                    x,
                    w,
                    ws,
                    y,
                    K,
                    x.stride(0),
                    w.stride(0),
                    ws.stride(0),
                    y.stride(0),
                    BLOCK_M=M,
                    BLOCK_N=bn,
                    VARIANT=variant,
                    num_warps=warps,
                    num_stages=3,
                )
                return y

            cands[f"natural V{variant} rows{bn} w{warps} st3"] = (run, lambda y: y.T[:, :4096])
        for r, warps, stages, ahead in ((64, 4, 3, 0), (64, 4, 3, 1), (64, 4, 4, 1), (128, 8, 3, 0), (128, 8, 3, 1)):
            y = torch.empty(N, M, dtype=torch.float32, device="cuda")

            def run(y=y, r=r, warps=warps, stages=stages, ahead=ahead):
                group_probe_kernel[(N // r,)](
                    x, wg, ws, y, K, x.stride(0), M=M, R=r, ASM=True, AHEAD=ahead, num_warps=warps, num_stages=stages
                )
                return y

            cands[f"group rows{r} w{warps} st{stages}" + (" ahead" if ahead else "")] = (run, lambda y: y.T[:, :4096])
        for bm, bn, warps, stages in ((M, 64, 4, 3), (M, 128, 4, 3), (M, 128, 8, 3)):
            if bm > 128:
                continue
            cfg = LinearConfig(bm, bn, 128, 1, warps, stages, swap_ab=True, fold_scale=True)
            cands[f"shipped kernel {cfg.name()}"] = (
                functools.partial(linear_mxfp4, x, w, ws, None, "w4a16", cfg, fold_scale=True),
                lambda y: y[:, :4096].float(),
            )
        for label, (run, view) in cands.items():
            rec = {"M": M, "candidate": label}
            try:
                got = view(run())
                rec["rel_err"] = float((got - ref).norm() / ref.norm())
                rec["ms"] = do_bench(run, warmup=25, rep=200)
                rec["tflops"] = flops / rec["ms"] / 1e9
            except Exception as e:  # noqa: BLE001 - e.g. out of shared memory
                rec["error"] = f"{type(e).__name__}: {e}"[:300]
            rows.append(rec)
            print(
                f"M={M:4d} {label:40s} "
                + (
                    f"{rec['ms']:.4f} ms {rec['tflops']:6.1f} TFLOP/s err {rec['rel_err']:.1e}"
                    if "ms" in rec
                    else rec["error"]
                ),
                flush=True,
            )
    if out:
        meta = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "N": N, "K": K}
        Path(out).write_text(json.dumps({**meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    {"check": check, "emulate": emulate, "sass": sass, "time": time}[sys.argv[1]](*sys.argv[2:])
