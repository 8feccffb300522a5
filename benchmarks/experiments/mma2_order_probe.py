"""A byte order of MXFP4 weights for Triton's ``mma.sync`` (mma v2: sm_80 to sm_121a, GB10 included), the counterpart of
``fragment_order_probe.py``'s order, which fits Hopper's wgmma only. CPU only: the interpreter checks the order and its
relabel against ``mxrepack.quant.dequantize_mxfp4``; the compiled loops are counted and the packed decode's operand
layout is checked in the TTGIR (a helper session's finding, 2026-11-25; no GPU has run it).

    TRITON_INTERPRET=1 python benchmarks/experiments/mma2_order_probe.py check
    python benchmarks/experiments/mma2_order_probe.py sass [OUT.json]
    DISABLE_MMA_V3=1 python benchmarks/experiments/mma2_order_probe.py time [OUT.json]   # a Hopper GPU

Why another order: for a bf16 A operand fed from i8 bytes through a ``tl.join``, Triton 3.9 gives the mma v2 dot
operand kWidth = 8 (the narrowest load in its chain, 8 bits, halved by the join, 32 / 4), so lane 4 g + t of a warp
holds, for rows g and g + 8 of its 16 and each 32-code chunk q of a 128-code K tile, the 8 consecutive codes
32 q + 8 t .. + 7: 4 consecutive bytes of one row, one 32-bit word. wgmma's kWidth = 2 operand instead pairs rows g and
g + 8 in a word (the fragment order). A packed inline-asm decode (pack = 4) receives 4 consecutive *registers* of that
layout, so the bytes in memory must be in that register order; fed the fragment order, the sm_121a build decodes the
wrong bytes. kWidth is a heuristic: removing the join or changing load widths in the operand's chain changes it, so a
kernel built on either order must check the packing (:func:`pack_ok`) on every compile.

The order: per 16-row block and K tile, lane L = 4 g + t holds 32 bytes; its byte 8 q + 4 c + e is natural byte
(row 8 c + g, byte 16 q + 4 t + e of the tile's 64). Scales in ``fragment_order_probe.quad_scale_order``. ``NSPLIT``
puts the tokens in 2 or 4 dots sharing one decoded W, which keeps Triton's mma v2 warps on the weight rows (warps along
the tokens would each load and decode the same rows).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fragment_order_probe import _decode_words, fragment_order, quad_scale_order  # noqa: E402
from fragment_order_probe import _w_tile as fragment_w_tile  # noqa: E402

from mxrepack.kernels.dequant_mxfp4 import e8m0_to_bf16_folded  # noqa: E402


def mma2_order(w: torch.Tensor) -> torch.Tensor:
    """Packed bytes ``[N, K/2]`` (N % 16 == 0, K % 128 == 0) -> ``[N/16, K/128, 32 lanes, 32 bytes]``."""
    N, KH = w.shape
    x = w.reshape(N // 16, 2, 8, KH // 64, 4, 4, 4)  # block, c, g, K tile, q, t, e
    return x.permute(0, 3, 2, 5, 4, 1, 6).reshape(N // 16, KH // 64, 32, 32).contiguous()  # block, tile, g, t | q, c, e


@triton.jit
def _scales(s_ptr, block0, kt, k_tiles, BLOCKS: tl.constexpr):
    """Per lane the 8 quad-ordered scale bytes of its rows g, g + 8 (index 2 q + c), folded for the decode."""
    quad = ((block0 + tl.arange(0, BLOCKS))[:, None, None] * k_tiles + kt) * 64 + 8 * (tl.arange(0, 32) // 4)[
        None, :, None
    ]
    return e8m0_to_bf16_folded(tl.load(s_ptr + quad + tl.arange(0, 8)[None, None, :]))


@triton.jit
def _w_tile(w_ptr, s_ptr, block0, kt, k_tiles, BLOCKS: tl.constexpr, ASM: tl.constexpr, ORDER: tl.constexpr):
    """``[16 BLOCKS, 128]`` bf16 in natural (row, k) order from ``ORDER``-ordered bytes ("mma2" or "frag")."""
    if ORDER != "mma2":  # fragment_order_probe's order (wgmma, kWidth 2), quad scales
        return fragment_w_tile(w_ptr, s_ptr, block0, kt, k_tiles, BLOCKS, ASM, "quad")
    at = ((block0 + tl.arange(0, BLOCKS))[:, None, None] * k_tiles + kt) * 32 + tl.arange(0, 32)[None, :, None]
    wb = tl.load(w_ptr + at * 32 + tl.arange(0, 32)[None, None, :])
    sf = _scales(s_ptr, block0, kt, k_tiles, BLOCKS)
    sf = tl.broadcast_to(tl.reshape(sf, (BLOCKS, 32, 4, 2, 1)), (BLOCKS, 32, 4, 2, 4))  # q, c, e
    r0, r1 = _decode_words(wb, tl.reshape(sf, (BLOCKS, 32, 32)), BLOCKS, ASM)
    # r_J at (b, 4 g + t, 8 q + 4 c + e) = code (16 b + 8 c + g, 32 q + 8 t + 4 J + e)
    x = tl.reshape(tl.join(r0, r1), (BLOCKS, 8, 4, 4, 2, 4, 2))  # b, g, t, q, c, e, J
    x = tl.permute(x, (0, 4, 1, 3, 2, 6, 5))  # b, c, g | q, t, J, e
    return tl.reshape(x, (16 * BLOCKS, 128))


@triton.jit
def _dot(w, x_ptr, rm, stride_x, kt, acc, ASM: tl.constexpr):
    b = tl.trans(tl.load(x_ptr + rm[:, None] * stride_x + kt * 128 + tl.arange(0, 128)[None, :]))
    if ASM:
        return tl.dot(w, b, acc)
    return tl.dot(w.to(tl.float32), b.to(tl.float32), acc)


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
    ORDER: tl.constexpr = "mma2",
    NSPLIT: tl.constexpr = 1,
):
    """``y[rows, M] = W[rows] @ x.T``, one decode per K tile shared by ``NSPLIT`` dots of M / NSPLIT tokens."""
    pid = tl.program_id(0)
    k_tiles = K // 128
    MS: tl.constexpr = M // NSPLIT
    rm = tl.arange(0, MS)
    acc0 = tl.zeros((16 * BLOCKS, MS), dtype=tl.float32)
    acc1 = tl.zeros((16 * BLOCKS, MS), dtype=tl.float32)
    acc2 = tl.zeros((16 * BLOCKS, MS), dtype=tl.float32)
    acc3 = tl.zeros((16 * BLOCKS, MS), dtype=tl.float32)
    for kt in range(0, k_tiles):
        w = _w_tile(w_ptr, s_ptr, pid * BLOCKS, kt, k_tiles, BLOCKS, ASM, ORDER)
        acc0 = _dot(w, x_ptr, rm, stride_x, kt, acc0, ASM)
        if NSPLIT >= 2:
            acc1 = _dot(w, x_ptr, rm + MS, stride_x, kt, acc1, ASM)
        if NSPLIT >= 4:
            acc2 = _dot(w, x_ptr, rm + 2 * MS, stride_x, kt, acc2, ASM)
            acc3 = _dot(w, x_ptr, rm + 3 * MS, stride_x, kt, acc3, ASM)
    rn = pid * 16 * BLOCKS + tl.arange(0, 16 * BLOCKS)
    tl.store(y_ptr + rn[:, None] * M + rm[None, :], acc0)
    if NSPLIT >= 2:
        tl.store(y_ptr + rn[:, None] * M + MS + rm[None, :], acc1)
    if NSPLIT >= 4:
        tl.store(y_ptr + rn[:, None] * M + 2 * MS + rm[None, :], acc2)
        tl.store(y_ptr + rn[:, None] * M + 3 * MS + rm[None, :], acc3)


# probe_kernel's signature for triton.compile (its constexprs given per build)
PROBE_SIGNATURE = {
    "x_ptr": "*bf16",
    "w_ptr": "*u8",
    "s_ptr": "*u8",
    "y_ptr": "*fp32",
    "K": "i32",
    "stride_x": "i32",
} | {name: "constexpr" for name in ("M", "BLOCKS", "ASM", "ORDER", "NSPLIT")}


def check() -> None:
    from mxrepack.quant import dequantize_mxfp4

    torch.manual_seed(0)
    N, K = 256, 384
    w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8)
    ws = torch.randint(119, 124, (N, K // 32), dtype=torch.uint8)
    for M in (16, 64):
        x = torch.randn(M, K).to(torch.bfloat16)
        ref = x.float() @ dequantize_mxfp4(w, ws, torch.float32).T
        for order, wf in (("mma2", mma2_order(w)), ("frag", fragment_order(w))):
            for blocks, nsplit in ((1, 1), (4, 1), (4, 4 if M >= 64 else 1)):
                y = torch.empty(N, M, dtype=torch.float32)
                probe_kernel[(N // (16 * blocks),)](
                    x,
                    wf,
                    quad_scale_order(ws),
                    y,
                    K,
                    x.stride(0),
                    M=M,
                    BLOCKS=blocks,
                    ASM=False,
                    ORDER=order,
                    NSPLIT=nsplit,
                )
                err = ((y.T - ref).norm() / ref.norm()).item()
                print(f"M={M:3d} {order} BLOCKS={blocks} NSPLIT={nsplit}: relative error {err:.2e}", flush=True)
                assert err < 1e-5, err


def pack_ok(ttgir: str) -> bool:
    """Whether the packed decode's i8 operand layout puts bytes 0..3 of one memory word in its registers 0..3 (its
    first two register bases step the innermost dim by 1 and 2, and no other basis moves the word's low 2 bits)."""
    layouts = {m.group(1): m.group(2) for m in re.finditer(r"^(#\w+) = (.*)$", ttgir, re.M)}
    line = next(ln for ln in ttgir.splitlines() if "tt.elementwise_inline_asm" in ln)
    m = re.search(r":\s*\(?tensor<([0-9x]+)xi8, (#[\w.]+)", line.split('"')[-1])
    rank, enc = len(m.group(1).split("x")), layouts[m.group(2)]
    if "ttg.linear" in enc:
        bases = {
            k: json.loads(re.search(k + r" = (\[.*?\]\]|\[\])", enc).group(1)) for k in ("register", "lane", "warp")
        }
        unit = lambda v: [0] * (rank - 1) + [v]  # noqa: E731
        rest = bases["register"][2:] + bases["lane"] + bases["warp"]
        return bases["register"][:2] == [unit(1), unit(2)] and all(b[-1] % 4 == 0 for b in rest)
    size = json.loads(re.search(r"sizePerThread = (\[[^\]]*\])", enc).group(1))
    order = json.loads(re.search(r"order = (\[[^\]]*\])", enc).group(1))
    return size[-1] >= 4 and order[0] == rank - 1


