"""Where the dense W4A16 prefill's time goes (dequantize + cuBLAS, ``dequant_mxfp4.linear_dequant_gemm``) and whether
the dequantization can hide behind cuBLAS: at 2048 and 8192 rows, q/k/v/o's and lm_head's widths, in one run and in
CUDA graphs as ``peers.py`` times them, with every weight rotating through more than L2.

    python benchmarks/experiments/prefill_probe.py check             # on any CUDA GPU: the variants' bits
    python benchmarks/experiments/prefill_probe.py time [OUT.json] [SHAPES] [ROWS] [REPEATS] [ONLY]

Variants (each the plain ``rows`` order and, where this GPU reads one, the chunk order: wgmma on Hopper, mma2 under
``DISABLE_MMA_V3``, where the rows order runs the same code and is left out): ``cublas`` (BF16 weights, rotating: the
peer), ``cublas_same_w`` (one BF16 weight, which stays in L2 where it fits: the bound of what a dequantized slab still
in L2 saves), ``cublas_nn`` (BF16 weights stored ``[K, N]``), ``cublas_lt`` (with a zero bias, as
``torch.addmm`` runs it: cuBLASLt), ``shipped`` (the dispatch), ``dequant``
(the whole weight dequantized, no GEMM), ``slabN`` (the shipped path with N MB slabs), ``pipeN`` (slabs of N MB, each
dequantized on a side stream into one of two buffers while cuBLAS multiplies the one before: the dequantization behind
the GEMM where SMs are free), ``pipeN_hi`` (the same with the side stream at high priority, so that the dequant's
programs take SMs as the GEMM's finish). A sweep of the chunk dequantizer's rows, K tiles and warps a program ran at
c4dcf5a with those as ``DequantConfig`` fields (variants ``bBkKwW``; record ``prefill_probe_chunk_dequant_sweep_wgmma_
h200_2026-11-28_c4dcf5a.json``): none ahead of the shipped 64 rows x 1 K tile on 4 warps beyond the run's 2% spread,
and the fields went.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dense_chunk_probe import SHAPES, chunk_pack  # noqa: E402 - beside this script
from dense_chunk_probe import meta as probe_meta  # noqa: E402

from mxrepack.kernels.dequant_mxfp4 import (  # noqa: E402
    DequantConfig,
    dequantize_chunks,
    dequantize_mxfp4_rows,
    linear_dequant_gemm,
    mma_v3_disabled,
)


def dequant_slab(w, s, K: int, order: str, n0: int, n1: int, buf: torch.Tensor) -> torch.Tensor:
    """Rows ``n0:n1`` of W dequantized into ``buf`` (whole 16-row tiles in a chunk order), as BF16 ``[n1 - n0, K]``."""
    if order == "rows":
        return dequantize_mxfp4_rows(w[n0:n1], s[n0:n1], buf[: n1 - n0])
    hi = min(w.shape[0], -(-n1 // 16) * 16)
    return dequantize_chunks(w[n0:hi], s[n0:hi], K, order, buf[: hi - n0])[: n1 - n0]


def pipelined(x, w, s, out, order: str, rows: int, bufs: list, side: torch.cuda.Stream) -> torch.Tensor:
    """``out = x @ W.T``: slabs of ``rows`` rows dequantized on ``side`` into ``bufs`` in turn, each multiplied on the
    current stream once its dequantization is done; a buffer is written again only after its GEMM (events)."""
    N, K = out.shape[1], x.shape[1]
    main = torch.cuda.current_stream()
    side.wait_stream(main)  # fork: x, W and out are ready
    freed: list[torch.cuda.Event] = []
    for i, n0 in enumerate(range(0, N, rows)):
        n1 = min(N, n0 + rows)
        with torch.cuda.stream(side):
            if i >= len(bufs):
                side.wait_event(freed[i - len(bufs)])
            slab = dequant_slab(w, s, K, order, n0, n1, bufs[i % len(bufs)])
            ready = torch.cuda.Event()
            ready.record(side)
        main.wait_event(ready)
        torch.mm(x, slab.T, out=out[:, n0:n1])
        done = torch.cuda.Event()
        done.record(main)
        freed.append(done)
    main.wait_stream(side)  # join
    return out


def check() -> None:
    """On a GPU: the chunk orders' dequantizer (both orders: its decode does not depend on the MMA) gives the plain
    dequantizer's bits at q/k/v/o's and lm_head's widths; the pipelined slabs' error beside the shipped path's."""
    from common import deq, rand_mx

    for (name, (N, K)), o in itertools.product(SHAPES.items(), ("wgmma", "mma2")):
        N = min(N, 20000) + 8  # a partial last row tile
        w, s = rand_mx(N, K)
        s[0, :3] = torch.tensor([0, 1, 254], dtype=torch.uint8)  # E8M0's subnormal, smallest and largest scales
        want = dequantize_mxfp4_rows(w, s)
        got = dequantize_chunks(*chunk_pack(w, s, o), K, o)[:N]
        print(f"{o} dequantizer {name} N={N}: plain bits {torch.equal(got, want)}", flush=True)
        assert torch.equal(got, want)
    N, K, M = 1000, 2880, 300
    w, s = rand_mx(N, K)
    x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    ref = x.float() @ deq(w, s).T
    side = torch.cuda.Stream()
    bufs = [torch.empty(512, K, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    want = linear_dequant_gemm(x, w, s, None, torch.empty(M, N, dtype=torch.bfloat16, device="cuda"))
    for rows in (128, 384):
        got = pipelined(x, w, s, torch.empty_like(want), "rows", rows, bufs, side)
        errs = [float((y.float() - ref).norm() / ref.norm()) for y in (got, want)]
        print(f"pipelined rows={rows}: rel err {errs[0]:.2e} (shipped {errs[1]:.2e})", flush=True)
        assert errs[0] < 1e-2


def time(
    out: str | None = None,
    shapes: str = ",".join(SHAPES),
    sizes: str = "2048,8192",
    repeats: str = "2",
    only: str = "",
) -> None:
    """``only``: comma-separated variant names to time (default all)."""
    from common import deq, interleaved_ms, rand_mx, rotating

    order = "mma2" if mma_v3_disabled() else "wgmma"
    side, side_hi = torch.cuda.Stream(), torch.cuda.Stream(priority=-1)
    rows = []
    for name in shapes.split(","):
        N, K = SHAPES[name]
        w, s = rand_mx(N, K)
        wf = deq(w, s)
        wbytes = w.numel() + s.numel()
        nxt = {
            "rows": rotating(lambda: rand_mx(N, K), wbytes),
            order: rotating(lambda: chunk_pack(*rand_mx(N, K), order), wbytes),
        }
        nxt_b = rotating(lambda: torch.randn(N, K, device="cuda").to(torch.bfloat16), N * K * 2)
        w_same = wf.to(torch.bfloat16)
        # the same weights stored [K, N] (cuBLAS's NN product where x @ W.T is TN): what a dequantizer writing W
        # transposed would hand cuBLAS
        nxt_t = rotating(lambda: torch.randn(K, N, device="cuda").to(torch.bfloat16), N * K * 2)
        zero = torch.zeros(N, dtype=torch.bfloat16, device="cuda")
        whole = torch.empty(-(-N // 16) * 16, K, dtype=torch.bfloat16, device="cuda")
        for M in map(int, sizes.split(",")):
            if M * N > 2048 * 201088:
                continue
            x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
            y = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
            ref = x.float() @ wf.T
            fns = {
                "cublas": lambda: torch.mm(x, nxt_b().T, out=y),
                "cublas_same_w": lambda: torch.mm(x, w_same.T, out=y),
                "cublas_nn": lambda: torch.mm(x, nxt_t(), out=y),
                "cublas_lt": lambda: torch.addmm(zero, x, nxt_b().T, out=y),  # with a bias: cuBLASLt's epilogue
            }
            for o in (order,) if mma_v3_disabled() else ("rows", order):  # under DISABLE_MMA_V3 rows is the same
                fns[f"{o}_shipped"] = lambda o=o: linear_dequant_gemm(x, *nxt[o](), None, y, order=o)
                fns[f"{o}_dequant"] = lambda o=o: dequant_slab(*nxt[o](), K, o, 0, N, whole)
                for mb in (16, 64):
                    cfg = DequantConfig(chunk_bytes=mb << 20)
                    fns[f"{o}_slab{mb}"] = lambda o=o, cfg=cfg: linear_dequant_gemm(x, *nxt[o](), None, y, cfg, o)
                for mb in (4, 8, 16, 32):
                    slab_rows = max(128, (mb << 20) // (2 * K) // 128 * 128)
                    if slab_rows >= N:
                        continue
                    bufs = [torch.empty(slab_rows + 16, K, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
                    for tag, st in (("", side), ("_hi", side_hi)):
                        fns[f"{o}_pipe{mb}{tag}"] = lambda o=o, r=slab_rows, b=bufs, st=st: pipelined(
                            x, *nxt[o](), y, o, r, b, st
                        )
            if not only or any("lt" in k for k in only.split(",")):
                fns |= _lt_variants(x, y, wf.to(torch.bfloat16), nxt, nxt_b, order, K, N, whole)
            if only:
                fns = {k: f for k, f in fns.items() if k in only.split(",")}
            rec = {"shape": name, "N": N, "K": K, "M": M, "order": order, "err": {}, "ms": {}}
            for key, fn in fns.items():
                if key.endswith("_dequant"):
                    continue
                fn()
                torch.cuda.synchronize()
                rec["err"][key] = float((y.float() - ref).norm() / ref.norm())
            times = interleaved_ms(fns, int(repeats))
            rec["ms"] = {key: round(statistics.median(t), 5) for key, t in times.items()}
            rec["all_ms"] = times
            base = rec["ms"]["cublas"]
            rows.append(rec)
            best = sorted((t, k) for k, t in rec["ms"].items() if not k.startswith("cublas") and "dequant" not in k)
            print(
                f"{name} M={M}: cublas {base:.4f} same-w {rec['ms'].get('cublas_same_w', float('nan')):.4f} | "
                + " ".join(
                    f"{k} {t:.4f} ({base / t:.3f})" for k, t in sorted(rec["ms"].items()) if not k.startswith("cublas")
                ),
                flush=True,
            )
            print(f"  best: {', '.join(f'{k} {base / t:.3f}' for t, k in best[:4])}", flush=True)
            if out:
                Path(out).write_text(json.dumps(meta() | {"rows": rows}, indent=1))


def _lt_variants(x, y, w_bf16, nxt, nxt_b, order: str, K: int, N: int, whole) -> dict:
    """Stop 53's lever, timed in this probe's frame: the GEMM on cuBLASLt's heuristic candidates for this shape
    (``cublaslt_algos_probe``) in place of torch's default call. ``cublas_ltN``: the BF16 peer on the Nth candidate;
    ``cublas_ltbest``: on the one a short event timing on one weight picks (what a BF16 model could get too);
    ``{order}_whole_torch`` / ``{order}_whole_lt``: the whole weight dequantized, then torch's call or the picked
    algorithm. Run at stop 54 (PERF_LOG): the pick did not hold here."""
    from cublaslt_algos_probe import Gemm, _loaded_cublaslt
    from cublaslt_algos_probe import _time as event_ms

    M = x.shape[0]
    gemm = Gemm(_loaded_cublaslt(), M, N, K)
    found = gemm.candidates(16)
    best = min(found, key=lambda h: event_ms(lambda: gemm.run(h, x, w_bf16, y), reps=10, rounds=1))
    return {f"cublas_lt{i}": lambda h=h: gemm.run(h, x, nxt_b(), y) for i, h in enumerate(found)} | {
        "cublas_ltbest": lambda: gemm.run(best, x, nxt_b(), y),
        f"{order}_whole_torch": lambda: torch.mm(x, dequant_slab(*nxt[order](), K, order, 0, N, whole).T, out=y),
        f"{order}_whole_lt": lambda: gemm.run(best, x, dequant_slab(*nxt[order](), K, order, 0, N, whole), y),
    }


def meta() -> dict:
    return probe_meta() | {"script": "benchmarks/experiments/prefill_probe.py"}


if __name__ == "__main__":
    {"check": check, "time": time}[sys.argv[1]](*sys.argv[2:])
