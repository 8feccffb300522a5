"""Pick the shipped decode configs among a sweep's leaders: each candidate timed several times,
interleaved (so that drift hits all alike), median reported. Dense layers at M = 1 (lm_head) and the 120b MoE at
T = 1..64 (CUDA graph; bytes = weights + scales, touched experts only for the MoE). The MoE routing rotates through
several draws whose touched experts add up to > 400 MB, as the dense weights rotate: one layer's four experts at
T = 1 (53 MB) would otherwise be read from H100's 50 MB L2 in part. Candidates that differ only in ``pdl`` must
give the same bits (it changes when a GEMV starts, not what it computes).

Candidate sets (``SETS``): ``default``, the stop-9 set (dense f16x2 shapes, MoE shapes with and without pdl);
``shipped``, the shipped configs alone; ``shapes``, tile shapes again once the partial K tile was loaded first
(stop 11). The ``tail`` set of stop 11, each shipped config with its partial tile first and last, ran at commit
9597ffa, which still had the option; the ``handoff`` and ``prefetch`` sets of stop 15 (the MoE pair with down
started per assignment, and with down's weights asked of L2 during gate_up) ran at commit 5f58364; the ``group``
and ``group_shapes`` sets of stop 16 (two assignments of one expert per program) at commit d711308; the ``fused``
and ``fused64`` sets of stop 18 (down by intermediate slices inside the gate_up programs, atomics into the output)
at commit 72bda58, and its ``maxnreg`` set (registers capped at launch; it printed each kernel's registers as
compiled there) at commit e61bd69.
Usage: python benchmarks/experiments/decode_pick.py [--set NAME] [OUT.json]"""

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for common
from common import (  # noqa: E402
    DEV,
    copy_roofline,
    interleaved_ms,
    moe_expert_bytes,
    moe_weights,
    rand_mx,
    rotating,
    rotating_moe_draws,
    without_pdl,
)

from mxrepack.kernels.gemv_mxfp4 import NARROW, WIDE, GemvConfig, gemv_mxfp4  # noqa: E402
from mxrepack.kernels.moe_mxfp4 import MOE_GEMV, moe_mxfp4  # noqa: E402

REPEATS = 5
LM_HEAD = ("lm_head", 201088, 2880)


SETS = {
    "default": {
        "dense": [
            (
                LM_HEAD,
                [
                    GemvConfig(16, 1024, 8, 1, "f16x2"),
                    GemvConfig(16, 1024, 8, 1, "f16x2", pdl=1),
                    GemvConfig(8, 512, 4, 1, "f16x2"),
                    GemvConfig(8, 512, 4, 1, "f16x2", pdl=1),
                ],
            )
        ],
        "moe": [
            MOE_GEMV,
            MOE_GEMV.each(pdl=0),
            GemvConfig(16, 512, 4, 1, "f16x2", pdl=1),
            GemvConfig(32, 256, 8, 1, "f16x2", pdl=1),
            GemvConfig(16, 256, 4, 1, "f16x2", pdl=1),
        ],
        "tokens": (1, 2, 4, 8, 16, 64),
    },
    "shipped": {"dense": [(LM_HEAD, [WIDE])], "moe": [MOE_GEMV], "tokens": (1, 2, 4, 8, 16, 32, 64)},
    "shapes": {  # tile shapes again, with the partial tile first
        "dense": [
            (
                LM_HEAD,
                [WIDE]
                + [
                    GemvConfig(n, k, w, 1, "f16x2")
                    for n, k, w in ((16, 512, 4), (8, 1024, 8), (32, 1024, 8), (16, 1024, 4), (8, 512, 4))
                ],
            )
        ],
        "moe": [MOE_GEMV]
        + [
            GemvConfig(n, k, w, 1, "f16x2", pdl=1)
            for n, k, w in ((16, 1024, 8), (16, 256, 4), (32, 512, 8), (8, 512, 4), (16, 512, 8), (32, 256, 4))
        ],
        "tokens": (1, 4, 8, 64),
    },
}


