"""A decode GEMV on the strided layout's ``mma2`` order: does one token's MoE step need the rows order's bytes?

    TRITON_INTERPRET=1 python benchmarks/experiments/mma2_gemv_probe.py check
    python benchmarks/experiments/mma2_gemv_probe.py sass [OUT.json]      # CPU: sm_121a / sm_90a builds
    python benchmarks/experiments/mma2_gemv_probe.py time [OUT.json]      # a GPU (no MMA: no DISABLE_MMA_V3 needed)

The ``mma2`` order's MoE tiles are at or above vLLM's Marlin at every T on sm_12x's code path, but at T = 1-8 the rows
order's decode GEMVs are 1.1-1.9x faster than those tiles (docs/PERF.md), and one checkpoint holds one order. This probe
times ``gemv_mxfp4.gemv_chunks`` on the ``mma2`` order (``gemv_mma2`` when it was first run), a GEMV over ``mma2`` bytes
(each 32-bit word is 8 consecutive codes of one row in one scale group: lane ``4g + t``'s word ``2q + c`` is row ``8c +
g``, codes ``32q + 8t ..``; a program decodes whole words as the tiles do, one scale a word, and multiplies each by an
8-value slice of x, accumulating per (row, lane, word) across the K tiles and reducing once at the end: no shuffle in
the loop), on a dense matrix. Its first GPU run (2026-11-27) had these functions inside the probe; they moved into the
package after it, the same code. A first version that decoded bytes four at a time (the tiles' ``pack = 4`` form) failed
``wgmma_words_packed`` in every build: a GEMV's reduction gives Triton no MMA operand layout to follow, so the decode
takes one int32 word. ``time`` sets it beside the shipped rows-order GEMV (``linear_mxfp4`` at M = 1) on the same
weights, at the MoE decode's N at T = 1 (4 experts' gate_up, 23040 x 2944; their down, 11520 x 2944) and lm_head's, in
CUDA graphs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mxrepack.kernels.gemv_mxfp4 import gemv_chunks  # noqa: E402


@triton.jit
def gemv_mma2_kernel(x_ptr, w_ptr, s_ptr, y_ptr, K, BLOCKS: tl.constexpr, MATH: tl.constexpr):
    """``y[rows] = W[rows] @ x`` for ``BLOCKS`` 16-row blocks (``gemv_mxfp4.gemv_chunks``, what the MoE decode GEMVs on
    this order run): W ``[N/16, K/128, 1024]`` bytes in the mma2 order, scales ``[N/16, K/128, 64]`` in the quad
    order, x ``[K]`` bf16, y fp32."""
    k_tiles = K // 128
    blk = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)
    y = gemv_chunks(x_ptr, w_ptr, s_ptr, blk * k_tiles * 1024, blk * k_tiles * 64, 1024, 64, K, BLOCKS, "mma2", MATH, 0)
    tl.store(y_ptr + tl.program_id(0) * 16 * BLOCKS + tl.arange(0, 16 * BLOCKS), y)


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


def run_gemv_mma2(x: torch.Tensor, wm: torch.Tensor, sm: torch.Tensor, y: torch.Tensor, blocks: int, warps: int, math):
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
        y = run_gemv_mma2(x, wm, sm, torch.empty(N), blocks, 4, "ops")
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
                run_gemv_mma2, x[0], wm, sm, y, blocks, warps, "asm-fold"
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
