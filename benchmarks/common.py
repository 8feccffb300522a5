"""Helpers the GPU benchmark scripts share (``gpu_check.py``, ``peers.py``, the probes in ``experiments/``): random
MXFP4 weights and their fp32 dequantization, the copy roofline, CUDA-graph and interleaved timers, weights and routing
draws that rotate through more than L2, and a random 120b-shaped MoE layer in the ``strided`` layout with its fp32
reference. Not a test; importing it needs torch and Triton, calling its functions a CUDA device.

Scripts run as ``python benchmarks/NAME.py`` (``benchmarks`` is not a package) put this folder on ``sys.path`` and
``from common import ...``; importing this module puts the repository root there too, so ``mxrepack`` imports from a
checkout without installing it.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import statistics
import sys
from pathlib import Path

import torch
from triton.testing import do_bench, do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mxrepack.kernels.moe_mxfp4 import MoeGemvConfig, moe_mxfp4  # noqa: E402
from mxrepack.layouts import strided  # noqa: E402

FP4 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
DEV = "cuda"


def deq(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """GPU MXFP4 dequantization to fp32 (reference only)."""
    lut = FP4.to(packed.device)
    codes = torch.stack([packed & 15, packed >> 4], -1).flatten(-2).long()
    v = lut[codes]
    s = torch.exp2(scales.float() - 127)
    return (v.unflatten(-1, (-1, 32)) * s.unsqueeze(-1)).flatten(-2)


def rand_mx(*shape_nk) -> tuple[torch.Tensor, torch.Tensor]:
    *lead, N, K = shape_nk
    w = torch.randint(0, 256, (*lead, N, K // 2), dtype=torch.uint8, device=DEV)
    s = torch.randint(119, 124, (*lead, N, K // 32), dtype=torch.uint8, device=DEV)
    return w, s


def quant_ref(x: torch.Tensor, mode: str) -> torch.Tensor:
    """The activations as the kernel sees them (quantized by the same Triton quantizer, dequantized)."""
    from mxrepack.kernels.mx_quant import quantize_activations

    if mode == "w4a16":
        return x.float()
    q, s = quantize_activations(x, "e4m3" if mode == "w4a8" else "e2m1")
    if mode == "w4a8":
        return (q.float().unflatten(-1, (-1, 32)) * torch.exp2(s.float() - 127).unsqueeze(-1)).flatten(-2)
    return deq(q, s)


def measure_candidate(rec: dict, run, view, ref: torch.Tensor, flops: float) -> dict:
    """``rec`` with one candidate's relative error (``view(run())`` against ``ref``), time (``do_bench``, ms) and
    TFLOP/s, or the error that stopped it (e.g. out of shared memory): recorded, the other candidates still run."""
    from triton.testing import do_bench

    try:
        got = view(run())
        rec["rel_err"] = float((got - ref).norm() / ref.norm())
        rec["ms"] = do_bench(run, warmup=25, rep=200)
        rec["tflops"] = flops / rec["ms"] / 1e9
    except Exception as e:  # noqa: BLE001
        rec["error"] = f"{type(e).__name__}: {e}"[:300]
    return rec


def bench_decode(fn, rep: int = 100) -> float:
    """Decode-sized work (a few microseconds) timed inside a CUDA graph, as engines run decode, so that
    Python launch overhead does not hide the kernel; used for our kernels and cuBLAS alike."""
    fn()
    return do_bench_cudagraph(fn, rep=rep)


def capture_graph(fn, unroll: int = 1) -> torch.cuda.CUDAGraph:
    """``fn`` called ``unroll`` times in one CUDA graph, after one eager warm-up call; replayed once."""
    fn()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(unroll):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def replay_ms(g: torch.cuda.CUDAGraph, replays: int = 10) -> float:
    """Milliseconds per replay of ``g``, from CUDA events around ``replays`` back-to-back replays."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays


def without_pdl(cfg):
    """A decode config (:class:`GemvConfig` or the MoE's pair) without programmatic dependent launch: the same
    math, so the same bits, launched after the kernel before it has finished."""
    return cfg.each(pdl=0) if isinstance(cfg, MoeGemvConfig) else dataclasses.replace(cfg, pdl=0)


