"""Which tile the chunk orders' dense W4A16 (``linear_mxfp4.linear_chunks``: weights in the dense layout's wgmma /
mma2 order) should take at each row count: every candidate tile (rows x columns, K splits) at q/k/v/o's and lm_head's
widths, beside the dispatch's own pick (``pick_chunk_config``) and cuBLAS BF16, in one run. Marlin's figures are the
same-run records of ``benchmarks/peers.py`` (docs/PERF.md).

    TRITON_INTERPRET=1 python benchmarks/experiments/dense_chunk_probe.py check
    python benchmarks/experiments/dense_chunk_probe.py time [OUT.json] [SHAPES] [ROWS] [KIND]   # Hopper: wgmma order
    DISABLE_MMA_V3=1 python benchmarks/experiments/dense_chunk_probe.py time [OUT.json]         # sm_12x's path: mma2

SHAPES: comma-separated from qkv, o, lm_head (default all); ROWS: comma-separated row counts (default 4,16,32,48,64;
past 64 the dispatch's pick is dequantize + cuBLAS, timed with ``pick``);
KIND (:func:`candidates`): ``deep``, also 8 warps and 2 or 4 pipeline stages on the 32- and 64-row tiles, splits 2-8;
``splits``, the 64-column tiles at 2-6 and 8 K splits (3, 5 and 6 not powers of two); ``mid64``, the 64 x 64 tile at 3
and 4 splits on 4 or 8 warps and 2-4 stages; ``fly``, the 16-, 32- and 64-row tiles with their wgmmas waited for and
kept in flight (Hopper: ``dequant_mxfp4.fresh_operand``); ``stages``, the 64-row tiles on 1-3 splits and 3-8
stages (cuBLAS's form at 64 rows: few programs, deep pipelines); ``pick-stages``, the dispatch's tile on 2-6 stages,
each timed twice; ``pick``, the dispatch's tile
alone (an A/B of two trees). The ``prefetch`` kind of d5b9856, each tile with its W
asked of L2 before the K loop, lost and went with its kernel option (records
``dense_chunk_probe_prefetch_*_h200_2026-11-28_d5b9856.json``). The first version of this probe
(c392dd9, records ``dense_chunk_probe_{wgmma,mma2}_h100_2026-11-28_c392dd9.json``) carried its own copy of the
kernel, before it shipped; the fused tile at prefill (2048 rows) measured 0.72x of cuBLAS there (dequantize + cuBLAS
ships instead).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
from collections.abc import Callable
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mxrepack.kernels.dequant_mxfp4 import fits_fold, mma_v3_disabled, with_fold  # noqa: E402
from mxrepack.kernels.linear_mxfp4 import LinearConfig, linear_chunks, linear_mxfp4, pick_chunk_config  # noqa: E402
from mxrepack.layouts.dense import DenseMxLayout  # noqa: E402

SHAPES = {"qkv": (5120, 2880), "o": (2880, 4096), "lm_head": (201088, 2880)}


def chunk_pack(w: torch.Tensor, s: torch.Tensor, order: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain MXFP4 ``[N, K/2]`` / ``[N, K/32]`` -> the dense layout's stored ``[Np, Kp/2]`` / ``[Np, Kp/32]``."""
    layout = DenseMxLayout(order=order)
    pad = -w.shape[0] % 16
    k = w.shape[1] * 2
    return (
        layout.store(F.pad(w, (0, 0, 0, pad)), None, k, "values"),
        layout.store(None, F.pad(s, (0, 0, 0, pad)), k, "scales"),
    )


