"""Pack (and unpack) speed of every expert layout on one gpt-oss-120b-shaped MoE layer. Not a test.

    python benchmarks/bench_layouts.py [--experts 128] [--chunk 16] [--layouts marlin,trtllm]

One layer = 128 experts, hidden = intermediate = 2880: 1.69 GB of packed source (blocks, scales,
biases). Random bytes (values don't matter to a permutation). Each layout packs the layer in chunks of
``--chunk`` experts, as the pipeline streams it, and the figure is source bytes / wall seconds on this
machine's threads. A baseline measured in the same run: ``torch.clone`` of the same source bytes (a
memory-bandwidth copy). Prints a Markdown table; ``--json FILE`` writes the records.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import date

import torch

from mxrepack.layouts import ExpertDims, make_layout
from mxrepack.repack.memory import keep_freed_memory


def layer(E: int, H: int, I: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "gate_up_proj_blocks": torch.randint(0, 256, (E, 2 * I, H // 32, 16), generator=g, dtype=torch.uint8),
        "gate_up_proj_scales": torch.randint(118, 131, (E, 2 * I, H // 32), generator=g, dtype=torch.uint8),
        "gate_up_proj_bias": torch.randn(E, 2 * I, generator=g).to(torch.bfloat16),
        "down_proj_blocks": torch.randint(0, 256, (E, H, I // 32, 16), generator=g, dtype=torch.uint8),
        "down_proj_scales": torch.randint(118, 131, (E, H, I // 32), generator=g, dtype=torch.uint8),
        "down_proj_bias": torch.randn(E, H, generator=g).to(torch.bfloat16),
    }


LAYOUTS = {
    "mxfp4": ("mxfp4", {}),
    "marlin": ("marlin", {}),
    "trtllm": ("trtllm", {}),
    "flashinfer-cutlass": ("flashinfer-cutlass", {}),
    "triton-hopper": ("triton-hopper", {}),
    "strided": ("strided", {}),
    "bf16": ("bf16", {}),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=2880)
    ap.add_argument("--intermediate", type=int, default=2880)
    ap.add_argument("--chunk", type=int, default=16)
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--json")
    a = ap.parse_args()
    keep_freed_memory()  # as repack() does: chunk buffers reuse pages instead of faulting in new ones
    dims = ExpertDims(a.experts, a.hidden, a.intermediate)
    parts = layer(a.experts, a.hidden, a.intermediate)
    src_bytes = sum(t.numel() * t.element_size() for t in parts.values())
    t0 = time.perf_counter()
    for t in parts.values():
        t.clone()
    copy_s = time.perf_counter() - t0
    rows = []
    for name in a.layouts.split(","):
        layout = make_layout(*LAYOUTS[name])
        outs = layout.outputs(dims)
        t0 = time.perf_counter()
        out_bytes = 0
        for e0 in range(0, a.experts, a.chunk):
            for o in outs:
                y = o.pack(**{k: parts[k][e0 : e0 + a.chunk] for k in o.inputs})
                out_bytes += y.numel() * y.element_size()
        pack_s = time.perf_counter() - t0
        # unpack timing on one chunk, scaled (verification speed)
        chunk = {o.suffix: o.pack(**{k: parts[k][: a.chunk] for k in o.inputs}) for o in outs}
        t0 = time.perf_counter()
        layout.unpack(chunk, dims)
        unpack_s = (time.perf_counter() - t0) * a.experts / a.chunk
        rows.append(
            {
                "layout": name,
                "source_GB": src_bytes / 1e9,
                "output_GB": out_bytes / 1e9,
                "pack_s": pack_s,
                "pack_GBps": src_bytes / pack_s / 1e9,
                "unpack_GBps": src_bytes / unpack_s / 1e9,
                "clone_GBps": src_bytes / copy_s / 1e9,
            }
        )
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, torch threads "
        f"{torch.get_num_threads()}, {date.today()}; one layer E={a.experts} H={a.hidden} I={a.intermediate}, "
        f"chunks of {a.chunk} experts"
    )
    print("| layout | source GB | output GB | pack s | pack GB/s | unpack GB/s | clone GB/s (baseline) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['layout']} | {r['source_GB']:.2f} | {r['output_GB']:.2f} | {r['pack_s']:.2f} | {r['pack_GBps']:.2f} "
            f"| {r['unpack_GBps']:.2f} | {r['clone_GBps']:.2f} |"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
