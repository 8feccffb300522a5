"""The vLLM plugin's own logic, without vLLM: what it reads from a written checkpoint, what it refuses, how it is found.

The plugin's vLLM side (mxrepack/serve/vllm) runs on a real vLLM in benchmarks/vllm_plugin_check.py (docs/SERVING.md);
here only its dense methods, against a stand-in for the few vLLM names they touch.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import mxrepack
from mxrepack.errors import MxRepackError
from mxrepack.layouts import get_layout
from mxrepack.recipes import list_recipes, load_recipe
from mxrepack.repack.pipeline import repack
from mxrepack.serve.spec import (
    EXPERT_BACKENDS,
    ServeSpec,
    check_checkpoint,
    check_vllm_version,
    chosen_dense_kernel,
    dense_kernel,
    dense_serving,
    order_advice,
    serve_hint,
    serve_refusal,
    serving,
)

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_TARGETS = [r.name for r in list_recipes() if r.quantization_config == "mxrepack"]


def test_every_gpu_target_layout_has_a_vllm_backend():
    assert set(PLUGIN_TARGETS) >= {"sm80", "sm89", "sm90", "sm100", "sm120", "sm121", "sm121-marlin"}
    for name in PLUGIN_TARGETS:
        layout = get_layout(load_recipe(name).expert_layout).name
        assert layout in EXPERT_BACKENDS, name
    assert EXPERT_BACKENDS["flashinfer-cutlass"].vllm_backend == "FLASHINFER_CUTLASS_MXFP4_MXFP8"
    assert EXPERT_BACKENDS["marlin"].vllm_backend == "MARLIN" and EXPERT_BACKENDS["strided"].vllm_backend == "mxrepack"


@pytest.fixture(scope="module")
def outputs(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    return {t: repack(str(tiny), t, root / t).out for t in PLUGIN_TARGETS}


@pytest.mark.parametrize("target", PLUGIN_TARGETS)
def test_spec_matches_the_written_checkpoint(outputs, target):
    """The parameters the plugin creates (ServeSpec.stored, dense shapes) are the written tensors, dtype and shape."""
    out = outputs[target]
    spec = check_checkpoint(out)
    manifest = json.loads((out / "mxrepack.json").read_text())
    stored = {
        n.split(".mlp.experts.")[1]: (t["dtype"], tuple(t["stored_shape"]))
        for n, t in manifest["tensors"].items()
        if n.startswith("model.layers.0.mlp.experts.")
    }
    assert {k: (d, s) for k, (d, s) in spec.stored.items()} == stored
    assert spec.layout == get_layout(load_recipe(target).expert_layout).name
    config = json.loads((out / "config.json").read_text())
    expected = spec.expected_tensors(config)
    assert len(expected) == config["num_hidden_layers"] * 6 + 2 * len(spec.dense_modules)
    if target in ("sm120", "sm121"):
        assert spec.lm_head_quantized
        assert spec.quantized_vllm_prefixes() == {"lm_head"} | {
            f"model.layers.{i}.attn.{p}" for i in range(2) for p in ("qkv_proj", "o_proj")
        }
        assert expected["lm_head.weight_packed"] == ("uint8", (config["vocab_size"], config["hidden_size"] // 2))
    elif target == "sm121-strided":  # the same dense layers in the mma2 order: padded to 16 rows and 128 columns
        assert spec.lm_head_quantized and spec.dense_order == "mma2"
        vocab, hidden = -(-config["vocab_size"] // 16) * 16, -(-config["hidden_size"] // 128) * 128
        assert expected["lm_head.weight_packed"] == ("uint8", (vocab, hidden // 2))
        assert expected["lm_head.weight_scale"] == ("uint8", (vocab, hidden // 32))
    else:
        assert not spec.dense_modules and spec.dense_order == "rows"


def _edit_config(out: Path, tmp_path: Path, edit, name: str = "copy") -> Path:
    copy = tmp_path / name
    shutil.copytree(out, copy)
    config = json.loads((copy / "config.json").read_text())
    edit(config["quantization_config"])
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda qc: qc.update(quant_method="mxfp4"), r"quant_method is 'mxfp4', not 'mxrepack'"),
        (lambda qc: qc["groups"]["experts"].update(layout="bf16"), r"layout is 'bf16', which no vLLM backend serves"),
        (lambda qc: qc["groups"].pop("experts"), r"groups.experts is missing"),
        (lambda qc: qc["groups"]["experts"]["stored"].pop("w2_bias"), r"stored lacks w2_bias"),
        (lambda qc: qc["groups"]["dense"].update(format="mxfp8"), r"dense MXFP4 with plain scales"),
        (lambda qc: qc["groups"]["dense"].update(order="mma3"), r"dense\.order is 'mma3': .*rows, wgmma, mma2"),
        (
            lambda qc: qc["groups"]["dense"]["modules"].remove("model.layers.1.self_attn.k_proj"),
            r"model.layers.1.self_attn: only q/v_proj are MXFP4",
        ),
    ],
)
def test_what_the_plugin_cannot_serve_is_one_line(outputs, tmp_path, edit, message):
    with pytest.raises(MxRepackError, match=message) as e:
        check_checkpoint(_edit_config(outputs["sm121"], tmp_path, edit))
    assert "\n" not in str(e.value)


def test_chunk_order_dense_says_its_scales_are_quad_and_needs_whole_row_tiles(outputs, tmp_path):
    """The chunk orders' dense group records quad-order scales (a plugin older than the orders, which serves plain
    scales only, refuses it rather than reading the bytes as rows); outputs written when it said "plain" still serve;
    a model whose vocabulary is not whole 16-row tiles is refused before loading (vLLM's lm_head loader would cut a
    tile); the rows order's dense group with quad scales is refused."""
    out = outputs["sm121-strided"]
    dense = json.loads((out / "config.json").read_text())["quantization_config"]["groups"]["dense"]
    assert (dense["scales"], dense["order"]) == ("quad", "mma2")
    assert check_checkpoint(_edit_config(out, tmp_path, lambda qc: qc["groups"]["dense"].update(scales="plain")))
    odd = tmp_path / "odd"
    shutil.copytree(out, odd)
    config = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps(config | {"vocab_size": config["vocab_size"] - 3}))
    with pytest.raises(MxRepackError, match=r"lm_head has \d+ rows, not whole 16-row tiles, which the mma2 order"):
        check_checkpoint(odd)
    with pytest.raises(MxRepackError, match=r"dense MXFP4 with plain scales"):
        check_checkpoint(
            _edit_config(outputs["sm121"], tmp_path, lambda qc: qc["groups"]["dense"].update(scales="quad"), "rows")
        )


