"""Kernel layouts against the vectors produced by the consumers' own code (../shared/golden)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxrepack.layouts import ExpertDims, dense_weights, get_layout
from mxrepack.repack.gptoss import EXPERT_PARTS


def _inputs(g):
    return {p: g[f"in.{p}"] for p in EXPERT_PARTS}


def _pack(layout, parts, dims):
    return {o.suffix: o.pack(**{k: parts[k] for k in o.inputs}) for o in layout.outputs(dims)}


GOLDEN_DIMS = ExpertDims(experts=3, hidden=160, intermediate=96)


def test_marlin_matches_vllm(golden):
    g = golden("vllm_marlin.safetensors")
    layout = get_layout("marlin")
    out = _pack(layout, _inputs(g), GOLDEN_DIMS)
    for name in ("w13_weight", "w2_weight", "w13_bias", "w2_bias"):
        assert torch.equal(out[name], g[f"out.{name}"]), name
    for name in ("w13_weight_scale", "w2_weight_scale"):
        assert out[name].dtype == torch.float8_e8m0fnu
        assert torch.equal(out[name].view(torch.uint8), g[f"out.{name}"]), name


def test_marlin_scale_permutation_before_swap_matches_vllm(golden):
    from mxrepack.layouts.marlin import _E8M0_SWAP

    g = golden("vllm_marlin.safetensors")
    out = _pack(get_layout("marlin"), _inputs(g), GOLDEN_DIMS)
    for name, mid in (("w13_weight_scale", "w13"), ("w2_weight_scale", "w2")):
        swapped = out[name].view(torch.uint8)
        unswapped = swapped.reshape(3, -1, 4)[:, :, _E8M0_SWAP].reshape(swapped.shape)
        ref = g[f"mid.{mid}_scale_marlin_permuted_bf16"].view(torch.int16)
        # E8M0 byte s is bf16 2^(s-127): exponent field s, except s=0 (subnormal 2^-127 = bits 0x0040)
        as_bf16 = torch.where(unswapped == 0, 0x40, unswapped.to(torch.int16) << 7).to(torch.int16)
        assert torch.equal(as_bf16, ref), name


def test_trtllm_matches_vllm_flashinfer(golden):
    from mxrepack.layouts.trtllm import swizzle_128x4

    g = golden("flashinfer_trtllm.safetensors")
    out = _pack(get_layout("trtllm"), _inputs(g), GOLDEN_DIMS)
    for name in ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale", "w13_bias", "w2_bias"):
        assert out[name].dtype == g[f"out.{name}"].dtype, name
        assert torch.equal(out[name], g[f"out.{name}"]), name
    # the 128x4 swizzle alone, against FlashInfer's swizzle_block_scale
    s = g["in.padded.w13_weight_scale"][:1]
    assert torch.equal(swizzle_128x4(s)[0].reshape(-1), g["fi.swizzle_block_scale.w13_scale_padded_e0"].reshape(-1))


def _random_parts(E, H, I, seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "gate_up_proj_blocks": torch.randint(0, 256, (E, 2 * I, H // 32, 16), generator=g, dtype=torch.uint8),
        "gate_up_proj_scales": torch.randint(100, 140, (E, 2 * I, H // 32), generator=g, dtype=torch.uint8),
        "gate_up_proj_bias": torch.randn(E, 2 * I, generator=g).to(torch.bfloat16),
        "down_proj_blocks": torch.randint(0, 256, (E, H, I // 32, 16), generator=g, dtype=torch.uint8),
        "down_proj_scales": torch.randint(100, 140, (E, H, I // 32), generator=g, dtype=torch.uint8),
        "down_proj_bias": torch.randn(E, H, generator=g).to(torch.bfloat16),
    }


@pytest.mark.parametrize("name", ["marlin", "marlin-fp8", "trtllm", "bf16", "mxfp4"])
@settings(max_examples=12, deadline=None)
@given(E=st.integers(1, 3), h=st.integers(1, 10), i=st.integers(1, 10), seed=st.integers(0, 2**31))
def test_roundtrip_is_byte_exact(name, E, h, i, seed):
    from mxrepack.layouts.marlin import MarlinLayout

    layout = MarlinLayout(fp8_activations=True) if name == "marlin-fp8" else get_layout(name)
    dims = ExpertDims(E, 32 * h, 32 * i)  # multiples of 32, mostly not of 128
    parts = _random_parts(E, dims.hidden, dims.intermediate, seed)
    stored = _pack(layout, parts, dims)
    for o in layout.outputs(dims):
        assert tuple(stored[o.suffix].shape) == o.shape and stored[o.suffix].dtype == o.dtype
    back = layout.unpack(stored, dims)
    if layout.exact_bytes:
        assert all(torch.equal(back[k], parts[k]) for k in parts)
    else:  # bf16: exact values, not bytes
        want, have = dense_weights(parts), dense_weights(back)
        assert all(torch.equal(want[k], have[k]) for k in want)
    # packing any expert range gives the same bytes as packing all experts (the pipeline streams)
    if E > 1:
        one = _pack(layout, {k: v[1:2] for k, v in parts.items()}, dims)
        assert all(torch.equal(one[k].view(torch.uint8), stored[k][1:2].view(torch.uint8)) for k in one)


def test_marlin_reference_gemm_padding_is_inert():
    """A product through the padded, repacked layout equals the unpadded reference."""
    from mxrepack.kernels.reference import expert_mlp

    dims = ExpertDims(2, 160, 96)
    parts = _random_parts(2, 160, 96, 7)
    layout = get_layout("marlin")
    stored = _pack(layout, parts, dims)
    x = torch.randn(5, 160).to(torch.bfloat16)
    want = expert_mlp(x, dense_weights(parts), 1)
    got = expert_mlp(x, dense_weights(layout.unpack(stored, dims)), 1)
    assert torch.equal(want, got)
