"""Dense W4A16 on weights in a chunk order (the strided layout's wgmma / mma2 byte orders, as w2 stores them: row
tiles of 16, K-tiled), the question being whether the MoE tiles' decode (8 codes in about 13 instructions) closes the
dense q/k/v/o gap at 4-64 rows, which Nsight Compute put on instruction issue (about 12 thread instructions per weight
value in the shipped split-K tile at qkv M = 16; docs/PERF.md "Why q/k/v/o trail at 4-64 rows").

    TRITON_INTERPRET=1 python benchmarks/experiments/dense_chunk_probe.py check
    python benchmarks/experiments/dense_chunk_probe.py time [OUT.json]                      # Hopper: wgmma order
    DISABLE_MMA_V3=1 python benchmarks/experiments/dense_chunk_probe.py time [OUT.json]     # sm_12x's path: mma2

The kernel is the MoE's ``chunk_dots`` on rows in order (no gather), K split over programs as the shipped dense tiles
do (each split's fp32 partial, the tile's last split to arrive sums them in split order). Beside it in the same run:
the shipped ``linear_mxfp4`` and cuBLAS BF16 (Marlin's figures: the same-run records in docs/PERF.md).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mxrepack.kernels.arrival import arrival_counters, last_to_arrive  # noqa: E402
from mxrepack.kernels.dequant_mxfp4 import (  # noqa: E402
    check_chunk_build,
    chunk_dots,  # noqa: E402
    fits_fold,
    in_flight_allowed,
    mma_v3_disabled,
    wgmma_chunks,
)
from mxrepack.layouts.strided import CHUNK_ORDERS, k_tiled, quad_scales  # noqa: E402


def chunk_pack(w: torch.Tensor, s: torch.Tensor, order: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain MXFP4 ``[N, K/2]`` / ``[N, K/32]`` -> ``[Np, Kp/2]`` / ``[Np, Kp/32]`` in ``order`` (rows padded to 16,
    K to 128, zeros), as the strided layout stores w2."""
    N, KH = w.shape
    Np, Kp = -(-N // 16) * 16, -(-2 * KH // 128) * 128
    w = F.pad(w, (0, 0, 0, Np - N))
    s = F.pad(s, (0, Kp // 32 - s.shape[1], 0, Np - N))
    tiled = k_tiled(w.view(1, Np // 16, 16, 1, KH), Np // 16, Kp // 2)
    return CHUNK_ORDERS[order][0](tiled)[0], quad_scales(s.view(1, Np, Kp // 32).contiguous(), 16)[0]


@triton.jit
def dense_chunk_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    y_ptr,
    part_ptr,
    count_ptr,
    M,
    N,
    K,
    Np,
    stride_x,
    stride_wn,
    stride_wsn,
    stride_y,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOTS: tl.constexpr,
    MATH: tl.constexpr,
    ORDER: tl.constexpr,
    INTERPRETER: tl.constexpr,
    WAIT_MMA: tl.constexpr,
):
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    k_tiles = tl.cdiv(K, 128)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    kt0 = pid_k * per_split
    kt1 = tl.minimum(k_tiles, kt0 + per_split)
    blocks = tl.minimum(pid_n * BLOCK_N + 16 * tl.arange(0, BLOCK_N // 16), Np - 16)
    w_off, s_off = wgmma_chunks(blocks, stride_wn, stride_wsn, 16)
    acc = chunk_dots(
        x_ptr + kt0 * 128,
        x_ptr,
        pid_m * BLOCK_M,
        M,
        1,
        K - kt0 * 128,
        stride_x,
        w_ptr,
        s_ptr,
        w_off + kt0 * 1024,
        s_off + kt0 * 64,
        1024,
        64,
        kt1 - kt0,
        BLOCK_N // 16,
        BLOCK_M,
        DOTS,
        False,
        MATH,
        ORDER,
        INTERPRETER,
        WAIT_MMA,
        0,
        True,
    )
    acc = tl.trans(acc)  # [BLOCK_M, BLOCK_N]
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    ok = (rm < M)[:, None] & n_ok[None, :]
    y = y_ptr + rm[:, None] * stride_y + rn[None, :]
    if SPLIT_K > 1:
        part = part_ptr + rm[:, None] * N + rn[None, :]
        tl.store(part + pid_k.to(tl.int64) * M * N, acc, mask=ok)
        counter = count_ptr + pid_m * tl.num_programs(0) + pid_n
        if last_to_arrive(counter, SPLIT_K):
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for _ in range(SPLIT_K):
                acc += tl.load(part, mask=ok, other=0.0, cache_modifier=".cg")
                part += M * N
            if HAS_BIAS:
                acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=ok)
            tl.atomic_xchg(counter, 0)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=ok)


def dense_chunks(x, wq, sq, N, bias, order, block_m, block_n, split_k, warps=4, stages=3, wait=True, fold=True):
    M, K = x.shape
    Np = wq.shape[0]
    y = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    grid = (triton.cdiv(N, block_n), triton.cdiv(M, block_m), split_k)
    if split_k > 1:
        part = torch.empty(split_k, M, N, dtype=torch.float32, device=x.device)
        counters = arrival_counters(x.device, grid[0] * grid[1], "dense_chunk_probe")
    else:
        part = counters = y
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    dots = block_m // (16 if block_m <= 32 else 32) if order == "mma2" else 1
    kernel = dense_chunk_kernel[grid](
        x,
        wq,
        sq,
        bias if bias is not None else sq,
        y,
        part,
        counters,
        M,
        N,
        K,
        Np,
        x.stride(0),
        wq.stride(0),
        sq.stride(0),
        y.stride(0),
        HAS_BIAS=bias is not None,
        SPLIT_K=split_k,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        DOTS=dots,
        MATH="ops" if interp else ("asm-fold" if fold else "asm"),
        ORDER=order,
        INTERPRETER=interp,
        WAIT_MMA=order == "wgmma" and (wait or not in_flight_allowed()) and not interp,
        num_warps=warps,
        num_stages=stages,
    )
    if not interp:
        check_chunk_build(kernel)
    return y


def check() -> None:
    from mxrepack.quant.mx import dequantize_mxfp4

    torch.manual_seed(0)
    for order, (N, K, M) in itertools.product(("wgmma", "mma2"), ((80, 288, 5), (64, 256, 17))):
        w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8)
        s = torch.randint(118, 126, (N, K // 32), dtype=torch.uint8)
        bias = torch.randn(N)
        x = torch.randn(M, K).to(torch.bfloat16)
        ref = x.float() @ dequantize_mxfp4(w, s).float().T + bias
        wq, sq = chunk_pack(w, s, order)
        for bm, bn, split in ((16, 64, 1), (32, 64, 2), (16, 128, 3)):
            y = dense_chunks(x, wq, sq, N, bias, order, bm, bn, split)
            err = float((y.float() - ref).norm() / ref.norm())
            print(f"{order} N={N} K={K} M={M} tile {bm}x{bn} split {split}: rel err {err:.2e}", flush=True)
            assert err < 1e-2, err


def time(out: str | None = None) -> None:
    from common import bench_decode, deq, rand_mx, rotating

    from mxrepack.kernels.linear_mxfp4 import linear_mxfp4

    order = "mma2" if mma_v3_disabled() else "wgmma"
    rows = []
    shapes = {"qkv": (5120, 2880), "o": (2880, 4096)}
    waits = (True, False) if order == "wgmma" else (True,)

    def cands(M: int) -> list[tuple]:
        if M >= 1024:  # prefill: the MoE's wide tiles, no split
            return [(64, 128, 1, 4, 3, False), (128, 128, 1, 8, 3, False), (128, 128, 1, 8, 4, False)]
        return [
            (bm, bn, split, warps, 3, wait)
            for bm in (16, 32, 64)
            if bm <= max(16, M)
            for bn, warps in ((64, 4), (128, 4), (128, 8))
            for split in (1, 2, 4, 8)
            for wait in waits
        ]

    for name, (N, K) in shapes.items():
        w, s = rand_mx(N, K)
        wf = deq(w, s)
        bias = torch.randn(N, device="cuda")
        fold = fits_fold(s)
        wbytes = w.numel() + s.numel()
        pool = [rand_mx(N, K) for _ in range(max(2, (400 << 20) // wbytes))]
        chunked = [chunk_pack(a, b, order) for a, b in pool]
        it_q = itertools.cycle(pool)
        it_c = itertools.cycle(chunked)
        nxt_b = rotating(lambda: torch.randn(N, K, device="cuda").to(torch.bfloat16), N * K * 2)
        wq, sq = chunk_pack(w, s, order)
        for M in (4, 16, 64, 2048):
            x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
            ref = x.float() @ wf.T + bias
            rec = {"shape": name, "N": N, "K": K, "M": M, "order": order}
            y = linear_mxfp4(x, w, s, bias, "w4a16", fold_scale=fold)
            rec["shipped_err"] = float((y.float() - ref).norm() / ref.norm())
            rec["shipped_ms"] = bench_decode(lambda: linear_mxfp4(x, *next(it_q), bias, "w4a16", fold_scale=fold))
            rec["cublas_ms"] = bench_decode(lambda: x @ nxt_b().T)
            best = None
            for bm, bn, split, warps, stages, wait in cands(M):
                key = f"m{bm}n{bn}s{split}w{warps}st{stages}" + ("" if wait else "fly")
                try:
                    y = dense_chunks(x, wq, sq, N, bias, order, bm, bn, split, warps, stages, wait, fold)
                    err = float((y.float() - ref).norm() / ref.norm())
                    ms = bench_decode(
                        lambda: dense_chunks(x, *next(it_c), N, bias, order, bm, bn, split, warps, stages, wait, fold)
                    )
                except Exception as e:  # noqa: BLE001
                    rec[key] = f"{type(e).__name__}: {e}"[:200]
                    continue
                rec[key] = [round(ms, 5), err]
                if best is None or ms < best[1]:
                    best = (key, ms)
            rec["best"] = best
            rows.append(rec)
            print(
                f"{name} M={M}: shipped {rec['shipped_ms']:.4f} cublas {rec['cublas_ms']:.4f} "
                f"best chunk {best[0]} {best[1]:.4f} ({min(rec['shipped_ms'], rec['cublas_ms']) / best[1]:.2f}x "
                f"of the better)",
                flush=True,
            )
            if out:
                Path(out).write_text(json.dumps(meta() | {"rows": rows}, indent=1))


def meta() -> dict:
    return {
        "script": "benchmarks/experiments/dense_chunk_probe.py",
        "date": str(date.today()),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "disable_mma_v3": mma_v3_disabled(),
    }


if __name__ == "__main__":
    {"check": check, "time": time}[sys.argv[1]](*sys.argv[2:])
