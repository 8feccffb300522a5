"""The chunk orders' weight reads from shared memory, and a stored byte order that makes them conflict-free.

Every chunk-order tile (the strided layout's wgmma and mma2 orders, MoE and dense) copies each 16-row block's 1 KB
weight chunk of a K tile into shared memory as one row (``dequant_mxfp4.chunk_tile``, since stop 37) and reads it back
with lane l's 32 bytes at ``32 l .. 32 l + 31``: two ``LDS.128`` a lane, a warp's first touching 16 bytes of every 32
across the whole chunk, so 8 shared-memory wavefronts where 4 would do. Under ncu (stop 37, the 20b's gate_up at
T = 4096 on an H200) these reads were 8.8M of the 15.4M wavefronts over the ideal, the largest excess left.

Stored as (half, lane, 16 bytes) instead -- lane l's bytes 0-15 at ``16 l``, bytes 16-31 at ``512 + 16 l`` -- each
``LDS.128`` of a warp reads 512 contiguous bytes. ``chunk_tile``'s read becomes ``reshape [BLOCKS, 2, 32, 16]``,
``permute (0, 2, 1, 3)``, ``reshape [BLOCKS, 32, 32]``; the global copies stay rows. Offline (stop 51, Triton 3.6,
sm_90a and sm_121a; ``layouts``' record ``chunk_halves_probe_layouts_triton36_cpu_2026-11-29_d61129a.json``): every
shipped chunk tile's W read (18 MoE builds, 44 dense) then has lane bases 16 .. 256 bytes and a register basis of 512
(shipped: lanes 32 .. 512), the same K loops within 2 instructions on sm_90a (the 20b's prefill gate_up 528 -> 527,
down 512 -> 510; sm_121a's SASS is not read by 3.6's cuobjdump), registers equal or fewer but in one build (+1). Stack
on sm_121a: the mma2 MoE's 128-token gate_up 168 -> 160 bytes, but the mma2 order's 64-row dense lm_head tiles
(``chunk_wide64``) 24 -> 56 and 40 -> 48 (folded). The prefill tile's words still packed and no register hazard
(printed).
Timed (stop 52, three H200s, Triton 3.6, ``chunk_halves_ab.sh``: each tree in a process of its own, taken in turns,
2-3 rounds; record ``chunk_halves_ab_h200_2026-11-29_9a3914c.json``), the halves read against the shipped one, medians:
the MoE tiles faster or level in both orders at every T timed (8-8192; 32 experts), by up to 2.3%, e.g. the wgmma
order at T = 4096 -0.8 / -1.1% on two machines, at 8192 -0.9 / -0.9%. The dense tiles (one weight, L2-resident) moved
both ways: o +0.3 to -3.3%; qkv at 16 rows +1% (wgmma) and -2% (mma2), at 64 rows +1.3 / +2.2% (wgmma) and
**+6.3 / +6.5%** (mma2). Not shipped: it is a format change of the chunk orders (their stored bytes, the GEMVs' and the
prefill dequantizer's word addressing, a version the plugin checks) for about 1% of the MoE, and the dense qkv tiles at
64 rows lose with it; worth carrying with the next change of the chunk orders' bytes, after a look at those tiles.

The ``gather`` read (``tree DIR gather``) keeps the shipped bytes and loads each chunk's 16-byte pieces in the halves
order, so shared memory holds, and the tiles read, what the halves tree's do, with no format change. It was 5-47%
slower (the MoE +37-47% at T = 16-64, +5-18% from 512; the dense tiles +10-25%): its copies step 32 bytes across a
warp, and ``cp.async.cg`` bypasses L1, so (the likely cause, not measured) each 32-byte sector is requested from L2
twice.

The decode GEMVs (T <= 2) and the prefill dequantizer load lane l's 8 words with two 16-byte loads 32 bytes apart
across the warp (TTGIR: sizePerThread [1, 1, 8] on [blocks, 32, 8] int32). Those are plain loads, which may find the
sector in L1 the second time. The halves and gather trees leave them unchanged (they read the shipped bytes), so their
``time`` stays at T >= 3 and 16-64 rows, where only the tiles run.

The ``words`` tree (``tree DIR words``) changes those loads instead: each lane's words loaded as (half, 4 words), so a
warp's 16-byte loads read 512 contiguous bytes (the shipped bytes; the tiles as shipped). It gives the same bits
(``prefill_probe.py check`` in that tree on an H200, both orders). Timed (stop 52; record
``chunk_words_load_ab_h200_2026-11-29_9a3914c.json``), it lost: the MoE's decode GEMVs at T = 1 / 2 0.0702 / 0.0803 ms
against 0.0464 / 0.0687 (+51% / +17%; the wgmma order, one run a tree); the prefill dequantizer alone level (-1.3 to
+0.2%, two runs a tree in turns, both orders); the wgmma order's dequantizer builds 408 instructions against 336 on
sm_90a (Triton 3.9), with two more layout conversions.

    python benchmarks/experiments/chunk_halves_probe.py tree DIR [halves|gather|words]   # mxrepack so changed, in DIR
    python benchmarks/experiments/chunk_halves_probe.py layouts [OUT.json] [halves|gather]   # beside the shipped (CPU)
    PYTHONPATH=DIR python benchmarks/experiments/chunk_halves_probe.py time OUT.json [T,T,...] [EXPERTS]   # GPU
    PYTHONPATH=DIR ncu --profile-from-start off --set full -o OUT/TREE \
        python benchmarks/experiments/chunk_halves_probe.py profile [T] [EXPERTS]      # GPU, under Nsight Compute

(``tree``'s folder lasts only as long as the lent machine: write it in the call that times.)

``time`` runs under whichever tree ``PYTHONPATH`` gives (the repository's, or ``tree``'s copy): the shipped MoE
dispatch of the order this GPU runs (wgmma on Hopper; mma2 on sm_12x / sm_8x or a Hopper under ``DISABLE_MMA_V3``) at
each T (the tiles from T = 3, the decode GEMVs below: the words tree's change runs only at T = 1, 2),
on a random 120b-shaped layer (``EXPERTS``, 128 unless given; stop 52 ran 32, the 20b's count) whose stored chunks
are put in the tree's read order, against the fp32 reference, and qkv / o through ``linear_mxfp4``'s chunk tiles at 16
and 64 rows (T ``""``: the dense tiles only). ``chunk_halves_ab.sh`` runs the trees alternately in one device call.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(1, str(ROOT / "benchmarks"))
BAD_ERR = 0.02  # a run's error past this: the bytes were not in the order its tree reads (about 1.3 then)

SHIPPED_READ = (
    "    i = tl.arange(0, 1024)[None, :]\n    wb = tl.reshape(tl.load(w_ptr + w_off[:, None] + i), (BLOCKS, 32, 32))\n"
)
HALVES_READ = (
    "    # (half, lane, 16 bytes) per chunk: each LDS.128 of a warp reads 512 contiguous bytes (chunk_halves_probe)\n"
    "    i = tl.arange(0, 1024)[None, :]\n"
    "    wb = tl.load(w_ptr + w_off[:, None] + i)\n"
    "    wb = tl.reshape(tl.permute(tl.reshape(wb, (BLOCKS, 2, 32, 16)), (0, 2, 1, 3)), (BLOCKS, 32, 32))\n"
)


GATHER_READ = (
    "    # the stored chunk loaded as (half, lane, 16 bytes): the halves read, shipped bytes (chunk_halves_probe)\n"
    "    i = tl.arange(0, 1024)\n"
    "    i = (32 * ((i // 16) % 32) + 16 * (i // 512) + i % 16)[None, :]\n"
    "    wb = tl.load(w_ptr + w_off[:, None] + i)\n"
    "    wb = tl.reshape(tl.permute(tl.reshape(wb, (BLOCKS, 2, 32, 16)), (0, 2, 1, 3)), (BLOCKS, 32, 32))\n"
)


SHIPPED_WORDS = (
    "    words = tl.load(w_ptr.to(tl.pointer_type(tl.int32)) + w_off // 4 + lane * 8"
    " + tl.arange(0, 8)[None, None, :])\n"
)
WORDS_READ = (
    "    # each lane's 8 words as (half, 4 words): a warp's 16-byte loads read 512 contiguous bytes (probe)\n"
    "    base = w_ptr.to(tl.pointer_type(tl.int32)) + w_off[:, :, :, None] // 4 + lane[:, :, :, None] * 8\n"
    "    half = 4 * tl.arange(0, 2)[None, None, :, None] + tl.arange(0, 4)[None, None, None, :]\n"
    "    words = tl.reshape(tl.load(base + half), (w_off.shape[0], 32, 8))\n"
)


def tree(out: str, read: str = "halves") -> None:
    """A copy of the repository's ``mxrepack`` in ``out`` with one read changed: ``chunk_tile`` reading the halves
    order from bytes stored so (``read`` "halves"), or from the shipped bytes by loading each chunk's 16-byte pieces in
    that order ("gather": the same shared-memory buffer and reads, no format change; the copies' global addresses then
    step 32 bytes across a warp); or the chunk words' global loads (GEMVs, prefill dequantizer) as (half, 4 words)
    ("words": the shipped bytes, the tiles as shipped)."""
    old, new = {
        "halves": (SHIPPED_READ, HALVES_READ),
        "gather": (SHIPPED_READ, GATHER_READ),
        "words": (SHIPPED_WORDS, WORDS_READ),
    }[read]
    dst = Path(out) / "mxrepack"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(ROOT / "mxrepack", dst, ignore=shutil.ignore_patterns("__pycache__"))
    path = dst / "kernels" / "dequant_mxfp4.py"
    text = path.read_text()
    if text.count(old) != 1:
        raise SystemExit(f"{path}: the load this probe's {read} tree replaces is not there as written")
    path.write_text(text.replace(old, new))
    print(dst)


def read_here() -> str:
    """How the imported mxrepack reads a chunk: "shipped", "halves", "gather" or "words" (``tree``'s copies)."""
    from mxrepack.kernels import dequant_mxfp4

    if "half = 4 * tl.arange(0, 2)" in inspect.getsource(dequant_mxfp4._word_pairs_asm.fn):
        return "words"
    src = inspect.getsource(dequant_mxfp4.chunk_tile.fn)  # gather's read also holds the halves' reshape: first
    return "gather" if "(i // 512)" in src else "halves" if "(BLOCKS, 2, 32, 16)" in src else "shipped"


def halves_here() -> bool:
    """Whether the imported mxrepack reads chunks stored in the halves order (``tree``'s "halves" copy)."""
    return read_here() == "halves"


def _layouts_here() -> list[dict]:
    """Each shipped chunk tile (the MoE's gate_up and down, and the dense tiles ``linear_chunks`` picks at gpt-oss's
    widths), built offline where its order runs: the W read's layout (``local_load`` of the [rows, 1024] i8 chunk
    buffer) and the K loop's instruction counts."""
    import mxrepack  # first, as in time(): sass_vs_triton_kernels puts the repository first on the path

    read = read_here()
    import triton
    from sass_vs_triton_kernels import loop_counts
    from triton.backends.compiler import GPUTarget

    from mxrepack.kernels import check
    from mxrepack.kernels.moe_mxfp4 import MOE_TILES_BY_ORDER

    rows = []
    for order, cap in (("wgmma", 90), ("mma2", 121)):
        builds = [
            (bound, cfg, kernel, src, cfg.num_warps, cfg.num_stages)
            for bound, cfg in MOE_TILES_BY_ORDER[order]
            for kernel, src in check._moe_sources("bf16", cfg).items()
        ]
        # and the dense tiles the dispatch picks at gpt-oss's widths (the same chunk_tile read)
        builds += [
            (name, tile, "linear_chunks", check._linear_chunks_source(tile, order), tile.num_warps, tile.num_stages)
            for name, tile in check.chunk_tiles(order).items()
        ]
        for bound, cfg, kernel, src, warps, stages in builds:
            built = triton.compile(
                check.specialized(check.for_arch(src, cap)),
                target=GPUTarget("cuda", cap, 32),
                options={"num_warps": warps, "num_stages": stages},
            )
            ttgir = built.asm["ttgir"]
            layouts = {m.group(1): m.group(2) for m in re.finditer(r"^(#[\w.]+) = (.*)$", ttgir, re.M)}
            reads = [
                layouts.get(m.group(1), m.group(1))
                for m in re.finditer(r"local_load.*-> tensor<\d+x1024xi8, (#[\w.]+)>", ttgir)
            ]
            rows.append(
                {
                    "tree": read,
                    "mxrepack": mxrepack.__file__,
                    "order": order,
                    "arch": f"sm_{cap}a",
                    "picked_as": bound,  # the MoE table's rows bound, or the dense tile's name in CHUNK_CONFIGS
                    "config": cfg.name(),
                    "kernel": kernel,
                    "w_read_layouts": sorted(set(reads)),
                    "loop": loop_counts(built.asm["cubin"]),
                }
            )
    return rows


def layouts(out: str | None = None, read: str = "halves") -> None:
    """The shipped read and ``read`` (``tree``'s) side by side, each tree built in a process of its own (Triton caches
    by source)."""
    import tempfile

    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        tree(tmp, read)
        for name, path in (("shipped", str(ROOT)), (read, tmp)):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([path, os.environ.get("PYTHONPATH", "")]))
            run = subprocess.run(
                [sys.executable, __file__, "_layouts"], env=env, capture_output=True, text=True, check=True
            )
            result[name] = json.loads(run.stdout.splitlines()[-1])
            if {r["tree"] for r in result[name]} != {name}:
                raise SystemExit(f"the {name} builds imported another tree's mxrepack: {result[name][0]['mxrepack']}")
    for a, b in zip(result["shipped"], result[read]):
        print(
            f"{a['order']:5s} {a['arch']} {a['config']:60s} {a['kernel']:20s} loop {_loop(a)} -> {_loop(b)}, "
            f"registers {a['loop']['registers']} -> {b['loop']['registers']}, stack {a['loop']['stack_bytes']} -> "
            f"{b['loop']['stack_bytes']}; lanes {_lane_bases(a)} -> {_lane_bases(b)}"
        )
    if out:
        Path(out).write_text(json.dumps(result, indent=1))


