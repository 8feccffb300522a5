"""Where the scheduled MoE tiles' time goes (T >= 64): each kernel's duration from the CUDA profiler over CUDA-graph
replays of the shipped choice (120b shapes, folded scales, the rows order and, on Hopper, the wgmma order), with the
two matmul kernels' achieved TFLOP/s (routed rows only, unpadded) and the same products as one cuBLAS BF16 matmul
each (``T k x 2944 @ 2944 x 5888`` and ``x 2944``: what the tensor cores give these shapes without routing or
decode). The question it answers: how much of the gap to triton_kernels at T = 1024-4096 is the matmuls and how much
the schedule, the gather and the combine.
Usage: python benchmarks/experiments/moe_tile_profile.py [OUT.json] [T,T,...]"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for common
sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/, for moe_profile
from common import DEV, capture_graph, moe_decode_inputs, moe_weights, replay_ms  # noqa: E402
from moe_profile import REPLAYS, profile_graph  # noqa: E402

from mxrepack.kernels.dequant_mxfp4 import fits_fold  # noqa: E402
from mxrepack.kernels.moe_mxfp4 import moe_mxfp4, pick_moe  # noqa: E402
from mxrepack.layouts import strided  # noqa: E402

H = I = 2880
HP = IP = 2944
K_TOP = 4


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else None
    Ts = [int(t) for t in sys.argv[2].split(",")] if len(sys.argv) > 2 else [64, 512, 1024, 4096]
    rows = [{"device": torch.cuda.get_device_name()}]
    W = moe_weights()
    fold = fits_fold(W["w13_weight_scale"], W["w2_weight_scale"])
    orders = {"rows": W}
    if torch.cuda.get_device_capability()[0] == 9:
        orders["wgmma"] = strided.from_row_major(strided.to_row_major(W), order="wgmma")
    for T in Ts:
        torch.manual_seed(T)
        x, ids, wts = moe_decode_inputs(T, 128, K_TOP, H)
        flops_gu, flops_down = 2 * T * K_TOP * H * 2 * I, 2 * T * K_TOP * I * H
        a = torch.randn(T * K_TOP, HP, device=DEV, dtype=torch.bfloat16)
        b_gu = torch.randn(HP, 2 * IP, device=DEV, dtype=torch.bfloat16)
        b_down = torch.randn(IP, HP, device=DEV, dtype=torch.bfloat16)
        for what, fn, flops in (("gate_up", lambda: a @ b_gu, flops_gu), ("down", lambda: a @ b_down, flops_down)):
            ms = replay_ms(capture_graph(fn, 10), 10) / 10
            print(f"T={T} cuBLAS BF16 {what}: {ms * 1e3:.1f} us, {flops / ms / 1e9:.0f} TFLOP/s", flush=True)
            rows.append({"T": T, "what": f"cublas {what}", "us": ms * 1e3, "tflops": flops / ms / 1e9})
        for order, Wo in orders.items():
            cfg = pick_moe(T, K_TOP, 128, H, fold_scale=fold, order=order)
            ms, kernels, gaps = profile_graph(lambda: moe_mxfp4(x, ids, wts, Wo, config=cfg, order=order))
            print(f"T={T} {order} {cfg.name()}: {ms * 1e3:.1f} us per call", flush=True)
            for k in kernels:
                flops = flops_gu if "gate_up" in k["kernel"] else flops_down if "down" in k["kernel"] else 0
                launches = k["calls"] // REPLAYS  # a tile with a remainder tile launches each kernel twice a call
                k["tflops"] = flops / (k["us_mean"] * launches) / 1e6 if flops else None
                print(
                    f"   {k['kernel'][:50]:50s} {k['us_mean']:8.1f} us x{k['calls'] // REPLAYS}"
                    + (f"  {k['tflops']:.0f} TFLOP/s" if flops else ""),
                    flush=True,
                )
            rows.append({"T": T, "order": order, "config": cfg.name(), "us_per_call": ms * 1e3, "kernels": kernels})
    if out:
        json.dump(rows, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