def candidates(M: int, N: int, kind: str = "", pick: LinearConfig | None = None) -> list[LinearConfig]:
    """Tiles of 16, 32 and 64 rows (no more rows than M needs), 64 or 128 columns, K split 1-8 (not on lm_head:
    its 201088 rows fill the GPU unsplit); other ``kind`` s as the module's docstring lists (``pick``: the dispatch's
    tile for M rows, None past 64)."""
    splits = (1,) if N > 100_000 else (1, 2, 4, 8)
    shapes = [(bm, bn) for bm in (16, 32, 64) if bm <= max(16, triton.next_power_of_2(M)) for bn in (64, 128)]
    if kind == "pick":  # the dispatch's own tile only, timed as pick_ms (an A/B of two trees)
        return []
    if kind == "pick-stages":  # the dispatch's tile on 2-6 stages
        return [] if pick is None else [dataclasses.replace(pick, num_stages=st) for st in (2, 3, 4, 5, 6)]
    if kind == "fly":  # the 16-, 32- and 64-row tiles each timed twice, their wgmmas waited for and kept in flight
        tiles = ((16, 4), (16, 8), (32, 4), (64, 3), (64, 4))
        return [LinearConfig(bm, 64, 128, split, swap_ab=True) for bm, split in tiles if (bm, 64) in shapes]
    if kind == "mid64":  # the 64-row tile at 3 and 4 splits on 4 or 8 warps and 2-4 stages (linear_mxfp4.CHUNK_MID64)
        return [
            LinearConfig(64, 64, 128, split, num_warps=warps, num_stages=stages, swap_ab=True)
            for split in (3, 4)
            for warps in (4, 8)
            for stages in (2, 3, 4)
        ]
    if kind == "stages":  # cuBLAS's form at 64 rows (bf16_gemm_probe.py kernels: 80 CTAs of 64 x 64, 13 stages of 64
        # codes, no split): fewer programs with deeper pipelines; past 3 stages Hopper's shared memory only
        return [
            LinearConfig(64, bn, 128, split, num_warps=4, num_stages=stages, swap_ab=True)
            for bn in (64, 128)
            for split in (1, 2, 3)
            for stages in (3, 4, 5, 6, 8)
        ]
    if kind == "splits":  # K splits that are not powers of two beside 2 and 4, on 64 columns
        return [
            LinearConfig(bm, 64, 128, split, num_warps=4, num_stages=3, swap_ab=True)
            for bm, bn in shapes
            if bn == 64
            for split in (2, 3, 4, 5, 6, 8)
        ]
    if kind == "deep":
        return [
            LinearConfig(bm, bn, 128, split, num_warps=warps, num_stages=stages, swap_ab=True)
            for bm, bn in shapes
            if bm >= 32
            for split in splits[1:]
            for warps in (4, 8)
            for stages in (2, 3, 4)
        ]
    return [
        LinearConfig(bm, bn, 128, split, num_warps=4, num_stages=3, swap_ab=True)
        for bm, bn in shapes
        for split in splits
    ]