def test_a_wrong_or_missing_tensor_is_named_before_any_engine_starts(outputs, tmp_path):
    out = outputs["sm80"]
    wrong = _edit_config(
        out, tmp_path, lambda qc: qc["groups"]["experts"]["stored"]["w13_weight"].update(shape=[4, 1, 1])
    )
    with pytest.raises(
        MxRepackError,
        match=r"model-\d+-of-\d+\.safetensors: model\.layers\.0\.mlp\.experts\.w13_weight "
        r"is I32 \[4, \d+, \d+\]; the config's marlin layout stores I32 \[4, 1, 1\]",
    ):
        check_checkpoint(wrong)
    missing = _edit_config(out, tmp_path, lambda qc: None, "missing")
    index = missing / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    del data["weight_map"]["model.layers.1.mlp.experts.w2_bias"]
    index.write_text(json.dumps(data))
    with pytest.raises(MxRepackError, match=r"model\.layers\.1\.mlp\.experts\.w2_bias is missing"):
        check_checkpoint(missing)


def test_b12x_outputs_written_before_the_rename_still_serve(outputs, tmp_path):
    old = _edit_config(outputs["sm121"], tmp_path, lambda qc: qc["groups"]["experts"].update(layout="b12x"))
    assert check_checkpoint(old).layout == "flashinfer-cutlass"


@pytest.mark.parametrize(
    "activation, alpha, limit, ok",
    [
        ("swigluoai", None, None, True),
        ("swigluoai", 1.702, 7.0, True),
        ("silu", None, None, False),
        ("swigluoai", 1.0, None, False),
        ("swigluoai", None, 10.0, False),
    ],
)
def test_the_strided_moe_method_refuses_another_activation_in_one_line(activation, alpha, limit, ok):
    from mxrepack.serve.spec import check_moe_activation

    if ok:
        check_moe_activation(activation, alpha, limit)
        return
    with pytest.raises(MxRepackError, match=r"gpt-oss's SwiGLU \(swigluoai, alpha 1\.702, limit 7\.0\); this MoE") as e:
        check_moe_activation(activation, alpha, limit)
    assert "\n" not in str(e.value)


def test_expert_options_the_layout_does_not_take_are_refused(outputs):
    # e.g. Marlin's fp8_activations, withdrawn in stop 46: its bytes were not what vLLM's FP8-activation Marlin reads
    config = json.loads((outputs["sm121-marlin"] / "config.json").read_text())
    config["quantization_config"]["groups"]["experts"]["options"] = {"fp8_activations": True}
    with pytest.raises(
        MxRepackError, match=r"groups\.experts: experts\.options \['fp8_activations'\] not accepted"
    ) as e:
        ServeSpec.from_config(config)
    assert "\n" not in str(e.value) and "repack the source" in str(e.value)
    # a value the layout takes but the plugin does not serve: triton-hopper bytes swizzled for 4 warps
    config = json.loads((outputs["sm90"] / "config.json").read_text())
    config["quantization_config"]["groups"]["experts"].setdefault("options", {})["num_warps"] = 4
    with pytest.raises(MxRepackError, match=r"triton-hopper experts written with num_warps=4; .* reads num_warps=8"):
        ServeSpec.from_config(config)