def same_bits_as_pdl_twin(run, cfg) -> None:
    twin = without_pdl(cfg)
    if twin != cfg:
        assert torch.equal(run(cfg), run(twin)), cfg.name()


def dense_case(rows: list, bw: float, shape, configs) -> None:
    name, N, K = shape
    wbytes = N * K // 2 + N * K // 32
    nxt = rotating(lambda: rand_mx(N, K), wbytes)
    nxt_b = rotating(lambda: torch.randn(N, K, device=DEV).to(torch.bfloat16), N * K * 2)
    x = torch.randn(1, K, device=DEV).to(torch.bfloat16)
    out = torch.empty(1, N, device=DEV, dtype=torch.bfloat16)
    w0 = nxt()
    for c in configs:
        same_bits_as_pdl_twin(lambda cfg: gemv_mxfp4(x, *w0, None, out.clone(), cfg), c)
    fns = {"cublas": lambda: x @ nxt_b().T}
    fns |= {c.name(): (lambda c=c: gemv_mxfp4(x, *nxt(), None, out, c)) for c in configs}
    times = interleaved_ms(fns, REPEATS)
    ms_c = statistics.median(times.pop("cublas"))
    for cfg_name, t in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
        ms = statistics.median(t)
        rows.append(
            {
                "kind": f"{name}_m1",
                "N": N,
                "K": K,
                "config": cfg_name,
                "ms_median": ms,
                "ms_all": t,
                "cublas_bf16_ms": ms_c,
                "vs_cublas": ms_c / ms,
                "roofline_frac": wbytes / (ms * 1e-3) / bw,
            }
        )
        print(
            f"{name} M=1 {cfg_name:32s} {ms:.4f} ms (min {min(t):.4f} max {max(t):.4f})  x{ms_c / ms:.2f} cuBLAS "
            f"{100 * wbytes / (ms * 1e-3) / bw:.1f}% roofline",
            flush=True,
        )


def moe_cases(rows: list, bw: float, configs, tokens) -> None:
    W = moe_weights()
    per_expert = moe_expert_bytes(W)
    torch.manual_seed(0)
    for T in tokens:
        nxt, draws, touched = rotating_moe_draws(T, per_expert)
        xm, ids, wts = nxt()
        for c in configs:
            same_bits_as_pdl_twin(lambda cfg: moe_mxfp4(xm, ids, wts, W, config=cfg), c)
        o = torch.empty(T, 2880, device=DEV, dtype=torch.bfloat16)
        times = interleaved_ms(
            {c.name(): (lambda c=c: moe_mxfp4(*nxt(), W, config=c, out=o)) for c in configs}, REPEATS
        )
        for name, t in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
            ms = statistics.median(t)
            rows.append(
                {
                    "kind": "moe_decode",
                    "T": T,
                    "config": name,
                    "ms_median": ms,
                    "ms_all": t,
                    "draws": len(draws),
                    "experts_touched": touched / per_expert,
                    "roofline_frac": touched / (ms * 1e-3) / bw,
                }
            )
            print(
                f"moe T={T} {name:32s} {ms:.4f} ms (min {min(t):.4f} max {max(t):.4f})  "
                f"{100 * touched / (ms * 1e-3) / bw:.1f}% roofline",
                flush=True,
            )


def main() -> None:
    args = sys.argv[1:]
    set_name = args[args.index("--set") + 1] if "--set" in args else "default"
    chosen = SETS[set_name]
    out = [a for a in args if not a.startswith("--") and a != set_name]
    bw = copy_roofline()
    rows = [
        {
            "device": torch.cuda.get_device_name(),
            "copy_TBps": bw / 1e12,
            "repeats": REPEATS,
            "set": set_name,
            "shipped_dense": [WIDE.name(), NARROW.name()],
            "shipped_moe": MOE_GEMV.name(),
        }
    ]
    for shape, configs in chosen["dense"]:
        dense_case(rows, bw, shape, configs)  # each case's rotating weights are freed when it returns
    torch.cuda.empty_cache()
    moe_cases(rows, bw, chosen["moe"], chosen["tokens"])
    if out:
        json.dump(rows, open(out[0], "w"), indent=1)


if __name__ == "__main__":
    main()
