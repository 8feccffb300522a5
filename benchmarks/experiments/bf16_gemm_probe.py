"""What the MMA instruction costs at q/k/v/o's shapes, apart from MXFP4: a plain BF16 GEMM built by Triton (W ``[N, K]``
BF16 as the first operand, the tokens as the second, as the chunk orders' tiles take them), timed over a grid of tiles
and K splits beside cuBLAS BF16 and the chunk orders' dispatch (``linear_mxfp4.linear_mxfp4``) in one run. In the
normal build on Hopper Triton builds it with wgmma; under ``DISABLE_MMA_V3`` with ``mma.sync``, the instruction sm_12x
has, so the two runs say how much of the ``mma2`` order's gap to cuBLAS at 64 rows (cuBLAS on Hopper runs wgmma) a
GEMM with no decode at all pays too.

    TRITON_INTERPRET=1 python benchmarks/experiments/bf16_gemm_probe.py check
    python benchmarks/experiments/bf16_gemm_probe.py time [OUT.json] [SHAPES] [ROWS]
    DISABLE_MMA_V3=1 python benchmarks/experiments/bf16_gemm_probe.py time [OUT.json] [SHAPES] [ROWS]
    python benchmarks/experiments/bf16_gemm_probe.py kernels [OUT.json] [SHAPES] [ROWS]   # what cuBLAS launches

The split tiles add their fp32 partials with atomics into an output zeroed before the call: the timed figure is the
GEMM's launch alone (the zeroing and the bf16 cast not timed), so a split tile's time is a lower bound on a GEMM that
delivers bf16.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dense_chunk_probe import SHAPES, Layer, meta  # noqa: E402

from mxrepack.kernels.dequant_mxfp4 import interpreting, mma_v3_disabled  # noqa: E402
from mxrepack.kernels.linear_mxfp4 import linear_mxfp4, pick_chunk_config  # noqa: E402


@triton.jit
def _bf16_gemm_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K, tiles_per_split,
    BLOCK_W: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, ATOMIC: tl.constexpr,
    INTERPRETER: tl.constexpr,
):  # fmt: skip
    """Program (W rows block, K split): ``y[:, rows] (+)= x[:, ks] @ W[rows, ks].T`` as ``W @ x.T`` (W the first
    operand); ``ATOMIC``: fp32 partials added into ``y``, else bf16 stored."""
    pid_w, pid_s = tl.program_id(0), tl.program_id(1)
    rw = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    rt = tl.arange(0, BLOCK_T)
    rk = tl.arange(0, BLOCK_K)
    k0 = pid_s * tiles_per_split * BLOCK_K
    k1 = tl.minimum(k0 + tiles_per_split * BLOCK_K, K)
    acc = tl.zeros((BLOCK_W, BLOCK_T), tl.float32)
    for k in range(k0, k1, BLOCK_K):
        w = tl.load(
            w_ptr + rw[:, None] * K + (k + rk)[None, :], mask=(rw[:, None] < N) & (k + rk < K)[None, :], other=0.0
        )
        x = tl.load(
            x_ptr + rt[None, :] * K + (k + rk)[:, None], mask=(rt[None, :] < M) & (k + rk < K)[:, None], other=0.0
        )
        if INTERPRETER:  # Triton 3.9's interpreter multiplies bf16 operands' bits as integers
            acc = tl.dot(w.to(tl.float32), x.to(tl.float32), acc)
        else:
            acc = tl.dot(w, x, acc)
    out = y_ptr + rt[None, :] * N + rw[:, None]
    ok = (rw[:, None] < N) & (rt[None, :] < M)
    if ATOMIC:
        tl.atomic_add(out, acc, mask=ok, sem="relaxed")
    else:
        tl.store(out, acc.to(tl.bfloat16), mask=ok)


def bf16_gemm(x, w, y, block_w, block_k, splits, warps, stages):
    """One launch: ``y`` bf16 ``[M, N]`` when ``splits`` is 1, else fp32 to add into (zeroed by the caller)."""
    M, K = x.shape
    N = w.shape[0]
    k_tiles = triton.cdiv(K, block_k)
    per = triton.cdiv(k_tiles, splits)
    grid = (triton.cdiv(N, block_w), triton.cdiv(k_tiles, per))
    _bf16_gemm_kernel[grid](
        x, w, y, M, N, K, per, block_w, max(16, triton.next_power_of_2(M)), block_k, splits > 1,
        interpreting(), num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return y


def tiles(N: int):
    """(block_w, block_k, splits, warps, stages): W rows a program 64 / 128, K tile 64 / 128, splits 1-4 (1 on lm_head,
    whose rows fill the GPU), 4 / 8 warps, 3 / 4 stages."""
    splits = (1,) if N > 100_000 else (1, 2, 3, 4)
    return itertools.product((64, 128), (64, 128), splits, (4, 8), (3, 4))


def check() -> None:
    torch.manual_seed(0)
    for N, K, M in ((80, 288, 5), (200, 512, 40)):
        x, w = torch.randn(M, K).to(torch.bfloat16), torch.randn(N, K).to(torch.bfloat16)
        ref = x.float() @ w.float().T
        for bw, bk, s in ((64, 64, 1), (128, 128, 3)):
            y = torch.zeros(M, N, dtype=torch.float32 if s > 1 else torch.bfloat16)
            err = float((bf16_gemm(x, w, y, bw, bk, s, 4, 3).float() - ref).norm() / ref.norm())
            print(f"N={N} K={K} M={M} w{bw} k{bk} s{s}: rel err {err:.2e}", flush=True)
            assert err < 1e-2, err


def time(out: str | None = None, shapes: str = "qkv,o", sizes: str = "16,64") -> None:
    from common import bench_decode

    order = "mma2" if mma_v3_disabled() else "wgmma"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name in shapes.split(","):
        layer = Layer.random(name, order)
        N, K, fold, nxt_b = layer.N, layer.K, layer.fold, layer.next_bf16
        wf = layer.wf.to(torch.bfloat16)
        for M in map(int, sizes.split(",")):
            x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
            ref = x.float() @ wf.float().T
            y = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
            y32 = torch.zeros(M, N, dtype=torch.float32, device="cuda")
            pick = pick_chunk_config(M, N, K, sms, fold, order=order)
            picked = pick.name() if pick is not None else "dequantize + cuBLAS"  # past 64 rows
            rec = {"shape": name, "N": N, "K": K, "M": M, "order": order, "sms": sms, "pick": picked}
            rec["pick_ms"] = bench_decode(
                lambda: linear_mxfp4(x, *layer.next_chunked(), order=order, out=y, fold_scale=fold)
            )
            rec["cublas_ms"] = bench_decode(lambda: x @ nxt_b().T)
            best = None
            for bw, bk, sp, wp, st in tiles(N):
                tag = f"w{bw}k{bk}s{sp}w{wp}st{st}"
                out_t = y32 if sp > 1 else y
                try:
                    y32.zero_()
                    got = bf16_gemm(x, wf, out_t, bw, bk, sp, wp, st)
                    err = float((got.float() - ref).norm() / ref.norm())
                    ms = bench_decode(lambda: bf16_gemm(x, nxt_b(), out_t, bw, bk, sp, wp, st))
                except Exception as e:  # noqa: BLE001 - a tile that does not build here is a result too
                    rec[tag] = f"{type(e).__name__}: {e}"[:200]
                    continue
                rec[tag] = [round(ms, 5), err]
                if best is None or ms < best[1]:
                    best = (tag, ms)
            rec["best_bf16"] = best
            rows.append(rec)
            line = f"{name} M={M} {order}: ours ({rec['pick']}) {rec['pick_ms']:.4f} cublas {rec['cublas_ms']:.4f}"
            if best is not None:  # else no tile built here: their errors are in the record
                line += (
                    f" triton bf16 best {best[0]} {best[1]:.4f} (cublas/ours {rec['cublas_ms'] / rec['pick_ms']:.2f}"
                )
                line += f", triton bf16/ours {best[1] / rec['pick_ms']:.2f})"
            print(line, flush=True)
            if out:
                Path(out).write_text(
                    json.dumps(meta() | {"script": "benchmarks/experiments/bf16_gemm_probe.py", "rows": rows}, indent=1)
                )


def kernels(out: str | None = None, shapes: str = "qkv,o", sizes: str = "16,64,2048") -> None:
    """The kernels cuBLAS launches for ``x @ W.T`` at each shape and row count (torch's profiler trace: name, grid,
    block, registers, shared memory, duration; one W called five times, so held in L2 where it fits: the durations are
    not the rotating-weight timings of :func:`time`): which tile and K split the leader picks."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    rows = []
    for name in shapes.split(","):
        N, K = SHAPES[name]
        w = torch.randn(N, K, device="cuda").to(torch.bfloat16)
        for M in map(int, sizes.split(",")):
            x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
            for _ in range(3):
                x @ w.T
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    x @ w.T
                torch.cuda.synchronize()
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                prof.export_chrome_trace(f.name)
                with open(f.name) as trace:
                    events = json.load(trace)["traceEvents"]
            launched = [e for e in events if e.get("cat") == "kernel"]
            keys = ("grid", "block", "registers per thread", "shared memory")
            for e in launched[-(len(launched) // 5) :]:  # the last call's kernels
                rec = {"shape": name, "M": M, "kernel": e["name"], "us": e["dur"]} | {k: e["args"].get(k) for k in keys}
                rows.append(rec)
                print(json.dumps(rec), flush=True)
    if out:
        Path(out).write_text(json.dumps(meta() | {"script": "benchmarks/experiments/bf16_gemm_probe.py", "rows": rows}))


if __name__ == "__main__":
    {"check": check, "time": time, "kernels": kernels}[sys.argv[1]](*sys.argv[2:])