def rotating(make, bytes_each: int, min_total: int = 400 << 20):
    n = max(2, -(-min_total // max(bytes_each, 1)))
    items = [make() for _ in range(n)]
    it = itertools.cycle(items)
    return lambda: next(it)


def lm_head_m1(N: int = 201088, K: int = 2880):
    """lm_head decode at M = 1: (weight bytes, next MXFP4 weight (packed, scales), next BF16 weight, x, out);
    both weights rotate through > 400 MB, so that neither our kernels nor cuBLAS run from L2."""
    wbytes = N * K // 2 + N * K // 32
    nxt = rotating(lambda: rand_mx(N, K), wbytes)
    nxt_b = rotating(lambda: torch.randn(N, K, device=DEV).to(torch.bfloat16), N * K * 2)
    x = torch.randn(1, K, device=DEV).to(torch.bfloat16)
    return wbytes, nxt, nxt_b, x, torch.empty(1, N, device=DEV, dtype=torch.bfloat16)


def copy_roofline() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device=DEV)
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=50, rep=300)
    return 2 * a.numel() / (ms * 1e-3)  # bytes moved per second


def moe_weights(E: int = 128, H: int = 2880, I: int = 2880, Hp: int = 2944, Ip: int = 2944) -> dict:
    """A random 120b-shaped MoE layer in the strided layout, padding zeroed as the layout does (made row-major,
    then put in the layout's tile order: :func:`moe_row_major` gives it back for references)."""
    w13, s13 = rand_mx(E, 2 * Ip, Hp)
    w2, s2 = rand_mx(E, Hp, Ip)
    # zero the padding as the strided layout does (rows I..Ip of each half, columns H..Hp)
    w13[..., H // 2 :] = 0
    w2[..., I // 2 :] = 0
    s13[..., H // 32 :] = 127
    s2[..., I // 32 :] = 127
    w13.view(E, 2, Ip, -1)[:, :, I:] = 0
    w2[:, H:] = 0
    b13 = torch.randn(E, 2 * Ip, device=DEV) * 0.1
    b13.view(E, 2, Ip)[:, :, I:] = 0
    b2 = torch.randn(E, Hp, device=DEV) * 0.1
    b2[:, H:] = 0
    return strided.from_row_major(
        {
            "w13_weight": w13,
            "w13_weight_scale": s13,
            "w13_bias": b13,
            "w2_weight": w2,
            "w2_weight_scale": s2,
            "w2_bias": b2,
        }
    )


def moe_row_major(W: dict, experts=slice(None)) -> tuple[torch.Tensor, ...]:
    """(w13, s13, w2, s2) of ``experts`` row-major, w13 rows [gate | up]: what the references dequantize."""
    rm = strided.to_row_major({n: W[n][experts] for n in ("w13_weight", "w13_weight_scale", "w2_weight")})
    return rm["w13_weight"], rm["w13_weight_scale"], rm["w2_weight"], W["w2_weight_scale"][experts]


def moe_expert_bytes(W: dict) -> int:
    """Bytes one expert's weights and scales occupy (what a decode touching it must read)."""
    return sum(W[n][0].numel() for n in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale"))


def moe_decode_inputs(T: int, E: int = 128, k: int = 4, H: int = 2880):
    """Random decode inputs: x [T, H] bf16, each token routed to k distinct experts, softmax weights."""
    x = torch.randn(T, H, device=DEV).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, device=DEV)[:k] for _ in range(T)])
    return x, ids, torch.softmax(torch.randn(T, k, device=DEV), -1)


def rotating_moe_draws(T: int, per_expert: int):
    """Decode routing draws for ``T`` tokens that rotate as the weights do: enough of them that their touched
    experts add up to > 400 MB (one draw at T = 1, 53 MB, would be read from H100's 50 MB L2 in part).
    Returns (next draw, the draws, mean bytes of the experts one draw touches)."""
    draws = []
    nxt = rotating(lambda: draws.append(moe_decode_inputs(T)) or draws[-1], 4 * T * per_expert)
    return nxt, draws, statistics.mean(d[1].unique().numel() for d in draws) * per_expert


def interleaved_ms(fns: dict, repeats: int, shuffle: bool = False) -> dict:
    """Milliseconds of each of ``fns`` (name -> callable) in a CUDA graph (:func:`bench_decode`), ``repeats``
    rounds, interleaved so that drift hits all alike: name -> list of times. ``shuffle``: a fresh random order
    each round (in a fixed order the same one always follows the same other)."""
    times = {name: [] for name in fns}
    order = list(fns)
    for _ in range(repeats):
        if shuffle:
            random.shuffle(order)
        for name in order:
            times[name].append(bench_decode(fns[name], rep=50))
    return times


def moe_candidates(W: dict, per_expert: int, T: int, cands: dict, repeats: int, shuffle: bool = False):
    """MoE decode configs ``cands`` (name -> config) at ``T`` tokens: each checked against the fp32 reference on
    one routing draw, then timed interleaved (:func:`interleaved_ms`) with the routing rotating
    (:func:`rotating_moe_draws`). Returns (mean bytes of the touched experts, name -> relative error,
    name -> times in ms)."""
    nxt, draws, touched = rotating_moe_draws(T, per_expert)
    o = torch.empty(T, 2880, device=DEV, dtype=torch.bfloat16)
    xm, ids, wts = draws[0]
    ref = moe_reference(xm, ids, wts, W)
    err = {
        key: ((moe_mxfp4(xm, ids, wts, W, config=c).float() - ref).norm() / ref.norm()).item()
        for key, c in cands.items()
    }
    times = interleaved_ms(
        {key: (lambda c=c: moe_mxfp4(*nxt(), W, config=c, out=o)) for key, c in cands.items()}, repeats, shuffle
    )
    return touched, err, times


def moe_prefill_inputs(T: int, E: int = 128, k: int = 4, H: int = 2880):
    """Random prefill-sized inputs: as :func:`moe_decode_inputs`, but each token's k experts drawn with
    replacement (one batched draw instead of a permutation per token)."""
    x = torch.randn(T, H, device=DEV).to(torch.bfloat16)
    ids = torch.randint(0, E, (T, k), device=DEV)
    return x, ids, torch.softmax(torch.randn(T, k, device=DEV), -1)


def moe_reference(x, ids, wts, W, H: int = 2880, Hp: int = 2944, Ip: int = 2944) -> torch.Tensor:
    """Per-expert fp32 on the dequantized padded weights (the intermediate rounded to bf16 as the kernels do)."""
    b13, b2 = W["w13_bias"], W["w2_bias"]
    ref = torch.zeros(x.shape[0], Hp, device=DEV)
    xp = torch.nn.functional.pad(x.float(), (0, Hp - H))
    for e in ids.unique().tolist():
        r, slot = (ids == e).nonzero(as_tuple=True)
        w13, s13, w2, s2 = (t[0] for t in moe_row_major(W, slice(e, e + 1)))
        g = xp[r] @ deq(w13, s13).T + b13[e]
        gate, up = g[:, :Ip].clamp(max=7.0), g[:, Ip:].clamp(-7.0, 7.0)
        h = (up + 1) * gate * torch.sigmoid(1.702 * gate)
        # index_add_, not ``ref[r] +=``: a token routed twice to one expert (prefill draws with replacement) adds
        # both contributions
        ref.index_add_(0, r, wts[r, slot, None] * (h.bfloat16().float() @ deq(w2, s2).T + b2[e]))
    return ref[:, :H]


def vllm_convert(backend_name: str, t: dict) -> tuple:
    """vLLM's own ``convert_gpt_oss_weight_to_mxfp4_moe_kernel_format`` for ``backend_name`` (an
    ``Mxfp4MoeBackend`` member) on a layer holding ``t`` (w13/w2 weight, weight_scale and bias, as vLLM's loader
    leaves them): the six tensors (or triton_kernels wrappers) that backend computes with. Needs vLLM."""
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle

    layer = torch.nn.Module()
    layer.params_dtype = torch.bfloat16
    for n, v in t.items():
        layer.register_parameter(n, torch.nn.Parameter(v, requires_grad=False))
    return oracle.convert_gpt_oss_weight_to_mxfp4_moe_kernel_format(
        mxfp4_backend=oracle.Mxfp4MoeBackend[backend_name],
        layer=layer,
        w13_weight=layer.w13_weight,
        w2_weight=layer.w2_weight,
        w13_weight_scale=layer.w13_weight_scale,
        w2_weight_scale=layer.w2_weight_scale,
        w13_bias=layer.w13_bias,
        w2_bias=layer.w2_bias,
        _cache_permute_indices={},
    )
