"""Why the decode GEMVs' one-token lead over Marlin (peers.py: 0.042 against 0.058 ms, wgmma order) does not carry
into vLLM (SERVING.md "Inside the engine": about 53 against an estimated 46 us a layer and step). Three ways of
timing the same MoE layer, each ours and Marlin's, in one run on one GPU:

* ``one``: one layer and one routing draw replayed (``peers.py``'s protocol: a T = 1 call touches 4 experts, 50 MB,
  about the H100's L2);
* ``cold``: ``LAYERS`` copies of the layer at other addresses (as the engine's layers are), each with its own draw,
  called in turn: nothing of a layer is in L2 when it runs;
* ``router``: ``cold`` with each layer's router in front, as vLLM runs it: a BF16 linear with bias and vLLM's fused
  top-k softmax (``fused_topk``, renormalized: ``topkGating``), whose ids and weights the experts read.

The layer has one scale byte at 129, as the 12-layer check's fixture has: ours runs unfolded (as the plugin ran such
layers before ``dequant_mxfp4.fold_shift``) and folded with that shift (as it runs them now). First run (ed846bd,
3337468: before the shift existed, no scale over 128 here) it found the cause of the in-engine gap: the unfolded decode
GEMVs took 34 / 49 us (gate_up / down's end) against 25 / 39 folded, the engine's 34 / 48.
Each mode is one CUDA graph of ``LAYERS`` calls; figures are us a layer. The ``router`` mode is then profiled
(torch.profiler over graph replays): each kernel's mean duration and where it starts relative to the kernel before
it (kernels launched under PDL start before it ends). 20b shapes (32 experts, top-4, H = I = 2880). Needs vLLM (the
kit) for Marlin and the top-k; without it, ours only with ``torch.topk``. Ours: the rows order and the chunk order the
GPU builds (wgmma on a Hopper; mma2 under ``DISABLE_MMA_V3=1``, sm_12x's code path).

Usage: python benchmarks/experiments/engine_layer_probe.py [OUT.json] [T,T,...]
"""

import functools
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for common and peers
sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiments/, for moe_profile
from common import DEV, capture_graph, moe_decode_inputs, moe_weights, replay_ms  # noqa: E402
from moe_profile import profile_graph  # noqa: E402

from mxrepack.kernels.dequant_mxfp4 import fold_shift  # noqa: E402
from mxrepack.kernels.moe_mxfp4 import moe_mxfp4, pick_moe  # noqa: E402
from mxrepack.layouts import strided  # noqa: E402

E, H, K_TOP, LAYERS = 32, 2880, 4, 12


