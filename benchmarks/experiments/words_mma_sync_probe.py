"""Whether the wgmma order, decoded a word at a time, beats the mma2 order on ``mma.sync`` (sm_12x's code path).

Offline (PERF_LOG stop 43; records ``sass_mma2_loop_moves_*`` and ``sass_wgmma_words_on_mma_sync_*``): every mma2-order
K loop on sm_121a spends about 1.5 ``MOV``s per ``HMMA`` pairing x's registers, because Triton's ``computeOrigBitWidth``
follows the byte decode back to its uint8 load and gives the dot kWidth 8. The wgmma order's bytes decoded word by word
(int32 loads of words and scales, ``WORD_ASM`` per word, as the GEMVs decode) with an impure no-op on the decoded tile
before the dot build with kWidth 2 instead: x read by ``ldmatrix``, the ``MOV``s gone, MoE gate_up's 128-token loop
1195 -> 1083 instructions, down's 651 -> 462, the dense 16-row tile's 225 -> 265. This probe runs that build (the
module's ``chunk_tile`` swapped for :func:`chunk_tile_words` before anything compiles; the order checks that refuse
the wgmma order on ``mma.sync`` relaxed for the probe only) against the shipped mma2 order: same weights in the two byte
orders, the mma2 order's own tiles for both, errors against the fp32 reference, times interleaved.

    DISABLE_MMA_V3=1 python benchmarks/experiments/words_mma_sync_probe.py check              # Hopper: sm_12x's path
    DISABLE_MMA_V3=1 python benchmarks/experiments/words_mma_sync_probe.py time [OUT.json] [MOE_T] [E] [DENSE_ROWS]

Ran once (H200, 2026-11-29, PERF_LOG stop 44): ``check`` passed, and ``time`` found the word decode 1.8-7.3x slower than
the shipped mma2 order at every size: the no-op makes Triton convert the decoded tile through shared memory.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mxrepack.kernels.dequant_mxfp4 as dq  # noqa: E402
import mxrepack.kernels.linear_mxfp4 as lin  # noqa: E402
import mxrepack.kernels.moe_mxfp4 as moe  # noqa: E402
from mxrepack.kernels.dequant_mxfp4 import _word_pairs_asm, _word_scales, shift_scales  # noqa: E402

SHIPPED_CHUNK_TILE = dq.chunk_tile


@triton.jit
def wgmma_words_tile(
    w_ptr,
    s_ptr,
    w_off,
    s_off,
    BLOCKS: tl.constexpr,
    MATH: tl.constexpr,
    SCALE_SHIFT: tl.constexpr,
    SCALES_U8: tl.constexpr,
):
    """The wgmma order's K tile decoded a word at a time, relabelled to ``[16 BLOCKS, 128]`` in natural order.
    ``SCALES_U8``: the scale bytes taken as uint8 after their int32 loads, as this probe ran them; without it they stay
    int32 (``chunk_operand_probe.py words-int32``)."""
    lane = tl.arange(0, 32)[None, :, None]
    woff = w_off[:, None, None]
    soff = s_off[:, None, None]
    # the lane's 8 scale bytes as two int32 words: a uint8 load would widen kWidth again
    s_words = s_ptr.to(tl.pointer_type(tl.int32)) + (soff + 8 * (lane // 4)) // 4
    sw = tl.load(s_words + tl.arange(0, 2)[None, None, :])
    sb = tl.reshape((sw[:, :, :, None] >> (8 * tl.arange(0, 4))[None, None, None, :]) & 0xFF, (BLOCKS, 32, 8))
    if SCALES_U8:
        sb = sb.to(tl.uint8)
    sc = shift_scales(sb, SCALE_SHIFT)
    s_lo, s_hi = _word_scales(sc, "wgmma")
    p0, p1, p2, p3 = _word_pairs_asm(w_ptr, woff, lane, s_lo, s_hi, "wgmma", MATH)
    pairs = tl.join(tl.join(p0, p1), tl.join(p2, p3))  # [BLOCKS, 32, 8, kh, c]: pair 2 c + kh of word s
    lo, hi = tl.inline_asm_elementwise(
        "mov.b32 {$0, $1}, $2;", "=h,=h,r", [pairs], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=1
    )
    x = tl.reshape(tl.join(lo, hi), (BLOCKS, 8, 4, 8, 2, 2, 2))  # block, g, t, s, kh, c, kl
    return tl.reshape(tl.permute(x, (0, 5, 1, 3, 4, 2, 6)), (16 * BLOCKS, 128))  # block, c, g | s, kh, t, kl


@triton.jit
def chunk_tile_words(
    w_ptr, s_ptr, w_off, s_off, BLOCKS: tl.constexpr, MATH: tl.constexpr, ORDER: tl.constexpr, SCALE_SHIFT: tl.constexpr
):
    """``dequant_mxfp4.chunk_tile``, but the wgmma order decoded a word at a time and fenced from Triton's operand-width
    search (the mma2 order as shipped)."""
    if ORDER == "mma2":
        x = SHIPPED_CHUNK_TILE(w_ptr, s_ptr, w_off, s_off, BLOCKS, MATH, ORDER, SCALE_SHIFT)
    else:
        x = wgmma_words_tile(w_ptr, s_ptr, w_off, s_off, BLOCKS, MATH, SCALE_SHIFT, True)
        # impure: Triton's computeOrigBitWidth stops here, so mma.sync takes kWidth 2 (x by ldmatrix)
        x = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.bfloat16, is_pure=False, pack=2)
    return x


def install() -> None:
    """Swap the decode in before anything compiles; let the wgmma order run on mma.sync; skip the byte-decode build
    check (this decode has no byte asm to check)."""
    dq.chunk_tile = chunk_tile_words
    shipped_check = dq.check_order

    def check_order(order, activations, device):
        if order != "wgmma":
            shipped_check(order, activations, device)

    for module in (moe, lin):
        module.check_order = check_order
        module.check_chunk_build = lambda compiled: None
    if hasattr(lin, "_LAUNCH_CHUNKS"):  # since stop 44 the dense launcher checks each build itself
        lin._LAUNCH_CHUNKS.check = None


def _layers(W: dict) -> dict:
    from peers import ordered_layer

    return {order: ordered_layer(W, order) for order in ("mma2", "wgmma")}


def _as_wgmma(cfg):
    """The mma2 order's tile (and its remainder) reading the wgmma order's bytes."""
    rem = cfg.remainder
    return dataclasses.replace(
        cfg, order="wgmma", remainder=None if rem is None else dataclasses.replace(rem, order="wgmma")
    )


def check() -> None:
    """Small MoE layers and dense layers, both decodes against the fp32 reference (needs mma.sync: DISABLE_MMA_V3)."""
    from common import moe_decode_inputs, moe_reference, moe_weights
    from dense_chunk_probe import chunk_pack

    from mxrepack.quant.mx import dequantize_mxfp4

    install()
    W = moe_weights(E=8)
    layers = _layers(W)
    for T in (16, 200):
        x, ids, wts = moe_decode_inputs(T, E=8)
        ref = moe_reference(x, ids, wts, W)
        cfg = moe.pick_moe(T, 4, 8, 2880, order="mma2")
        for order, c in (("mma2", cfg), ("wgmma", _as_wgmma(cfg))):
            y = moe.moe_mxfp4(x, ids, wts, layers[order], config=c, order=order)
            err = float((y.float() - ref).norm() / ref.norm())
            print(f"moe T={T} {order} {c.name()}: rel err {err:.2e}", flush=True)
            assert err < 1e-2, err
    torch.manual_seed(0)
    for N, K, M in ((80, 288, 5), (200, 512, 40), (5120, 2880, 64)):
        w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8)
        s = torch.randint(118, 126, (N, K // 32), dtype=torch.uint8)
        x = torch.randn(M, K).to(torch.bfloat16).cuda()
        ref = x.float() @ dequantize_mxfp4(w, s).float().cuda().T
        cfg = lin.pick_chunk_config(M, N, K, order="mma2")
        for order in ("mma2", "wgmma"):
            wq, sq = (t.cuda() for t in chunk_pack(w, s, order))
            y = lin.linear_chunks(x, wq, sq, order, None, cfg, torch.empty(M, N, dtype=torch.bfloat16, device="cuda"))
            err = float((y.float() - ref).norm() / ref.norm())
            print(f"dense N={N} K={K} M={M} {order} {cfg.name()}: rel err {err:.2e}", flush=True)
            assert err < 1e-2, err


def time(
    out: str | None = None, moe_t: str = "64,512,1024,4096", experts: str = "128", dense_rows: str = "16,64"
) -> None:
    """The MoE at each T (the mma2 order's pick, in both byte orders) and q/k/v/o / lm_head at each row count (the mma2
    dispatch's tile, both orders), interleaved, three rounds each."""
    from common import interleaved_ms, moe_decode_inputs, moe_reference, moe_weights
    from dense_chunk_probe import Layer, meta

    from mxrepack.kernels.dequant_mxfp4 import fits_fold

    install()
    rows = []
    E = int(experts)
    W = moe_weights(E=E)
    layers = _layers(W)
    fold = fits_fold(W["w13_weight_scale"], W["w2_weight_scale"])
    for T in map(int, moe_t.split(",")):
        cfg = moe.pick_moe(T, 4, E, 2880, fold_scale=fold, order="mma2")
        cands = {"mma2": (cfg, "mma2"), "wgmma words": (_as_wgmma(cfg), "wgmma")}
        # from 64 tokens each draw touches nearly every expert (1.4 GB at 128): no weight stays in L2 between calls
        draws = itertools.cycle([moe_decode_inputs(T, E) for _ in range(4)])
        x, ids, wts = next(draws)
        ref = moe_reference(x, ids, wts, W)
        o = torch.empty(T, 2880, device="cuda", dtype=torch.bfloat16)
        rec = {"kind": "moe", "E": E, "T": T, "config": cfg.name()}
        for name, (c, order) in cands.items():
            y = moe.moe_mxfp4(x, ids, wts, layers[order], config=c, order=order, fold_scale=fold)
            rec[f"{name}_err"] = float((y.float() - ref).norm() / ref.norm())
        fns = {
            name: (
                lambda c=c, order=order: moe.moe_mxfp4(
                    *next(draws), layers[order], config=c, order=order, out=o, fold_scale=fold
                )
            )
            for name, (c, order) in cands.items()
        }
        rec |= {f"{name}_ms": ts for name, ts in interleaved_ms(fns, 3).items()}
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for shape in ("qkv", "o", "lm_head"):
        by_order = {order: Layer.random(shape, order) for order in ("mma2", "wgmma")}
        for M in map(int, dense_rows.split(",")):
            layer = by_order["mma2"]
            cfg = lin.pick_chunk_config(M, layer.N, layer.K, sms, layer.fold, order="mma2")
            x = torch.randn(M, layer.K, device="cuda").to(torch.bfloat16)
            y = torch.empty(M, layer.N, dtype=torch.bfloat16, device="cuda")
            ref = x.float() @ layer.wf.T
            rec = {"kind": "dense", "shape": shape, "M": M, "config": cfg.name()}
            for order, lay in by_order.items():
                got = lin.linear_chunks(x, lay.wq, lay.sq, order, None, cfg, y)
                rec[f"{order}_err"] = float((got.float() - x.float() @ lay.wf.T).norm() / ref.norm())
            fns = {
                order: (lambda lay=lay, order=order: lin.linear_chunks(x, *lay.next_chunked(), order, None, cfg, y))
                for order, lay in by_order.items()
            }
            rec |= {f"{order}_ms": ts for order, ts in interleaved_ms(fns, 3).items()}
            rows.append(rec)
            print(json.dumps(rec), flush=True)
    if out:
        Path(out).write_text(
            json.dumps(meta() | {"script": "benchmarks/experiments/words_mma_sync_probe.py", "rows": rows})
        )


if __name__ == "__main__":
    {"check": check, "time": time}[sys.argv[1]](*sys.argv[2:])
