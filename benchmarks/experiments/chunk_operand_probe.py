"""Offline (CPU, ``triton.compile`` only): two ways of feeding the chunk orders' MoE tiles their weights, each built
beside the shipped tiles and counted from the SASS (each build's longest K loop by opcode, its shared memory, and the
shared-copy model of ``mxrepack.kernels.check``). PERF_LOG stop 47; neither was run on a GPU, both were refuted here.

* ``scales-once``: each block's 64-byte scale piece loaded once and broadcast to the 4 lanes of a quad in registers,
  instead of the shipped load of 8 bytes a lane (the 4 lanes of a quad copy the same bytes: the scale copies' 3.7x
  under ncu, stop 37). Both orders' folded tiles, wgmma on sm_90a, mma2 on sm_121a.
* ``words-int32``: the wgmma order's bytes decoded a word at a time on ``mma.sync`` (sm_121a, the mma2 order's tiles
  reading the wgmma order) with no 8-bit tensor in the decode's chain (scales loaded and kept as int32) and without
  ``words_mma_sync_probe.py``'s impure no-op: whether Triton then gives the dot kWidth 2 with no fence.

    python benchmarks/experiments/chunk_operand_probe.py scales-once|words-int32|shipped OUT.json

(``shipped``: the same tiles as they ship, the base of both.) Records:
``sass_chunk_scales_once_sm90_sm121_cpu_2026-11-29_ec5dd22.json``,
``sass_wgmma_words_int32_scales_mma_sync_sm121_cpu_2026-11-29_ec5dd22.json``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sass_vs_triton_kernels import loop_counts  # noqa: E402
from words_mma_sync_probe import wgmma_words_tile  # noqa: E402

import mxrepack.kernels.dequant_mxfp4 as dq  # noqa: E402
from mxrepack.kernels import check  # noqa: E402
from mxrepack.kernels.dequant_mxfp4 import _mma2_words, _wgmma_words, shift_scales  # noqa: E402


@triton.jit
def chunk_tile_scales_once(
    w_ptr, s_ptr, w_off, s_off, BLOCKS: tl.constexpr, MATH: tl.constexpr, ORDER: tl.constexpr, SCALE_SHIFT: tl.constexpr
):
    """``dequant_mxfp4.chunk_tile`` with each 64-byte scale piece loaded once and broadcast to a quad's 4 lanes."""
    i = tl.arange(0, 1024)[None, :]
    wb = tl.reshape(tl.load(w_ptr + w_off[:, None] + i), (BLOCKS, 32, 32))
    j = tl.arange(0, 64)[None, :]
    s64 = tl.reshape(tl.load(s_ptr + s_off[:, None] + j), (BLOCKS, 8, 1, 8))
    sc = shift_scales(tl.reshape(tl.broadcast_to(s64, (BLOCKS, 8, 4, 8)), (BLOCKS, 32, 8)), SCALE_SHIFT)
    if ORDER == "mma2":
        r0, r1 = _mma2_words(wb, sc, BLOCKS, MATH)
        x = tl.reshape(tl.join(r0, r1), (BLOCKS, 8, 4, 4, 2, 4, 2))
        x = tl.permute(x, (0, 4, 1, 3, 2, 6, 5))
    else:
        r0, r1 = _wgmma_words(wb, sc, BLOCKS, MATH)
        x = tl.reshape(tl.join(r0, r1), (BLOCKS, 8, 4, 8, 2, 2, 2))
        x = tl.permute(x, (0, 6, 1, 3, 4, 2, 5))
    return tl.reshape(x, (16 * BLOCKS, 128))


@triton.jit
def chunk_tile_words_int32(
    w_ptr, s_ptr, w_off, s_off, BLOCKS: tl.constexpr, MATH: tl.constexpr, ORDER: tl.constexpr, SCALE_SHIFT: tl.constexpr
):
    """The wgmma order decoded a word at a time (``words_mma_sync_probe.wgmma_words_tile``) with the scales kept int32
    and no impure no-op before the dot (every tile of this variant reads the wgmma order: :func:`_tiles`)."""
    tl.static_assert(ORDER == "wgmma", "words-int32 builds the wgmma order's bytes only")
    return wgmma_words_tile(w_ptr, s_ptr, w_off, s_off, BLOCKS, MATH, SCALE_SHIFT, False)


def _tiles(variant: str):
    """(name, ASTSource, warps, stages, cap): the folded chunk-order MoE tiles each variant is compared on."""
    for kernel, config, _, src, warps, stages in check.shipped_kernels():
        if not kernel.startswith("moe_") or "remainder" in config or "+fold" not in config:
            continue
        order = config.split()[0]
        if order not in ("wgmma", "mma2") or (variant == "words-int32" and order != "mma2"):
            continue
        if variant == "words-int32":  # the mma2 order's tile reading the wgmma order, on mma.sync
            names = list(src.fn.arg_names)
            key = "ORDER" if "ORDER" in src.constants else (names.index("ORDER"),)
            src = ASTSource(src.fn, src.signature, dict(src.constants) | {key: "wgmma"}, src.attrs)
            config = f"wgmma bytes in the {config}"
        yield f"{kernel} {config}", src, warps, stages, 90 if order == "wgmma" else 121


def main() -> None:
    variant, out = sys.argv[1], sys.argv[2]
    if variant == "scales-once":
        dq.chunk_tile = chunk_tile_scales_once  # chunk_dots reads it from the module at compile time
    elif variant == "words-int32":
        dq.chunk_tile = chunk_tile_words_int32
    elif variant != "shipped":
        raise SystemExit("variant: scales-once, words-int32 or shipped")
    rows = {}
    for name, src, warps, stages, cap in _tiles(variant):
        c = triton.compile(
            check.specialized(src),
            target=GPUTarget("cuda", cap, 32),
            options={"num_warps": warps, "num_stages": stages},
        )
        lc = loop_counts(c.asm["cubin"])
        rows[name] = {
            "arch": f"sm_{cap}a",
            "shared": c.metadata.shared,
            "loop": lc["loop"],
            "registers": lc["registers"],
            "kWidth": sorted(set(re.findall(r"kWidth = (\d+)", c.asm["ttgir"]))),
            "loop_ops": {
                k: lc["loop_ops"].get(k, 0) for k in ("LDS", "LDSM", "STS", "LDGSTS", "MOV", "PRMT", "HMMA", "HGMMA")
            },
            "copies": [
                (c_["shape"], c_["wavefronts"], c_["ideal"]) for c_ in check.shared_copy_wavefronts(c.asm["ttgir"])
            ],
        }
        print(name, json.dumps(rows[name]), flush=True)
    meta = {"variant": variant, "triton": triton.__version__, "machine": "cpu (triton.compile only)"}
    Path(out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