def test_flashinfer_experts_refused_for_missing_kernels_say_how_to_install_them():
    # vLLM refuses FlashInfer's MoE without its kernels as "kernel does not support current device NVIDIA GB10": the
    # plugin's refusal adds that the kernels are what is missing, and how to get them
    from mxrepack.serve.spec import EXPERT_BACKENDS, missing_kernels_hint

    cutlass, trtllm, marlin = (EXPERT_BACKENDS[n] for n in ("flashinfer-cutlass", "trtllm", "marlin"))
    asked = []

    def absent(name):
        asked.append(name)
        return False

    hint = missing_kernels_hint(cutlass, 12, absent)  # a GB10
    assert asked == ["has_flashinfer_cutlass_fused_moe"] and "pip install flashinfer-cubin" in hint
    assert "vllm download-kernels" in hint and "\n" not in hint
    assert "has_flashinfer_trtllm_fused_moe() is false" in missing_kernels_hint(trtllm, 10, absent)
    assert missing_kernels_hint(cutlass, 12, lambda name: True) == ""  # installed: vLLM's own reason stands alone
    # not FlashInfer's backend, or a GPU that would not run it with the kernels either (a Hopper): nothing asked
    assert missing_kernels_hint(marlin, 12, absent) == missing_kernels_hint(cutlass, 9, absent) == ""
    assert missing_kernels_hint(trtllm, 12, absent) == "" and len(asked) == 2

    def older_vllm(name):
        raise AttributeError(name)

    assert missing_kernels_hint(cutlass, 12, older_vllm) == ""


def test_a_moe_backend_request_for_another_backend_is_one_line(outputs):
    from mxrepack.serve.spec import check_moe_backend_request

    marlin, strided = check_checkpoint(outputs["sm121-marlin"]), check_checkpoint(outputs["sm121-strided"])
    for requested in (None, "auto"):
        check_moe_backend_request(requested, None, marlin)
    check_moe_backend_request("marlin", ["MARLIN"], marlin)  # what vLLM maps "marlin" to: the stored backend
    refusals = [
        ("triton", ["TRITON"], marlin),
        ("no-such-backend", None, marlin),  # a name this vLLM does not map
        ("marlin", ["MARLIN"], strided),  # mxrepack's own kernels: no vLLM backend serves them
    ]
    for requested, candidates, spec in refusals:
        with pytest.raises(MxRepackError, match=f"--moe-backend {requested} cannot serve this checkpoint") as e:
            check_moe_backend_request(requested, candidates, spec)
        assert spec.target in str(e.value) and "\n" not in str(e.value)


def test_mxrepacks_kernels_on_a_cpu_engine_are_one_line(monkeypatch):
    """vLLM's CPU backend would hand the strided experts and the dense chunk tiles CPU tensors, which Triton cannot
    launch ("0 active drivers" at the first call): refused at load in one line; the interpreter (the tests') runs."""
    import torch

    from mxrepack.serve.spec import check_kernel_device

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(
        MxRepackError, match=r"strided experts run on mxrepack's Triton kernels, which need a CUDA GPU; "
    ) as e:
        check_kernel_device(torch.device("cpu"), "this checkpoint's strided experts")
    assert "\n" not in str(e.value)
    check_kernel_device(torch.device("cuda", 0), "x")  # the device's type only: no GPU needed to ask
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    check_kernel_device(torch.device("cpu"), "x")


@pytest.mark.parametrize(
    "version, ok",
    [
        ("0.25.2", False),
        ("0.26.0", True),
        ("0.33.0", True),
        ("0.33.1", True),
        ("0.34.0", False),
        ("1.0.0", False),
        ("dev", False),
    ],
)
def test_vllm_versions_outside_the_tested_range_are_refused_in_one_line(version, ok):
    if ok:
        check_vllm_version(version)
    else:
        with pytest.raises(MxRepackError, match=r"supported: vLLM 0\.26 to 0\.33|supports vLLM 0\.26 to 0\.33"):
            check_vllm_version(version)


@pytest.mark.parametrize(
    "value, kernel",
    [(None, "marlin"), ("", "marlin"), ("marlin", "marlin"), ("mxrepack", "mxrepack"), (" MXREPACK ", "mxrepack")],
)
def test_the_dense_kernel_is_chosen_by_environment_with_marlin_by_default(value, kernel):
    environ = {} if value is None else {"MXREPACK_DENSE_KERNEL": value}
    assert dense_kernel(environ) == kernel


def test_the_dense_kernel_recorded_by_the_config_process_wins_over_a_workers_environment():
    assert chosen_dense_kernel({"dense_kernel": "mxrepack"}, {}) == "mxrepack"
    assert chosen_dense_kernel({"dense_kernel": "marlin"}, {"MXREPACK_DENSE_KERNEL": "mxrepack"}) == "marlin"
    assert chosen_dense_kernel({"quant_method": "mxrepack"}, {"MXREPACK_DENSE_KERNEL": "mxrepack"}) == "mxrepack"
    with pytest.raises(MxRepackError, match=r"^quantization_config.dense_kernel is 'cutlass': expected one of marlin"):
        chosen_dense_kernel({"dense_kernel": "cutlass"}, {})


def test_an_unknown_dense_kernel_is_one_line_naming_the_variable_and_the_choices():
    with pytest.raises(MxRepackError) as e:
        dense_kernel({"MXREPACK_DENSE_KERNEL": "triton"})
    assert str(e.value) == "MXREPACK_DENSE_KERNEL='triton': expected one of marlin, mxrepack"


