"""Do the dense prefill's GEMMs fill the GPU better as concurrent slabs? At 2048 rows cuBLAS runs qkv
(2048 x 5120) and o (2048 x 2880) at about two thirds of the H200's BF16 peak; in 128 x 256 tiles they are 320 and 192
tiles on 132 SMs, 2.4 and 1.5 waves run as 3 and 2. If W's rows are cut into slabs whose GEMMs run on streams of their
own, the slabs' tiles can share a wave: the last wave of one fills with another's. The chunk orders' prefill then
dequantizes each slab on its own stream before its GEMM (the dequantization stays in front of its GEMM, but the GEMMs
pack).

Variants, each in a CUDA graph with weights rotating through more than L2 (as ``prefill_probe.py`` times them), ratio
cuBLAS (torch's call on the whole BF16 W) / variant, each checked against the fp32 reference:

- ``cublas_{split}``: the BF16 W in slabs, one stream each (the packing alone, no MXFP4);
- ``{order}_shipped``: the dispatch (``linear_dequant_gemm``: the whole W dequantized, then one GEMM);
- ``{order}_{split}``: each slab dequantized and multiplied on its own stream.

``split`` names the slabs: ``h2`` / ``h3`` equal slabs (256-row multiples), ``aF`` two slabs, the first F of W's rows.

    python benchmarks/experiments/prefill_streams_probe.py time [OUT.json] [SHAPES] [ROWS] [REPEATS]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dense_chunk_probe import SHAPES, chunk_pack  # noqa: E402
from dense_chunk_probe import meta as probe_meta  # noqa: E402
from prefill_probe import dequant_slab  # noqa: E402

from mxrepack.kernels.dequant_mxfp4 import linear_dequant_gemm, mma_v3_disabled  # noqa: E402

SPLITS = ("h2", "h3", "a0.6", "a0.75", "a0.8", "a0.2")


def bounds(N: int, split: str) -> list[tuple[int, int]]:
    """Row ranges of W's slabs for ``split`` (each start a multiple of 256 rows)."""
    if split.startswith("h"):
        parts = int(split[1:])
        step = -(-N // parts // 256) * 256
        cuts = list(range(0, N, step)) + [N]
    else:
        cut = round(N * float(split[1:]) / 256) * 256
        cuts = [0, cut, N]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def on_streams(streams: list, slabs: list, work) -> None:
    """``work(n0, n1)`` for each slab on its own stream, forked from and joined to the current one."""
    main = torch.cuda.current_stream()
    for st in streams[: len(slabs)]:
        st.wait_stream(main)
    for (n0, n1), st in zip(slabs, streams):
        with torch.cuda.stream(st):
            work(n0, n1)
    for st in streams[: len(slabs)]:
        main.wait_stream(st)


def time(out: str | None = None, shapes: str = "qkv,o", sizes: str = "2048,8192", repeats: str = "5") -> None:
    from common import deq, interleaved_ms, rand_mx, rotating

    order = "mma2" if mma_v3_disabled() else "wgmma"
    streams = [torch.cuda.Stream() for _ in range(3)]
    rows = []
    for name in shapes.split(","):
        N, K = SHAPES[name]
        w, s = rand_mx(N, K)
        wf = deq(w, s)
        w_bf16 = wf.to(torch.bfloat16)
        packed = chunk_pack(w, s, order)
        nxt = rotating(lambda: chunk_pack(*rand_mx(N, K), order), N * K // 2 + N * K // 32)
        nxt_b = rotating(lambda: torch.randn(N, K, device="cuda").to(torch.bfloat16), N * K * 2)
        whole = torch.empty(-(-N // 16) * 16, K, dtype=torch.bfloat16, device="cuda")
        for M in map(int, sizes.split(",")):
            if M * N > 2048 * 201088:
                continue
            x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
            y = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
            ref = x.float() @ wf.T

            def bf16_slabs(slabs, wb=None):
                wb = nxt_b() if wb is None else wb
                on_streams(streams, slabs, lambda n0, n1: torch.mm(x, wb[n0:n1].T, out=y[:, n0:n1]))

            def mx_slabs(slabs, wq=None):
                wq, sq = nxt() if wq is None else wq

                def work(n0, n1):
                    slab = dequant_slab(wq, sq, K, order, n0, n1, whole[n0:])
                    torch.mm(x, slab.T, out=y[:, n0:n1])

                on_streams(streams, slabs, work)

            fns = {
                "cublas": lambda: torch.mm(x, nxt_b().T, out=y),
                f"{order}_shipped": lambda: linear_dequant_gemm(x, *nxt(), None, y, order=order),
            }
            checks = {"cublas": lambda: torch.mm(x, w_bf16.T, out=y)}
            checks[f"{order}_shipped"] = lambda: linear_dequant_gemm(x, *packed, None, y, order=order)
            for split in SPLITS:
                slabs = bounds(N, split)
                fns[f"cublas_{split}"] = lambda sl=slabs: bf16_slabs(sl)
                fns[f"{order}_{split}"] = lambda sl=slabs: mx_slabs(sl)
                checks[f"cublas_{split}"] = lambda sl=slabs: bf16_slabs(sl, w_bf16)
                checks[f"{order}_{split}"] = lambda sl=slabs: mx_slabs(sl, packed)
            err = {}
            for key, fn in checks.items():
                y.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                err[key] = float((y.float() - ref).norm() / ref.norm())
            times = interleaved_ms(fns, int(repeats))
            ms = {key: round(statistics.median(t), 5) for key, t in times.items()}
            base = ms["cublas"]
            rows.append(
                {"shape": name, "N": N, "K": K, "M": M, "order": order, "ms": ms, "all_ms": times, "err": err}
                | {"slabs": {split: bounds(N, split) for split in SPLITS}}
            )
            print(
                f"{name} M={M}: cublas {base:.4f} | "
                + " ".join(f"{k} {t:.4f} ({base / t:.3f}, {err[k]:.1e})" for k, t in ms.items() if k != "cublas"),
                flush=True,
            )
            if out:
                Path(out).write_text(json.dumps(meta() | {"rows": rows}, indent=1))


def meta() -> dict:
    return probe_meta() | {"script": "benchmarks/experiments/prefill_streams_probe.py"}


if __name__ == "__main__":
    {"time": time}[sys.argv[1]](*sys.argv[2:])
