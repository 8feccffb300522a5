"""The MX codec against transformers, gpt-oss, compressed-tensors and the golden vectors."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxrepack.errors import MxRepackError
from mxrepack.quant import (
    check_e8m0,
    dequantize_mxfp4,
    dequantize_mxfp8,
    e8m0_to_float,
    pack_fp4,
    quantize_mxfp4,
    quantize_mxfp8,
    unpack_fp4,
)
from mxrepack.quant.mx import FP4_VALUES


def _bits(t):
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("proj", ["gate_up_proj", "down_proj"])
@pytest.mark.parametrize("dtype,tag", [(torch.bfloat16, "bf16"), (torch.float32, "f32")])
def test_dequant_matches_golden_transformers_and_gpt_oss(golden, proj, dtype, tag):
    g = golden("dequant_transformers.safetensors")
    out = dequantize_mxfp4(g[f"in.{proj}_blocks"], g[f"in.{proj}_scales"], dtype)
    assert torch.equal(_bits(out.transpose(1, 2).contiguous()), _bits(g[f"out.transformers.{proj}.{tag}"]))
    o = golden("dequant_gpt_oss.safetensors")
    name = "mlp1_weight" if proj == "gate_up_proj" else "mlp2_weight"
    assert torch.equal(_bits(out), _bits(o[f"out.gpt_oss.{name}.{tag}"]))


@pytest.fixture(params=["native", "twin"])
def dequant_path(request, monkeypatch):
    """Run a test with BF16 dequantization by the compiled loop (``mxrepack.native``) and by its numpy twin."""
    from mxrepack import native

    if request.param == "twin":
        monkeypatch.setattr(native, "library", lambda: None)
    elif native.library() is None:
        pytest.skip("no C compiler: the native loops are not built here")
    return request.param


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dequant_bit_identical_to_transformers_over_all_scales(dtype, dequant_path):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    blocks = torch.randint(0, 256, (3, 40, 4, 16), dtype=torch.uint8)
    scales = torch.randint(0, 255, (3, 40, 4), dtype=torch.uint8)  # every byte but NaN, subnormal 2^-127 included
    scales[0, 0] = torch.tensor([0, 1, 253, 254], dtype=torch.uint8)
    ref = convert_moe_packed_tensors(blocks.clone(), scales.clone(), dtype=dtype)
    assert torch.equal(_bits(dequantize_mxfp4(blocks, scales, dtype).transpose(1, 2).contiguous()), _bits(ref))
    assert torch.equal(_bits(dequantize_mxfp4(blocks, scales, dtype, transpose=True)), _bits(ref))


@pytest.mark.parametrize("lead,rows,groups", [((3,), 37, 5), ((2,), 64, 3), ((), 33, 2), ((2, 2), 1, 1)])
def test_dequant_bf16_native_equals_twin(lead, rows, groups):
    """The compiled BF16 loop gives its twin's bits for every E8M0 byte 0..254 and every code, row-major and
    transposed (rows that are not a multiple of the 32-row tile included). Byte 255 (NaN, refused in sources) gives
    inf times the code in both, so NaN at the same places, with another NaN payload."""
    from mxrepack import native

    if native.library() is None:
        pytest.skip("no C compiler: the native loops are not built here")
    g = torch.Generator().manual_seed(rows)
    blocks = torch.randint(0, 256, (*lead, rows, groups, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(0, 256, (*lead, rows, groups), generator=g, dtype=torch.uint8)
    flat = scales.view(-1)
    flat[: min(256, flat.numel())] = torch.arange(256, dtype=torch.uint8)[: flat.numel()]
    got = dequantize_mxfp4(blocks, scales), dequantize_mxfp4(blocks, scales, transpose=True)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(native, "library", lambda: None)
        ref = dequantize_mxfp4(blocks, scales), dequantize_mxfp4(blocks, scales, transpose=True)
    legal = (scales != 255).unsqueeze(-1).expand(*scales.shape, 32).flatten(-2)
    for out, want, ok in zip(got, ref, (legal, legal.transpose(-1, -2))):
        assert out.shape == want.shape and out.dtype == torch.bfloat16
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(out), nan) and not nan[ok].any()
        assert torch.equal(_bits(out)[~nan], _bits(want)[~nan])
    assert torch.equal(_bits(got[1]), _bits(got[0].transpose(-1, -2).contiguous()))


def test_e2m1_table_and_nibble_order():
    codes = torch.arange(16, dtype=torch.uint8)
    packed = pack_fp4(codes)
    assert packed.tolist() == [c0 | (c1 << 4) for c0, c1 in zip(range(0, 16, 2), range(1, 16, 2))]
    values = dequantize_mxfp4(packed.repeat(2).view(1, 16), torch.tensor([[127]], dtype=torch.uint8), torch.float32)
    assert values[0, :16].tolist() == list(FP4_VALUES)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 15), min_size=2, max_size=256).filter(lambda x: len(x) % 2 == 0))
def test_pack_unpack_roundtrip(codes):
    c = torch.tensor(codes, dtype=torch.uint8)
    assert torch.equal(unpack_fp4(pack_fp4(c)), c)


def test_e8m0_nan_is_an_error_naming_the_tensor():
    s = torch.tensor([127, 255], dtype=torch.uint8)
    with pytest.raises(MxRepackError, match=r"layer0\.scales: 1 E8M0 scale byte\(s\) are 255"):
        check_e8m0(s, "layer0.scales")
    assert e8m0_to_float(torch.tensor([0, 127, 254], dtype=torch.uint8)).tolist() == [2.0**-127, 1.0, 2.0**127]


@pytest.mark.parametrize("rule", ["ocp", "compressed-tensors"])
def test_quantize_mxfp4_recovers_exact_mxfp4_values(rule):
    blocks = torch.randint(0, 256, (64, 6, 16), dtype=torch.uint8)
    scales = torch.randint(110, 140, (64, 6), dtype=torch.uint8)
    w = dequantize_mxfp4(blocks, scales, torch.float32)
    packed, s = quantize_mxfp4(w, rule)
    assert torch.equal(dequantize_mxfp4(packed, s, torch.float32), w)


def test_quantize_mxfp4_ocp_rule_and_rounding():
    # group max 6*2^k -> scale 2^k; elements round to nearest, ties to even code, saturate at 6
    w = torch.zeros(1, 32)
    w[0, :8] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    w[0, 8:12] = torch.tensor([-0.3, -0.0, 7.9, -0.1])
    packed, s = quantize_mxfp4(w * 4)
    assert s.item() == 127 + 2  # amax 31.6: floor(log2) = 4, minus E2M1's emax 2 -> scale 2^2
    deq = dequantize_mxfp4(packed, s, torch.float32)[0] / 4
    assert deq[:8].tolist() == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert deq[8:11].tolist() == [-0.5, 0.0, 6.0]
    assert unpack_fp4(packed)[0, 9:12].tolist() == [0, 7, 8]  # -0.0 -> +0; saturate; tiny negative -> -0
    zeros, zs = quantize_mxfp4(torch.zeros(2, 32))
    assert zs.tolist() == [[0], [0]] and zeros.eq(0).all()


def test_compressed_tensors_rule_matches_golden(golden):
    g = golden("compressed_tensors.safetensors")
    for w in ("random", "from_mxfp4"):
        packed, scales = quantize_mxfp4(g[f"in.{w}.weight"], "compressed-tensors")
        assert torch.equal(scales, g[f"out.{w}.weight_scale"]), w
        assert torch.equal(packed, g[f"out.{w}.weight_packed"]), w
        assert torch.equal(dequantize_mxfp4(packed, scales, torch.bfloat16), g[f"out.{w}.decompressed_weight"])


def test_compressed_tensors_rule_matches_installed_library():
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    scheme = preset_name_to_scheme("MXFP4A16", ["Linear"])
    w = (torch.randn(96, 256) * torch.logspace(-3, 1, 96).unsqueeze(1)).to(torch.bfloat16)
    w[3, :32] = 0  # an all-zero group
    w[4, :32] = torch.linspace(-7, 7, 32).to(torch.bfloat16) * 0.25  # group max with mantissa >= .75
    groups = w.reshape(96, 8, 32)
    scale, zp = calculate_qparams(groups.amin(-1), groups.amax(-1), scheme.weights)
    sd = MXFP4PackedCompressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zp}, scheme)
    packed, scales = quantize_mxfp4(w, "compressed-tensors")
    assert torch.equal(scales, sd["weight_scale"].view(torch.uint8))
    assert torch.equal(packed, sd["weight_packed"])


def test_mxfp8_roundtrip_error_is_small():
    w = torch.randn(64, 128) * 0.05
    values, scales = quantize_mxfp8(w)
    assert values.dtype == torch.float8_e4m3fn and scales.shape == (64, 4)
    rel = (dequantize_mxfp8(values, scales, torch.float32) - w).norm() / w.norm()
    assert rel < 0.04  # E4M3 has 3 mantissa bits: per-element error <= 2^-4 relative
    with pytest.raises(MxRepackError, match="multiple of 32"):
        quantize_mxfp8(torch.randn(4, 40))