def _loop(row: dict) -> str:
    """The K loop's instruction count, or "?" where this Triton's cuobjdump gave no SASS (sm_121a under 3.6)."""
    return str(row["loop"]["loop"]) if row["loop"]["total"] else "?"


def _lane_bases(row: dict) -> str:
    found = re.search(r"lane = (\[\[.*?\]\])", " ".join(row["w_read_layouts"]))
    return found.group(1) if found else "?"


def _to_halves(stored):
    """Stored chunk-order bytes (whole 1 KB chunks in memory order) with each chunk's lane-major 32-byte runs split
    into (half, lane, 16 bytes)."""
    flat = stored.contiguous().view(-1, 32, 2, 16)
    return flat.transpose(1, 2).contiguous().view(stored.shape)


def _order_here() -> str:
    """The chunk order this GPU's tiles run (wgmma on Hopper; mma2 where Triton builds mma.sync)."""
    from peers import mma2_here, wgmma_here

    order = "wgmma" if wgmma_here() else "mma2" if mma2_here() else None
    if order is None:
        raise SystemExit("no chunk order runs on this GPU")
    return order


def _moe_layer(experts: int, order: str, halves: bool):
    """(the layer row-major, the same bytes in ``order`` -- split into halves for the halves tree --, fold): a random
    120b-shaped layer of ``experts``, seeded, so that every tree gets the same weights."""
    import torch
    from common import moe_weights
    from peers import HP, IP, H, ordered_layer

    from mxrepack.kernels.dequant_mxfp4 import fits_fold

    torch.manual_seed(0)
    W = moe_weights(experts, H, 2880, HP, IP)
    Wc = ordered_layer(W, order)
    if halves:
        Wc = dict(Wc, w13_weight=_to_halves(Wc["w13_weight"]), w2_weight=_to_halves(Wc["w2_weight"]))
    return W, Wc, fits_fold(W["w13_weight_scale"], W["w2_weight_scale"])


