"""Data-free dense quantization speed and memory: lm_head (201088 x 2880) and the whole 120b dense set.

Runs the same code the pipeline runs (``DenseQuantizer``: quantize, store, error statistics), over
row chunks sized the way the pipeline sizes them, on synthetic N(0, 0.02) BF16 weights generated
chunk by chunk (generation is not timed). Prints a table and, with ``--json FILE``, writes the
figures with the machine, date and peak RSS.

    python benchmarks/bench_dense_quant.py [--formats mxfp4,mxfp8] [--only lm_head] [--json docs/bench/x.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time
from datetime import date

import torch

from mxrepack.layouts.dense import DenseMxLayout
from mxrepack.quant.dense import ErrorStats
from mxrepack.repack.pipeline import DEFAULT_CHUNK_BYTES

SHAPES_120B = {"q_proj": (4096, 2880), "k_proj": (512, 2880), "v_proj": (512, 2880), "o_proj": (2880, 4096)}
LM_HEAD = (201088, 2880)
LAYERS_120B = 36


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def quantize_tensor(layout: DenseMxLayout, shape: tuple[int, int], seed: int) -> tuple[float, dict]:
    """Seconds spent quantizing (values + scales + error stats) one [N, K] weight, chunked."""
    n, k = shape
    rows = max(1, DEFAULT_CHUNK_BYTES // (k * 2 * 8 + k * 2))
    stats = ErrorStats(f"bench.{seed}", k)
    g = torch.Generator().manual_seed(seed)
    spent = 0.0
    for r0 in range(0, n, rows):
        w = (torch.randn(min(rows, n - r0), k, generator=g) * 0.02).to(torch.bfloat16)
        t = time.perf_counter()
        values, scales = layout.quantize(w)
        layout.store(values, scales, k, "values")
        layout.store(values, scales, k, "scales")
        stats.add(w, layout.dequantize(values, scales))
        spent += time.perf_counter() - t
    return spent, stats.result()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="mxfp4,mxfp8")
    ap.add_argument("--rule", default="ocp")
    ap.add_argument("--search", action="store_true")
    ap.add_argument("--only", choices=["lm_head", "all"], default="all")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    records = []
    for fmt in a.formats.split(","):
        layout = DenseMxLayout(fmt, "plain", a.rule, a.search)
        secs, err = quantize_tensor(layout, LM_HEAD, 0)
        gb = LM_HEAD[0] * LM_HEAD[1] * 2 / 1e9
        records.append(
            {
                "what": "lm_head 201088x2880",
                "format": fmt,
                "seconds": round(secs, 2),
                "source_GB_per_s": round(gb / secs, 3),
                "rel_fro": round(err["rel_fro"], 5),
                "sqnr_db": round(err["sqnr_db"], 2),
                "peak_rss_MB": round(peak_rss_mb()),
            }
        )
        print(records[-1], flush=True)
        if a.only == "all":
            total, elems = secs, LM_HEAD[0] * LM_HEAD[1]
            for layer in range(LAYERS_120B):
                for i, shape in enumerate(SHAPES_120B.values()):
                    s, _ = quantize_tensor(layout, shape, 1 + layer * 4 + i)
                    total += s
                    elems += shape[0] * shape[1]
            records.append(
                {
                    "what": "120b dense set (36 x q/k/v/o + lm_head)",
                    "format": fmt,
                    "seconds": round(total, 1),
                    "source_GB_per_s": round(elems * 2 / 1e9 / total, 3),
                    "params": elems,
                    "peak_rss_MB": round(peak_rss_mb()),
                }
            )
            print(records[-1], flush=True)
    result = {
        "benchmark": "dense data-free quantization (values + scales + error stats)",
        "machine": f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}",
        "date": date.today().isoformat(),
        "scale_rule": a.rule,
        "scale_search": a.search,
        "chunk_budget_bytes": DEFAULT_CHUNK_BYTES,
        "records": records,
    }
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