def check() -> None:
    from mxrepack.quant.mx import dequantize_mxfp4

    torch.manual_seed(0)
    for order, (N, K, M) in itertools.product(("wgmma", "mma2"), ((80, 288, 5), (64, 256, 40))):
        w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8)
        s = torch.randint(118, 126, (N, K // 32), dtype=torch.uint8)
        x = torch.randn(M, K).to(torch.bfloat16)
        ref = x.float() @ dequantize_mxfp4(w, s).float().T
        wq, sq = chunk_pack(w, s, order)
        for cfg in (LinearConfig(64, 64, 128, 2, swap_ab=True), LinearConfig(32, 128, 128, 3, swap_ab=True)):
            y = linear_chunks(x, wq, sq, order, None, cfg, torch.empty(M, N, dtype=torch.bfloat16))
            err = float((y.float() - ref).norm() / ref.norm())
            print(f"{order} N={N} K={K} M={M} {cfg.name()}: rel err {err:.2e}", flush=True)
            assert err < 1e-2, err


@dataclasses.dataclass
class Layer:
    """One of :data:`SHAPES` on the GPU: a random MXFP4 weight in chunk order (``wq`` / ``sq``), the same weight
    plain (``plain``: ``[N, K/2]`` / ``[N, K/32]``), its fp32 dequantization ``wf`` and whether its scales fold;
    ``next_chunked()`` cycles through 400 MB of others like it and ``next_bf16()`` through BF16 weights of the shape
    (cuBLAS's), so that no timing reads a weight held in L2."""

    N: int
    K: int
    wq: torch.Tensor
    sq: torch.Tensor
    wf: torch.Tensor
    fold: bool
    next_chunked: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    next_bf16: Callable[[], torch.Tensor]
    plain: tuple[torch.Tensor, torch.Tensor]

    @classmethod
    def random(cls, name: str, order: str) -> Layer:
        from common import deq, rand_mx, rotating

        N, K = SHAPES[name]
        w, s = rand_mx(N, K)
        wq, sq = chunk_pack(w, s, order)
        pool = [chunk_pack(*rand_mx(N, K), order) for _ in range(max(2, (400 << 20) // (wq.numel() + sq.numel())))]
        chunked = itertools.cycle(pool)
        bf16 = rotating(lambda: torch.randn(N, K, device="cuda").to(torch.bfloat16), N * K * 2)
        return cls(N, K, wq, sq, deq(w, s), fits_fold(s), lambda: next(chunked), bf16, (w, s))


def time(out: str | None = None, shapes: str = ",".join(SHAPES), sizes: str = "4,16,32,48,64", kind: str = "") -> None:
    from common import bench_decode

    import mxrepack.kernels.linear_mxfp4 as linear_module

    waits = linear_module.mma_reads_registers_async
    order = "mma2" if mma_v3_disabled() else "wgmma"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name in shapes.split(","):
        layer = Layer.random(name, order)
        N, K, wq, sq, wf, fold = layer.N, layer.K, layer.wq, layer.sq, layer.wf, layer.fold
        next_chunked, next_bf16 = layer.next_chunked, layer.next_bf16
        for M in map(int, sizes.split(",")):
            x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
            ref = x.float() @ wf.T
            y = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
            pick = pick_chunk_config(M, N, K, sms, fold, order=order)
            picked = pick.name() if pick is not None else "dequantize + cuBLAS"  # past 64 rows
            rec = {"shape": name, "N": N, "K": K, "M": M, "order": order, "pick": picked, "sms": sms}
            got = linear_mxfp4(x, wq, sq, order=order, out=y, fold_scale=fold)
            rec["pick_err"] = float((got.float() - ref).norm() / ref.norm())
            rec["pick_ms"] = bench_decode(lambda: linear_mxfp4(x, *next_chunked(), order=order, out=y, fold_scale=fold))
            rec["cublas_ms"] = bench_decode(lambda: x @ next_bf16().T)
            best = None
            flights = (False, True) if kind == "fly" and order == "wgmma" else (False,)  # mma.sync never waits
            repeats = 2 if kind == "pick-stages" else 1  # each config timed twice, the repeats apart
            for rep, cfg, fly in itertools.product(range(repeats), candidates(M, N, kind, pick), flights):
                cfg = with_fold(cfg, True, fold)
                tag = ("-fly" if fly else "") + (f"#{rep}" if repeats > 1 else "")
                # kept in flight: the kernel's WAIT_MMA off, as linear_chunks asks mma_reads_registers_async
                linear_module.mma_reads_registers_async = (lambda device: False) if fly else waits
                if hasattr(linear_module, "_chunk_call"):  # since stop 44 the call's constants are cached per shape
                    linear_module._chunk_call.cache_clear()
                try:
                    err = float((linear_chunks(x, wq, sq, order, None, cfg, y).float() - ref).norm() / ref.norm())
                    ms = bench_decode(lambda: linear_chunks(x, *next_chunked(), order, None, cfg, y))
                except Exception as e:  # noqa: BLE001 - a tile that does not build here is a result too
                    rec[cfg.name() + tag] = f"{type(e).__name__}: {e}"[:200]
                    continue
                finally:
                    linear_module.mma_reads_registers_async = waits
                rec[cfg.name() + tag] = [round(ms, 5), err]
                if best is None or ms < best[1]:
                    best = (cfg.name() + tag, ms)
            rec["best"] = best
            rows.append(rec)
            line = f"{name} M={M}: pick {rec['pick']} {rec['pick_ms']:.4f} cublas {rec['cublas_ms']:.4f}"
            print(
                line
                if best is None
                else f"{line} best {best[0]} {best[1]:.4f} (pick/best {rec['pick_ms'] / best[1]:.2f}, cublas/best "
                f"{rec['cublas_ms'] / best[1]:.2f})",
                flush=True,
            )
            if out:
                Path(out).write_text(json.dumps(meta() | {"rows": rows}, indent=1))


def meta() -> dict:
    return {
        "script": "benchmarks/experiments/dense_chunk_probe.py",
        "date": str(date.today()),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "disable_mma_v3": mma_v3_disabled(),
    }


if __name__ == "__main__":
    {"check": check, "time": time}[sys.argv[1]](*sys.argv[2:])