def time(out: str, ts: str = "64,512,2048,4096,8192", experts: str = "128") -> None:
    # first: the tree PYTHONPATH names (the repository's or ``tree``'s copy), before benchmarks/common.py puts the
    # repository first on the path (submodules then come from the package imported here)
    import mxrepack

    tree_file = mxrepack.__file__
    import torch
    from common import moe_decode_inputs, moe_reference
    from peers import HP, IP, K_TOP, H, rel_err, time_it

    from mxrepack.kernels.moe_mxfp4 import moe_mxfp4, pick_moe

    halves = halves_here()
    order = _order_here()
    E = int(experts)
    W, Wc, fold = _moe_layer(E, order, halves)  # both trees time the same bytes
    meta = {
        "tree": read_here(),
        "mxrepack": tree_file,
        "order": order,
        "experts": E,
        "device": torch.cuda.get_device_name(),
        "triton": __import__("triton").__version__,
        "DISABLE_MMA_V3": os.environ.get("DISABLE_MMA_V3", ""),
    }
    rows = [meta]

    def keep(row: dict) -> None:  # each row written as it comes: a failure or the call's time limit loses none
        if row.get("rel_err", 0.0) > BAD_ERR:
            row["wrong_bytes"] = True
        rows.append(row)
        print(json.dumps(row), flush=True)
        Path(out).write_text(json.dumps(rows, indent=1))

    for T in (int(t) for t in ts.split(",") if t):  # none (""): the dense tiles only
        try:
            torch.manual_seed(T)
            x, ids, wts = moe_decode_inputs(T, E, K_TOP, H)
            ref = moe_reference(x, ids, wts, W, H, HP, IP)
            cfg = pick_moe(T, K_TOP, E, H, fold_scale=fold, order=order)  # the tiles from T = 3 (GEMVs below)
            run = lambda: moe_mxfp4(x, ids, wts, Wc, fold_scale=fold, order=order)  # noqa: E731
            ms, how = time_it(run, T)
            keep({"T": T, "config": cfg.name(), "ms": ms, "timing": how, "rel_err": rel_err(run(), ref)})
        except Exception as e:  # noqa: BLE001 - recorded, the other sizes still run
            keep({"T": T, "error": f"{type(e).__name__}: {e}"[:500]})
    _dense(order, halves, keep)


