"""Correctness at real gpt-oss sizes and speed of mxrepack's Triton kernels on one GPU. Not a test.

    python benchmarks/gpu_check.py [--quick] [--json out.json]

Everything in one run, so every ratio compares figures measured together:
* HBM roofline: device-to-device copy of 1 GiB (bytes read + written per second);
* dense MXFP4 GEMM (W4A16/W4A8/W4A4) on q/k/v fused (5120x2880), o (2880x4096), lm_head (201088x2880):
  relative error vs an fp32 reference, time, weight bytes / time vs the copy roofline, and the ratio
  to cuBLAS BF16 ``x @ W.T`` on the same shape. Weights rotate through enough copies (> 4x L2) that
  neither kernel runs from L2;
* a small config sweep on lm_head M=1 (which split/tile is best here);
* MoE (128 experts, top-4, H = I = 2880 padded to 2944): error vs a torch reference, decode
  T = 1, 8, 64 (roofline on the touched experts' bytes) and prefill T = 4096 (ratio to BF16
  per-expert matmuls on pre-dequantized weights).
Timings: ``triton.testing.do_bench`` medians (ms).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mxrepack.kernels.linear_mxfp4 import LinearConfig, linear_mxfp4, pick_config  # noqa: E402
from mxrepack.kernels.moe_mxfp4 import moe_mxfp4, pick_moe_config  # noqa: E402

FP4 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
DEV = "cuda"


def deq(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """GPU MXFP4 dequantization to fp32 (reference only)."""
    lut = FP4.to(packed.device)
    codes = torch.stack([packed & 15, packed >> 4], -1).flatten(-2).long()
    v = lut[codes]
    s = torch.exp2(scales.float() - 127)
    return (v.unflatten(-1, (-1, 32)) * s.unsqueeze(-1)).flatten(-2)


def rand_mx(*shape_nk) -> tuple[torch.Tensor, torch.Tensor]:
    *lead, N, K = shape_nk
    w = torch.randint(0, 256, (*lead, N, K // 2), dtype=torch.uint8, device=DEV)
    s = torch.randint(119, 124, (*lead, N, K // 32), dtype=torch.uint8, device=DEV)
    return w, s


def quant_ref(x: torch.Tensor, mode: str) -> torch.Tensor:
    """The activations as the kernel sees them (quantized by the same Triton quantizer, dequantized)."""
    from mxrepack.kernels.mx_quant import quantize_activations

    if mode == "w4a16":
        return x.float()
    q, s = quantize_activations(x, "e4m3" if mode == "w4a8" else "e2m1")
    if mode == "w4a8":
        return (q.float().unflatten(-1, (-1, 32)) * torch.exp2(s.float() - 127).unsqueeze(-1)).flatten(-2)
    return deq(q, s)


def rotating(make, bytes_each: int, min_total: int = 400 << 20):
    n = max(2, -(-min_total // max(bytes_each, 1)))
    items = [make() for _ in range(n)]
    it = itertools.cycle(items)
    return lambda: next(it)


def copy_roofline() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device=DEV)
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=50, rep=300)
    return 2 * a.numel() / (ms * 1e-3)  # bytes moved per second


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
            ms_cublas = do_bench(lambda: x @ nxt_b().T, warmup=25, rep=200)
            for mode in ("w4a16", "w4a8", "w4a4"):
                if M > 16 and mode != "w4a16" and quick:
                    continue
                y = linear_mxfp4(x, w, ws, bias, mode)
                ref = quant_ref(x, mode) @ wf.T + bias.float()
                err = float((y.float() - ref).norm() / ref.norm())
                ms = do_bench(lambda: linear_mxfp4(x, *nxt_q(), bias, mode), warmup=25, rep=200)
                cfg = pick_config(M, N, K, torch.cuda.get_device_properties(0).multi_processor_count)
                rec = {"kind": "dense", "shape": name, "N": N, "K": K, "M": M, "mode": mode, "config": cfg.name(),
                       "rel_err": err, "ms": ms, "cublas_bf16_ms": ms_cublas, "vs_cublas": ms_cublas / ms,
                       "weight_GBps": wbytes / (ms * 1e-3) / 1e9, "roofline_frac": (wbytes / (ms * 1e-3)) / bw}
                rows.append(rec)
                print(f"dense {name:8s} M={M:5d} {mode:6s} {cfg.name():22s} err {err:.1e}  {ms:.4f} ms  "
                      f"cuBLAS {ms_cublas:.4f} ms  x{ms_cublas / ms:.2f}  {rec['weight_GBps']:.0f} GB/s "
                      f"({100 * rec['roofline_frac']:.0f}% of copy roofline)", flush=True)


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


def moe(rows: list, bw: float, quick: bool) -> None:
    E, H, I, k = 128, 2880, 2880, 4
    Hp, Ip = 2944, 2944
    w13, s13 = rand_mx(E, 2 * Ip, Hp)
    w2, s2 = rand_mx(E, Hp, Ip)
    # zero the padding as the strided layout does (rows I..Ip of each half, columns H..Hp)
    w13[..., H // 2:] = 0
    w2[..., I // 2:] = 0
    s13[..., H // 32:] = 127
    s2[..., I // 32:] = 127
    w13.view(E, 2, Ip, -1)[:, :, I:] = 0
    w2[:, H:] = 0
    b13 = torch.randn(E, 2 * Ip, device=DEV) * 0.1
    b13.view(E, 2, Ip)[:, :, I:] = 0
    b2 = torch.randn(E, Hp, device=DEV) * 0.1
    b2[:, H:] = 0
    W = {"w13_weight": w13, "w13_weight_scale": s13, "w13_bias": b13, "w2_weight": w2, "w2_weight_scale": s2, "w2_bias": b2}
    per_expert = (w13[0].numel() + s13[0].numel() + w2[0].numel() + s2[0].numel())
    Tdec = (1, 8, 64)
    for T in Tdec + (4096,):
        x = torch.randn(T, H, device=DEV).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E, device=DEV)[:k] for _ in range(T)]) if T <= 64 else \
            torch.randint(0, E, (T, k), device=DEV)
        wts = torch.softmax(torch.randn(T, k, device=DEV), -1)
        y = moe_mxfp4(x, ids, wts, W)
        err = None
        if T <= 64:  # reference: per-expert fp32 on the dequantized padded weights
            ref = torch.zeros(T, Hp, device=DEV)
            xp = torch.nn.functional.pad(x.float(), (0, Hp - H))
            for e in ids.unique().tolist():
                r, slot = (ids == e).nonzero(as_tuple=True)
                g = xp[r] @ deq(w13[e], s13[e]).T + b13[e]
                gate, up = g[:, :Ip].clamp(max=7.0), g[:, Ip:].clamp(-7.0, 7.0)
                h = (up + 1) * gate * torch.sigmoid(1.702 * gate)
                ref[r] += wts[r, slot, None] * (h.bfloat16().float() @ deq(w2[e], s2[e]).T + b2[e])
            err = float((y.float() - ref[:, :H]).norm() / ref[:, :H].norm())
        ms = do_bench(lambda: moe_mxfp4(x, ids, wts, W), warmup=10, rep=100)
        touched = ids.unique().numel() * per_expert
        rec = {"kind": "moe", "T": T, "topk": k, "experts_touched": ids.unique().numel(), "rel_err": err, "ms": ms,
               "config": pick_moe_config(T, k, E).name(), "touched_GBps": touched / (ms * 1e-3) / 1e9,
               "roofline_frac": (touched / (ms * 1e-3)) / bw}
        if T == 4096:  # baseline: BF16 weights already dequantized, one matmul pair per expert
            wg = torch.stack([deq(w13[e], s13[e]) for e in range(E)]).bfloat16()
            wd = torch.stack([deq(w2[e], s2[e]) for e in range(E)]).bfloat16()
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
                        t = tok[start:start + c]
                        g = xp[t] @ wg[e].T
                        gate, up = g[:, :Ip].float().clamp(max=7.0), g[:, Ip:].float().clamp(-7.0, 7.0)
                        h = ((up + 1) * gate * torch.sigmoid(1.702 * gate)).bfloat16()
                        out.index_add_(0, t, (h @ wd[e].T).float() * wts.flatten()[order[start:start + c], None])
                    start += c
                return out

            rec["bf16_baseline_ms"] = do_bench(baseline, warmup=3, rep=20)
            rec["vs_bf16_baseline"] = rec["bf16_baseline_ms"] / ms
            del wg, wd
        rows.append(rec)
        print(f"moe T={T:5d} top{k} touched {rec['experts_touched']:3d} err {err if err is None else f'{err:.1e}'} "
              f"{ms:.4f} ms  {rec['touched_GBps']:.0f} GB/s ({100 * rec['roofline_frac']:.0f}% of copy roofline)"
              + (f"  bf16 baseline {rec['bf16_baseline_ms']:.3f} ms x{rec['vs_bf16_baseline']:.2f}" if T == 4096 else ""),
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip", default="", help="comma list of: dense,sweep,moe")
    ap.add_argument("--json")
    a = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    head = {"device": props.name, "sms": props.multi_processor_count, "date": str(date.today()),
            "torch": torch.__version__, "triton": triton.__version__, "host": platform.node()}
    print(head, flush=True)
    rows: list = []
    t0 = time.time()
    bw = copy_roofline()
    print(f"HBM copy: {bw / 1e12:.2f} TB/s (read+write)", flush=True)
    skip = set(a.skip.split(","))
    if "dense" not in skip:
        dense(rows, bw, a.quick)
    if "moe" not in skip:
        moe(rows, bw, a.quick)
    if "sweep" not in skip:
        sweep(rows, bw)
    print(f"total {time.time() - t0:.0f} s", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({**head, "copy_Bps": bw, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