def sass(out: str | None = None) -> None:
    """sm_121a and sm_90a builds of both orders: main-loop counts, the MMA's warps and kWidth, the packing check."""
    from sass_vs_triton_kernels import loop_counts
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from mxrepack.kernels import check as kcheck

    shapes = [(121, M, "mma2", {16: 1, 32: 2, 64: 2, 128: 4}[M]) for M in (16, 32, 64, 128)]
    shapes += [(121, M, "frag", 1) for M in (16, 64)] + [(90, M, "frag", 1) for M in (16, 64)] + [(90, 16, "mma2", 1)]
    rows = []
    for cap, M, order, nsplit in shapes:
        const = {"M": M, "BLOCKS": 4, "ASM": True, "ORDER": order, "NSPLIT": nsplit}
        k = triton.compile(
            kcheck.specialized(ASTSource(probe_kernel, PROBE_SIGNATURE, const)),
            target=GPUTarget("cuda", cap, 32),
            options={"num_warps": 4, "num_stages": 3},
        )
        c, ttgir = loop_counts(k.asm["cubin"]), k.asm["ttgir"]
        ops = c["loop_ops"]
        rec = {"cap": cap, "M": M, "order": order, "nsplit": nsplit, "loop": c["loop"], "per_code": c["loop"] / 64}
        rec |= {op: ops.get(op, 0) for op in ("LDS", "STS", "PRMT", "HMMA", "HGMMA")} | {"registers": c["registers"]}
        rec |= {"kWidth": sorted(set(re.findall(r"kWidth = (\d+)", ttgir))), "pack_ok": pack_ok(ttgir)}
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    if out:
        Path(out).write_text(json.dumps(rows, indent=1))