def _dense(order: str, halves: bool, keep) -> None:
    """qkv and o through the dense chunk tiles (:func:`_dense_cases`), timed."""
    from peers import rel_err, time_it

    for name, M, run, ref in _dense_cases(order, halves):
        try:
            ms, how = time_it(run, M)
            keep({"layer": name, "M": M, "ms": ms, "timing": how, "rel_err": rel_err(run(), ref())})
        except Exception as e:  # noqa: BLE001 - recorded, the other layers still run
            keep({"layer": name, "M": M, "error": f"{type(e).__name__}: {e}"[:500]})


def _dense_cases(order: str, halves: bool):
    """(layer, rows, run, reference) for qkv and o at 16 and 64 rows through the dense chunk tiles (no GEMV and no
    dequantize + cuBLAS at these rows: every launch reads through ``chunk_tile``), folded as shipped, weights stored in
    the tree's read order. One weight each, not rotated: it stays in L2, so these isolate the tile, and are not
    comparable with peers.py's figures."""
    import torch
    from common import DEV, deq, rand_mx
    from dense_chunk_probe import chunk_pack

    from mxrepack.kernels.dequant_mxfp4 import fits_fold
    from mxrepack.kernels.linear_mxfp4 import linear_mxfp4

    for name, (N, K) in {"qkv": (5120, 2880), "o": (2880, 4096)}.items():
        torch.manual_seed(N)
        w, s = rand_mx(N, K)
        wc, sc = (t.to(DEV) for t in chunk_pack(w.cpu(), s.cpu(), order))  # packed on the CPU, as the repacker
        if halves:
            wc = _to_halves(wc)
        fold = fits_fold(s)
        for M in (16, 64):
            x = torch.randn(M, K, device=DEV).to(torch.bfloat16)
            run = lambda x=x, wc=wc, sc=sc, fold=fold: linear_mxfp4(  # noqa: E731
                x, wc, sc, None, "w4a16", fold_scale=fold, order=order
            )
            ref = lambda x=x, w=w, s=s: x.float() @ deq(w, s).T  # noqa: E731 - on the GPU, as peers.py's reference
            yield name, M, run, ref


