"""Main-loop SASS of triton_kernels' Hopper MXFP4 MoE matmul (as vendored in vLLM) beside mxrepack's swapped MoE
tiles, compiled for sm_90a with the local Triton and its ptxas. No GPU: CPU only.

    python benchmarks/experiments/sass_vs_triton_kernels.py --vllm-src DIR --json out.json

``DIR``: an unpacked vLLM wheel (``pip download --no-deps vllm==0.26.0`` then unzip) holding
``vllm/third_party/triton_kernels``. Its ``matmul_ogs`` launcher runs on meta tensors for gpt-oss-120b's gate_up at
T = 4096 (128 experts, top-4, K = 2880, N = 5760, weights in the Hopper value/scale layouts as vLLM's
``_swizzle_mxfp4`` makes them, SwiGLU fused), behind a fake CUDA driver that reports sm_90 and 132 SMs; the kernel's
own argument binder gives the signature, constexprs and options, which are compiled as they are. The same counts
for mxrepack's gate_up tiles (swapped, folded) follow. The main loop is the largest backward branch span.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TARGET = GPUTarget("cuda", 90, 32)
E, H, I, T, TOPK = 128, 2880, 2880, 4096, 4
BIN = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")


def loop_counts(cubin: bytes, modifiers: bool = False) -> dict:
    """Opcode counts of the main loop (placeholder ``@!PT`` instructions, which never run, counted apart), total
    instructions, registers and stack; with ``modifiers``, also the loop's opcodes with their modifiers
    (``loop_ops_modifiers``: ``LDS.U16`` and ``LDS.128`` apart)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    sass = subprocess.run([f"{BIN}/cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
    usage = subprocess.run([f"{BIN}/cuobjdump", "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    ins = [(int(a, 16), body.strip()) for a, body in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    index = {a: i for i, (a, _) in enumerate(ins)}
    best = (0, 0, -1)
    for i, (a, body) in enumerate(ins):
        target = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", body)
        if target and int(target.group(1), 16) <= a and int(target.group(1), 16) in index:
            start = index[int(target.group(1), 16)]
            best = max(best, (i - start + 1, start, i))
    _, start, end = best
    loop = [body for _, body in ins[start : end + 1]]
    never = [b for b in loop if b.startswith("@!PT ")]
    opcodes = [re.sub(r"^@!?U?P\w+\s+", "", b).split()[0] for b in loop if b not in never]
    ops = collections.Counter(op.split(".")[0] for op in opcodes)
    regs = re.search(r"REG:(\d+).*?STACK:(\d+)", usage, re.S)
    counts = {
        "total": len(ins),
        "loop": len(loop) - len(never),
        "loop_placeholders": len(never),
        "registers": int(regs.group(1)),
        "stack_bytes": int(regs.group(2)),
        "loop_ops": dict(ops.most_common()),
    }
    return counts | ({"loop_ops_modifiers": dict(collections.Counter(opcodes))} if modifiers else {})


def triton_kernels_gate_up(vllm_src: Path) -> dict:
    """Capture and compile the launch ``matmul_ogs`` makes for the 120b gate_up at T = 4096 on sm_90."""
    work = Path(tempfile.mkdtemp())
    shutil.copytree(vllm_src / "vllm/third_party/triton_kernels", work / "triton_kernels")
    sys.path.insert(0, str(work))
    from triton.runtime import driver

    class FakeDriver:  # what the launcher asks of the CUDA driver
        def get_current_target(self):
            return TARGET

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_active_torch_device(self):
            return torch.device("cpu")

    driver.set_active(FakeDriver())
    props = types.SimpleNamespace(
        multi_processor_count=132, shared_memory_per_block_optin=232448, major=9, minor=0, name="NVIDIA H100 80GB HBM3"
    )
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_properties = lambda *a, **k: props

    import triton_kernels.matmul_ogs as mo
    import triton_kernels.matmul_ogs_details.opt_flags as opt_flags
    import triton_kernels.swiglu
    from triton.runtime.jit import JITFunction
    from triton_kernels.matmul_ogs import FlexCtx, FnSpecs, FusedActivation, PrecisionConfig, matmul_ogs
    from triton_kernels.numerics import InFlexData
    from triton_kernels.routing import (
        ExptData,
        GatherIndx,
        RoutingData,
        _compute_expt_data_internal,
        _unpack_into_dict,
    )
    from triton_kernels.tensor import FP4, convert_layout, wrap_torch_tensor
    from triton_kernels.tensor_details import layout

    # the weights as vLLM's _swizzle_mxfp4 leaves them on sm_90 (meta tensors: only shapes and strides matter)
    value_layout, value_opts = layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
    scale_layout, scale_opts = layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=8)
    opt_flags.update_opt_flags_constraints({"split_k": 1})
    w = torch.empty((E, 2 * I, H // 2), dtype=torch.uint8, device="meta").transpose(-2, -1)
    s = torch.empty((E, 2 * I, H // 32), dtype=torch.uint8, device="meta")
    s = torch.nn.functional.pad(s, (0, -s.shape[-1] % 4)).transpose(-2, -1)
    w = convert_layout(wrap_torch_tensor(w, dtype=FP4), value_layout, **value_opts)
    s = convert_layout(wrap_torch_tensor(s), scale_layout, **scale_opts)
    precision = PrecisionConfig(weight_scale=s, flex_ctx=FlexCtx(rhs_data=InFlexData()))
    # routing: T * k assignments, evenly over the experts
    gates = T * TOPK
    hist = torch.full((E,), gates // E, dtype=torch.int32)
    combined = torch.empty(2 * gates, dtype=torch.int32)
    _, tok_raw, tok_pad, blocks_per_m, *_ = _compute_expt_data_internal(hist, E, gates)
    expt = ExptData(hist, tok_raw, _unpack_into_dict(tok_pad), _unpack_into_dict(blocks_per_m))
    routing = RoutingData(torch.empty(gates, dtype=torch.bfloat16), hist, E, TOPK, expt)
    gather = GatherIndx(src_indx=combined[:gates], dst_indx=combined[gates:])
    act = FusedActivation(FnSpecs("swiglu", triton_kernels.swiglu.swiglu_fn, ("alpha", "limit")), (1.702, 7.0), 2)

    captured: dict = {}

    class Captured(Exception):
        pass

    pack = JITFunction._pack_args

    def capture(self, backend, kwargs, bound_args, specialization, options):
        res = pack(self, backend, kwargs, bound_args, specialization, options)
        captured.update(fn=self, options=res[0], signature=res[1], constexprs=res[2], attrs=res[3])
        raise Captured()

    make_flags = mo.make_opt_flags
    mo.make_opt_flags = lambda *a, **k: captured.setdefault("flags", make_flags(*a, **k))
    JITFunction._pack_args = capture
    try:
        matmul_ogs(
            torch.empty((T, H), dtype=torch.bfloat16),
            w,
            torch.zeros((E, 2 * I), dtype=torch.float32),
            routing,
            gather_indx=gather,
            precision_config=precision,
            gammas=None,
            fused_activation=act,
            y=torch.empty((1, gates, I), dtype=torch.bfloat16),
        )
    except Captured:
        pass
    finally:
        JITFunction._pack_args = pack
    opts = {"num_warps": captured["options"].num_warps, "num_stages": captured["options"].num_stages}
    k = triton.compile(
        ASTSource(captured["fn"], captured["signature"], captured["constexprs"], captured["attrs"]),
        target=TARGET,
        options=opts,
    )
    flags = captured["flags"]
    tile = {f: getattr(flags, f) for f in ("block_m", "block_n", "block_k", "num_warps", "num_stages", "split_k")}
    # codes decoded per thread per K step: block_n weight rows x block_k codes over the program's threads
    codes = flags.block_n * flags.block_k // (32 * flags.num_warps)
    rec = {"kernel": k.metadata.name, "opt_flags": tile, "shared_bytes": k.metadata.shared, "codes_per_thread": codes}
    return rec | loop_counts(k.asm["cubin"]) | ptx_hazards(k.asm["ptx"])


def ptx_hazards(ptx: str) -> dict:
    """wgmma groups its PTX leaves in flight and registers it rewrites under one (the kernels check's walk, PERF_LOG
    stop 36)."""
    from mxrepack.kernels import check, dequant_mxfp4

    found = dequant_mxfp4.wgmma_register_hazards(ptx)
    return {"wgmma_groups_in_flight": check.wgmma_left_in_flight(ptx), "ptx_hazards": len(found), "first": found[:2]}


def mxrepack_gate_up() -> dict:
    from mxrepack.kernels import check
    from mxrepack.kernels.moe_mxfp4 import MOE_TILES, MoeConfig

    out = {}
    for cfg in (
        dataclasses.replace(MOE_TILES[3][1], fold_scale=True, remainder=None),  # shipped at 49-128 rows per expert
        MoeConfig(128, 128, 128, num_warps=8, num_stages=3, swap_ab=True, fold_scale=True),  # their tile's shape
    ):
        src = check.for_arch(check._moe_sources("bf16", cfg)["moe_gate_up_swiglu"], 90)
        k = triton.compile(
            check.specialized(src), target=TARGET, options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        )
        codes = 2 * cfg.block_n * cfg.block_k // (32 * cfg.num_warps)  # gate and up rows
        out[cfg.name()] = (
            {"shared_bytes": k.metadata.shared, "codes_per_thread": codes}
            | loop_counts(k.asm["cubin"])
            | ptx_hazards(k.asm["ptx"])
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm-src", type=Path, required=True, help="an unpacked vLLM wheel (vllm/third_party/...)")
    ap.add_argument("--json")
    args = ap.parse_args()
    rec = {"triton": triton.__version__, "target": "sm_90a", "shape": "120b gate_up, T = 4096"}
    rec["mxrepack"] = mxrepack_gate_up()  # before the fake driver replaces the real one
    rec["triton_kernels"] = triton_kernels_gate_up(args.vllm_src)
    for name, r in [("triton_kernels", rec["triton_kernels"]), *rec["mxrepack"].items()]:
        r["loop_per_code"] = round(r["loop"] / r["codes_per_thread"], 2)
        print(
            f"{name:24s} loop {r['loop']:5d} / {r['codes_per_thread']} codes = {r['loop_per_code']:.2f} per code, "
            f"{r['registers']} registers, stack {r['stack_bytes']}, top {list(r['loop_ops'].items())[:8]}, wgmma "
            f"groups in flight {r['wgmma_groups_in_flight']}, registers rewritten under one {r['ptx_hazards']} "
            f"{r['first'][:1]}",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()
