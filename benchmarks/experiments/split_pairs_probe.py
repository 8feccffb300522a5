"""GPU time of ``split_pairs`` (the swapped tiles' activations, even then odd columns per 128-column tile): torch's pad
and copy, which it was until stop 49, against its Triton kernel at a few tiles per program, in CUDA graphs.

    python benchmarks/experiments/split_pairs_probe.py [OUT.json]     # GPU machine

gpt-oss's hidden width (2880 -> 2944) at the token counts where the rows order's swapped tiles run, dense (lm_head at
16-64 rows) and MoE (up to 4096 tokens); each form's output compared bit for bit with torch's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import bench_decode  # noqa: E402

import mxrepack.kernels.dequant_mxfp4 as dq  # noqa: E402
from mxrepack.kernels import cdiv  # noqa: E402

K, WIDTH = 2880, 2944
FORMS = {"tiles1_warps1": (1, 1), "tiles4_warps2": (4, 2), "tiles8_warps4": (8, 4)}  # (TILES, num_warps)


def torch_split(x: torch.Tensor) -> torch.Tensor:
    T = x.shape[0]
    x = torch.nn.functional.pad(x, (0, WIDTH - K))
    return x.reshape(T, WIDTH // 128, 64, 2).transpose(2, 3).reshape(T, WIDTH)


def kernel_split(x: torch.Tensor, out: torch.Tensor, tiles: int, warps: int) -> torch.Tensor:
    grid = (x.shape[0], cdiv(WIDTH // 128, tiles))
    dq._split_pairs_kernel[grid](x, out, K, WIDTH, x.stride(0), x.stride(1), TILES=tiles, num_warps=warps)
    return out


def main(out_path: str | None = None) -> None:
    rows = []
    for T in (16, 64, 512, 1024, 4096):
        x = torch.randn(T, K, device="cuda").to(torch.bfloat16)
        ref = torch_split(x)
        rec = {"T": T, "torch_us": bench_decode(lambda: torch_split(x)) * 1e3}
        for name, (tiles, warps) in FORMS.items():
            out = torch.empty(T, WIDTH, dtype=torch.bfloat16, device="cuda")
            rec[f"{name}_same_bits"] = bool(torch.equal(kernel_split(x, out, tiles, warps), ref))
            rec[f"{name}_us"] = bench_decode(lambda: kernel_split(x, out, tiles, warps)) * 1e3
        rec["shipped_us"] = bench_decode(lambda: dq.split_pairs(x, WIDTH)) * 1e3
        rows.append(rec)
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in rec.items()}), flush=True)
    if out_path:
        meta = {
            "script": "benchmarks/experiments/split_pairs_probe.py",
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": __import__("triton").__version__,
        }
        Path(out_path).write_text(json.dumps(meta | {"rows": rows}, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