def test_vllm_finds_the_plugin_through_its_entry_point_and_importing_mxrepack_needs_no_vllm():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["vllm.general_plugins"] == {"mxrepack": "mxrepack.serve.vllm:register"}
    assert any(r.startswith("vllm") for r in project["optional-dependencies"]["vllm"])
    assert not any(r.startswith("compressed-tensors") for r in project["dependencies"])  # vLLM pins its own
    code = (
        "import sys, mxrepack.serve.vllm as p, mxrepack.serve.spec, mxrepack.cli; "
        "assert callable(p.register); assert 'vllm' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_output_no_engine_serves_says_so_instead_of_vllm_serve(tiny, tmp_path):
    # a recipe can write what the plugin refuses (MXFP8 dense; BF16 experts with MXFP4 dense, whose config names
    # quant_method mxrepack): repack and the model card give the plugin's reason, not a "vllm serve" that fails
    from mxrepack.hub import plan_push

    for target, dense, reason in (("sm121", "mxfp8", "'dense-mxfp8'"), ("bf16", "mxfp4", "layout is 'bf16'")):
        out = tmp_path / f"{target}-{dense}"
        repack(str(tiny), target, out, dense=dense)
        refusal = serve_refusal(json.loads((out / "config.json").read_text()))
        assert reason in refusal
        hint = serve_hint(out, "x", "mxrepack", refusal=refusal)
        assert hint[0] == f"serve: no engine serves this output: {refusal}" and "vllm serve" not in "".join(hint)
        card = plan_push(out, "me/x").card
        assert f"No serving engine loads this checkpoint: {refusal}" in card and "vllm serve" not in card
    sm121 = tmp_path / "sm121"
    repack(str(tiny), "sm121", sm121)
    assert serve_refusal(json.loads((sm121 / "config.json").read_text())) is None
    assert serve_refusal({"quantization_config": {"quant_method": "mxfp4"}}) is None  # not the plugin's to judge


def test_repack_says_how_to_serve_each_kind_of_target():
    hint = "\n".join(serve_hint("/models/out", "flashinfer-cutlass", "mxrepack"))
    assert 'pip install "mxrepack[vllm]"' in hint and "vllm serve /models/out" in hint
    assert "FLASHINFER_CUTLASS" in serving("flashinfer-cutlass", "mxrepack")[1] or "CUTLASS" in hint
    assert serve_hint("/m", "mxfp4", "native")[0] == "serve: vllm serve /m"  # labelled as the plugin's first line is
    # a kernel no lent GPU could run is said to be untried where the user reads how to serve (GB10's sm121 target)
    untried = serve_hint("/m", "flashinfer-cutlass", "mxrepack")
    assert any("has not run on a GPU in mxrepack's checks" in line for line in untried)
    assert not any("has not run" in line for line in serve_hint("/m", "marlin", "mxrepack"))
    ct = serve_hint("/m", "compressed-tensors", "compressed-tensors")  # stock vLLM cannot: the plugin serves it
    assert ct[0].startswith('serve: pip install "mxrepack[vllm]"')
    assert ct[1].strip() == "vllm serve /m" and ct[-1].strip().startswith("--load-format mxrepack: the plugin's reader")


def test_targets_with_mxfp4_dense_say_which_kernel_serves_it_and_the_option():
    hint = serve_hint("/m", "flashinfer-cutlass", "mxrepack", None, "mxfp4")
    assert hint[-2].strip().startswith("dense MXFP4 kernel: vLLM's Marlin MXFP4 linear") and (
        "MXREPACK_DENSE_KERNEL=mxrepack" in hint[-2]
    )
    assert not any("dense" in line for line in serve_hint("/m", "marlin", "mxrepack", None, "bf16"))
    chunks = serve_hint("/m", "strided", "mxrepack", {"order": "mma2"}, "mxfp4", "mma2")[-2]
    assert "mxrepack's Triton chunk tiles" in chunks and "mma2 order" in chunks and "does not apply" in chunks
    # vLLM's own compressed-tensors linear, named by format (no choice of kernel): MXFP8 is another scheme than MXFP4
    assert "compressed-tensors MXFP4 linear" in dense_serving("mxfp4", "compressed-tensors")
    assert "CompressedTensorsW8A8Mxfp8" in dense_serving("mxfp8", "compressed-tensors")
    assert dense_serving("bf16", "compressed-tensors") is None


def test_the_compressed_tensors_target_names_the_versions_it_is_tested_with(monkeypatch):
    import compressed_tensors

    from mxrepack.quant import compressed_tensors as ct

    monkeypatch.setattr(compressed_tensors, "__version__", "0.17.0")
    with pytest.raises(MxRepackError, match=r"compressed-tensors 0\.17\.0 is installed; .* tested with 0\.19 to 0\.21"):
        ct.require()


def test_spec_needs_only_the_config(outputs):
    config = json.loads((outputs["sm90"] / "config.json").read_text())
    spec = ServeSpec.from_config(config)
    assert spec.hidden == (config["hidden_size"],) * 2  # triton-hopper records no padding: none is applied


def test_compressed_tensors_experts_reassemble_into_vllms_gpt_oss_mxfp4_parameters(tiny, tmp_path):
    """What the plugin's loader does with a compressed-tensors checkpoint (mxrepack/serve/vllm/model.py), on CPU: every
    per-expert tensor placed into fused parameters shaped as vLLM's gpt-oss MXFP4 MoE method makes them from
    config.json gives back the original checkpoint's fused experts (gate/up interleaved by rows), zeros in the padding.
    On the H100 the same placement gave logprobs bit-identical to stock vLLM on the source (docs/SERVING.md)."""
    pytest.importorskip("compressed_tensors")
    import torch
    from safetensors.torch import load_file

    from mxrepack.serve.spec import ct_expert_destination, ct_gpt_oss_mxfp4_experts, place_ct_expert

    out = repack(str(tiny), "compressed-tensors", tmp_path / "ct").out
    config = json.loads((out / "config.json").read_text())
    assert ct_gpt_oss_mxfp4_experts(config["quantization_config"])
    assert not ct_gpt_oss_mxfp4_experts({"quant_method": "mxrepack"}) and not ct_gpt_oss_mxfp4_experts(None)
    stored = {k: v for f in sorted(out.glob("*.safetensors")) for k, v in load_file(f).items()}
    source = {k: v for f in sorted(tiny.glob("*.safetensors")) for k, v in load_file(f).items()}
    E, H, Ip = config["num_local_experts"], config["hidden_size"], config["intermediate_size"]
    shapes = {
        "w13_weight": (E, 2 * Ip, H // 2),
        "w13_weight_scale": (E, 2 * Ip, H // 32),
        "w13_bias": (E, 2 * Ip),
        "w2_weight": (E, H, Ip // 2),
        "w2_weight_scale": (E, H, Ip // 32),
        "w2_bias": (E, H),
    }
    fused: dict = {}
    for name, tensor in stored.items():
        where = ct_expert_destination(name)
        if where is None:
            assert ".experts." not in name, name
            continue
        key, expert, parity = where
        prefix, param = key.rsplit(".", 1)
        if key not in fused:
            fused[key] = torch.zeros(shapes[param], dtype=tensor.dtype)
        place_ct_expert(fused[key], expert, parity, tensor, name)
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}.mlp.experts."
        gate_up = source[p + "gate_up_proj_blocks"].flatten(2)
        I2 = gate_up.shape[1]
        for ours, theirs in (
            (fused[p + "w13_weight"], gate_up),
            (fused[p + "w13_weight_scale"], source[p + "gate_up_proj_scales"]),
            (fused[p + "w13_bias"], source[p + "gate_up_proj_bias"]),
        ):
            assert torch.equal(ours[:, :I2], theirs.to(ours.dtype)) and not ours[:, I2:].any()
        down = source[p + "down_proj_blocks"].flatten(2)
        for ours, theirs in (
            (fused[p + "w2_weight"], down),
            (fused[p + "w2_weight_scale"], source[p + "down_proj_scales"]),
        ):
            assert torch.equal(ours[..., : theirs.shape[-1]], theirs) and not ours[..., theirs.shape[-1] :].any()
        assert torch.equal(fused[p + "w2_bias"], source[p + "down_proj_bias"].to(torch.bfloat16))
    with pytest.raises(MxRepackError, match=r"experts\.0\.up_proj\.weight_packed: shape .* does not fit"):
        place_ct_expert(
            torch.zeros(1, 4, 8, dtype=torch.uint8),
            0,
            1,
            torch.zeros(3, 8, dtype=torch.uint8),
            "model.layers.0.mlp.experts.0.up_proj.weight_packed",
        )


def test_rows_order_experts_on_a_gpu_with_its_own_order_get_one_line_naming_the_target():
    """The plugin logs this once when it serves strided experts in the rows order on a GPU whose MMA operand is a chunk
    order timed there: that order's built-in target and its measured gain (for wgmma, that the rows order leads at one
    token). Nothing where the checkpoint is already in the GPU's order, only the rows order runs, or the order was not
    timed on that GPU (sm_8x)."""
    # (sm_90 with mma2 native: under DISABLE_MMA_V3, the stand-in the mma2 order was timed on)
    for native, major, target in (
        ("wgmma", 9, "sm90-strided"),
        ("mma2", 12, "sm121-strided"),
        ("mma2", 9, "sm121-strided"),
    ):
        line = order_advice("rows", native, major)
        assert f"--target {target}" in line and f"reads the {native} order" in line and "\n" not in line
        assert load_recipe(target).expert_options == {"order": native}
        assert order_advice(native, native, major) is None
    assert "at one token the rows order is faster" in order_advice("rows", "wgmma", 9)
    assert order_advice("rows", "mma2", 8) is None  # sm_8x builds the mma2 order too, but it was never timed there
    assert order_advice("rows", "rows", 10) is None


def test_strided_order_is_read_from_the_config(tiny, tmp_path):
    """A recipe's strided ``order: wgmma`` is recorded in config.json and parsed into the spec (the plugin passes it
    to the kernels); a config without the option is the order rows (every output written before it); an order this
    mxrepack does not know is one line at parse time."""
    from mxrepack.layouts import strided
    from mxrepack.serve.spec import STRIDED_ORDERS

    assert STRIDED_ORDERS == strided.ORDERS
    # the shipped target on this order, and what repack and `repack targets` say serves it
    assert load_recipe("sm90-strided").expert_options == {"order": "wgmma"}
    assert load_recipe("sm121-strided").expert_options == {"order": "mma2"}
    assert serving("strided", "mxrepack", {"order": "wgmma"})[1].endswith("wgmma order [sm90 (H100/H200) only]")
    assert "sm120/sm121 included" in serving("strided", "mxrepack")[1]
    recipe = tmp_path / "wgmma.yaml"
    recipe.write_text(
        "name: h100-wgmma\ndescription: d\nexperts: {layout: strided, options: {order: wgmma}}\n"
        "dense: {format: bf16}\nconfig: {quantization_config: mxrepack}\n"
    )
    out = repack(str(tiny), None, tmp_path / "o", recipe_file=str(recipe)).out
    spec = check_checkpoint(out)
    assert (spec.layout, spec.strided_order, spec.expert_options) == ("strided", "wgmma", {"order": "wgmma"})
    manifest = json.loads((out / "mxrepack.json").read_text())
    assert manifest["target"]["recipe"]["experts"]["options"] == {"order": "wgmma"}  # what verify and eval unpack by
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["groups"]["experts"]["options"] == {"order": "wgmma"}
    experts = config["quantization_config"]["groups"]["experts"]
    experts.pop("options")
    assert ServeSpec.from_config(config).strided_order == "rows"
    experts["options"] = {"order": "mma2"}
    assert ServeSpec.from_config(config).strided_order == "mma2"
    assert serving("strided", "mxrepack", {"order": "mma2"})[1].endswith(
        "mma2 order [sm120/sm121 and sm80-sm89; not sm90/sm100]"
    )
    experts["options"] = {"order": "mma_sync"}
    with pytest.raises(MxRepackError, match=r"experts\.options\.order is 'mma_sync': .*rows, wgmma, mma2") as e:
        ServeSpec.from_config(config)
    assert "\n" not in str(e.value)
    # order wgmma written before its words' bits were rotated (mxrepack 0.1.0, or no version): refused in one line by
    # the plugin's parse and by the evaluation's loader; the rows order is read from any version
    experts["options"] = {"order": "wgmma"}
    assert config["quantization_config"]["mxrepack_version"] == mxrepack.__version__
    for old in ("0.1.0", None):
        config["quantization_config"]["mxrepack_version"] = old
        with pytest.raises(MxRepackError, match=r"order wgmma written by mxrepack .*repack the source again") as e:
            ServeSpec.from_config(config)
        assert "\n" not in str(e.value)
    experts["options"] = {"order": "rows"}
    assert ServeSpec.from_config(config).strided_order == "rows"
    from mxrepack.eval.model import load_weights
    from mxrepack.hub import plan_push
    from mxrepack.repack.output import write_manifest
    from mxrepack.repack.verify import verify_dir

    manifest["tool"]["mxrepack"] = "0.1.0"
    write_manifest(out, manifest)  # sealed again: the digest holds, only the version is old
    with pytest.raises(MxRepackError, match=r"order wgmma written by mxrepack 0\.1\.0"):
        load_weights(out)
    report = verify_dir(out, source=False)  # one problem, not a source mismatch per tensor
    assert not report["ok"] and len(report["problems"]) == 1 and "written by mxrepack 0.1.0" in report["problems"][0]
    with pytest.raises(MxRepackError, match=r"refusing to push.*written by mxrepack 0\.1\.0"):
        plan_push(out, "user/repo")


# The few vLLM names the dense methods touch, for running them without vLLM (their real behaviour: SERVING.md's check).
_VLLM_STAND_IN = {
    "vllm/__init__.py": "",
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/layers/__init__.py": "",
    "vllm/model_executor/layers/linear.py": "class LinearMethodBase:\n    pass\n",
    "vllm/model_executor/layers/quantization/__init__.py": "",
    "vllm/model_executor/layers/quantization/utils/__init__.py": "",
    "vllm/model_executor/layers/quantization/utils/marlin_utils_fp4.py": (
        "def apply_fp4_marlin_linear(**kwargs):\n    raise AssertionError('Marlin called')\n"
        "def prepare_fp4_layer_for_marlin(layer):\n    raise AssertionError('Marlin called')\n"
    ),
    "vllm/model_executor/utils.py": (  # as vLLM's: an attribute is set once
        "def set_weight_attrs(p, attrs):\n    for k, v in attrs.items():\n"
        "        assert not hasattr(p, k), f'Overwriting existing tensor attribute: {k}'\n        setattr(p, k, v)\n"
    ),
    "vllm/utils/__init__.py": "",
    "vllm/utils/torch_utils.py": (
        "from torch._library.infer_schema import infer_schema\n"
        "def direct_register_custom_op(op_name, op_func, mutates_args=None, fake_impl=None, target_lib=None,"
        " dispatch_key='CPU', tags=()):\n"
        "    target_lib.define(op_name + infer_schema(op_func, mutates_args=mutates_args or []), tags=tags)\n"
        "    target_lib.impl(op_name, op_func, dispatch_key=dispatch_key)\n"
        "    target_lib._register_fake(op_name, fake_impl)\n"
    ),
}

_DENSE_ON_MXREPACK = """
import torch
from mxrepack.kernels.reference import mxfp4_linear
from mxrepack.serve.vllm import linear as L

assert type(L.make_dense_method("marlin")).__name__ == "MarlinMxfp4LinearMethod" and L._LIB is None
rows = []
apply = L.TritonMxfp4LinearMethod.apply
L.TritonMxfp4LinearMethod.apply = lambda self, layer, x, bias=None: rows.append(
    (len(x), bias is not None, torch.is_grad_enabled())
) or apply(self, layer, x, bias)


def loaded(N=96, K=320):  # q/k/v-like partitions; K not a multiple of 128
    method, layer = L.make_dense_method("mxrepack"), torch.nn.Module()
    method.create_weights(layer, K, [64, 16, 16], K, N, torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    layer.weight_packed.data = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, generator=g)
    layer.weight_scale.data = torch.randint(118, 130, (N, K // 32), dtype=torch.uint8, generator=g)
    # gpt-oss's q/k/v have one; vLLM's linear layers leave it requiring grad (their forward runs in inference mode, the
    # warm-up at load does not)
    layer.bias = torch.nn.Parameter(torch.randn(N).to(torch.bfloat16))
    method.process_weights_after_loading(layer)
    return method, layer


method, layer = loaded()
assert type(method).__name__ == "TritonMxfp4LinearMethod" and L._LIB is not None
# every row-count class compiled at load, with the bias the forward passes (the kernels specialize on it)
# (the warm-up with autograd off: vLLM loads with it on and leaves the bias requiring grad)
assert rows == [(m, True, False) for m in L.WARM_ROWS], rows
loaded()
assert rows == [(m, True, False) for m in L.WARM_ROWS], rows  # once a shape
x, b = torch.randn(2, 3, 320).to(torch.bfloat16), torch.randn(96).to(torch.bfloat16)
y = method.apply(layer, x, b)
ref = mxfp4_linear(x.reshape(6, 320), layer.weight_packed, layer.weight_scale, b).reshape(2, 3, 96)
assert y.shape == (2, 3, 96) and y.dtype == torch.bfloat16
assert float((y.float() - ref.float()).abs().max() / ref.float().abs().max()) < 1e-2
assert method.apply(layer, x[:0, :0].reshape(0, 320)).shape == (0, 96)
# vLLM's calls (2-D BF16) skip the reshape and casts: the same bits; other activations are cast to BF16 and back
assert torch.equal(method.apply(layer, x.reshape(6, 320), b), y.reshape(6, 96))
y32 = method.apply(layer, x.float(), b)
assert y32.dtype == torch.float32 and torch.equal(y32, y.float())
try:
    torch.ops.mxrepack.linear_mxfp4(x[0].half(), layer.weight_packed, layer.weight_scale, None, False, "rows", 96)
    raise SystemExit("fp16 activations were taken")
except ValueError as e:
    assert "bf16 activations" in str(e)
# one opaque op to torch.compile (vLLM compiles the model with fullgraph=True); run eagerly (lm_head at every step),
# the op's function called without the dispatcher
direct = []
op_function = L._linear_mxfp4_op
L._linear_mxfp4_op = lambda *a: direct.append(len(a[0])) or op_function(*a)
compiled = torch.compile(lambda t: method.apply(layer, t, b), backend="eager", fullgraph=True)
assert torch.equal(compiled(x), y) and torch.equal(compiled(x.reshape(6, 320)), y.reshape(6, 96)) and direct == []
assert torch.equal(method.apply(layer, x, b), y) and direct == [6]
assert torch.equal(method.apply(layer, x.reshape(6, 320), b), y.reshape(6, 96)) and direct == [6, 6]  # the 2-D path
L._linear_mxfp4_op = op_function
# the split-K counters among the model's buffers (vLLM's sleep mode level 2 restores those alone), not its state dict
from mxrepack.kernels.arrival import arrival_counters

model = torch.nn.ModuleDict({"a": layer, "b": loaded()[1]})
assert [n for n, _ in model.named_buffers()] == ["a.mxrepack_arrival_counters"]
assert dict(model.named_buffers())["a.mxrepack_arrival_counters"] is arrival_counters(x.device, 1, "linear")
assert not any("counters" in n for n in model.state_dict())
# the same weights stored in a chunk order (the dense layout's): mxrepack's method whatever kernel was chosen, its
# parameters padded to 16 rows and 128 columns, the same products at decode and past it
from mxrepack.layouts.dense import DenseMxLayout

for order in ("wgmma", "mma2"):
    chunked, c_layer = L.make_dense_method("marlin", order), torch.nn.Module()
    assert type(chunked).__name__ == "TritonMxfp4LinearMethod" and chunked.order == order
    chunked.create_weights(c_layer, 320, [64, 16, 16], 320, 96, torch.bfloat16)
    assert c_layer.weight_packed.shape == (96, 192) and c_layer.weight_scale.shape == (96, 12)
    dense = DenseMxLayout("mxfp4", order=order)
    c_layer.weight_packed.data = dense.store(layer.weight_packed, layer.weight_scale, 320, "values")
    c_layer.weight_scale.data = dense.store(layer.weight_packed, layer.weight_scale, 320, "scales")
    c_layer.bias = torch.nn.Parameter(b.clone())
    chunked.process_weights_after_loading(c_layer)
    for t in (x, torch.randn(70, 320).to(torch.bfloat16)):
        r = mxfp4_linear(t.reshape(-1, 320), layer.weight_packed, layer.weight_scale, b).reshape(*t.shape[:-1], 96)
        yc = chunked.apply(c_layer, t, b)
        assert yc.shape == r.shape and float((yc.float() - r.float()).abs().max() / r.float().abs().max()) < 1e-2
print("ok")
"""


def test_dense_layers_on_mxrepacks_kernels_through_a_registered_op(tmp_path):
    """The plugin's ``mxrepack`` dense method against a stand-in for the vLLM names it touches: the op registered only
    when asked for, every row-count class compiled at load once a shape, the op's result against the reference, bf16
    activations only, and Dynamo tracing it as one call."""
    for path, text in _VLLM_STAND_IN.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}", "TRITON_INTERPRET": "1"}
    p = subprocess.run([sys.executable, "-c", _DENSE_ON_MXREPACK], env=env, capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]


def test_weights_identity_names_the_weights_for_vllms_compile_cache(tmp_path):
    """What the plugin records in the quantization config for vLLM's compile cache (a cached graph keeps the dense
    op's fold flag, read from the weights when it was traced): the manifest's digest for an mxrepack output, which
    any change of a file changes; else the safetensors files' names, sizes and times; never an error."""
    from mxrepack.repack.output import MANIFEST_KIND, load_manifest, write_manifest
    from mxrepack.serve.spec import weights_identity

    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "model.safetensors").write_bytes(b"\0" * 8)
    before = weights_identity(plain)
    assert before.startswith("files:") and weights_identity(plain) == before
    (plain / "model.safetensors").write_bytes(b"\0" * 9)
    assert weights_identity(plain) != before
    out = tmp_path / "out"
    out.mkdir()
    sealed = write_manifest(out, {"format": MANIFEST_KIND, "files": {"a.safetensors": {"sha256": "1" * 64}}})
    first = weights_identity(out)
    assert first == f"manifest:{sealed['manifest_sha256'][:16]}"
    write_manifest(out, {"format": MANIFEST_KIND, "files": {"a.safetensors": {"sha256": "2" * 64}}})
    assert weights_identity(out) != first
    # nothing unreadable stops an engine: a manifest that is JSON but no object, or not UTF-8; a dangling link
    for bad, why in ((b"[1, 2]", "a JSON list, not an object"), (b"\xff\xfe", "not valid JSON")):
        (out / "mxrepack.json").write_bytes(bad)
        assert weights_identity(out).startswith("files:")
        with pytest.raises(MxRepackError, match=f"mxrepack.json: .*{why}"):  # elsewhere: one line, no traceback
            load_manifest(out)
    (plain / "gone.safetensors").symlink_to(tmp_path / "nowhere")
    assert weights_identity(plain).startswith("files:")


def test_a_hub_model_id_is_named_by_the_snapshot_vllm_read_its_config_from(tmp_path):
    """For a Hub id the plugin records the commit of the cached snapshot holding the config (a repo pushed again gets
    a new one, where vLLM hashes only the name and the revision): the revision's, else the default branch's; None
    where nothing is cached or the name is no repo id; no network."""
    from mxrepack.serve.spec import hub_snapshot_identity

    repo = tmp_path / "models--org--gpt-oss-120b-sm121"
    for ref, commit in (("main", "a" * 40), ("v2", "b" * 40)):
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "config.json").write_text("{}")
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    assert hub_snapshot_identity("org/gpt-oss-120b-sm121", cache_dir=tmp_path) == "hub:" + "a" * 40
    assert hub_snapshot_identity("org/gpt-oss-120b-sm121", "v2", cache_dir=tmp_path) == "hub:" + "b" * 40
    (repo / "refs" / "main").write_text("c" * 40)  # pushed again: vLLM's config download moved the branch
    (repo / "snapshots" / ("c" * 40)).mkdir()
    (repo / "snapshots" / ("c" * 40) / "config.json").write_text("{}")
    assert hub_snapshot_identity("org/gpt-oss-120b-sm121", cache_dir=tmp_path) == "hub:" + "c" * 40
    assert hub_snapshot_identity("org/other", cache_dir=tmp_path) is None
    assert hub_snapshot_identity("/no/such/dir.gguf", cache_dir=tmp_path) is None
    # the commit the config came from wins over the cache's refs, which another process may have moved meanwhile:
    # the config's own (transformers before 5.20), then vLLM 0.33's revision resolved to its commit, or a commit given
    # as the revision
    assert hub_snapshot_identity("org/gpt-oss-120b-sm121", "main", "e" * 40, cache_dir=tmp_path) == "hub:" + "e" * 40

    class Resolved(str):  # as vLLM 0.33's ResolvedRevision: the name as given, the commit it resolved to
        resolved = "f" * 40

    assert hub_snapshot_identity("org/gpt-oss-120b-sm121", Resolved("main"), cache_dir=tmp_path) == "hub:" + "f" * 40
    assert hub_snapshot_identity("org/gpt-oss-120b-sm121", "9" * 40, cache_dir=tmp_path) == "hub:" + "9" * 40