NSPLIT = {16: 1, 32: 2, 64: 2, 128: 4}  # dots per decoded K tile, as `sass` builds them


def time(out: str | None = None) -> None:
    """GPU. The dense stand-in of ``fragment_order_probe.time`` (32 experts' gate_up rows, K = 2944, 16-128 tokens):
    the probe on the ``mma2`` order against ``linear_mxfp4``'s shipped swapped tiles on the same weights in natural
    order, each output checked against the fp32 reference. Run it under ``DISABLE_MMA_V3=1`` on a Hopper
    (``mma_v2_proxy.py``: both then build sm_12x's ``mma.sync`` loops; without it the probe decodes the wrong bytes
    there, and the record says which it was)."""
    import functools
    import os

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from common import deq, measure_candidate, rand_mx

    from mxrepack.kernels.linear_mxfp4 import LinearConfig, linear_mxfp4

    meta = {
        "device": torch.cuda.get_device_name(),
        "triton": triton.__version__,
        "DISABLE_MMA_V3": os.environ.get("DISABLE_MMA_V3", ""),
    }
    rows: list[dict] = []

    def measure(label: str, run, view, ref, flops: float, M: int) -> None:
        rec = measure_candidate({"M": M, "candidate": label}, run, view, ref, flops)
        rows.append(rec)
        if out:  # after every row: a run stopped at its time limit keeps what it measured
            Path(out).write_text(json.dumps({**meta, "rows": rows}, indent=1))
        shown = f"{rec['ms']:.4f} ms err {rec['rel_err']:.1e}" if "ms" in rec else rec["error"]
        print(f"M={M:4d} {label:40s} {shown}", flush=True)

    print(json.dumps(meta), flush=True)
    torch.manual_seed(0)
    N, K = 5760 * 32, 2944
    w, ws = rand_mx(N, K)
    ws.clamp_(max=128)  # the folded decode's precondition (fits_fold), for both
    wm, sq = mma2_order(w), quad_scale_order(ws)
    for M in (16, 32, 64, 128):
        x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        ref = x.float() @ deq(w[:4096], ws[:4096]).T  # the first rows: enough to see a wrong order
        y = torch.empty(N, M, dtype=torch.float32, device="cuda")

        def run(x=x, y=y, M=M):
            probe_kernel[(N // 64,)](
                x,
                wm,
                sq,
                y,
                K,
                x.stride(0),
                M=M,
                BLOCKS=4,
                ASM=True,
                ORDER="mma2",
                NSPLIT=NSPLIT[M],
                num_warps=4,
                num_stages=3,
            )
            return y

        measure(f"mma2 probe rows64 w4 st3 nsplit{NSPLIT[M]}", run, lambda y: y.T[:, :4096], ref, 2 * M * N * K, M)
        for bn, warps in ((64, 4), (128, 8)):
            cfg = LinearConfig(M, bn, 128, 1, warps, 4 if M == 16 else 3, swap_ab=True, fold_scale=True)
            shipped = functools.partial(linear_mxfp4, x, w, ws, None, "w4a16", cfg, fold_scale=True)
            measure(f"shipped {cfg.name()}", shipped, lambda y: y[:, :4096].float(), ref, 2 * M * N * K, M)


if __name__ == "__main__":
    {"check": check, "sass": sass, "time": time}[sys.argv[1]](*sys.argv[2:])
