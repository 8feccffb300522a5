"""Correctness at real gpt-oss sizes and speed of mxrepack's Triton kernels on one GPU. Not a test.

    python benchmarks/gpu_check.py [--quick] [--json out.json]

Everything in one run, so every ratio compares figures measured together:
* HBM roofline: device-to-device copy of 1 GiB (bytes read + written per second);
* dense MXFP4 GEMM (W4A16/W4A8/W4A4) on q/k/v fused (5120x2880), o (2880x4096), lm_head (201088x2880):
  relative error vs an fp32 reference, time, weight bytes / time vs the copy roofline, and the ratio
  to cuBLAS BF16 ``x @ W.T`` on the same shape. Weights rotate through enough copies (> 4x L2) that
  neither kernel runs from L2;
* W4A16 prefill from 64 to 8192 rows: the tile kernel vs dequantize + cuBLAS, vs cuBLAS BF16;
* a small config sweep on lm_head M=1 (which split/tile is best here);
* the W4A16 GEMV: decode variants checked, a config sweep at M = 1 per shape, GEMV vs tile for M <= 16;
* MoE (128 experts, top-4, H = I = 2880 padded to 2944): error vs a torch reference, decode
  T = 1, 8, 64 (roofline on the touched experts' bytes) and prefill T = 4096 (ratio to BF16
  per-expert matmuls on pre-dequantized weights).
Timings: ``triton.testing.do_bench`` medians (ms). The helpers shared with the other GPU scripts are in
``common.py``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import sys
import time
from datetime import date
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    DEV,
    bench_decode,
    copy_roofline,
    deq,
    moe_decode_inputs,
    moe_expert_bytes,
    moe_prefill_inputs,
    moe_reference,
    moe_row_major,
    moe_weights,
    quant_ref,
    rand_mx,
    rotating,
)

from mxrepack.kernels.dequant_mxfp4 import DEQUANT, DequantConfig, dequantize_mxfp4_rows  # noqa: E402
from mxrepack.kernels.gemv_mxfp4 import GemvConfig, gemv_mxfp4, pick_gemv_config  # noqa: E402
from mxrepack.kernels.linear_mxfp4 import LinearConfig, linear_mxfp4, pick_config, use_dequant_gemm, use_gemv  # noqa: E402
from mxrepack.kernels.moe_mxfp4 import moe_mxfp4, pick_moe, pick_moe_config, pick_moe_gemv_config  # noqa: E402


def dense(rows: list, bw: float, quick: bool) -> None:
    shapes = {"qkv": (5120, 2880), "o": (2880, 4096), "lm_head": (201088, 2880)}
    Ms = (1, 4, 16, 2048) if quick else (1, 4, 16, 2048, 8192)
    for name, (N, K) in shapes.items():
        w, ws = rand_mx(N, K)
        bias = torch.randn(N, device=DEV).to(torch.bfloat16)
        wf = deq(w, ws)
        wbytes = w.numel() + ws.numel()
        nxt_q = rotating(lambda: rand_mx(N, K), wbytes)
        nxt_b = rotating(lambda: torch.randn(N, K, device=DEV).to(torch.bfloat16), N * K * 2)
        for M in Ms:
            if M >= 8192 and name == "lm_head":
                continue
            x = torch.randn(M, K, device=DEV).to(torch.bfloat16)
            timer = bench_decode if M <= 16 else (lambda f: do_bench(f, warmup=25, rep=200))
            ms_cublas = timer(lambda: x @ nxt_b().T)
            for mode in ("w4a16", "w4a8", "w4a4"):
                if M > 16 and mode != "w4a16" and quick:
                    continue
                y = linear_mxfp4(x, w, ws, bias, mode)
                ref = quant_ref(x, mode) @ wf.T + bias.float()
                err = float((y.float() - ref).norm() / ref.norm())
                ms = timer(lambda: linear_mxfp4(x, *nxt_q(), bias, mode))
                sms = torch.cuda.get_device_properties(0).multi_processor_count
                if mode == "w4a16" and use_gemv(M, N, sms):
                    cfg = pick_gemv_config(N, sms, M=M).launched(M)
                elif mode == "w4a16" and use_dequant_gemm(M, N, sms):
                    cfg = DEQUANT
                else:
                    cfg = pick_config(M, N, K, sms, mode)
                rec = {
                    "kind": "dense",
                    "shape": name,
                    "N": N,
                    "K": K,
                    "M": M,
                    "mode": mode,
                    "config": cfg.name(),
                    "rel_err": err,
                    "ms": ms,
                    "cublas_bf16_ms": ms_cublas,
                    "vs_cublas": ms_cublas / ms,
                    "weight_GBps": wbytes / (ms * 1e-3) / 1e9,
                    "roofline_frac": (wbytes / (ms * 1e-3)) / bw,
                }
                rows.append(rec)
                print(
                    f"dense {name:8s} M={M:5d} {mode:6s} {cfg.name():22s} err {err:.1e}  {ms:.4f} ms  "
                    f"cuBLAS {ms_cublas:.4f} ms  x{ms_cublas / ms:.2f}  {rec['weight_GBps']:.0f} GB/s "
                    f"({100 * rec['roofline_frac']:.0f}% of copy roofline)",
                    flush=True,
                )


def prefill(rows: list, bw: float) -> None:
    """W4A16 from 64 rows up: the tensor-core tile kernel vs dequantize + cuBLAS (slab sizes at M = 2048),
    both against cuBLAS BF16 on the same shape; and the GPU dequantizer bit-exact against the reference."""
    shapes = {"qkv": (5120, 2880), "o": (2880, 4096), "lm_head": (201088, 2880)}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for name, (N, K) in shapes.items():
        w, ws = rand_mx(N, K)
        wf = deq(w, ws)
        exact = torch.equal(dequantize_mxfp4_rows(w, ws), wf.to(torch.bfloat16))
        nxt_q = rotating(lambda: rand_mx(N, K), w.numel() + ws.numel())
        nxt_b = rotating(lambda: torch.randn(N, K, device=DEV).to(torch.bfloat16), N * K * 2)
        for M in (64, 128, 256, 512, 1024, 2048, 8192):
            if M == 8192 and name == "lm_head":
                continue
            x = torch.randn(M, K, device=DEV).to(torch.bfloat16)
            # CUDA-graph timing (weights still rotate: the capture unrolls the calls), so that the ~0.05 ms of
            # Python and launch overhead per call does not decide the small shapes, for both sides alike.
            ms_cublas = bench_decode(lambda: x @ nxt_b().T)
            cands = {"tile": pick_config(M, N, K, sms), "dequant": DEQUANT}
            if M == 2048:
                cands.update({f"dequant-{mb}M": DequantConfig(chunk_bytes=mb << 20) for mb in (16, 64, 128)})
            ref = x.float() @ wf.T
            for label, cfg in cands.items():
                err = float((linear_mxfp4(x, w, ws, None, "w4a16", cfg).float() - ref).norm() / ref.norm())
                ms = bench_decode(lambda: linear_mxfp4(x, *nxt_q(), None, "w4a16", cfg))
                rec = {
                    "kind": "prefill",
                    "shape": name,
                    "N": N,
                    "K": K,
                    "M": M,
                    "path": label,
                    "config": cfg.name(),
                    "rel_err": err,
                    "ms": ms,
                    "cublas_bf16_ms": ms_cublas,
                    "vs_cublas": ms_cublas / ms,
                    "dequant_exact": exact,
                }
                rows.append(rec)
                print(
                    f"prefill {name:8s} M={M:5d} {label:12s} {cfg.name():22s} err {err:.1e} {ms:.4f} ms  cuBLAS "
                    f"{ms_cublas:.4f} ms  x{ms_cublas / ms:.2f}  dequant exact {exact}",
                    flush=True,
                )


def dequant_sweep(rows: list, bw: float) -> None:
    """The prefill's dequantizer alone on lm_head: bytes read + written per second vs the copy roofline."""
    N, K = 201088, 2880
    nxt_q = rotating(lambda: rand_mx(N, K), N * K // 2 + N * K // 32)
    out = torch.empty(N, K, dtype=torch.bfloat16, device=DEV)
    moved = N * K // 2 + N * K // 32 + N * K * 2
    for bn, bk, nw in (
        (32, 256, 4),
        (64, 256, 4),
        (16, 512, 4),
        (64, 128, 4),
        (128, 128, 8),
        (32, 512, 8),
        (8, 1024, 4),
        (64, 512, 8),
        (128, 256, 8),
    ):
        cfg = DequantConfig(bn, bk, nw)
        ms = do_bench(lambda: dequantize_mxfp4_rows(*nxt_q(), out, cfg), warmup=25, rep=200)
        rec = {
            "kind": "dequant",
            "config": cfg.name(),
            "ms": ms,
            "GBps": moved / (ms * 1e-3) / 1e9,
            "roofline_frac": moved / (ms * 1e-3) / bw,
        }
        rows.append(rec)
        print(
            f"dequant lm_head {cfg.name():22s} {ms:.4f} ms  {rec['GBps']:.0f} GB/s "
            f"({100 * rec['roofline_frac']:.0f}% of copy roofline)",
            flush=True,
        )


def sweep(rows: list, bw: float) -> None:
    N, K = 201088, 2880
    nxt = rotating(lambda: rand_mx(N, K), N * K // 2 + N * K // 32)
    x = torch.randn(1, K, device=DEV).to(torch.bfloat16)
    wbytes = N * K // 2 + N * K // 32
    best = None
    for bn, bk, warps, stages, md in itertools.product((32, 64, 128), (128, 256, 512), (4, 8), (3, 4), (False, True)):
        cfg = LinearConfig(16, bn, bk, 1, warps, stages, md)
        try:
            ms = do_bench(lambda: linear_mxfp4(x, *nxt(), None, "w4a16", cfg), warmup=10, rep=60)
        except Exception as e:  # out of resources etc.
            print(f"sweep {cfg.name()}: {type(e).__name__}", flush=True)
            continue
        frac = (wbytes / (ms * 1e-3)) / bw
        rows.append({"kind": "sweep_lm_head_m1", "config": cfg.name(), "ms": ms, "roofline_frac": frac})
        print(f"sweep {cfg.name():24s} {ms:.4f} ms ({100 * frac:.0f}%)", flush=True)
        if best is None or ms < best[1]:
            best = (cfg.name(), ms, frac)
    print(f"sweep lm_head M=1 best {best[0]} {best[1]:.4f} ms ({100 * best[2]:.0f}% of copy roofline)", flush=True)


def gemv(rows: list, bw: float) -> None:
    """The W4A16 GEMV: asm vs portable decode checked against fp32 (a ragged shape exercises the masked
    tail), then a config sweep on lm_head, o and qkv at M = 1, and GEMV vs tensor-core tile at M = 1..16."""
    for N, K in ((37, 160), (201088, 2880)):
        w, ws = rand_mx(N, K)
        # activations with outliers and a wide range, which the f16x2 path's per-group scaling must keep
        x = (
            torch.randn(3, K, device=DEV)
            * torch.where(torch.rand(K, device=DEV) < 0.01, 100.0, 1.0)
            * torch.exp2(torch.randint(-10, 4, (K,), device=DEV).float())
        ).to(torch.bfloat16)
        ref = x.float() @ deq(w, ws).T
        for dec in ("ops", "asm", "f16x2"):
            y = gemv_mxfp4(
                x, w, ws, None, torch.empty(3, N, device=DEV, dtype=torch.bfloat16), GemvConfig(64, 256, 4, 3, dec)
            )
            err = float((y.float() - ref).norm() / ref.norm())
            rows.append({"kind": "gemv_check", "N": N, "K": K, "decode": dec, "rel_err": err})
            print(f"gemv check N={N} K={K} {dec}: rel err {err:.1e}", flush=True)
    shapes = {"lm_head": (201088, 2880), "o": (2880, 4096), "qkv": (5120, 2880)}
    for name, (N, K) in shapes.items():
        wbytes = N * K // 2 + N * K // 32
        nxt = rotating(lambda: rand_mx(N, K), wbytes)
        nxt_b = rotating(lambda: torch.randn(N, K, device=DEV).to(torch.bfloat16), N * K * 2)
        x1 = torch.randn(1, K, device=DEV).to(torch.bfloat16)
        ms_cublas = bench_decode(lambda: x1 @ nxt_b().T)
        best = None
        wide = name == "lm_head"
        grid = itertools.product(
            (8, 16, 32, 64, 128) if wide else (4, 8, 16),
            (128, 256, 512, 1024) if wide else (256, 512),
            (4, 8) if wide else (2, 4),
            ("asm", "f16x2", "ops"),
        )
        for bn, bk, warps, dec in grid:
            if dec == "ops" and (not wide or (bn, bk, warps) != (64, 128, 4)):
                continue  # the portable decode once, on lm_head
            cfg = GemvConfig(bn, bk, warps, 1, dec)
            try:
                ms = bench_decode(lambda: linear_mxfp4(x1, *nxt(), None, "w4a16", cfg), rep=50)
            except Exception as e:  # out of resources etc.
                print(f"gemv {name} {cfg.name()}: {type(e).__name__}", flush=True)
                continue
            frac = (wbytes / (ms * 1e-3)) / bw
            rows.append(
                {
                    "kind": "gemv_sweep",
                    "shape": name,
                    "M": 1,
                    "config": cfg.name(),
                    "ms": ms,
                    "cublas_bf16_ms": ms_cublas,
                    "vs_cublas": ms_cublas / ms,
                    "roofline_frac": frac,
                }
            )
            if best is None or ms < best[1]:
                best = (cfg, ms, frac)
        print(
            f"gemv {name} M=1 best {best[0].name()} {best[1]:.4f} ms ({100 * best[2]:.0f}% of copy roofline), "
            f"cuBLAS {ms_cublas:.4f} ms, x{ms_cublas / best[1]:.2f}",
            flush=True,
        )
        for M in (1, 2, 4, 8, 16):
            x = torch.randn(M, K, device=DEV).to(torch.bfloat16)
            ms_c = bench_decode(lambda: x @ nxt_b().T)
            ms_g = bench_decode(lambda: linear_mxfp4(x, *nxt(), None, "w4a16", best[0]))
            cfg_t = pick_config(16, N, K, torch.cuda.get_device_properties(0).multi_processor_count)
            ms_t = bench_decode(lambda: linear_mxfp4(x, *nxt(), None, "w4a16", cfg_t))
            rows.append(
                {
                    "kind": "gemv_vs_tile",
                    "shape": name,
                    "M": M,
                    "gemv_ms": ms_g,
                    "tile_ms": ms_t,
                    "cublas_bf16_ms": ms_c,
                    "gemv_config": best[0].name(),
                    "tile_config": cfg_t.name(),
                }
            )
            print(f"gemv {name} M={M:2d}: gemv {ms_g:.4f} ms  tile {ms_t:.4f} ms  cuBLAS {ms_c:.4f} ms", flush=True)


def moe(rows: list, bw: float, quick: bool) -> None:
    E, H, I, k = 128, 2880, 2880, 4
    Hp, Ip = 2944, 2944
    W = moe_weights(E, H, I, Hp, Ip)
    per_expert = moe_expert_bytes(W)
    Tdec = (1, 2, 4, 8, 64, 128)
    for T in Tdec + (1024, 4096):
        x, ids, wts = (moe_decode_inputs if T <= 128 else moe_prefill_inputs)(T, E, k, H)
        y = moe_mxfp4(x, ids, wts, W)
        err = None
        if T <= 128:
            ref = moe_reference(x, ids, wts, W, H, Hp, Ip)
            err = float((y.float() - ref).norm() / ref.norm())
        # decode-sized calls in a CUDA graph (both paths capture: the schedule has no host sync), prefill with
        # do_bench (milliseconds per call: launch overhead does not matter there)
        timer = bench_decode if T <= 128 else (lambda f: do_bench(f, warmup=10, rep=100))  # noqa: E731
        ms = timer(lambda: moe_mxfp4(x, ids, wts, W))
        touched = ids.unique().numel() * per_expert
        rec = {
            "kind": "moe",
            "T": T,
            "topk": k,
            "experts_touched": ids.unique().numel(),
            "rel_err": err,
            "ms": ms,
            "config": pick_moe(T, k, E, H).name(),
            "touched_GBps": touched / (ms * 1e-3) / 1e9,
            "roofline_frac": (touched / (ms * 1e-3)) / bw,
        }
        if T <= 16:  # the other path at the same T, and a few GEMV tiles
            rec["scheduled_ms"] = timer(lambda: moe_mxfp4(x, ids, wts, W, config=pick_moe_config(T, k, E)))
            for cfg in itertools.product((8, 16, 32, 64), (256, 512), (2, 4, 8)):
                gcfg = GemvConfig(*cfg, 1, "asm")
                rec[f"gemv_{gcfg.name()}_ms"] = timer(lambda: moe_mxfp4(x, ids, wts, W, config=gcfg))
            best = min((v, n) for n, v in rec.items() if n.startswith("gemv_"))
            rec["gemv_graph_ms"] = bench_decode(lambda: moe_mxfp4(x, ids, wts, W, config=pick_moe_gemv_config(T * k)))
            print(f"moe T={T}: shipped gemv in a CUDA graph {rec['gemv_graph_ms']:.4f} ms", flush=True)
            print(
                f"moe T={T}: scheduled {rec['scheduled_ms']:.4f} ms, best gemv {best[1]} {best[0]:.4f} ms", flush=True
            )
            if T == 1:
                y_g = moe_mxfp4(x, ids, wts, W, config=pick_moe_gemv_config(T * k))
                rec["gemv_rel_err"] = float((y_g.float() - ref).norm() / ref.norm())
                print(f"moe T=1 gemv err {rec['gemv_rel_err']:.1e}", flush=True)
        if T == 4096:  # baseline: BF16 weights already dequantized, one matmul pair per expert
            w13, s13, w2, s2 = moe_row_major(W)
            wg = torch.stack([deq(w13[e], s13[e]) for e in range(E)]).bfloat16()
            wd = torch.stack([deq(w2[e], s2[e]) for e in range(E)]).bfloat16()
            del w13, s13, w2, s2
            xp = torch.nn.functional.pad(x, (0, Hp - H))

            def baseline():
                out = torch.zeros(T, Hp, device=DEV, dtype=torch.float32)
                flat = ids.flatten()
                order = torch.argsort(flat)
                counts = torch.bincount(flat, minlength=E).tolist()
                tok = order // k
                start = 0
                for e in range(E):
                    c = counts[e]
                    if c:
                        t = tok[start : start + c]
                        g = xp[t] @ wg[e].T
                        gate, up = g[:, :Ip].float().clamp(max=7.0), g[:, Ip:].float().clamp(-7.0, 7.0)
                        h = ((up + 1) * gate * torch.sigmoid(1.702 * gate)).bfloat16()
                        out.index_add_(0, t, (h @ wd[e].T).float() * wts.flatten()[order[start : start + c], None])
                    start += c
                return out

            rec["bf16_baseline_ms"] = do_bench(baseline, warmup=3, rep=20)
            rec["vs_bf16_baseline"] = rec["bf16_baseline_ms"] / ms
            del wg, wd
        rows.append(rec)
        print(
            f"moe T={T:5d} top{k} touched {rec['experts_touched']:3d} err {err if err is None else f'{err:.1e}'} "
            f"{ms:.4f} ms  {rec['touched_GBps']:.0f} GB/s ({100 * rec['roofline_frac']:.0f}% of copy roofline)"
            + (f"  bf16 baseline {rec['bf16_baseline_ms']:.3f} ms x{rec['vs_bf16_baseline']:.2f}" if T == 4096 else ""),
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip", default="", help="comma list of: dense,prefill,sweep,moe,gemv")
    ap.add_argument("--json")
    a = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    head = {
        "device": props.name,
        "sms": props.multi_processor_count,
        "date": str(date.today()),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "host": platform.node(),
    }
    print(head, flush=True)
    rows: list = []
    t0 = time.time()
    bw = copy_roofline()
    print(f"HBM copy: {bw / 1e12:.2f} TB/s (read+write)", flush=True)
    skip = set(a.skip.split(","))
    if "dense" not in skip:
        dense(rows, bw, a.quick)
    if "prefill" not in skip:
        dequant_sweep(rows, bw)
        prefill(rows, bw)
    if "moe" not in skip:
        moe(rows, bw, a.quick)
    if "sweep" not in skip:
        sweep(rows, bw)
    if "gemv" not in skip:
        gemv(rows, bw)
    print(f"total {time.time() - t0:.0f} s", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({**head, "copy_Bps": bw, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