def topk_fn():
    """vLLM's fused top-k softmax (gpt-oss renormalizes), or torch's where vLLM does not import."""
    try:
        from vllm.model_executor.layers.fused_moe.router.fused_topk_router import fused_topk

        return "vllm fused_topk", lambda x, logits: fused_topk(x, logits, K_TOP, True)[:2]
    except Exception:  # noqa: BLE001

        def torch_topk(x, logits):
            v, i = logits.topk(K_TOP, -1)
            return torch.softmax(v.float(), -1), i.to(torch.int32)

        return "torch.topk", torch_topk


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else None
    Ts = [int(t) for t in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1, 4, 64]
    torch.manual_seed(0)
    W = moe_weights(E)
    for n in ("w13_bias", "w2_bias"):
        W[n] = W[n].bfloat16().float()
    # one scale byte at 129, as the 12-layer check's fixture has (its tail reaches 129): the folded decode then needs
    # a shift (dequant_mxfp4.fold_shift); each order unfolded, and folded with that shift
    W["w13_weight_scale"].view(-1)[0] = 129
    shift = fold_shift(W["w13_weight_scale"], W["w2_weight_scale"])
    topk_name, topk = topk_fn()
    rec = {"device": torch.cuda.get_device_name(), "experts": E, "layers": LAYERS, "topk": topk_name, "rows": []}
    rec["scale_shift"] = shift
    impls = {"rows": lambda: {k: v.clone() for k, v in W.items()}}
    # the chunk order this GPU's Triton builds: wgmma on a Hopper, mma2 where it builds mma.sync (sm_12x, sm_8x, or a
    # Hopper under DISABLE_MMA_V3: sm_12x's code path)
    import peers

    chunk = "wgmma" if peers.wgmma_here() else "mma2" if peers.mma2_here() else None
    if chunk:
        Wc = strided.from_row_major(strided.to_row_major(W), order=chunk)
        impls = {chunk: lambda: {k: v.clone() for k, v in Wc.items()}} | impls
    rec["chunk_order"] = chunk
    calls = {}
    for (name, make), f in itertools.product(impls.items(), (True, False)):
        order = name
        kw = {"fold_scale": True, "scale_shift": shift} if f else {}
        calls[f"{name}_shifted" if f else f"{name}_unfolded"] = [
            functools.partial(
                lambda x, i, w, Wl, o, kw: moe_mxfp4(x, i, w, Wl, order=o, **kw), Wl=make(), o=order, kw=kw
            )
            for _ in range(LAYERS)
        ]
    try:
        peers.E = E  # its conversion and Marlin's call read the module's expert count
        calls["marlin"] = [peers.marlin_moe(W)[0] for _ in range(LAYERS)]
    except Exception as e:  # noqa: BLE001
        print(f"marlin not run: {type(e).__name__}: {e}"[:300], flush=True)
    routers = [
        (torch.randn(E, H, device=DEV).to(torch.bfloat16) * 0.05, torch.randn(E, device=DEV).to(torch.bfloat16))
        for _ in range(LAYERS)
    ]
    for T in Ts:
        draws = [moe_decode_inputs(T, E, K_TOP, H) for _ in range(LAYERS)]
        draws = [(x, i.to(torch.int32), w) for x, i, w in draws]
        row = {"T": T}
        if chunk:
            row[f"config_{chunk}"] = pick_moe(T, K_TOP, E, H, fold_scale=True, order=chunk).name()
        row["config_rows"] = pick_moe(T, K_TOP, E, H, fold_scale=True).name()
        # how evenly each way of routing fills the experts: the most rows any expert gets, mean over the layers
        # (uniform draws against the routers' top-k on these random activations)
        most = lambda ids: float(torch.bincount(ids.flatten().long(), minlength=E).max())  # noqa: E731
        row["most_rows_uniform"] = sum(most(i) for _, i, _ in draws) / LAYERS
        row["most_rows_router"] = (
            sum(most(topk(x, torch.nn.functional.linear(x, wr, br))[1]) for (x, _, _), (wr, br) in zip(draws, routers))
            / LAYERS
        )
        print(
            f"T={T}: most rows an expert gets, uniform {row['most_rows_uniform']:.1f}, router "
            f"{row['most_rows_router']:.1f} (mean {T * K_TOP / E:.1f})",
            flush=True,
        )
        for name, fns in calls.items():

            def one(fns=fns):
                for _ in range(LAYERS):
                    fns[0](*draws[0])

            def cold(fns=fns):
                for fn, d in zip(fns, draws):
                    fn(*d)

            def router(fns=fns):
                for fn, (x, _, _), (wr, br) in zip(fns, draws, routers):
                    wts, ids = topk(x, torch.nn.functional.linear(x, wr, br))
                    fn(x, ids, wts)

            for mode, fn in (("one", one), ("cold", cold), ("router", router)):
                row[f"{name}_{mode}_us"] = replay_ms(capture_graph(fn), 20) * 1e3 / LAYERS
            ms, kernels, gaps = profile_graph(router)
            row[f"{name}_router_kernels"] = kernels
            print(
                f"T={T:3d} {name:6s} us a layer: one {row[f'{name}_one_us']:6.1f}  cold {row[f'{name}_cold_us']:6.1f}"
                f"  router {row[f'{name}_router_us']:6.1f}",
                flush=True,
            )
            for k in kernels:
                print(
                    f"      {k['kernel'][:56]:56s} {k['us_mean']:7.2f} us x{k['calls']}, starts "
                    f"{k['start_after_previous_end_us']:+.2f} us after the previous kernel's end",
                    flush=True,
                )
        rec["rows"].append(row)
        if out:
            Path(out).write_text(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()
