"""Dense MX quantization (q/k/v/o/lm_head), the compressed-tensors target, and their bad-input errors."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from mxrepack.errors import MxRepackError
from mxrepack.gptoss import EXPERT_PARTS
from mxrepack.layouts import ExpertDims, dense_weights, get_layout
from mxrepack.layouts.compressed_tensors import marlin_moe_valid
from mxrepack.layouts.dense import DenseMxLayout
from mxrepack.quant import dequantize_mxfp4, dequantize_mxfp8, quantize_mxfp4, quantize_mxfp8
from mxrepack.quant.dense import select_dense
from mxrepack.repack.fixture import make_fixture
from mxrepack.repack.pipeline import repack
from mxrepack.repack.safetensors_io import read_directory
from mxrepack.repack.source import open_checkpoint
from mxrepack.repack.verify import verify_dir


def test_mxfp8_compressed_tensors_rule_matches_installed_library():
    from compressed_tensors.compressors.mxfp8.base import MXFP8QuantizationCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    scheme = preset_name_to_scheme("MXFP8A16", ["Linear"])
    w = (torch.randn(64, 256) * torch.logspace(-3, 1, 64).unsqueeze(1)).to(torch.bfloat16)
    w[3, :32] = 0
    groups = w.reshape(64, 8, 32)
    scale, zp = calculate_qparams(groups.amin(-1), groups.amax(-1), scheme.weights)
    sd = MXFP8QuantizationCompressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zp}, scheme)
    values, scales = quantize_mxfp8(w, "compressed-tensors")
    assert torch.equal(scales, sd["weight_scale"].view(torch.uint8))
    assert torch.equal(values.view(torch.uint8), sd["weight"].view(torch.uint8))


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
def test_scale_search_never_worse_per_group_and_better_overall(fmt):
    quant, deq = (quantize_mxfp4, dequantize_mxfp4) if fmt == "mxfp4" else (quantize_mxfp8, dequantize_mxfp8)
    w = torch.randn(256, 512) * 0.02
    w[torch.rand_like(w) < 0.01] *= 8  # outliers: where clipping at the rule's scale costs most
    errs = {}
    for search in (False, True):
        v, s = quant(w, "ocp", search)
        errs[search] = (deq(v, s, torch.float32) - w).square().unflatten(-1, (-1, 32)).sum(-1)
    assert (errs[True] <= errs[False] + 1e-12).all()
    assert errs[True].sum() < errs[False].sum()


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
def test_dense_layout_swizzled_round_trip_and_padding(fmt):
    layout = DenseMxLayout(fmt, "swizzled")
    n, k = 200, 96  # neither a multiple of 128
    w = torch.randn(n, k).to(torch.bfloat16)
    outs = layout.outputs((n, k))
    assert [o.shape for o in outs] == [(256, 64 if fmt == "mxfp4" else 128), (256, 4)]
    values, scales = layout.quantize(torch.cat([w, w.new_zeros(56, k)]))
    stored_v = layout.store(values, scales, k, "values")
    stored_s = layout.store(values, scales, k, "scales")
    back_v, back_s = layout.unpack(stored_v, stored_s, (n, k))
    assert torch.equal(back_v.view(torch.uint8), values[:n].view(torch.uint8)) and torch.equal(back_s, scales[:n])
    # padding is zero bytes and zero scales: inert in any GEMM
    assert int(stored_v[n:].view(torch.uint8).max()) == 0
    with pytest.raises(MxRepackError, match="multiple of 32"):
        layout.outputs((64, 80))


def test_layer_selection_and_errors():
    names = [
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.q_proj.bias",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.router.weight",
        "model.layers.0.input_layernorm.weight",
    ]
    assert select_dense(names, ["qkv"]) == names[2:3] + names[4:6]
    assert select_dense(names, ["o", "lm_head"]) == ["lm_head.weight", "model.layers.0.self_attn.o_proj.weight"]
    assert select_dense(names, ["model.layers.0.self_attn.o_proj"]) == ["model.layers.0.self_attn.o_proj.weight"]
    assert "model.layers.0.mlp.router.weight" not in select_dense(names, ["attn", "lm_head", "embed"])
    with pytest.raises(MxRepackError, match="'re:.*layers\\\\.7.*' matches no dense weight"):
        select_dense(names, [r"re:.*layers\.7.*"])
    with pytest.raises(MxRepackError, match="unknown entry 'mlp'"):
        select_dense(names, ["mlp"])


def test_sm121_quantizes_dense_by_default_and_dense_bf16_keeps_them(tiny, tmp_path):
    out = repack(str(tiny), "sm121", tmp_path / "a").out
    stored = read_directory(out)
    ck = open_checkpoint(str(tiny))
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.o_proj", "lm_head"):
        assert name + ".weight" not in stored
        packed, scales = stored[name + ".weight_packed"], stored[name + ".weight_scale"]
        src = ck.tensors[name + ".weight"].read()
        want = quantize_mxfp4(src, "ocp")
        assert torch.equal(packed, want[0]) and torch.equal(scales, want[1])
        rel = (dequantize_mxfp4(packed, scales, torch.float32) - src.float()).norm() / src.float().norm()
        assert rel < 0.15  # MXFP4 on N(0, .02) weights: ~0.11
    assert stored["model.layers.0.mlp.router.weight"].dtype == torch.bfloat16
    manifest = json.loads((out / "mxrepack.json").read_text())
    report = manifest["quantization_error"]
    assert set(report) == {"lm_head.weight"} | {
        f"model.layers.{i}.self_attn.{p}_proj.weight" for i in (0, 1) for p in "qkvo"
    }
    assert all(
        0.05 < r["rel_fro"] < 0.15 and 15 < r["sqnr_db"] < 25 and r["out_rel_random"] > 0 for r in report.values()
    )
    quant = json.loads((out / "config.json").read_text())["quantization_config"]["groups"]["dense"]
    assert quant["format"] == "mxfp4" and "lm_head" in quant["modules"]

    kept = read_directory(repack(str(tiny), "sm121", tmp_path / "b", dense="bf16").out)
    assert kept["lm_head.weight"].dtype == torch.bfloat16 and "lm_head.weight_packed" not in kept


def test_dense_options_that_would_do_nothing_are_refused():
    # an empty layer list (recorded as [] while the default layers were quantized), and the quantization's options on a
    # target whose dense layers stay BF16 (silently ignored before)
    from mxrepack.recipes import load_recipe

    with pytest.raises(MxRepackError, match="--dense-layers ',': name at least one layer"):
        load_recipe("sm121").with_overrides(dense_layers=",")
    for options in ({"dense_layers": "qkv"}, {"scale_search": True}, {"scale_rule": "ocp"}):
        with pytest.raises(MxRepackError, match="sm80 keeps the dense layers BF16; pass --dense mxfp4"):
            load_recipe("sm80").with_overrides(**options)
        with pytest.raises(MxRepackError, match="--dense bf16 keeps the dense layers BF16"):
            load_recipe("sm121").with_overrides(dense="bf16", **options)
    assert load_recipe("sm80").with_overrides(scale_search=False).name == "sm80"  # --no-scale-search asks nothing
    assert load_recipe("sm80").with_overrides(dense="mxfp4", dense_layers="qkv").dense_layers == ["qkv"]


def test_recorded_activations_enter_the_report(tiny, tmp_path):
    acts = {"lm_head.weight": torch.randn(8, 288).to(torch.bfloat16)}
    save_file(acts, str(tmp_path / "acts.safetensors"))
    r = repack(
        str(tiny),
        "sm121",
        tmp_path / "o",
        dense_layers="lm_head",
        activations=tmp_path / "acts.safetensors",
        dense="mxfp8",
        scale_rule="compressed-tensors",
    )
    entry = r.quantization_error["lm_head.weight"]
    assert entry["format"] == "mxfp8" and 0 < entry["out_rel_recorded"] < 0.05
    # the weights given by mistake (same names, each its weight's shape): their "output error" would mean nothing
    from mxrepack.repack.source import open_checkpoint

    shape = open_checkpoint(str(tiny)).tensors["lm_head.weight"].shape
    save_file({"lm_head.weight": torch.zeros(*shape, dtype=torch.bfloat16)}, str(tmp_path / "weights.safetensors"))
    with pytest.raises(MxRepackError, match="holds the weights themselves"):
        repack(
            str(tiny), "sm121", tmp_path / "o2", dense_layers="lm_head", activations=tmp_path / "weights.safetensors"
        )


def _rewrite(directory, name, fn):
    index = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
    path = directory / index[name]
    tensors = load_file(str(path))
    tensors[name] = fn(tensors[name])
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_bad_dense_inputs_are_one_line_errors_naming_the_tensor(tiny, copy_of, tmp_path):
    src = copy_of(tiny)
    _rewrite(src, "model.layers.1.self_attn.v_proj.weight", lambda t: t.float())
    with pytest.raises(
        MxRepackError, match=r"tensor 'model\.layers\.1\.self_attn\.v_proj\.weight': dtype F32, expected BF16"
    ):
        repack(str(src), "sm121", tmp_path / "x")
    assert not (tmp_path / "x").exists()

    src2 = tmp_path / "nan"
    import shutil

    shutil.copytree(tiny, src2)

    def poison(t):
        t = t.clone()
        t[5, 7] = float("nan")
        return t

    _rewrite(src2, "model.layers.0.self_attn.o_proj.weight", poison)
    with pytest.raises(
        MxRepackError,
        match=r"tensor 'model\.layers\.0\.self_attn\.o_proj\.weight': 1 NaN/Inf value\(s\) \(first in row 5",
    ):
        repack(str(src2), "sm121", tmp_path / "y")
    assert not (tmp_path / "y").exists() and not list(tmp_path.glob(".y.*"))

    odd = make_fixture(tmp_path / "odd", "tiny", head_dim=20)  # o_proj K = 4 heads * 20 = 80
    with pytest.raises(
        MxRepackError,
        match=r"tensor 'model\.layers\.0\.self_attn\.o_proj\.weight': input width K=80 is not a multiple of 32",
    ):
        repack(str(odd), "sm121", tmp_path / "z")


def test_marlin_thread_config_rule_and_gpt_oss_padding():
    assert not marlin_moe_valid(2880, 2880)  # the w2 GEMM of vLLM #38022
    layout = get_layout("compressed-tensors")
    ip = layout.padded_intermediate(ExpertDims(128, 2880, 2880))
    assert ip == 2944 and marlin_moe_valid(2 * ip, 2880) and marlin_moe_valid(2880, ip)


def test_compressed_tensors_target_round_trips_through_the_library(tiny, tmp_path):
    from compressed_tensors.quantization import QuantizationConfig

    from mxrepack.quant.compressed_tensors import decompress

    out = repack(str(tiny), "compressed-tensors", tmp_path / "ct").out
    assert verify_dir(out)["ok"]
    config = json.loads((out / "config.json").read_text())
    qc = config["quantization_config"]
    parsed = QuantizationConfig.model_validate(
        {k: v for k, v in qc.items() if k not in ("version", "transform_config")}
    )
    assert parsed.format == "mxfp4-pack-quantized" and parsed.quantization_status == "compressed"
    assert "lm_head" in qc["ignore"] and qc["config_groups"]["group_0"]["weights"]["group_size"] == 32
    assert config["intermediate_size"] == 256  # 160 padded to 128

    stored = read_directory(out)
    ck = open_checkpoint(str(tiny))
    I = 160
    for layer in (0, 1):
        p = f"model.layers.{layer}.mlp.experts."
        w = dense_weights({k: ck.tensors[p + k].read() for k in EXPERT_PARTS})
        for e in range(4):
            got = {
                proj: decompress(
                    "mxfp4",
                    {
                        "weight_packed": stored[f"{p}{e}.{proj}.weight_packed"],
                        "weight_scale": stored[f"{p}{e}.{proj}.weight_scale"],
                    },
                ).float()
                for proj in ("gate_proj", "up_proj", "down_proj")
            }
            # exact: gate = even rows, up = odd rows of gate_up_proj; padding all zero
            assert torch.equal(got["gate_proj"][:I], w["gate_up_proj"][e, 0::2])
            assert torch.equal(got["up_proj"][:I], w["gate_up_proj"][e, 1::2])
            assert torch.equal(got["down_proj"][:, :I], w["down_proj"][e])
            assert got["gate_proj"][I:].eq(0).all() and got["down_proj"][:, I:].eq(0).all()
            assert torch.equal(stored[f"{p}{e}.gate_proj.bias"][:I].float(), w["gate_up_proj_bias"][e, 0::2])
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.o_proj"):
        src = ck.tensors[name + ".weight"].read().float()
        got = decompress(
            "mxfp4", {"weight_packed": stored[name + ".weight_packed"], "weight_scale": stored[name + ".weight_scale"]}
        ).float()
        assert torch.equal(got, dequantize_mxfp4(*quantize_mxfp4(src, "compressed-tensors"), torch.float32))
        assert (got - src).norm() / src.norm() < 0.15


def test_compressed_tensors_padding_is_inert_in_a_moe_forward(tiny, tmp_path):
    from mxrepack.kernels.reference import layout_moe_reference

    out = repack(str(tiny), "compressed-tensors", tmp_path / "ct").out
    stored = read_directory(out)
    layout = get_layout("compressed-tensors")
    dims = ExpertDims(4, 288, 160)
    p = "model.layers.1.mlp.experts."
    per_part = {}
    for e in range(4):
        for spec in layout.outputs(dims):
            per_part.setdefault(spec.suffix, []).append(stored[p + spec.suffix.format(e=e)])
    packed = {k: torch.stack(v) for k, v in per_part.items()}
    ck = open_checkpoint(str(tiny))
    native = get_layout("mxfp4")
    source = {k: ck.tensors[p + k].read() for k in EXPERT_PARTS}
    x = torch.randn(6, 288).to(torch.bfloat16)
    ids = torch.tensor([[0, 1], [2, 3], [1, 3], [0, 2], [3, 0], [2, 1]])
    wts = torch.softmax(torch.randn(6, 2), -1)
    y_padded = layout_moe_reference(x, packed, layout, dims, ids, wts, padded=True)
    y_source = layout_moe_reference(x, source, native, dims, ids, wts, padded=False)
    assert torch.equal(y_padded, y_source)  # zero rows/columns add exact zeros in fp32


def test_calibration_without_llmcompressor_says_how_to_install():
    import importlib.util

    from mxrepack.eval.calibrate import compare_gptq

    if importlib.util.find_spec("llmcompressor") is not None:
        pytest.skip("llm-compressor is installed here")
    with pytest.raises(MxRepackError, match=r"pip install 'mxrepack\[calib\]'"):
        compare_gptq("unused")


def test_swizzled_dense_scales_through_the_pipeline(tiny, tmp_path):
    from mxrepack.layouts.base import unswizzle_128x4

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "name: swz\ndescription: flashinfer-cutlass experts, MXFP4 dense with 128x4 scales\n"
        "experts:\n  layout: flashinfer-cutlass\n"
        "dense:\n  format: mxfp4\n  layers: [qkv, o, lm_head]\n  scales: swizzled\n"
        "config:\n  quantization_config: mxrepack\n"
    )
    out = repack(str(tiny), recipe_file=str(recipe), out=tmp_path / "o", chunk_bytes=1 << 16).out  # many 128-row chunks
    assert verify_dir(out)["ok"]
    stored = read_directory(out)
    src = open_checkpoint(str(tiny)).tensors["lm_head.weight"].read()  # [512, 288]
    packed, scales = stored["lm_head.weight_packed"], stored["lm_head.weight_scale"]
    assert packed.shape == (512, 192) and scales.shape == (512, 12)  # K 288 -> 384
    want_v, want_s = quantize_mxfp4(src)
    assert torch.equal(packed[:, :144], want_v) and torch.equal(unswizzle_128x4(scales[None])[0][:, :9], want_s)
    entry = json.loads((out / "mxrepack.json").read_text())["tensors"]["model.layers.0.self_attn.k_proj.weight_scale"]
    assert entry["padding"] == {"rows": [64, 128], "cols": [288, 384]} and entry["stored_shape"] == [128, 12]
    from mxrepack.eval.model import load_runner

    plain = repack(str(tiny), "sm121", tmp_path / "plain").out  # same quantization, plain scales
    ids = torch.randint(0, 512, (10,))
    assert torch.equal(load_runner(out).forward(ids), load_runner(plain).forward(ids))


def test_dense_chunks_are_sized_by_weights_and_nothing_is_held_after_the_run(tiny, tmp_path, monkeypatch):
    """Both stored tensors of a dense weight take the same rows per chunk, whose temporaries fit the budget (the
    scales, 1/32 byte per weight, once took 16x the values' rows); and once the run is over no quantizer holds a
    chunk (each held its last chunk to the end of the run: ~1.5 GB over gpt-oss-20b's layers)."""
    from mxrepack.repack import pipeline
    from mxrepack.repack.plan import TEMP_BYTES_PER_WEIGHT, DenseQuantizer, rows_per_chunk

    plans = []
    build = pipeline.build_plan
    monkeypatch.setattr(pipeline, "build_plan", lambda *a, **k: plans.append(build(*a, **k)) or plans[-1])
    repack(str(tiny), "sm121", tmp_path / "out")
    (plan,) = plans
    dense = {}
    for item in plan:
        quantizer = getattr(getattr(item.pack, "func", None), "__self__", None)
        if isinstance(quantizer, DenseQuantizer):
            dense.setdefault(item.group, []).append(item)
            assert quantizer._held is None, item.name
    assert "lm_head.weight" in dense and len(dense) > 4
    budget = 64 << 10
    for name, items in dense.items():
        assert len(items) == 2, name
        (rows,) = {rows_per_chunk(i, budget) for i in items}  # one row count for both
        k = items[0].inputs["value"].shape[1]
        assert rows == 1 or rows * k * TEMP_BYTES_PER_WEIGHT <= budget, name
