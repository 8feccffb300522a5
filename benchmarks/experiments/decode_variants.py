"""Experiment (not shipped): other schedules for the M = 1..16 W4A16 dense GEMM, timed beside the shipped GEMV.

    python benchmarks/experiments/decode_variants.py [--json out.json]

* ``swap``: the weights as the MMA's left operand, ``y^T = W @ x^T`` with ``tl.dot_scaled(e2m1 W, bf16 x^T)``,
  so that the 16-row minimum of the tensor-core tile is spent on weight rows instead of on padding
  activation rows, and Triton upcasts W in registers as the A operand.
Each variant is checked against an fp32 reference first. Results went to the lab notebook by hand (now
docs/PERF_LOG.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import DEV, copy_roofline, deq, rand_mx, rotating  # noqa: E402

from mxrepack.kernels.linear_mxfp4 import linear_mxfp4  # noqa: E402


@triton.jit
def _swap_kernel(
    x_ptr,
    w_ptr,
    ws_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_wsn,
    stride_ym,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    n_ok = rn < N
    rn_load = tl.minimum(rn, N - 1)
    rb = tl.arange(0, BLOCK_K // 2)
    rs = tl.arange(0, BLOCK_K // 32)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = tl.load(
            w_ptr + rn_load[:, None] * stride_wn + (k0 // 2 + rb)[None, :],
            mask=(k0 // 2 + rb)[None, :] < K // 2,
            other=0,
        )
        ws = tl.load(
            ws_ptr + rn_load[:, None] * stride_wsn + (k0 // 32 + rs)[None, :],
            mask=(k0 // 32 + rs)[None, :] < K // 32,
            other=127,
        )
        xt = tl.load(
            x_ptr + rm[None, :] * stride_xm + (k0 + rk)[:, None],
            mask=(rm[None, :] < M) & ((k0 + rk)[:, None] < K),
            other=0.0,
        )
        acc = tl.dot_scaled(w, ws, "e2m1", xt, None, "bf16", acc)
    tl.store(y_ptr + rm[None, :] * stride_ym + rn[:, None], acc.to(tl.bfloat16), mask=n_ok[:, None] & (rm[None, :] < M))


def swap_linear(x, w, ws, cfg):
    M, K = x.shape
    N = w.shape[0]
    bn, bk, warps, stages = cfg
    y = torch.empty(M, N, device=x.device, dtype=torch.bfloat16)
    _swap_kernel[(triton.cdiv(N, bn),)](
        x,
        w,
        ws,
        y,
        M,
        N,
        K,
        x.stride(0),
        w.stride(0),
        ws.stride(0),
        y.stride(0),
        BLOCK_N=bn,
        BLOCK_K=bk,
        BLOCK_M=16,
        num_warps=warps,
        num_stages=stages,
    )
    return y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    bw = copy_roofline()
    print(f"HBM copy {bw / 1e12:.2f} TB/s", flush=True)
    for name, (N, K) in {"lm_head": (201088, 2880), "qkv": (5120, 2880)}.items():
        wbytes = N * K // 2 + N * K // 32
        nxt = rotating(lambda: rand_mx(N, K), wbytes)
        w, ws = rand_mx(N, K)
        for M in (1, 4, 16):
            x = torch.randn(M, K, device=DEV).to(torch.bfloat16)
            ref = x.float() @ deq(w, ws).T
            ms_ship = do_bench(lambda: linear_mxfp4(x, *nxt(), None, "w4a16"), warmup=10, rep=60)
            best = None
            for cfg in itertools.product((64, 128, 256), (128, 256), (4, 8), (3, 4)):
                try:
                    y = swap_linear(x, w, ws, cfg)
                    err = float((y.float() - ref).norm() / ref.norm())
                    ms = do_bench(lambda: swap_linear(x, *nxt(), cfg), warmup=10, rep=60)
                except Exception as e:  # out of resources etc.
                    print(f"swap {cfg}: {type(e).__name__}", flush=True)
                    continue
                rows.append(
                    {
                        "variant": "swap",
                        "shape": name,
                        "M": M,
                        "config": cfg,
                        "ms": ms,
                        "rel_err": err,
                        "shipped_ms": ms_ship,
                        "roofline_frac": wbytes / (ms * 1e-3) / bw,
                    }
                )
                if best is None or ms < best[1]:
                    best = (cfg, ms, err)
            print(
                f"{name} M={M:2d}: shipped {ms_ship:.4f} ms; swap best {best[0]} {best[1]:.4f} ms "
                f"({100 * wbytes / (best[1] * 1e-3) / bw:.0f}% of copy roofline), err {best[2]:.1e}",
                flush=True,
            )
    if a.json:
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "copy_Bps": bw, "rows": rows}))


if __name__ == "__main__":
    main()
