"""mxrepack's Triton kernels against vLLM's own on one GPU, same shapes, same weights, same routing draws, one run.
Not a test.

    python benchmarks/peers.py [--quick] [--json out.json] [--commit C]
    DISABLE_MMA_V3=1 python benchmarks/peers.py --only moe   # sm_12x's mma.sync code path on a Hopper, against Marlin

Needs vLLM 0.26-0.33 (on the lent GPU: ../shared/tools/vllm-kit; docs/SERVING.md "Reproduce" has the calls; a GB10
runs vLLM 0.33). Peers:

* MoE, 120b shapes (128 experts, top-4, H = I = 2880; ``--experts 32``: the 20b's): vLLM's Marlin MXFP4 MoE
  (``fused_marlin_moe``) and OpenAI's triton_kernels ``matmul_ogs`` as vendored in vLLM
  (``triton_kernel_fused_experts``, routing metadata built in the timed call as vLLM does), each on the tensors vLLM's
  own ``convert_gpt_oss_weight_to_mxfp4_moe_kernel_format`` makes from one random gpt-oss layer at vLLM's padding for
  that backend; mxrepack's ``moe_mxfp4`` on the same layer in the ``strided`` layout. T in {1, 4, 8, 16, 32, 64, 128,
  512, 1024, 4096}.
* Dense W4A16 (qkv 5120x2880, o 2880x4096, lm_head 201088x2880) at M in {1, 4, 16, 64} and prefill M in {2048, 8192}:
  mxrepack's ``linear_mxfp4``, vLLM's Marlin MXFP4 linear (through the plugin's ``MarlinMxfp4LinearMethod``:
  ``prepare_fp4_layer_for_marlin`` + ``apply_fp4_marlin_linear``) and cuBLAS BF16 (``x @ W.T``); weights rotate through
  > 400 MB so that no one runs from L2.

Every implementation's relative error against the fp32 reference (dequantized weights, the intermediate rounded to
bf16) is printed beside its time. Timings: medians in ms; CUDA graphs up to T = M = 128 (``do_bench_cudagraph``, as
engines run decode), ``do_bench`` beyond.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import traceback
from datetime import date
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    DEV,
    bench_decode,
    copy_roofline,
    deq,
    moe_decode_inputs,
    moe_reference,
    moe_row_major,
    moe_weights,
    rand_mx,
    rotating,
    vllm_convert,
)

from mxrepack.kernels.dequant_mxfp4 import builds_wgmma, fits_fold, mma_v3_disabled, with_fold, without_fold  # noqa: E402
from mxrepack.kernels.linear_mxfp4 import linear_mxfp4  # noqa: E402
from mxrepack.kernels.moe_mxfp4 import (  # noqa: E402
    CHUNK_GEMVS,
    GEMV_MAX_ASSIGNMENTS,
    moe_mxfp4,
    pick_moe,
)

E, H, I, K_TOP = 128, 2880, 2880, 4
HP, IP = 2944, 2944  # the strided layout's padding
MOE_T = (1, 4, 8, 16, 32, 64, 128, 512, 1024, 4096)
DENSE = {"qkv": (5120, 2880), "o": (2880, 4096), "lm_head": (201088, 2880)}
DENSE_M = (1, 4, 16, 64)
PREFILL_M = (2048, 8192)


class Record(list):
    """The rows, written to ``path`` after each one: a run stopped at its time limit keeps what it measured."""

    def __init__(self, meta: dict, path: str | None):
        super().__init__()
        self.meta, self.path = meta, path

    def append(self, row: dict) -> None:
        super().append(row)
        if self.path:
            Path(self.path).write_text(json.dumps({**self.meta, "rows": list(self)}, indent=1))


def timer(n: int):
    """CUDA graphs for decode-sized calls (launch overhead would decide them otherwise), do_bench beyond."""
    return bench_decode  # every size: eager timing would charge multi-launch paths Python's launch overhead


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm())


def vllm_moe_tensors(W: dict, hv: int, iv: int) -> dict:
    """The layer as vLLM's gpt-oss MXFP4 method holds it before converting: the checkpoint's fused tensors (gate/up
    interleaved by rows, bf16 biases) in the top-left corner of zeros at vLLM's padding ``hv`` x ``iv``."""
    w13, s13, w2, s2 = moe_row_major(W)  # rows [gate | up], at the strided padding

    def interleave(t):  # [E, 2*IP, ...] rows [gate | up] -> the logical rows, gate/up interleaved
        return torch.stack([t[:, :I], t[:, IP : IP + I]], 2).flatten(1, 2)

    def corner(t, shape):
        out = torch.zeros(shape, dtype=t.dtype, device=t.device)
        out[tuple(slice(0, n) for n in t.shape)] = t
        return out

    return {
        "w13_weight": corner(interleave(w13)[..., : H // 2], (E, 2 * iv, hv // 2)),
        "w13_weight_scale": corner(interleave(s13)[..., : H // 32], (E, 2 * iv, hv // 32)),
        "w13_bias": corner(interleave(W["w13_bias"]).bfloat16(), (E, 2 * iv)),
        "w2_weight": corner(w2[:, :H, : I // 2], (E, hv, iv // 2)),
        "w2_weight_scale": corner(s2[:, :H, : I // 32], (E, hv, iv // 32)),
        "w2_bias": corner(W["w2_bias"][:, :H].bfloat16(), (E, hv)),
    }


def marlin_moe(W: dict):
    """vLLM's Marlin MXFP4 MoE as its MarlinExperts calls it for gpt-oss: SWIGLUOAI, whose kernel applies gpt-oss's
    alpha 1.702 and limit 7 itself (vLLM 0.26's clamp and alpha arguments were ignored for it; 0.33 removed them)."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.experts.marlin_moe import fused_marlin_moe
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import mxfp4_round_up_hidden_size_and_intermediate_size
    from vllm.scalar_type import scalar_types

    hv, iv = mxfp4_round_up_hidden_size_and_intermediate_size(oracle.Mxfp4MoeBackend.MARLIN, H, I)
    w13, w2, s13, s2, b13, b2 = vllm_convert("MARLIN", vllm_moe_tensors(W, hv, iv))

    def run(x, ids, wts):
        xp = torch.nn.functional.pad(x, (0, hv - H)) if hv != H else x  # vLLM's gpt-oss pads the hidden state too
        y = fused_marlin_moe(
            xp,
            w13,
            w2,
            b13,
            b2,
            s13,
            s2,
            wts,
            ids,
            quant_type_id=scalar_types.float4_e2m1f.id,
            global_num_experts=E,
            activation=MoEActivation.SWIGLUOAI,
        )
        return y[:, :H]

    return run, f"hidden {hv}, intermediate {iv}"


def triton_kernels_moe(W: dict):
    """OpenAI triton_kernels' matmul_ogs pair as vLLM's OAITritonExperts runs it (routing metadata from the top-k ids
    built inside the call, as vLLM does per forward)."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.experts.gpt_oss_triton_kernels_moe import (
        make_routing_data,
        triton_kernel_fused_experts,
    )
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle

    hv, iv = oracle.mxfp4_round_up_hidden_size_and_intermediate_size(oracle.Mxfp4MoeBackend.TRITON, H, I)
    w13, w2, pc13, pc2, b13, b2 = vllm_convert("TRITON", vllm_moe_tensors(W, hv, iv))
    qc = oracle.make_mxfp4_moe_quant_config(
        mxfp4_backend=oracle.Mxfp4MoeBackend.TRITON,
        w1_scale=pc13,
        w2_scale=pc2,
        w1_bias=b13,
        w2_bias=b2,
        gemm1_alpha=1.702,
        gemm1_beta=1.0,
        swiglu_limit=7.0,
    )

    def run(x, ids, wts):
        xp = torch.nn.functional.pad(x, (0, hv - H)) if hv != H else x
        routing, gather, scatter = make_routing_data(ids, wts, E)
        out = torch.empty_like(xp)
        y = triton_kernel_fused_experts(
            out,
            xp,
            w13,
            w2,
            routing,
            gather,
            scatter,
            topk=ids.shape[1],
            activation=MoEActivation.SWIGLUOAI,
            quant_config=qc,
            swiglu_alpha=1.702,
            swiglu_limit=7.0,
            global_num_experts=E,
        )
        return y[:, :H]

    return run, f"hidden {hv}, intermediate {iv}"


def time_it(fn, n: int) -> tuple[float, str]:
    try:
        return timer(n)(fn), "cuda graph"
    except Exception:  # noqa: BLE001 - a peer that cannot be captured is timed eagerly, and says so
        torch.cuda.synchronize()
        return do_bench(fn, warmup=10, rep=100), "eager (capture failed)"


# Under Triton's DISABLE_MMA_V3 (mma_v3_disabled) Hopper builds take mma.sync as sm_12x's do (experiments/
# mma_v2_proxy.py: the rows order's tiles compile to sm_121a's loops), so a run times GB10's code path on the H100.
# The wgmma order cannot run then, the mma2 order can, and triton_kernels (Triton too, its Hopper layouts made for
# wgmma) is not the peer it is in vLLM: Marlin, an mma.sync kernel either way, is the peer. On a real sm_12x (GB10,
# vLLM 0.33) both peers are tried: there vLLM ranks Marlin first for gpt-oss and keeps triton_kernels as a backend
# (block_m capped at 32); one that does not build is recorded as an error row, the others still run.


def wgmma_here() -> bool:
    """Whether this GPU runs the strided layout's wgmma order (Hopper, wgmma not disabled)."""
    return builds_wgmma(torch.cuda.get_device_capability()[0])


def mma2_here() -> bool:
    """Whether this GPU runs the strided layout's mma2 order (Triton builds mma.sync: sm_8x, sm_12x, or a Hopper
    under DISABLE_MMA_V3)."""
    major = torch.cuda.get_device_capability()[0]
    return major in (8, 12) or (major == 9 and mma_v3_disabled())


def order_of(name: str) -> str:
    """The byte order a candidate or implementation named ``name`` reads (named for it: "wgmma", "mma2")."""
    return "wgmma" if "wgmma" in name else "mma2" if "mma2" in name else "rows"


def ordered_layer(W: dict, order: str) -> dict:
    """``W`` (the strided layout, rows order) in byte ``order``: the same weights, another byte order."""
    from mxrepack.layouts import strided

    return strided.from_row_major(strided.to_row_major(W), order=order)


def moe(rows: list, quick: bool, Ts: tuple[int, ...] = MOE_T) -> None:
    W = moe_weights(E, H, I, HP, IP)
    for n in ("w13_bias", "w2_bias"):  # every implementation sees the same bf16-representable biases
        W[n] = W[n].bfloat16().float()
    # the plugin asks fold_shift at load: for these random scales (<= 128) that is fits_fold's answer, shift 0
    fold = fits_fold(W["w13_weight_scale"], W["w2_weight_scale"])
    impls = {"mxrepack": (lambda x, ids, wts: moe_mxfp4(x, ids, wts, W, fold_scale=fold), "strided, 2944 x 2944")}
    # the same layer in the strided layout's chunk orders where they run: wgmma (Hopper's MMA fragment) and mma2
    # (mma.sync's operand: sm_12x's code path)
    layers = {o: ordered_layer(W, o) for o, here in (("wgmma", wgmma_here()), ("mma2", mma2_here())) if here}
    for order, Wo in layers.items():
        impls[f"mxrepack_{order}"] = (
            functools.partial(moe_mxfp4, w=Wo, fold_scale=fold, order=order),
            f"strided order {order}, 2944 x 2944",
        )
    for order, Wo in layers.items():  # each chunk order's decode GEMVs at every T * k to 64 (the dispatch: to 8)
        impls[f"mxrepack_{order}_gemv"] = (
            functools.partial(moe_mxfp4, w=Wo, config=CHUNK_GEMVS[order], fold_scale=fold, order=order),
            f"strided order {order}, 2944 x 2944, decode GEMVs",
        )
    peers = (("vllm_marlin", marlin_moe),) + (() if mma_v3_disabled() else (("triton_kernels", triton_kernels_moe),))
    for name, make in peers:
        try:
            impls[name] = make(W)
        except Exception as e:  # noqa: BLE001 - recorded, the others still run
            rows.append(
                {
                    "kind": "moe_setup",
                    "impl": name,
                    "error": f"{type(e).__name__}: {e}"[:1500],
                    "traceback": traceback.format_exc()[-3000:],
                }
            )
            print(f"moe {name}: setup failed: {type(e).__name__}: {e}"[:400], flush=True)
    for T in [t for t in Ts if t <= 64] if quick else Ts:
        torch.manual_seed(T)
        # distinct experts per token at every T, as a router's top-k gives (triton_kernels mis-adds a repeated one)
        x, ids, wts = moe_decode_inputs(T, E, K_TOP, H)
        ids = ids.to(torch.int32)
        ref = moe_reference(x, ids, wts, W, H, HP, IP)
        rec: dict = {
            "kind": "moe",
            "T": T,
            "experts_touched": int(ids.unique().numel()),
            "mxrepack_config": pick_moe(T, K_TOP, E, H, fold_scale=fold).name(),
        }
        for order in ("wgmma", "mma2"):
            if f"mxrepack_{order}" in impls:
                rec[f"mxrepack_{order}_config"] = pick_moe(T, K_TOP, E, H, fold_scale=fold, order=order).name()
        for name, (fn, padding) in impls.items():
            if name.endswith("_gemv") and T * K_TOP > GEMV_MAX_ASSIGNMENTS:
                continue  # per-assignment GEMVs: decode sizes only, as the rows order's
            try:
                rec[f"{name}_rel_err"] = rel_err(fn(x, ids, wts), ref)
                rec[f"{name}_ms"], rec[f"{name}_timing"] = time_it(lambda: fn(x, ids, wts), T)
                rec[f"{name}_padding"] = padding
            except Exception as e:  # noqa: BLE001
                rec[f"{name}_error"] = f"{type(e).__name__}: {e}"[:800]
        peers = [rec[f"{p}_ms"] for p in impls if not p.startswith("mxrepack") and f"{p}_ms" in rec]
        for ours in (p for p in impls if p.startswith("mxrepack") and f"{p}_ms" in rec):
            if peers:
                rec[f"{ours}_vs_best_peer"] = min(peers) / rec[f"{ours}_ms"]  # > 1: mxrepack faster
        rows.append(rec)
        print(
            "moe T=%5d " % T
            + "  ".join(
                f"{n} {rec.get(f'{n}_ms', float('nan')):.4f} ms (err {rec.get(f'{n}_rel_err', float('nan')):.1e})"
                for n in impls
            )
            + "".join(
                f"  {n} vs best peer x{rec[f'{n}_vs_best_peer']:.2f}" for n in impls if f"{n}_vs_best_peer" in rec
            ),
            flush=True,
        )


def repeat_bits(fn, runs: int = 20) -> dict:
    """Run ``fn`` ``runs`` times on the same inputs: how many outputs are non-finite and how many differ from the
    first in any bit (a racing kernel shows as either; CONTRIBUTING: repeat a deciding GPU run)."""
    first, bad, differ = None, 0, 0
    for _ in range(runs):
        y = fn()
        bad += not bool(torch.isfinite(y).all())
        if first is None:
            first = y.clone()
        else:
            differ += not torch.equal(y, first)
    return {"runs": runs, "nonfinite_runs": bad, "runs_differing": differ}


def same_bits_as_plain(run, cfg) -> dict:
    """For a config with the scale folded (``fold_scale``, an exact decode): whether ``run(cfg)`` gives the
    bits of its unfolded twin, as it must (``bits_equal_unfolded``); nothing for any other config."""
    if not getattr(cfg, "fold_scale", False):
        return {}
    return {"bits_equal_unfolded": torch.equal(run(cfg), run(without_fold(cfg)))}


def moe_sweep(rows: list, Ts: tuple[int, ...], kind: str = "all") -> None:
    """mxrepack's scheduled MoE tiles at each T: the shipped choice against tile shapes, stages, the integer-op
    dequant (``MoeConfig.manual_dequant``) and the swapped operands (``MoeConfig.swap_ab``); ``kind`` "swap" sweeps
    only the latter beside the shipped choice, "fold" the shipped swapped tile (folded where the weights fit:
    ``MoeConfig.fold_scale``) beside its unfolded twin and triton_kernels' tile, "mma2" the mma2 order's tiles beside
    each order's shipped choice, and the wgmma kinds that order's variants. mxrepack only, no peers (for choosing
    ``MOE_TILES`` and the chunk orders' tables)."""
    import itertools

    from mxrepack.kernels.moe_mxfp4 import MOE_TILES, MOE_TILES_BY_ORDER, ChunkGemvConfig, MoeConfig

    W = moe_weights(E, H, I, HP, IP)
    fold = fits_fold(W["w13_weight_scale"], W["w2_weight_scale"])
    orders = kind.startswith("wgmma") or kind in (
        "remainder",
        "shipped",
        "overlap",
        "down-wide",
        "stages",
        "warps16",
    )
    gemv_order = {"mma2": "mma2", "wgmma-gemv": "wgmma"}.get(kind)  # whose decode GEMV shapes it sweeps
    Wg = ordered_layer(W, "wgmma") if orders and wgmma_here() else None
    Wm = ordered_layer(W, "mma2") if (orders or kind == "mma2") and mma2_here() else None
    chunked = (("wgmma", Wg), ("mma2", Wm))  # the chunk orders' layers, None where the order cannot run here
    for T in Ts:
        torch.manual_seed(T)
        x, ids, wts = moe_decode_inputs(T, E, K_TOP, H)
        ref = moe_reference(x, ids, wts, W, H, HP, IP)
        rows_per_expert = T * K_TOP / E
        ms_ = [m for m in (16, 32, 64, 128) if m <= max(16, 4 * rows_per_expert)][-2:]
        cands = {"shipped": pick_moe(T, K_TOP, E, H, fold_scale=fold)}
        if orders or kind == "mma2":
            for order, Wo in chunked:
                if Wo is not None:
                    cands[f"shipped {order}"] = pick_moe(T, K_TOP, E, H, fold_scale=fold, order=order)
        if gemv_order and T * K_TOP <= GEMV_MAX_ASSIGNMENTS:  # a chunk order's GEMVs: 16-row blocks a program, warps
            shapes = ((1, 2, 1, 2), (1, 4, 1, 4), (1, 4, 1, 2), (1, 2, 1, 4), (2, 4, 1, 4), (2, 4, 2, 4), (1, 1, 1, 1))
            for (gu, gw, dn, dw), pdl in itertools.product(shapes, (True, False)):
                if pdl or (gu, gw, dn, dw) in ((1, 4, 1, 4), (1, 2, 1, 4)):  # and two launched one after the other
                    cfg = ChunkGemvConfig(gemv_order, gu, gw, dn, dw, pdl)
                    cands[cfg.name()] = cfg
        if kind == "mma2":  # the mma2 order's tiles: tokens, warps, a down tile twice as wide, stages
            ms_ = ()
            for bm, warps, down, st in itertools.product((16, 32, 64, 128), (4, 8), (0, 128), (2, 3)):
                if (warps == 8) != (down == 128) or (bm == 128 and st == 3):
                    continue  # 8 warps split gate_up's 128 rows 16 a warp, and down's only when it has 128
                cfg = MoeConfig(bm, 64, 128, warps, st, swap_ab=True, fold_scale=fold, order="mma2", down_block_n=down)
                cands[f"mma2 {cfg.name()}"] = cfg
        if kind == "remainder":  # each order's table tiles with each smaller tile of the table as their remainder
            here = [("shipped", MOE_TILES)] + [(f"shipped {o}", MOE_TILES_BY_ORDER[o]) for o, Wo in chunked if Wo]
            for key, tiles in here:
                table = [with_fold(dataclasses.replace(c, remainder=None), True, fold) for _, c in tiles]
                for main, small in itertools.product(table, table):
                    if small.block_m < main.block_m and small.swap_ab == main.swap_ab:
                        cfg = dataclasses.replace(main, remainder=small)
                        cands[cfg.name()] = cfg
                if isinstance(cands[key], MoeConfig) and cands[key].remainder is not None:
                    cands[f"{key} without remainder"] = dataclasses.replace(cands[key], remainder=None)
        if kind == "overlap":  # the wgmma order's shipped tile (and remainder) beside its twin with the other wait
            # (kept in flight where it waits, waiting where it is kept in flight), and the in-flight one on 4 stages
            shipped = cands["shipped wgmma"]
            rem = shipped.remainder
            wait = not shipped.wait_mma
            twin = dataclasses.replace(
                shipped, wait_mma=wait, remainder=None if rem is None else dataclasses.replace(rem, wait_mma=wait)
            )
            cands[f"wgmma {twin.name()}"] = twin
            deep = dataclasses.replace(shipped if wait else twin, num_stages=4)
            cands[f"wgmma {deep.name()}"] = deep
        if kind == "stages":  # the wgmma order's shipped tile on 2 to 4 pipeline stages (its remainder as shipped)
            shipped = cands["shipped wgmma"]
            for st in (2, 3, 4):
                if st != shipped.num_stages:
                    cfg = dataclasses.replace(shipped, num_stages=st)
                    cands[f"wgmma {cfg.name()}"] = cfg
        if kind == "down-wide":  # the wgmma order's shipped tile (and remainder) with down tiles 1, 2 and 4 times
            # block_n (to 256 rows), whatever width it ships with
            shipped = cands["shipped wgmma"]
            rem = shipped.remainder
            for m in (1, 2, 4):
                if m * shipped.block_n <= 256:
                    wide = dataclasses.replace(shipped, down_block_n=m * shipped.block_n if m > 1 else 0)
                    for rm in (1, m) if rem is not None else (None,):
                        r = (
                            None
                            if rm is None
                            else dataclasses.replace(rem, down_block_n=rm * rem.block_n if rm > 1 else 0)
                        )
                        cfg = dataclasses.replace(wide, remainder=r)
                        cands[f"wgmma {cfg.name()}"] = cfg
        if kind == "wgmma":  # the wgmma order's tiles: shapes, stages, waiting for each wgmma or overlapping it
            for bm, bn, st, wait in itertools.product(ms_, (64, 128), (3, 4), (True, False)):
                warps = 4
                cfg = MoeConfig(bm, bn, 128, warps, st, swap_ab=True, fold_scale=fold, order="wgmma", wait_mma=wait)
                cands[cfg.name()] = cfg
        if kind == "warps16":  # the wgmma order's shipped tile (remainder as shipped) on four warpgroups: 64 weight
            # rows each where the 8-warp tile gives each of its two 128, so 4 warps a scheduler hide the decode's
            # latency instead of 2, in half the registers (128)
            shipped = cands["shipped wgmma"]
            if shipped.num_warps == 8:
                for st, dn in itertools.product((3, 4), (128, 256)):
                    cfg = dataclasses.replace(shipped, num_warps=16, num_stages=st, down_block_n=dn)
                    cands[f"wgmma {cfg.name()}"] = cfg
        if kind == "wgmma-wide":  # the wgmma order on two warpgroups (8 warps), beside the shipped 4-warp tiles
            for bm, bn in itertools.product(sorted({16 if rows_per_expert <= 16 else 64, *ms_}), (64, 128)):
                cfg = MoeConfig(bm, bn, 128, 8, 3, swap_ab=True, fold_scale=fold, order="wgmma")
                cands[cfg.name()] = cfg
        variants = ("swap",) if kind.startswith("swap") else () if orders else ("plain", "manual", "swap")
        if kind == "fold":  # the shipped swapped tile, folded (rand_mx: scales <= 128), and its unfolded twin
            variants, ms_ = (), ()
            if getattr(cands["shipped"], "swap_ab", False):
                plain = without_fold(cands["shipped"])
                cands[plain.name()] = plain
            if rows_per_expert >= 16:  # triton_kernels' tile: 128 tokens x 256 weight rows (gate + up), 8 warps
                for st, folded in itertools.product((3, 4), (False, True)):
                    cfg = MoeConfig(128, 128, 128, num_warps=8, num_stages=st, swap_ab=True, fold_scale=folded)
                    cands[cfg.name()] = cfg
                # the shipped 64 x 128 on 8 warps: its gate_up on 4 warps spills (255 registers, 168-byte stack on
                # sm_90a, local Triton 3.9), on 8 it holds 187 registers and no stack
                for st in (3, 4):
                    cfg = MoeConfig(64, 128, 128, num_warps=8, num_stages=st, swap_ab=True, fold_scale=fold)
                    cands[cfg.name()] = cfg
        for bm, bn, v in itertools.product(ms_, (64, 128), variants):
            # the swapped operands pipelined too: dequant_mxfp4.mma_done waits for each wgmma (triton#9433);
            # "swap-deep": 4 warps, 4 to 6 stages
            launches = ((4, 1), (4, 2), (4, 3), (4, 4), (8, 3)) if v == "swap" else ((4, 3), (4, 4), (8, 3))
            launches = ((4, 4), (4, 5), (4, 6)) if kind == "swap-deep" else launches
            for warps, st in launches:
                swap = v == "swap"  # folded where the weights fit, as the shipped choice is: the same footing
                cfg = MoeConfig(
                    bm, bn, 128, warps, st, manual_dequant=v == "manual", swap_ab=swap, fold_scale=swap and fold
                )
                cands[cfg.name()] = cfg
        for name, cfg in cands.items():
            rec = {
                "kind": "moe_sweep",
                "T": T,
                "config": f"{name} {cfg.name()}" if name.startswith("shipped") else name,
            }
            # the weights' scales fit the fold (asked once above): no per-call check of the folded configs
            order = order_of(name)  # a chunk order's candidates, and only they, are named so
            run = functools.partial(moe_mxfp4, fold_scale=fold, order=order)
            Wc = {"wgmma": Wg, "mma2": Wm}.get(order, W)
            try:
                rec["rel_err"] = rel_err(run(x, ids, wts, Wc, config=cfg), ref)
                rec["ms"], rec["timing"] = time_it(lambda: run(x, ids, wts, Wc, config=cfg), T)
                if getattr(cfg, "swap_ab", False):  # the shipped choice may be the GEMV pair
                    rec |= repeat_bits(lambda: run(x, ids, wts, Wc, config=cfg))
                rec |= same_bits_as_plain(lambda c: run(x, ids, wts, Wc, config=c), cfg)
            except Exception as e:  # noqa: BLE001 - e.g. out of shared memory
                rec["error"] = f"{type(e).__name__}: {e}"[:300]
            rows.append(rec)
            print(
                f"sweep T={T:5d} {rec['config']:28s} "
                + (f"{rec['ms']:.4f} ms err {rec['rel_err']:.1e}" if "ms" in rec else rec["error"][:120])
                + (f" nonfinite {rec['nonfinite_runs']} differing {rec['runs_differing']}" if "runs" in rec else ""),
                flush=True,
            )


def _compile_dense(job: tuple) -> str:
    """One spawned worker of :func:`precompile_dense`: each config run once on inputs of the sweep's shapes, so that
    Triton compiles it into the cache the timing process reads."""
    N, K, M, fold, configs = job
    w, ws = rand_mx(N, K)
    x = torch.randn(M, K, device=DEV).to(torch.bfloat16)
    for cfg in configs:
        try:
            linear_mxfp4(x, w, ws, None, "w4a16", cfg, fold_scale=fold)
        except Exception:  # noqa: BLE001 - the timing process records the error
            pass
    torch.cuda.synchronize()
    return "ok"


def precompile_dense(N: int, K: int, M: int, fold: bool, configs: list, workers: int = 8) -> None:
    """Compile a sweep's configs in parallel processes first (each a few seconds of Triton compile on one core, which
    dominated a sweep's wall time: 500 s for 103 candidates), then time them one by one from the warm cache."""
    import concurrent.futures
    import multiprocessing

    configs = [c for c in configs if c is not None]
    if not configs:  # only the shipped choice (None): nothing to compile ahead
        return
    jobs = [(N, K, M, fold, configs[i::workers]) for i in range(min(workers, len(configs)))]
    with concurrent.futures.ProcessPoolExecutor(len(jobs), mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile_dense, jobs))


def dense_sweep(rows: list, Ms: tuple[int, ...], kind: str = "all", shapes: tuple[str, ...] = ()) -> None:
    """mxrepack's W4A16 dense paths at each M: the shipped choice against the GEMV, dequantize + cuBLAS and tile
    configurations (split-K, tile widths, the integer-op dequant); ``kind`` "rows": the multi-row GEMVs only, "fold":
    the shipped swapped tile (folded where the weight fits) beside its unfolded twin. mxrepack only (for choosing the
    dispatch)."""
    import itertools

    from mxrepack.kernels.dequant_mxfp4 import DEQUANT
    from mxrepack.kernels.gemv_mxfp4 import GemvConfig, pick_gemv_config, sm_count
    from mxrepack.kernels.linear_mxfp4 import LinearConfig, pick_config, use_dequant_gemm, use_gemv

    for name, (N, K) in DENSE.items():
        if shapes and name not in shapes:
            continue
        w, ws = rand_mx(N, K)
        wf = deq(w, ws)
        nxt_q = rotating(lambda: rand_mx(N, K), w.numel() + ws.numel())
        fold = fits_fold(ws)  # rand_mx's scales: every rotated copy fits alike
        for M in Ms:
            x = torch.randn(M, K, device=DEV).to(torch.bfloat16)
            ref = x.float() @ wf.T
            gemv = pick_gemv_config(N, sm_count(x.device), M=M)
            # the GEMV as shipped for M, and with one row of x per program
            cands = {"shipped": None, "gemv": gemv, "gemv r0": dataclasses.replace(gemv, rows=0), "dequant": DEQUANT}
            if kind == "fold":  # the shipped swapped tile, folded (rand_mx: scales <= 128), and its unfolded twin
                cands = {"shipped": None}
                tile = pick_config(M, N, K, sm_count(x.device), fold_scale=fold)
                if (
                    tile.swap_ab
                    and not use_gemv(M, N, sm_count(x.device))
                    and not use_dequant_gemm(M, N, sm_count(x.device))
                ):
                    plain = without_fold(tile)
                    cands[plain.name()] = plain
            # the GEMV with all M rows in one program (prepared activations, packed fp16 math: each weight decoded once
            # for all of them), weights one K tile ahead or two; "rows": only these beside the shipped choice
            # (one row: the f16x2 GEMV, beside the shipped fp32 one)
            if kind == "rows":
                cands = {"shipped": None}
            if kind in ("all", "rows") and M <= 16 and not M & (M - 1):
                f16_tiles = ((16, 1024, 8), (16, 512, 4)) if name == "lm_head" else ((8, 512, 4), (16, 512, 4))
                for (bn, bk, warps), ahead, per in itertools.product(f16_tiles, (1, 2), (M, M // 2)):
                    if per == M or (per > 1 and (bn, bk) == (8, 512)):  # M / 2: two programs per tile, through L2
                        cfg = GemvConfig(bn, bk, warps, 1, "f16x2", prefetch=ahead, rows=per if per > 1 else 0)
                        cands[f"gemv {cfg.name()}"] = cfg
            grid = ((16,), (32, 64, 128), (256,), (1, 2, 4, 8)) if M <= 16 else ((16, 64), (64, 128), (128,), (1, 2, 4))
            # the swapped operands (one 128-code K tile per step): mma.sync on 2 warps, wgmma on 4 or 8 (pipelined:
            # dequant_mxfp4.mma_done waits for each wgmma, triton#9433)
            launches = ((4, 3),) if kind != "swap" else ((2, 3), (4, 1), (4, 3), (4, 4))
            if kind == "swap":  # up to 8 splits: on q/k/v/o at 17-64 rows split-K's 64 x 64 tiles took 4-8 (MID_SPLIT)
                grid = ((16,) if M <= 16 else (32, 64), (64, 128), (128,), (1, 2, 4, 8))
            if kind == "swap-deep":  # 4 warps, 3 to 5 stages
                launches = ((4, 3), (4, 4), (4, 5))
                grid = ((16,), (64, 128), (128,), (1, 2)) if M <= 16 else ((16, 32, 64), (64, 128), (128,), (1, 2))
            if kind in ("rows", "fold"):
                launches = ()
            for bm, bn, bk, split, v, (warps, st) in itertools.product(
                *grid, ("swap",) if kind.startswith("swap") else (False, True), launches
            ):
                swap = v == "swap"  # folded where the weight fits, as the shipped choice is: the same footing
                cfg = LinearConfig(bm, bn, bk if not swap else 128, split, warps, st, v is True, swap, swap and fold)
                cands[cfg.name()] = cfg
            # the tile the dispatch runs for "shipped" (None where it takes the GEMV or dequantize + cuBLAS)
            shipped = pick_config(M, N, K, sm_count(x.device), fold_scale=fold)
            shipped = (
                None if use_gemv(M, N, sm_count(x.device)) or use_dequant_gemm(M, N, sm_count(x.device)) else shipped
            )
            precompile_dense(N, K, M, fold, list(cands.values()))
            for label, cfg in cands.items():
                rec = {"kind": "dense_sweep", "shape": name, "M": M, "config": label}
                try:
                    run = functools.partial(linear_mxfp4, mode="w4a16", config=cfg, fold_scale=fold)
                    rec["rel_err"] = rel_err(run(x, w, ws), ref)
                    rec["ms"], rec["timing"] = time_it(lambda: run(x, *nxt_q()), M)
                    chosen = cfg if cfg is not None else shipped
                    if any(getattr(chosen, f, 0) for f in ("swap_ab", "rows")):
                        rec |= repeat_bits(lambda: run(x, w, ws))
                    rec |= same_bits_as_plain(
                        lambda c: linear_mxfp4(x, w, ws, None, "w4a16", c, fold_scale=fold), chosen
                    )
                except Exception as e:  # noqa: BLE001
                    rec["error"] = f"{type(e).__name__}: {e}"[:300]
                rows.append(rec)
            done = sorted(
                (r["ms"], r["config"])
                for r in rows
                if r.get("kind") == "dense_sweep" and r["shape"] == name and r["M"] == M and "ms" in r
            )
            shipped = next(
                r["ms"]
                for r in rows
                if r.get("kind") == "dense_sweep"
                and r["shape"] == name
                and r["M"] == M
                and r["config"] == "shipped"
                and "ms" in r
            )
            print(
                f"dense sweep {name:8s} M={M:3d} shipped {shipped:.4f} ms; best "
                + ", ".join(f"{c} {t:.4f}" for t, c in done[:4]),
                flush=True,
            )


def marlin_linear(w: torch.Tensor, s: torch.Tensor):
    """A layer holding vLLM's Marlin MXFP4 linear weights, prepared as the plugin's method does at load."""
    from mxrepack.serve.vllm.linear import MarlinMxfp4LinearMethod

    N, K2 = w.shape
    layer, method = torch.nn.Module(), MarlinMxfp4LinearMethod()
    method.create_weights(layer, K2 * 2, [N], K2 * 2, N, torch.bfloat16)
    layer.weight_packed.data = w.clone()
    layer.weight_scale.data = s.clone()
    method.process_weights_after_loading(layer)
    if getattr(layer, "workspace", None) is None:
        # vLLM 0.33 keeps Marlin's locks in its engine's workspace manager, which this script has none of: without one
        # every call would allocate and zero them. A layer's own, as 0.26 gives it, sized as 0.33 asks.
        from vllm.model_executor.layers.quantization.utils import marlin_utils

        blocks = getattr(marlin_utils, "MARLIN_MAX_BLOCKS_PER_SM", 4)
        layer.workspace = marlin_utils.marlin_make_workspace_new(w.device, blocks)
    return layer, method


def chunk_order_here() -> str | None:
    """The chunk order this GPU's dense and MoE tiles read (wgmma on Hopper, mma2 where Triton builds mma.sync)."""
    return "wgmma" if wgmma_here() else "mma2" if mma2_here() else None


def dense(rows: list, quick: bool) -> None:
    from mxrepack.layouts.dense import DenseMxLayout

    order = chunk_order_here()
    for name, (N, K) in DENSE.items():
        w, ws = rand_mx(N, K)
        wf = deq(w, ws)
        wbytes = w.numel() + ws.numel()
        nxt_q = rotating(lambda: rand_mx(N, K), wbytes)
        fold = fits_fold(ws)  # as a loader asks once per weight; rand_mx's scales: every rotated copy fits alike
        if order:  # the same weights in the dense layout's chunk order (the strided targets' dense MXFP4)
            layout = DenseMxLayout("mxfp4", order=order)

            def chunked(w, ws, layout=layout, K=K):
                return layout.store(w, ws, K, "values"), layout.store(w, ws, K, "scales")

            wc = chunked(w, ws)
            nxt_c = rotating(lambda: chunked(*rand_mx(N, K)), wbytes)
        nxt_b = rotating(lambda: torch.randn(N, K, device=DEV).to(torch.bfloat16), N * K * 2)
        try:
            marlin = marlin_linear(w, ws)
            nxt_m = rotating(lambda: marlin_linear(*rand_mx(N, K)), wbytes)
        except Exception as e:  # noqa: BLE001
            marlin = None
            rows.append(
                {
                    "kind": "dense_setup",
                    "impl": "vllm_marlin",
                    "shape": name,
                    "error": f"{type(e).__name__}: {e}"[:800],
                    "traceback": traceback.format_exc()[-3000:],
                }
            )
            print(f"dense {name}: Marlin setup failed: {e}"[:300], flush=True)
        for M in DENSE_M + (() if quick else PREFILL_M):
            if M == 8192 and name == "lm_head":
                continue
            x = torch.randn(M, K, device=DEV).to(torch.bfloat16)
            ref = x.float() @ wf.T
            rec: dict = {"kind": "dense" if M in DENSE_M else "prefill", "shape": name, "N": N, "K": K, "M": M}
            fns = {
                "mxrepack": (
                    lambda: linear_mxfp4(x, w, ws, None, "w4a16", fold_scale=fold),
                    lambda: linear_mxfp4(x, *nxt_q(), None, "w4a16", fold_scale=fold),
                ),
                "cublas_bf16": (lambda: x @ wf.to(torch.bfloat16).T, lambda: x @ nxt_b().T),
            }
            if order:
                fns[f"mxrepack_{order}"] = (
                    lambda: linear_mxfp4(x, *wc, None, "w4a16", fold_scale=fold, order=order),
                    lambda: linear_mxfp4(x, *nxt_c(), None, "w4a16", fold_scale=fold, order=order),
                )
            if marlin is not None:
                fns["vllm_marlin"] = (
                    lambda: marlin[1].apply(marlin[0], x),
                    lambda: (lambda lm: lm[1].apply(lm[0], x))(nxt_m()),
                )
            for impl, (once, rotated) in fns.items():
                try:
                    rec[f"{impl}_rel_err"] = rel_err(once(), ref)
                    rec[f"{impl}_ms"], rec[f"{impl}_timing"] = time_it(rotated, M)
                except Exception as e:  # noqa: BLE001
                    rec[f"{impl}_error"] = f"{type(e).__name__}: {e}"[:800]
            peers = [rec[f"{p}_ms"] for p in ("vllm_marlin", "cublas_bf16") if f"{p}_ms" in rec]
            for ours in ("mxrepack", f"mxrepack_{order}"):
                if peers and f"{ours}_ms" in rec:
                    rec[f"{ours}_vs_best_peer"] = min(peers) / rec[f"{ours}_ms"]
            rows.append(rec)
            print(
                f"{rec['kind']} {name:8s} M={M:5d} "
                + "  ".join(
                    f"{n} {rec.get(f'{n}_ms', float('nan')):.4f} ms (err {rec.get(f'{n}_rel_err', float('nan')):.1e})"
                    for n in fns
                )
                + "".join(
                    f"  {ours} vs best x{rec[f'{ours}_vs_best_peer']:.2f}"
                    for ours in ("mxrepack", f"mxrepack_{order}")
                    if f"{ours}_vs_best_peer" in rec
                ),
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="T <= 64 and no prefill")
    ap.add_argument("--only", choices=("moe", "dense"))
    ap.add_argument("--moe-t", help="comma-separated T for the MoE comparison (default: the issue's ten)")
    ap.add_argument("--sweep-moe", help="comma-separated T: mxrepack's MoE tile configs only, no peers")
    ap.add_argument(
        "--sweep-kind",
        choices=(
            "all",
            "swap",
            "swap-deep",
            "rows",
            "fold",
            "wgmma",
            "wgmma-wide",
            "warps16",
            "remainder",
            "shipped",
            "overlap",
            "down-wide",
            "stages",
            "mma2",
            "wgmma-gemv",
        ),
        default="all",
        help="--sweep-moe/--sweep-dense: every variant, or only the swapped-operand tiles (swap, swap-deep) or the "
        "multi-row GEMVs (rows, dense only) or the shipped swapped tiles with the scale folded (fold), or the tiles "
        "of the strided layout's wgmma order (wgmma, MoE only, Hopper; wgmma-wide: 8 warps; warps16: the shipped "
        "8-warp tile on 16) beside the shipped one, "
        "or each order's shipped tile with a smaller remainder tile for partial blocks (remainder, MoE only), or "
        "only each order's shipped choice (shipped, MoE only: an A/B of two commits on one machine), or the wgmma "
        "order's shipped tile beside its twin with the other wgmma wait, and the in-flight one on 4 stages (overlap, "
        "MoE only, Hopper), or with down tiles "
        "2 and 4 times as wide (down-wide, MoE only, Hopper), or on 2-4 pipeline stages (stages, MoE only, Hopper), "
        "or the mma2 order's tiles and decode GEMVs beside each order's shipped choice (mma2, MoE only; sm_8x, sm_12x, "
        "or a Hopper under DISABLE_MMA_V3), or the wgmma order's decode GEMV shapes beside each order's shipped choice "
        "(wgmma-gemv, MoE only, Hopper)",
    )
    ap.add_argument("--sweep-dense", help="comma-separated M: mxrepack's W4A16 dense paths only, no peers")
    ap.add_argument("--sweep-shapes", default="", help="--sweep-dense: comma-separated layers (qkv, o, lm_head)")
    ap.add_argument(
        "--experts",
        type=int,
        default=E,
        help="MoE experts (top-4 of them a token): 128 is gpt-oss-120b, 32 gpt-oss-20b (4x the rows per expert at a T)",
    )
    ap.add_argument("--commit", help="the commit under test, for the record")
    ap.add_argument("--json")
    args = ap.parse_args()
    globals()["E"] = args.experts  # read by moe() and moe_sweep() at their call
    import triton

    meta = {
        "date": date.today().isoformat(),
        "commit": args.commit,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "experts": E,
        "DISABLE_MMA_V3": mma_v3_disabled(),
    }
    try:
        import vllm

        meta["vllm"] = vllm.__version__
    except Exception as e:  # noqa: BLE001
        meta["vllm"] = f"not importable: {e}"
    meta["copy_roofline_GBps"] = copy_roofline() / 1e9
    print(json.dumps(meta), flush=True)
    rows = Record(meta, args.json)
    if args.sweep_moe and args.sweep_kind == "rows":
        ap.error("--sweep-kind rows is a dense sweep: use it with --sweep-dense")
    if (
        args.sweep_moe
        and args.sweep_kind in ("wgmma", "wgmma-wide", "warps16", "overlap", "down-wide", "stages", "wgmma-gemv")
        and not wgmma_here()
    ):
        ap.error(f"--sweep-kind {args.sweep_kind} sweeps the wgmma order: a Hopper without DISABLE_MMA_V3")
    if args.sweep_moe and args.sweep_kind == "mma2" and not mma2_here():
        ap.error("--sweep-kind mma2 needs mma.sync builds: sm_8x, sm_12x, or a Hopper under DISABLE_MMA_V3=1")
    if args.sweep_moe:
        moe_sweep(rows, tuple(int(t) for t in args.sweep_moe.split(",")), args.sweep_kind)
    if args.sweep_dense:
        dense_sweep(
            rows,
            tuple(int(m) for m in args.sweep_dense.split(",")),
            args.sweep_kind,
            tuple(s for s in args.sweep_shapes.split(",") if s),
        )
    if args.sweep_moe or args.sweep_dense:
        return
    if args.only in (None, "moe"):
        moe(rows, args.quick, tuple(int(t) for t in args.moe_t.split(",")) if args.moe_t else MOE_T)
    if args.only in (None, "dense"):
        dense(rows, args.quick)


if __name__ == "__main__":
    main()
