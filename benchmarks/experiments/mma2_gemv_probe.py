"""A decode GEMV on the strided layout's ``mma2`` order: does one token's MoE step need the rows order's bytes?

    TRITON_INTERPRET=1 python benchmarks/experiments/mma2_gemv_probe.py check
    python benchmarks/experiments/mma2_gemv_probe.py sass [OUT.json]      # CPU: sm_121a / sm_90a builds
    python benchmarks/experiments/mma2_gemv_probe.py time [OUT.json]      # a GPU (no MMA: no DISABLE_MMA_V3 needed)

The ``mma2`` order's MoE tiles are at or above vLLM's Marlin at every T on sm_12x's code path, but at T = 1-8 the rows
order's decode GEMVs are 1.1-1.9x faster than those tiles (docs/PERF.md), and one checkpoint holds one order. This
probe is a GEMV over ``mma2`` bytes: each 32-bit word is 8 consecutive codes of one row in one scale group (lane
``4g + t``'s word ``2q + c``: row ``8c + g``, codes ``32q + 8t ..``), so a program decodes whole words as the tiles
do (the rotate-and-mask decode, one scale a word) and multiplies each by an 8-value slice of x, accumulating per
(row, lane, word) across the K tiles and reducing once at the end: no shuffle in the loop. ``time`` sets it beside the
shipped rows-order GEMV (``linear_mxfp4`` at M = 1) on the same weights, at the MoE decode's N at T = 1 (4 experts'
gate_up, 23040 x 2944; their down, 11520 x 2944) and lm_head's, in CUDA graphs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mxrepack.kernels import dequant_mxfp4 as dq  # noqa: E402

# The tiles' word decode (dequant_mxfp4.WORD_ASM_FOLDED: rotate, mask, times the scale) with one scale for the whole
# word (an mma2 word is one row's codes in one scale group), on one int32 word at a time: elementwise over words, so
# no layout Triton picks can hand it another word's bytes (the tiles' byte form, pack = 4, relies on the MMA operand's
# layout, which a GEMV does not have: a first version's builds failed ``wgmma_words_packed``). Outputs: the word's 4
# bf16 pairs, pair p = codes 2p (low half) and 2p + 1.
WORD_ASM_GEMV = tl.constexpr(dq.WORD_ASM_FOLDED.value.replace("$6", "$5"))


@triton.jit
def _bf16_pair_values(pair):
    """A bf16 pair in an int32 -> (low, high) as fp32."""
    return (pair << 16).to(tl.float32, bitcast=True), (pair & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _word_values(w_ptr, piece, lane, sc, MATH: tl.constexpr):
    """The 8 codes' values (fp32, each ``[BLOCKS, 32, 8]``: block, lane, word) of the words at ``piece`` (the chunk
    index of each block), times their scales ``sc`` (E8M0 bytes, one a word)."""
    word = tl.arange(0, 8)[None, None, :]
    if MATH == "ops":  # the portable twin: the words' bytes back in fragment order, then each nibble
        wb = tl.load(w_ptr + piece * 1024 + lane * 32 + tl.arange(0, 32)[None, None, :])
        b = tl.reshape(dq._fragment_bytes(wb, wb.shape[0]).to(tl.int32), (wb.shape[0], 32, 8, 2, 2))  # p = 2 p1 + p0
        s = dq.e8m0_to_fp32(sc.to(tl.int32))
        e01, e23 = tl.split(tl.permute(b, (0, 1, 2, 4, 3)))  # p1 = 0: bytes 0, 1; p1 = 1: bytes 2, 3
        b0, b1 = tl.split(e01)
        b2, b3 = tl.split(e23)
        v0, v1 = dq.e2m1_to_fp32(b0 & 15) * s, dq.e2m1_to_fp32(b0 >> 4) * s
        v2, v3 = dq.e2m1_to_fp32(b1 & 15) * s, dq.e2m1_to_fp32(b1 >> 4) * s
        v4, v5 = dq.e2m1_to_fp32(b2 & 15) * s, dq.e2m1_to_fp32(b2 >> 4) * s
        v6, v7 = dq.e2m1_to_fp32(b3 & 15) * s, dq.e2m1_to_fp32(b3 >> 4) * s
    else:
        tl.static_assert(MATH == "asm-fold", "MATH is asm-fold (scales <= 128) or ops")
        words = tl.load(w_ptr.to(tl.pointer_type(tl.int32)) + piece * 256 + lane * 8 + word)
        s16 = dq.e8m0_to_bf16_folded(sc).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        p0, p1, p2, p3 = tl.inline_asm_elementwise(
            WORD_ASM_GEMV,
            "=r,=r,=r,=r,r,r",
            [words, s16 | (s16 << 16)],
            dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
            is_pure=True,
            pack=1,
        )
        v0, v1 = _bf16_pair_values(p0)
        v2, v3 = _bf16_pair_values(p1)
        v4, v5 = _bf16_pair_values(p2)
        v6, v7 = _bf16_pair_values(p3)
    return v0, v1, v2, v3, v4, v5, v6, v7


@triton.jit
def _x(x_ptr, kt, j: tl.constexpr):
    """x at code j of every word (t, q) of a K tile, ``[1, 4 (g's place), 4 t, 4 q, 1]`` -> fits ``[B, 8g, 4t, 4q, 2c]``
    after a reshape of the words' ``[B, 32, 8]``."""
    t = tl.arange(0, 4)[:, None]
    q = tl.arange(0, 4)[None, :]
    return tl.reshape(tl.load(x_ptr + kt * 128 + 32 * q + 8 * t + j).to(tl.float32), (1, 1, 4, 4, 1))


@triton.jit
def gemv_mma2_kernel(x_ptr, w_ptr, s_ptr, y_ptr, K, BLOCKS: tl.constexpr, MATH: tl.constexpr):
    """``y[rows] = W[rows] @ x`` for ``BLOCKS`` 16-row blocks: W ``[N/16, K/128, 1024]`` bytes in the mma2 order,
    scales ``[N/16, K/128, 64]`` in the quad order, x ``[K]`` bf16, y fp32."""
    k_tiles = K // 128
    blk = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)
    lane = tl.arange(0, 32)[None, :, None]
    acc = tl.zeros((BLOCKS, 8, 4, 4, 2), dtype=tl.float32)  # block, g, t, q, c: one word's 8 products summed
    for kt in range(0, k_tiles):
        piece = blk[:, None, None] * k_tiles + kt
        sc = tl.load(s_ptr + piece * 64 + 8 * (lane // 4) + tl.arange(0, 8)[None, None, :])  # word 2q + c's scale
        v0, v1, v2, v3, v4, v5, v6, v7 = _word_values(w_ptr, piece, lane, sc, MATH)
        part = tl.reshape(v0, (BLOCKS, 8, 4, 4, 2)) * _x(x_ptr, kt, 0)
        part += tl.reshape(v1, (BLOCKS, 8, 4, 4, 2)) * _x(x_ptr, kt, 1)
        part += tl.reshape(v2, (BLOCKS, 8, 4, 4, 2)) * _x(x_ptr, kt, 2)
        part += tl.reshape(v3, (BLOCKS, 8, 4, 4, 2)) * _x(x_ptr, kt, 3)
        part += tl.reshape(v4, (BLOCKS, 8, 4, 4, 2)) * _x(x_ptr, kt, 4)
        part += tl.reshape(v5, (BLOCKS, 8, 4, 4, 2)) * _x(x_ptr, kt, 5)
        part += tl.reshape(v6, (BLOCKS, 8, 4, 4, 2)) * _x(x_ptr, kt, 6)
        part += tl.reshape(v7, (BLOCKS, 8, 4, 4, 2)) * _x(x_ptr, kt, 7)
        acc += part
    y = tl.sum(tl.sum(acc, axis=3), axis=2)  # [block, g, c]
    rows = 16 * blk[:, None, None] + 8 * tl.arange(0, 2)[None, None, :] + tl.arange(0, 8)[None, :, None]
    tl.store(y_ptr + rows, y)


SIGNATURE = {"x_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "y_ptr": "*fp32", "K": "i32"} | {
    "BLOCKS": "constexpr",
    "MATH": "constexpr",
}
CANDIDATES = [(blocks, warps) for blocks in (1, 2, 4, 8) for warps in (1, 2, 4)]  # 16-row blocks a program, warps


def mma2_matrix(w: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Natural ``[N, K/2]`` bytes and ``[N, K/32]`` scales -> the mma2 order's 16-row blocks (the strided layout's
    functions on one 16-row tile per block): ``[N/16, K/128, 1024]`` and ``[N/16, K/128, 64]``."""
    from mxrepack.layouts import strided

    N, KH = w.shape
    tiled = w.view(N // 16, 16, KH // 64, 64).permute(0, 2, 1, 3).contiguous()
    scales = strided.quad_scales(s[None], 16).view(N // 16, KH // 64, 64)
    return strided.mma2_order(tiled).view(N // 16, KH // 64, 1024), scales


def gemv_mma2(x: torch.Tensor, wm: torch.Tensor, sm: torch.Tensor, y: torch.Tensor, blocks: int, warps: int, math):
    gemv_mma2_kernel[(wm.shape[0] // blocks,)](x, wm, sm, y, x.shape[-1], BLOCKS=blocks, MATH=math, num_warps=warps)
    return y


def check() -> None:
    from mxrepack.quant import dequantize_mxfp4

    torch.manual_seed(0)
    N, K = 128, 384
    w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8)
    s = torch.randint(119, 124, (N, K // 32), dtype=torch.uint8)
    x = torch.randn(K).to(torch.bfloat16)
    ref = dequantize_mxfp4(w, s, torch.float32) @ x.float()
    wm, sm = mma2_matrix(w, s)
    for blocks in (1, 2, 4):
        y = gemv_mma2(x, wm, sm, torch.empty(N), blocks, 4, "ops")
        err = ((y - ref).norm() / ref.norm()).item()
        print(f"BLOCKS={blocks}: relative error {err:.2e}", flush=True)
        assert err < 1e-5, err


def sass(out: str | None = None) -> None:
    """Main-loop counts of sm_121a and sm_90a builds: instructions a word (8 codes) of the probe."""
    from sass_vs_triton_kernels import loop_counts
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from mxrepack.kernels import check as kcheck

    rows = []
    for cap in (121, 90):
        for blocks, warps in CANDIDATES:
            src = ASTSource(gemv_mma2_kernel, SIGNATURE, {"BLOCKS": blocks, "MATH": "asm-fold"})
            k = triton.compile(kcheck.specialized(src), target=GPUTarget("cuda", cap, 32), options={"num_warps": warps})
            c = loop_counts(k.asm["cubin"])
            rec = {"cap": cap, "blocks": blocks, "warps": warps, "loop": c["loop"], "registers": c["registers"]}
            rec |= {"stack": c["stack_bytes"], "per_word": c["loop"] * 32 * warps / (blocks * 256)}
            rows.append(rec)
            print(json.dumps(rec), flush=True)
    if out:
        Path(out).write_text(json.dumps(rows, indent=1))


def time(out: str | None = None) -> None:
    """GPU: the probe's candidates beside the shipped rows-order GEMV, each checked against the fp32 reference."""
    import functools
    import os

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from common import DEV, bench_decode, deq, rand_mx

    from mxrepack.kernels.linear_mxfp4 import linear_mxfp4

    meta = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "commit": os.environ.get("COMMIT")}
    rows: list[dict] = []
    print(json.dumps(meta), flush=True)
    torch.manual_seed(0)
    for label, N in (("gate_up x4", 23040), ("down x4", 11520), ("lm_head", 201088)):
        K = 2944
        w, s = rand_mx(N, K)
        s.clamp_(max=128)  # the folded decode's precondition, for both
        wm, sm = mma2_matrix(w, s)
        x = torch.randn(1, K, device=DEV).to(torch.bfloat16)
        ref = deq(w[:4096], s[:4096]) @ x[0].float()  # the first rows: enough to see a wrong order
        y = torch.empty(N, device=DEV)
        runs = {"shipped rows GEMV": functools.partial(linear_mxfp4, x, w, s, None, "w4a16", fold_scale=True)}
        for blocks, warps in CANDIDATES:
            runs[f"mma2 gemv {16 * blocks} rows w{warps}"] = functools.partial(
                gemv_mma2, x[0], wm, sm, y, blocks, warps, "asm-fold"
            )
        for name, run in runs.items():
            rec = {"shape": label, "N": N, "K": K, "candidate": name}
            try:
                got = run().float().view(-1)[:4096]
                rec["rel_err"] = float((got - ref).norm() / ref.norm())
                rec["ms"] = bench_decode(run)
                rec["GBps"] = (w.numel() + s.numel()) / rec["ms"] / 1e6
            except Exception as e:  # noqa: BLE001 - recorded, the others still run
                rec["error"] = f"{type(e).__name__}: {e}"[:300]
            rows.append(rec)
            if out:
                Path(out).write_text(json.dumps({**meta, "rows": rows}, indent=1))
            shown = (
                f"{rec['ms']:.4f} ms {rec['GBps']:.0f} GB/s err {rec['rel_err']:.1e}" if "ms" in rec else rec["error"]
            )
            print(f"{label:10s} {name:28s} {shown}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    {"check": check, "sass": sass, "time": time}[sys.argv[1]](*sys.argv[2:])