def profile(t: str = "4096", experts: str = "32") -> None:
    """For ``ncu --profile-from-start off``, in each tree: one warm call each of the MoE at ``t`` tokens (``experts``;
    "" for none) and of the dense tiles (:func:`_dense_cases`) inside ``cudaProfilerStart/Stop``, the weights in this
    tree's read order (``ncu_moe_prefill.profile``). Stop 52's question: why qkv at 64 rows (the 64-row tile) loses
    with the halves read while the MoE and o gain; the loops are the same length in both trees."""
    import mxrepack  # first, as in time(): the tree PYTHONPATH names

    tree_file = mxrepack.__file__
    from common import moe_decode_inputs
    from ncu_moe_prefill import profile as profiled
    from peers import K_TOP, H

    from mxrepack.kernels.moe_mxfp4 import moe_mxfp4

    halves = halves_here()
    order = _order_here()
    print(f"tree {read_here()} ({tree_file}), order {order}", flush=True)
    runs = {}
    if t:
        _, Wc, fold = _moe_layer(int(experts), order, halves)
        x, ids, wts = moe_decode_inputs(int(t), int(experts), K_TOP, H)
        runs[f"moe T = {t}"] = lambda: moe_mxfp4(x, ids, wts, Wc, fold_scale=fold, order=order)
    for name, M, run, _ in _dense_cases(order, halves):
        runs[f"{name} M = {M}"] = run
    profiled(runs)


if __name__ == "__main__":
    if sys.argv[1] == "_layouts":
        sys.path.insert(0, str(ROOT / "benchmarks" / "experiments"))
        print(json.dumps(_layouts_here()))
    else:
        {"tree": tree, "layouts": layouts, "time": time, "profile": profile}[sys.argv[1]](*sys.argv[2:])
