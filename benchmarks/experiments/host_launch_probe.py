"""The host time of one dense W4A16 call (vLLM runs lm_head outside its CUDA graphs, so each step pays it).

Stop 39 profiled lm_head's call in vLLM at 240 us of host time a step against Marlin's 87 (`SERVING.md`); our own
Python in it was 6 us after e83e369 (``linear_host_path.py``, launches stubbed), so the rest is Triton's launch or the
profiler. This times, per call and on the host only (the GPU left to run behind), the layers of that call:

- ``full``: ``linear_mxfp4`` as the plugin's op calls it (checks, pick, ``out`` given);
- ``op``: the same behind a ``torch.library`` op registered as vLLM's ``direct_register_custom_op`` does;
- ``jit``: ``_linear_chunks_kernel[grid](...)`` alone, the arguments ``linear_chunks`` passed recorded once;
- ``compiled``: the compiled kernel's own launcher (``CompiledKernel[grid](*args)``), Triton's binder and cache
  lookup skipped;
- ``mm``: ``torch.mm`` on the BF16 weight (a cuBLAS launch from ATen) for scale;
- where vLLM imports (the kit's device calls): ``plugin``, the plugin's ``TritonMxfp4LinearMethod.apply`` on the layer
  as it ships (eager: the op's function called without the dispatcher); ``plugin_op``, the same body calling its
  registered op (through vLLM's ``direct_register_custom_op``, as a compiled graph does); and ``marlin``, the plugin's
  ``MarlinMxfp4LinearMethod.apply`` on the same values (vLLM's Marlin MXFP4 linear, what stock vLLM calls for them):
  the calls vLLM makes for lm_head outside its graphs, side by side in one run (no bias, as lm_head has none; qkv's
  rows are a stand-in: gpt-oss's has a bias, and a compiled engine runs it inside its graph).
  Earlier records name them otherwise: at 6eab5c3 ``plugin`` was ``apply`` calling the function directly and
  ``plugin_op`` the bare op without ``apply``'s body, each function's rounds one after another (not like for like;
  the inference-mode record ran 6eab5c3 plus the option committed in 2cfbcec);
  at 4a92125 ``plugin`` was ``apply`` through the op and ``plugin_direct`` the direct call.

    python benchmarks/experiments/host_launch_probe.py time [OUT.json] [SHAPES] [ROWS] [INFERENCE] [ORDER]  # Hopper
    python benchmarks/experiments/host_launch_probe.py profile [OUT.txt] [SHAPE] [ROWS] [CALLS] [ORDER]
    # with vLLM (the kit's fourth call): bash benchmarks/vllm_plugin_device.sh .kit3 >/dev/null 2>&1;
    #   source .kitx/device.sh .kitx; export PYTHONPATH=$PWD:$PYTHONPATH; python benchmarks/experiments/... time OUT
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import statistics
import sys
import time as clock
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mxrepack.kernels.linear_mxfp4 as lin  # noqa: E402
from mxrepack.kernels.dequant_mxfp4 import mma_v3_disabled  # noqa: E402

# the calls timed (module docstring), in the order each round calls them: the same as before the rows order came in
CALLED = ("full", "op", "jit", "compiled", "mm", "plugin", "plugin_op", "marlin")
CALLS = 300  # a round: few enough that the GPU's launch queue never fills, so the host is what is timed


def host_us(fns: dict, rounds: int = 7) -> dict[str, list[float]]:
    """Microseconds of host time a call of each of ``fns``, per round of :data:`CALLS` calls, the GPU synchronized
    between. The functions take turns within each round, so a slow period of the host falls on all of them alike (the
    rounds' times move by up to 2x here)."""
    for fn in fns.values():
        for _ in range(20):
            fn()
    out: dict[str, list[float]] = {key: [] for key in fns}
    for _ in range(rounds):
        for key, fn in fns.items():
            torch.cuda.synchronize()
            t0 = clock.perf_counter()
            for _ in range(CALLS):
                fn()
            out[key].append((clock.perf_counter() - t0) / CALLS * 1e6)
            torch.cuda.synchronize()
    return out


def recorded_launch(call) -> tuple:
    """(grid, args, kwargs, compiled kernel) of the ``_linear_chunks_kernel`` launch that ``call()`` makes, through
    Triton's own launch (the tree's ``linear_chunks`` launching through ``_LAUNCH_CHUNKS`` or straight)."""
    real = lin._linear_chunks_kernel
    seen = {}

    def launch(grid, *args, **kwargs):
        seen.update(grid=grid, args=args, kwargs=kwargs)
        seen["compiled"] = real[grid](*args, **kwargs)
        return seen["compiled"]

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launch(grid, *args, **kwargs)

    name, stand_in = (
        ("_LAUNCH_CHUNKS", launch) if hasattr(lin, "_LAUNCH_CHUNKS") else ("_linear_chunks_kernel", Recorder())
    )
    shipped = getattr(lin, name)
    setattr(lin, name, stand_in)
    try:
        call()
    finally:
        setattr(lin, name, shipped)
    return seen["grid"], seen["args"], seen["kwargs"], seen["compiled"]


def register_op() -> None:
    """``torch.ops.probe.linear_mxfp4``, as the plugin's op is (vLLM's ``direct_register_custom_op``: a schema and a
    CUDA implementation in a FRAGMENT library, no ``custom_op`` wrapper)."""
    lib = torch.library.Library("probe", "FRAGMENT")
    lib.define("linear_mxfp4(Tensor x, Tensor w, Tensor s, bool fold, str order, int n) -> Tensor")

    def impl(x, w, s, fold, order, n):
        out = x.new_empty(x.shape[0], n)
        return lin.linear_mxfp4(x, w, s, None, fold_scale=fold, order=order, out=out)

    lib.impl("linear_mxfp4", impl, "CUDA")
    register_op.lib = lib  # kept alive


def vllm_methods(layer, order: str, x: torch.Tensor) -> dict:
    """``plugin`` and ``marlin`` (module docstring) on ``layer``'s values where vLLM imports, else nothing."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return {}
    from peers import marlin_linear

    from mxrepack.serve.vllm import linear as plugin

    w, s = layer.plain
    mx, method = torch.nn.Module(), plugin.make_dense_method("mxrepack", order)
    method.create_weights(mx, layer.K, [layer.N], layer.K, layer.N, torch.bfloat16)
    mx.weight_packed.data, mx.weight_scale.data = layer.wq, layer.sq
    method.process_weights_after_loading(mx)
    marlin = marlin_linear(w, s)

    def through_op():  # apply's body calling the registered op, as a compiled graph does (and eager before stop 45);
        # since stop 50 a 2-D BF16 x goes to the op as it is
        args = (mx.weight_packed, mx.weight_scale, None, mx.mxrepack_fold_scale, order, mx.output_size_per_partition)
        return torch.ops.mxrepack.linear_mxfp4(x, *args)

    return {
        "plugin": lambda: method.apply(mx, x),
        "plugin_op": through_op,
        "marlin": lambda: marlin[1].apply(marlin[0], x),
    }


def _vllm_version() -> str | None:
    try:
        import vllm

        return vllm.__version__
    except ImportError:
        return None


def time(
    out: str | None = None, shapes: str = "lm_head,qkv", rows: str = "1,16,64", inference: str = "0", order: str = ""
) -> None:
    """``inference`` "1": every call under ``torch.inference_mode()``, as vLLM's model runner calls the model and
    lm_head (autograd's dispatch skipped for every torch op; a registered op's body skips it either way). ``order``:
    the weights' byte order, the GPU's chunk order by default (wgmma, or mma2 under ``DISABLE_MMA_V3``), or "rows"
    (the plain order: its GEMVs and tiles, two launches a call at one row; no ``jit`` / ``compiled`` rows, which
    record the chunk tile's single launch)."""
    with torch.inference_mode(inference == "1"):  # off: the default, autograd on
        _time(out, shapes, rows, inference, order or ("mma2" if mma_v3_disabled() else "wgmma"))


def _time(out, shapes, rows, inference, order) -> None:
    from dense_chunk_probe import meta

    register_op()
    records = []
    for name in shapes.split(","):
        layer = _layer(name, order)
        wbf = layer.next_bf16()
        for M in map(int, rows.split(",")):
            x = torch.randn(M, layer.K, device="cuda").to(torch.bfloat16)
            y = torch.empty(M, layer.N, device="cuda", dtype=torch.bfloat16)
            ybf = torch.empty(M, layer.N, device="cuda", dtype=torch.bfloat16)
            wq, sq, fold = layer.wq, layer.sq, layer.fold

            def full():
                return lin.linear_mxfp4(x, wq, sq, None, fold_scale=fold, order=order, out=y)

            fns = {
                "full": full,
                "op": lambda: torch.ops.probe.linear_mxfp4(x, wq, sq, fold, order, layer.N),
                "mm": lambda: torch.mm(x, wbf.t(), out=ybf),
            }
            fns |= vllm_methods(layer, order, x)
            rec = {"shape": name, "M": M, "order": order}
            ref = full().clone()
            if order == "rows":  # the plugin's calls and the op give the same bits as the call they wrap
                rec["same_bits"] = all(
                    torch.equal(fns[key](), ref) for key in fns if key in ("op", "plugin", "plugin_op")
                )
            else:  # the chunk tile's single launch, recorded: Triton's own launch and the build's launcher
                grid, args, kwargs, compiled = recorded_launch(full)
                params = inspect.signature(lin._linear_chunks_kernel.fn).parameters
                bound = inspect.signature(lin._linear_chunks_kernel.fn).bind(
                    *args, **{k: v for k, v in kwargs.items() if k in params}
                )
                bound.apply_defaults()
                values = list(bound.arguments.values())
                runner = compiled[grid]
                fns |= {
                    "jit": lambda: lin._linear_chunks_kernel[grid](*args, **kwargs),
                    "compiled": lambda: runner(*values),
                }
                runner(*values)
                torch.cuda.synchronize()
                rec |= {"grid": list(grid), "compiled_same_bits": bool(torch.equal(ref, y))}
            fns = {key: fns[key] for key in CALLED if key in fns}  # each round calls them in this order
            for key, ts in host_us(fns).items():
                rec[f"{key}_us"] = [round(t, 2) for t in ts]
                rec[f"{key}_median_us"] = round(statistics.median(ts), 2)
            records.append(rec)
            print(json.dumps({k: v for k, v in rec.items() if not k.endswith("_us") or "median" in k}), flush=True)
    if out:
        meta_rec = meta() | {
            "script": "benchmarks/experiments/host_launch_probe.py",
            "calls_a_round": CALLS,
            "inference_mode": inference == "1",
            "vllm": _vllm_version(),
        }
        Path(out).write_text(json.dumps(meta_rec | {"rows": records}, indent=1))


def _layer(name: str, order: str):
    """``dense_chunk_probe.Layer`` of ``name`` with its weights in ``order`` (a chunk order, or "rows": the plain
    weights as ``wq`` / ``sq``)."""
    from dense_chunk_probe import Layer

    layer = Layer.random(name, "mma2" if order == "mma2" else "wgmma")
    return dataclasses.replace(layer, wq=layer.plain[0], sq=layer.plain[1]) if order == "rows" else layer


def profile(out: str | None = None, shape: str = "qkv", rows: str = "1", calls: str = "3000", order: str = "") -> None:
    """cProfile of ``calls`` ``full`` calls: where the host time of the call goes (the profiler's own cost included).
    ``order`` as :func:`time`'s."""
    import cProfile
    import io
    import pstats

    order = order or ("mma2" if mma_v3_disabled() else "wgmma")
    layer = _layer(shape, order)
    M = int(rows)
    x = torch.randn(M, layer.K, device="cuda").to(torch.bfloat16)
    y = torch.empty(M, layer.N, device="cuda", dtype=torch.bfloat16)
    for _ in range(20):
        lin.linear_mxfp4(x, layer.wq, layer.sq, None, fold_scale=layer.fold, order=order, out=y)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(int(calls)):
        lin.linear_mxfp4(x, layer.wq, layer.sq, None, fold_scale=layer.fold, order=order, out=y)
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(25)
    print(text.getvalue())
    if out:
        Path(out).write_text(text.getvalue())


if __name__ == "__main__":
    {"time": time, "profile": profile}[sys.argv[1]](*sys.argv[2:])
