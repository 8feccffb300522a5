"""Is there a BF16 GEMM faster than cuBLAS's at the dense prefill's shapes? The last lever stop 54 named for prefill at
2048 rows: the chunk orders' prefill is a dequantization to BF16 and cuBLAS's ``x @ W.T``, and the dequantization costs
about 4% of the GEMM (0.0041 ms over cuBLAS's 0.0905 on qkv, H200) with no way found to hide it. cuBLAS runs qkv at
2048 rows at about two thirds of the H200's BF16 peak, and 2048 x 5120 in 128 x 256 tiles is 320 tiles on 132 SMs
(2.4 waves, run as 3): a GEMM that fills the SMs better could leave room for the dequantization.

Candidates, each timed beside cuBLAS (torch's call) in one run, in CUDA graphs, BF16 weights rotating through more than
L2 (as ``prefill_probe.py`` times the peer), each checked against torch's output: Hopper's TMA + wgmma matmul as
Triton's persistent-matmul tutorial writes it (host tensor descriptors, a grouped tile order), ``persistent`` (one
program per SM walking the tiles) and ``grid`` (one program a tile), over tile shapes, stages, warps and, where this
Triton builds it, warp specialization (``ws``).

    python benchmarks/experiments/bf16_tma_gemm_probe.py check            # any Hopper GPU: each candidate's error
    python benchmarks/experiments/bf16_tma_gemm_probe.py time [OUT.json] [SHAPES] [ROWS] [REPEATS]

Hopper only (TMA, wgmma): an sm90-only configuration, as issue 28 allows; sm_12x's prefill is another question.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dense_chunk_probe import SHAPES  # noqa: E402
from dense_chunk_probe import meta as probe_meta  # noqa: E402

from mxrepack.kernels.gemv_mxfp4 import sm_count  # noqa: E402


@triton.jit
def _tile_coords(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """Tile ``tile`` -> (m, n) in groups of GROUP_M row tiles, so that programs in flight share x rows and W rows."""
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    size = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % size, (tile % per_group) // size


@triton.jit
def _gemm_tma_kernel(
    x_desc,
    w_desc,
    y_desc,
    M,
    N,
    K,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP_M: tl.constexpr,
    PROGRAMS: tl.constexpr,
    PERSISTENT: tl.constexpr,
    WS: tl.constexpr,
    STAGES: tl.constexpr,
):
    """``y = x @ w.T``: x [M, K], w [N, K], y [M, N] BF16 through TMA descriptors, fp32 accumulation."""
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    tiles = num_m * num_n
    if PERSISTENT:
        for tile in tl.range(tl.program_id(0), tiles, PROGRAMS, flatten=True, warp_specialize=WS):
            pm, pn = _tile_coords(tile, num_m, num_n, GROUP_M)
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for ki in tl.range(k_tiles, num_stages=STAGES):
                a = x_desc.load([pm * BM, ki * BK])
                b = w_desc.load([pn * BN, ki * BK])
                acc = tl.dot(a, b.T, acc)
            y_desc.store([pm * BM, pn * BN], acc.to(tl.bfloat16))
    else:
        pm, pn = _tile_coords(tl.program_id(0), num_m, num_n, GROUP_M)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in tl.range(k_tiles, num_stages=STAGES, warp_specialize=WS):
            a = x_desc.load([pm * BM, ki * BK])
            b = w_desc.load([pn * BN, ki * BK])
            acc = tl.dot(a, b.T, acc)
        y_desc.store([pm * BM, pn * BN], acc.to(tl.bfloat16))


# (name, BM, BN, BK, warps, stages, persistent, warp-specialized)
CANDIDATES = [
    (f"{'p' if p else 'g'}{bm}x{bn}x{bk}w{w}s{s}{'ws' if ws else ''}", bm, bn, bk, w, s, p, ws)
    for p in (True, False)
    for bm, bn, bk, w, s in (
        (128, 128, 64, 4, 4),
        (128, 128, 64, 8, 4),
        (128, 256, 64, 8, 3),
        (256, 128, 64, 8, 3),
        (128, 128, 128, 8, 3),
        (64, 256, 64, 4, 4),
    )
    for ws in (False, True)
]


def gemm(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, cand: tuple) -> torch.Tensor:
    _, bm, bn, bk, warps, stages, persistent, ws = cand
    M, K = x.shape
    N = w.shape[0]
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    programs = min(sm_count(x.device), tiles) if persistent else tiles
    _gemm_tma_kernel[(programs,)](
        TensorDescriptor.from_tensor(x, [bm, bk]),
        TensorDescriptor.from_tensor(w, [bn, bk]),
        TensorDescriptor.from_tensor(y, [bm, bn]),
        M,
        N,
        K,
        BM=bm,
        BN=bn,
        BK=bk,
        GROUP_M=8,
        PROGRAMS=programs,
        PERSISTENT=persistent,
        WS=ws,
        STAGES=stages,
        num_warps=warps,
    )
    return y


def _working(x, w, y, want) -> tuple[dict, dict]:
    """Candidates that build and run here -> their relative error against torch's output; the others' errors."""
    ok, failed = {}, {}
    for cand in CANDIDATES:
        try:
            gemm(x, w, y, cand)
            torch.cuda.synchronize()
        except Exception as exc:  # a candidate this Triton does not build (warp specialization on Hopper, smem)
            failed[cand[0]] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            continue
        ok[cand[0]] = float((y.float() - want.float()).norm() / want.float().norm())
    return ok, failed


def check() -> None:
    torch.manual_seed(0)
    for M, N, K in ((300, 1000, 2880), (2048, 5120, 2880)):
        x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        w = torch.randn(N, K, device="cuda").to(torch.bfloat16)
        y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        ok, failed = _working(x, w, y, x @ w.T)
        for name, err in ok.items():
            print(f"M={M} N={N} K={K} {name}: rel err against torch {err:.2e}", flush=True)
        for name, why in failed.items():
            print(f"M={M} N={N} K={K} {name}: not built: {why}", flush=True)


def time(out: str | None = None, shapes: str = "qkv,o,lm_head", sizes: str = "2048,8192", repeats: str = "5") -> None:
    from common import interleaved_ms, rand_mx, rotating
    from dense_chunk_probe import chunk_pack

    from mxrepack.kernels.dequant_mxfp4 import dequantize_chunks, linear_dequant_gemm

    by_name = {c[0]: c for c in CANDIDATES}

    rows = []
    for name in shapes.split(","):
        N, K = SHAPES[name]
        nxt = rotating(lambda: torch.randn(N, K, device="cuda").to(torch.bfloat16), N * K * 2)
        for M in map(int, sizes.split(",")):
            if M * N > 2048 * 201088:
                continue
            x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
            y = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
            w0 = nxt()
            err, failed = _working(x, w0, y, x @ w0.T)
            fns = {"cublas": lambda: torch.mm(x, nxt().T, out=y)}
            for cand in CANDIDATES:
                if cand[0] in err:
                    fns[cand[0]] = lambda c=cand: gemm(x, nxt(), y, c)
            times = interleaved_ms(fns, int(repeats))
            ms = {k: round(statistics.median(t), 5) for k, t in times.items()}
            best = sorted((t, k) for k, t in ms.items() if k != "cublas")
            # the prefill as it would run: the whole W dequantized from the wgmma order, then the GEMM; beside the
            # shipped dequantize + cuBLAS, both on MXFP4 weights rotating, and cuBLAS again in the same rounds
            nxt_mx = rotating(lambda: chunk_pack(*rand_mx(N, K), "wgmma"), N * K // 2 + N * K // 32)
            whole = torch.empty(-(-N // 16) * 16, K, dtype=torch.bfloat16, device="cuda")
            fused = {
                "cublas": fns["cublas"],
                "wgmma_shipped": lambda: linear_dequant_gemm(x, *nxt_mx(), None, y, order="wgmma"),
            } | {
                f"wgmma_dequant_{k}": lambda c=by_name[k]: gemm(
                    x, dequantize_chunks(*nxt_mx(), K, "wgmma", whole)[:N], y, c
                )
                for _, k in best[:2]
            }
            ftimes = interleaved_ms(fused, int(repeats))
            fms = {k: round(statistics.median(t), 5) for k, t in ftimes.items()}
            base = ms["cublas"]
            flops = 2 * M * N * K
            rec = {"shape": name, "M": M, "N": N, "K": K, "ms": ms, "all_ms": times, "err": err, "not_built": failed}
            rec |= {"prefill_ms": fms, "prefill_all_ms": ftimes}
            rec["tflops"] = {k: round(flops / (t * 1e-3) / 1e12, 1) for k, t in ms.items()}
            rows.append(rec)
            print(
                f"{name} M={M}: cublas {base:.4f} ms ({rec['tflops']['cublas']} TFLOP/s); best "
                + ", ".join(f"{k} {t:.4f} ({base / t:.3f}, err {err[k]:.1e})" for t, k in best[:5]),
                flush=True,
            )
            print(
                "  prefill: " + ", ".join(f"{k} {t:.4f} ({fms['cublas'] / t:.3f})" for k, t in fms.items()),
                flush=True,
            )
            if failed:
                print(f"  not built: {', '.join(sorted(failed))}", flush=True)
            if out:
                Path(out).write_text(json.dumps(meta() | {"rows": rows}, indent=1))


def meta() -> dict:
    return probe_meta() | {
        "script": "benchmarks/experiments/bf16_tma_gemm_probe.py",
        "sm_count": sm_count(torch.device("cuda")),
    }


if __name__ == "__main__":
    {"check": check, "time": time}[sys.argv[1]](*sys.argv[2:])
