"""lm_head (201088 x 2880) decode at M = 1: the f16x2 GEMV around its best tile, with register caps
(more warps in flight), against the fp32-math GEMV and cuBLAS BF16; CUDA-graph timed, weights rotating.
Usage: python benchmarks/experiments/gemv_f16x2_sweep.py [OUT.json]"""

import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for common
from common import bench_decode, copy_roofline, lm_head_m1  # noqa: E402

from mxrepack.kernels.gemv_mxfp4 import GemvConfig, gemv_mxfp4, prepare_x  # noqa: E402


def main() -> None:
    bw = copy_roofline()
    wbytes, nxt, nxt_b, x, out = lm_head_m1()
    ms_cublas = bench_decode(lambda: x @ nxt_b().T)
    ms_prepare = bench_decode(lambda: prepare_x(x))  # part of every f16x2 figure below
    rows = [
        {
            "device": torch.cuda.get_device_name(),
            "copy_TBps": bw / 1e12,
            "cublas_bf16_ms": ms_cublas,
            "prepare_x_ms": ms_prepare,
        }
    ]
    configs = [GemvConfig(64, 128, 4, 1, "asm")]
    configs += [
        GemvConfig(bn, bk, w, 1, "f16x2", prefetch=ahead)
        for bn, bk, w, ahead in itertools.product((4, 8, 16, 32), (128, 256, 512), (1, 2, 4), (1, 2))
        if bn * bk // 32 >= 32 * w
    ]
    for cfg in configs:
        try:
            ms = bench_decode(lambda: gemv_mxfp4(x, *nxt(), None, out, cfg), rep=50)
        except Exception as e:  # out of resources, a cap ptxas refuses
            print(f"{cfg.name()}: {type(e).__name__}", flush=True)
            continue
        rows.append(
            {"config": cfg.name(), "ms": ms, "vs_cublas": ms_cublas / ms, "roofline_frac": wbytes / (ms * 1e-3) / bw}
        )
    for r in sorted(rows[1:], key=lambda r: r["ms"])[:15]:
        print(
            f"{r['config']:28s} {r['ms']:.4f} ms  x{r['vs_cublas']:.2f} cuBLAS  "
            f"{100 * r['roofline_frac']:.0f}% roofline",
            flush=True,
        )
    print(f"cuBLAS BF16 {ms_cublas:.4f} ms, copy {bw / 1e12:.2f} TB/s, prepare_x alone {ms_prepare:.4f} ms")
    if len(sys.argv) > 1:
        json.dump(rows, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
