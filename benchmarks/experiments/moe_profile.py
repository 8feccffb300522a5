"""Where MoE decode time goes: each kernel's duration and the gaps between them, from the CUDA profiler
over CUDA-graph replays (120b shapes, rotating routing as in decode_pick.py).
Each kernel is also reported with its start after the end of the kernel before it (negative: launched while
that one ran, under programmatic dependent launch). Stop 15's ``--handoff`` mode (the MoE pair only, with the
per-assignment handoff as a third variant) ran at commit 5f58364, stop 16's ``--group`` mode (one and two
assignments of one expert per program) at commit d711308.
Usage: python benchmarks/experiments/moe_profile.py [OUT.json] [T,T,...]"""

import collections
import dataclasses
import itertools
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for common
from common import (  # noqa: E402
    DEV,
    capture_graph,
    copy_roofline,
    lm_head_m1,
    moe_expert_bytes,
    moe_weights,
    replay_ms,
    rotating_moe_draws,
)

from mxrepack.kernels.gemv_mxfp4 import WIDE, gemv_mxfp4  # noqa: E402
from mxrepack.kernels.moe_mxfp4 import moe_mxfp4, pick_moe_gemv_config  # noqa: E402

REPLAYS = 20


def profile_graph(fn, per_launch: bool = False) -> tuple[float, list[dict], list[float]]:
    """(ms per replay of ``fn`` in a CUDA graph, per-kernel calls and mean duration in us, the gaps in us
    between one kernel's end and the next one's start; negative where they overlap). ``per_launch``: a kernel
    launched n times a replay is reported as n entries, ``name #i`` for its i-th launch in the replay (a tile and
    its remainder tile, apart)."""
    g = capture_graph(fn)
    ms = replay_ms(g, REPLAYS)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            g.replay()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
    names = [e.name for e in events]
    if per_launch:
        launches = collections.Counter(names)
        seen = collections.Counter()
        for i, n in enumerate(names):
            names[i] = f"{n[:50]} #{seen[n] % max(launches[n] // REPLAYS, 1)}"
            seen[n] += 1
    per = collections.defaultdict(list)
    for n, e in zip(names, events):
        per[n].append(e.time_range.end - e.time_range.start)
    gaps = [b.time_range.start - a.time_range.end for a, b in zip(events, events[1:])]
    starts = collections.defaultdict(list)  # each kernel's start after the end of the one before it
    for n, gap in zip(names[1:], gaps):
        starts[n].append(gap)
    kernels = [
        {
            "kernel": name[:60],
            "calls": len(d),
            "us_mean": sum(d) / len(d),
            "start_after_previous_end_us": sum(starts[name]) / max(len(starts[name]), 1),
        }
        for name, d in per.items()
    ]
    return ms, kernels, gaps


def report(rows: list, what: str, ms: float, roofline_s: float, kernels: list, gaps: list) -> None:
    print(f"{what}: {ms * 1e3:.1f} us per call, roofline {roofline_s * 1e6:.1f} us", flush=True)
    for k in kernels:
        print(
            f"   {k['kernel']:60s} {k['us_mean']:7.2f} us x{k['calls']}, starts "
            f"{k['start_after_previous_end_us']:+.2f} us after the previous kernel's end"
        )
    gap = sorted(gaps)[len(gaps) // 2] if gaps else 0.0
    print(f"   gap between kernels (negative: overlap): median {gap:.2f} us")
    rows.append(
        {
            "what": what,
            "us_per_call": ms * 1e3,
            "roofline_us": roofline_s * 1e6,
            "kernels": kernels,
            "gap_median_us": gap,
        }
    )


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else None
    Ts = [int(t) for t in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1, 8]
    bw = copy_roofline()
    rows = [{"device": torch.cuda.get_device_name(), "copy_TBps": bw / 1e12}]
    wbytes, nxt_w, _, x, y = lm_head_m1()
    for cfg in (WIDE, dataclasses.replace(WIDE, pdl=1)):
        ms, kernels, gaps = profile_graph(lambda: [gemv_mxfp4(x, *nxt_w(), None, y, cfg) for _ in range(8)])
        report(rows, f"lm_head M=1 {cfg.name()}", ms / 8, wbytes / bw, kernels, gaps)
    nxt_w = None  # frees the rotating lm_head weights
    torch.cuda.empty_cache()
    W = moe_weights()
    per_expert = moe_expert_bytes(W)
    torch.manual_seed(0)
    for T, pdl in itertools.product(Ts, (0, 1)):
        cfg = pick_moe_gemv_config(T * 4).each(pdl=pdl)
        nxt, draws, touched = rotating_moe_draws(T, per_expert)
        o = torch.empty(T, 2880, device=DEV, dtype=torch.bfloat16)
        calls = len(draws)
        ms, kernels, gaps = profile_graph(lambda: [moe_mxfp4(*nxt(), W, config=cfg, out=o) for _ in range(calls)])
        report(rows, f"moe T={T} {cfg.name()}", ms / calls, touched / bw, kernels, gaps)
    if out:
        json.dump(rows, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
