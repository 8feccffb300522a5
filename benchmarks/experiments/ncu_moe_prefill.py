"""Our kernels under Nsight Compute. The 20b's prefill MoE: our wgmma order's shipped kernels and triton_kernels'
pair on the same layer and routing draw, one warm call each inside ``cudaProfilerStart/Stop``, so that
``ncu --profile-from-start off`` reads exactly those launches. The question: at 512 routed rows per expert (32
experts, top-4, T = 4096) the two gate_up tiles have the same shape and MMA count, yet triton_kernels' reaches about
510 TFLOP/s on the routed rows and ours about 435 (PERF.md, "The 20b's prefill"). The hardware counters say where
ours waits: warp stall reasons, tensor-pipe use, shared-memory bank conflicts, issue slots.

Usage, on the GPU machine with vLLM importable (the kit):
  ncu --clock-control none --profile-from-start off --set full -o OUT/moe \
      python benchmarks/experiments/ncu_moe_prefill.py [T] [EXPERTS] [ours|peer|both]
then ``ncu -i OUT/moe.ncu-rep --page details --csv`` (and ``--page source --print-source sass``), summarized by
``ncu_summary.py``. ``dense`` instead of ours/peer/both: the q/k/v/o W4A16 layers at M = 4, 16 and 64 (the first
argument ignored), the sizes where they trail Marlin and cuBLAS (PERF.md, "Dense W4A16"); ``dense-chunk``: the same
layers in the chunk order this build reads (wgmma; mma2 under ``DISABLE_MMA_V3``) at M = 1, 16 and 64, and cuBLAS BF16
at 64 beside them."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for common and peers
from common import moe_decode_inputs, moe_weights, rand_mx  # noqa: E402

from mxrepack.kernels.dequant_mxfp4 import fits_fold  # noqa: E402
from mxrepack.kernels.linear_mxfp4 import linear_mxfp4  # noqa: E402
from mxrepack.kernels.moe_mxfp4 import moe_mxfp4, pick_moe  # noqa: E402
from mxrepack.layouts import strided  # noqa: E402

H = 2880
K_TOP = 4


def main() -> None:
    T = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    E = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    which = sys.argv[3] if len(sys.argv) > 3 else "both"
    if which in ("dense", "dense-chunk"):
        return profile(dense_runs(which == "dense-chunk"))
    W = moe_weights(E)
    fold = fits_fold(W["w13_weight_scale"], W["w2_weight_scale"])
    torch.manual_seed(T)
    x, ids, wts = moe_decode_inputs(T, E, K_TOP, H)
    runs = {}
    if which in ("ours", "both"):
        Wo = strided.from_row_major(strided.to_row_major(W), order="wgmma")
        cfg = pick_moe(T, K_TOP, E, H, fold_scale=fold, order="wgmma")
        runs[f"ours {cfg.name()}"] = lambda: moe_mxfp4(x, ids, wts, Wo, config=cfg, order="wgmma")
    if which in ("peer", "both"):
        import peers

        peers.E = E  # its routing reads the module's expert count
        Wp = dict(W) | {n: W[n].bfloat16().float() for n in ("w13_bias", "w2_bias")}
        peer = peers.triton_kernels_moe(Wp)[0]
        ids32 = ids.to(torch.int32)
        runs["triton_kernels"] = lambda: peer(x, ids32, wts)
    profile(runs)


def dense_runs(chunk: bool = False) -> dict:
    from dense_chunk_probe import chunk_pack
    from peers import chunk_order_here

    order = chunk_order_here()
    runs = {}
    for layer, (N, K) in {"qkv": (5120, 2880), "o": (2880, 4096)}.items():
        w, ws = rand_mx(N, K)
        fold = fits_fold(ws)  # once, as a loader asks: not a reduction inside each profiled call
        if chunk:
            wc = chunk_pack(w, ws, order)
            wb = torch.randn(N, K, device="cuda").to(torch.bfloat16)
            for M in (1, 16, 64):
                x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
                runs[f"{layer} {order} M = {M}"] = lambda x=x, wc=wc, fold=fold: linear_mxfp4(
                    x, *wc, None, "w4a16", fold_scale=fold, order=order
                )
            runs[f"{layer} cublas M = 64"] = lambda x=x, wb=wb: x @ wb.T
            continue
        for M in (4, 16, 64):
            x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
            runs[f"{layer} M = {M}"] = lambda x=x, w=w, ws=ws, fold=fold: linear_mxfp4(
                x, w, ws, None, "w4a16", fold_scale=fold
            )
    return runs


def profile(runs: dict) -> None:
    for name, fn in runs.items():
        for _ in range(3):  # compiled and warm before the profiled call
            fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(f"profiled: {name}", flush=True)


if __name__ == "__main__":
    main()
