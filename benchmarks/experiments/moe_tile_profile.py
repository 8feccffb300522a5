"""Where the scheduled MoE tiles' time goes (T >= 64): each kernel's duration from the CUDA profiler over CUDA-graph
replays of the shipped choice (120b shapes, or the 20b's expert count: EXPERTS below; folded scales, the rows order and,
on Hopper, the wgmma order), with the two matmul kernels' achieved TFLOP/s (routed rows only, unpadded) and the same
products as one cuBLAS BF16 matmul each (``T k x 2944 @ 2944 x 5888`` and ``x 2944``: what the tensor cores give these
shapes without routing or decode). The question it answers: how much of the gap to triton_kernels at T = 1024-4096 is
the matmuls and how much the schedule, the gather and the combine. Each launch is reported apart (a tile and its
remainder tile: ``#0``, ``#1``); where vLLM imports (the kit), triton_kernels' ``matmul_ogs`` pair as
``benchmarks/peers.py`` times it is profiled too.
Usage: python benchmarks/experiments/moe_tile_profile.py [OUT.json] [T,T,...] [EXPERTS]  (EXPERTS: 128 is the 120b's,
32 the 20b's)"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for common
sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/, for moe_profile
from common import DEV, capture_graph, moe_decode_inputs, moe_weights, replay_ms  # noqa: E402
from moe_profile import profile_graph  # noqa: E402

from mxrepack.kernels.dequant_mxfp4 import fits_fold  # noqa: E402
from mxrepack.kernels.moe_mxfp4 import moe_mxfp4, pick_moe  # noqa: E402
from mxrepack.layouts import strided  # noqa: E402

H = I = 2880
HP = IP = 2944
K_TOP = 4


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else None
    Ts = [int(t) for t in sys.argv[2].split(",")] if len(sys.argv) > 2 else [64, 512, 1024, 4096]
    E = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    rows = [{"device": torch.cuda.get_device_name(), "experts": E}]
    W = moe_weights(E)
    fold = fits_fold(W["w13_weight_scale"], W["w2_weight_scale"])
    orders = {"rows": W}
    if torch.cuda.get_device_capability()[0] == 9:
        orders["wgmma"] = strided.from_row_major(strided.to_row_major(W), order="wgmma")
    try:  # the peer, on the same layer (its biases bf16-representable, as peers.py gives every implementation)
        import peers
        from peers import triton_kernels_moe

        peers.E = E  # its routing reads the module's expert count
        Wp = dict(W) | {n: W[n].bfloat16().float() for n in ("w13_bias", "w2_bias")}
        peer = triton_kernels_moe(Wp)[0]
    except Exception as e:  # noqa: BLE001 - no vLLM here: ours only
        print(f"triton_kernels not profiled: {type(e).__name__}: {e}"[:300], flush=True)
        peer = None
    for T in Ts:
        torch.manual_seed(T)
        x, ids, wts = moe_decode_inputs(T, E, K_TOP, H)
        flops_gu, flops_down = 2 * T * K_TOP * H * 2 * I, 2 * T * K_TOP * I * H
        a = torch.randn(T * K_TOP, HP, device=DEV, dtype=torch.bfloat16)
        b_gu = torch.randn(HP, 2 * IP, device=DEV, dtype=torch.bfloat16)
        b_down = torch.randn(IP, HP, device=DEV, dtype=torch.bfloat16)
        for what, fn, flops in (("gate_up", lambda: a @ b_gu, flops_gu), ("down", lambda: a @ b_down, flops_down)):
            ms = replay_ms(capture_graph(fn, 10), 10) / 10
            print(f"T={T} cuBLAS BF16 {what}: {ms * 1e3:.1f} us, {flops / ms / 1e9:.0f} TFLOP/s", flush=True)
            rows.append({"T": T, "what": f"cublas {what}", "us": ms * 1e3, "tflops": flops / ms / 1e9})
        runs = {
            order: (lambda Wo=Wo, cfg=cfg, order=order: moe_mxfp4(x, ids, wts, Wo, config=cfg, order=order), cfg.name())
            for order, Wo in orders.items()
            for cfg in [pick_moe(T, K_TOP, E, H, fold_scale=fold, order=order)]
        }
        if peer is not None:
            ids32 = ids.to(torch.int32)
            runs["triton_kernels"] = (lambda: peer(x, ids32, wts), "vLLM's matmul_ogs pair")
        for order, (fn, name) in runs.items():
            ms, kernels, gaps = profile_graph(fn, per_launch=True)
            print(f"T={T} {order} {name}: {ms * 1e3:.1f} us per call", flush=True)
            for k in kernels:
                print(f"   {k['kernel'][:56]:56s} {k['us_mean']:8.1f} us", flush=True)
            for what, flops in (("gate_up", flops_gu), ("down", flops_down)):  # a projection's launches together
                us = sum(k["us_mean"] for k in kernels if what in k["kernel"])
                if us:
                    print(f"   {what}: {us:.1f} us, {flops / us / 1e6:.0f} TFLOP/s", flush=True)
            rows.append({"T": T, "order": order, "config": name, "us_per_call": ms * 1e3, "kernels": kernels})
    if out:
        json.dump(rows, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
