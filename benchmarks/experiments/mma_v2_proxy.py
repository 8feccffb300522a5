"""The H100 as a stand-in for sm_12x's instruction stream: Triton's ``DISABLE_MMA_V3=1`` makes an sm_90a build take
``mma.sync`` (MMA v2) instead of wgmma, as sm_120a/sm_121a builds do. CPU only: this compiles the rows order's shipped
MoE tiles for sm_121a and for sm_90a under the variable and compares their main loops, and checks that
``mma2_order_probe``'s byte order (the ``mma.sync`` fragment order for sm_12x) packs right on that sm_90a build.

    python benchmarks/experiments/mma_v2_proxy.py [OUT.json]

Why: the rows order is the one GB10 runs, and every figure of it so far is the H100's wgmma build, a different
instruction stream (the decoded operand goes to wgmma through shuffles; on sm_12x through shared memory to
``mma.sync``). Where the two builds' loops match, the H100 under ``DISABLE_MMA_V3=1`` can time GB10's code path
against Marlin (itself an ``mma.sync`` kernel) and verify the ``mma2`` order on a GPU. It cannot stand in for GB10's
memory bandwidth, SM count or clocks. The variable is one of Triton's cache-invalidating ones, so a launch under it
compiles its own kernels.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from pathlib import Path

os.environ["DISABLE_MMA_V3"] = "1"  # read by Triton's compiler at each build; set before any

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mma2_order_probe import PROBE_SIGNATURE, pack_ok, probe_kernel  # noqa: E402
from sass_vs_triton_kernels import loop_counts  # noqa: E402

from mxrepack.kernels import check  # noqa: E402
from mxrepack.kernels.moe_mxfp4 import MOE_TILES  # noqa: E402


def _counts(compiled) -> dict:
    c = loop_counts(compiled.asm["cubin"])
    ops = c["loop_ops"]
    return {"loop": c["loop"], "registers": c["registers"], "shared": int(compiled.metadata.shared)} | {
        op: ops.get(op, 0) for op in ("HMMA", "HGMMA", "LDS", "STS", "SHFL")
    }


def rows_order_tiles() -> list[dict]:
    """Every shipped rows-order MoE tile (and remainder tile) of the bf16 path, gate_up and down, on both targets."""
    tiles, rows = {}, []
    for _, cfg in MOE_TILES:
        for tile in (dataclasses.replace(cfg, remainder=None), cfg.remainder):
            if tile is not None:
                tiles[tile.name()] = dataclasses.replace(tile, fold_scale=tile.swap_ab)
    for name, tile in tiles.items():
        for kernel, src in check._moe_sources("bf16", tile).items():
            rec = {"tile": name, "kernel": kernel}
            for cap in (121, 90):
                compiled = triton.compile(
                    check.specialized(check.for_arch(src, cap)),
                    target=GPUTarget("cuda", cap, 32),
                    options={"num_warps": tile.num_warps, "num_stages": tile.num_stages},
                )
                rec[f"sm{cap}"] = _counts(compiled)
            rows.append(rec)
            print(json.dumps(rec), flush=True)
    return rows


def mma2_order_on_sm90() -> list[dict]:
    """``mma2_order_probe``'s decode under the variable: the operand's kWidth and the packing check, both targets."""
    rows = []
    for M, nsplit in ((16, 1), (64, 2)):
        rec = {"probe": "mma2 order", "M": M}
        for cap in (121, 90):
            const = {"M": M, "BLOCKS": 4, "ASM": True, "ORDER": "mma2", "NSPLIT": nsplit}
            compiled = triton.compile(
                check.specialized(ASTSource(probe_kernel, PROBE_SIGNATURE, const)),
                target=GPUTarget("cuda", cap, 32),
                options={"num_warps": 4, "num_stages": 3},
            )
            ttgir = compiled.asm["ttgir"]
            rec[f"sm{cap}"] = _counts(compiled) | {
                "kWidth": sorted(set(re.findall(r"kWidth = (\d+)", ttgir))),
                "pack_ok": pack_ok(ttgir),
            }
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    return rows


def main() -> None:
    record = {"triton": triton.__version__, "DISABLE_MMA_V3": os.environ["DISABLE_MMA_V3"]}
    record["rows_order_tiles"] = rows_order_tiles()
    record["mma2_order_probe"] = mma2_order_on_sm90()
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
