"""Kernel layouts against the vectors produced by the consumers' own code (../shared/golden)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxrepack.errors import MxRepackError
from mxrepack.gptoss import EXPERT_PARTS
from mxrepack.layouts import LAYOUTS, ExpertDims, dense_weights, get_layout


def _inputs(g):
    return {p: g[f"in.{p}"] for p in EXPERT_PARTS}


def _pack(layout, parts, dims):
    if layout.per_expert:  # one tensor per expert: pack each, stack them (what unpack takes)
        E = next(iter(parts.values())).shape[0]
        return {
            o.suffix: torch.stack([o.pack(**{k: parts[k][e : e + 1] for k in o.inputs}) for e in range(E)])
            for o in layout.outputs(dims)
        }
    return {o.suffix: o.pack(**{k: parts[k] for k in o.inputs}) for o in layout.outputs(dims)}


GOLDEN_DIMS = ExpertDims(experts=3, hidden=160, intermediate=96)


@pytest.fixture(params=["native", "scalar", "numpy"])
def byte_loops(request, monkeypatch):
    """Run a test with the compiled byte loops (``mxrepack.native``; their AVX-512 twins where the CPU has
    them), with the portable C loops only, and with the numpy twins."""
    from mxrepack import native

    if request.param == "numpy":
        monkeypatch.setattr(native, "library", lambda: None)
    elif native.compiler() is None:
        pytest.skip("no C compiler: the native loops are not built here")
    else:
        assert native.library() is not None, "a C compiler is present but the native loops did not build"
        if request.param == "scalar":
            monkeypatch.setenv("MXREPACK_NATIVE", "scalar")
    return request.param


def test_marlin_matches_vllm(golden, byte_loops):
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
    from mxrepack.layouts.base import swizzle_128x4

    g = golden("flashinfer_trtllm.safetensors")
    out = _pack(get_layout("trtllm"), _inputs(g), GOLDEN_DIMS)
    for name in ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale", "w13_bias", "w2_bias"):
        assert out[name].dtype == g[f"out.{name}"].dtype, name
        assert torch.equal(out[name], g[f"out.{name}"]), name
    # the 128x4 swizzle alone, against FlashInfer's swizzle_block_scale
    s = g["in.padded.w13_weight_scale"][:1]
    assert torch.equal(swizzle_128x4(s)[0].reshape(-1), g["fi.swizzle_block_scale.w13_scale_padded_e0"].reshape(-1))


# Every registered layout at its defaults, and the option sets the recipes and goldens use besides.
LAYOUT_VARIANTS = ["triton-blackwell-scales", "triton-hopper-vllm", "strided-wgmma"]
ALL_LAYOUTS = sorted(LAYOUTS) + LAYOUT_VARIANTS


def _layout(name):
    from mxrepack.layouts import make_layout

    if name == "triton-blackwell-scales":
        return make_layout("triton-hopper", {"value": "plain", "scale": "blackwell"})
    if name == "triton-hopper-vllm":  # the sm90 target: scale groups padded to 4 as vLLM does on sm90
        return make_layout("triton-hopper", {"scale_groups_multiple": 4})
    if name == "strided-wgmma":  # the sm_90 kernels' byte order
        return make_layout("strided", {"order": "wgmma"})
    return get_layout(name)


def _random_parts(E, H, I, seed, scales=(100, 140)):
    g = torch.Generator().manual_seed(seed)
    return {
        "gate_up_proj_blocks": torch.randint(0, 256, (E, 2 * I, H // 32, 16), generator=g, dtype=torch.uint8),
        "gate_up_proj_scales": torch.randint(*scales, (E, 2 * I, H // 32), generator=g, dtype=torch.uint8),
        "gate_up_proj_bias": torch.randn(E, 2 * I, generator=g).to(torch.bfloat16),
        "down_proj_blocks": torch.randint(0, 256, (E, H, I // 32, 16), generator=g, dtype=torch.uint8),
        "down_proj_scales": torch.randint(*scales, (E, H, I // 32), generator=g, dtype=torch.uint8),
        "down_proj_bias": torch.randn(E, H, generator=g).to(torch.bfloat16),
    }


_TRITON_GOLDEN = {
    "hopper": ("HopperMXValueLayout", "HopperMXScaleLayout"),
    "plain": ("StridedLayout", "StridedLayout"),
    "blackwell": ("BlackwellMXValueLayout", "BlackwellMXScaleLayout"),
}


@pytest.mark.parametrize("kind", sorted(_TRITON_GOLDEN))
def test_triton_kernels_layouts_match_vllm_vendored_triton_kernels(golden, kind, byte_loops):
    """Every value and scale layout in triton_kernels.safetensors (stored in memory order), with the
    native loops and with numpy."""
    from mxrepack.layouts.triton_hopper import TritonHopperLayout

    g = golden("triton_kernels.safetensors")
    out = _pack(TritonHopperLayout(value=kind, scale=kind), _inputs(g), GOLDEN_DIMS)
    vname, sname = _TRITON_GOLDEN[kind]
    for w in ("w13", "w2"):
        for mine, theirs in (
            (f"{w}_weight", f"out.{w}_weight.{vname}"),
            (f"{w}_weight_scale", f"out.{w}_scale.{sname}"),
        ):
            ref = g[theirs]
            assert out[mine].numel() == ref.numel(), (mine, out[mine].shape, ref.shape)
            assert torch.equal(out[mine].reshape(-1), ref.reshape(-1)), mine
        assert out[f"{w}_bias"].dtype == torch.float32


def test_triton_hopper_accepts_the_former_strided_option_value():
    """``value``/``scale`` ``strided`` was renamed ``plain``: recipes and manifests written before still load, to the
    same bytes."""
    from mxrepack.layouts import make_layout
    from mxrepack.layouts.triton_hopper import TritonHopperLayout

    old = make_layout("triton-hopper", {"value": "strided", "scale": "strided"})
    assert (old.value, old.scale) == ("plain", "plain")
    parts, dims = _random_parts(2, 64, 64, 0), ExpertDims(2, 64, 64)
    new = TritonHopperLayout(value="plain", scale="plain")
    a, b = _pack(old, parts, dims), _pack(new, parts, dims)
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert [o.upstream for o in old.outputs(dims)] == [o.upstream for o in new.outputs(dims)]
    with pytest.raises(MxRepackError, match="expected one of hopper, plain, blackwell"):
        TritonHopperLayout(value="swizzled")


@settings(max_examples=10, deadline=None)
@given(E=st.integers(1, 3), n16=st.integers(1, 5), kb32=st.integers(1, 4), seed=st.integers(0, 2**31))
def test_triton_hopper_values_native_equals_numpy(E, n16, kb32, seed):
    """The compiled Hopper value loop gives numpy's bytes, both ways, on random 16-row x 32-byte shapes."""
    from mxrepack import native
    from mxrepack.layouts import triton_hopper as th

    if native.library() is None:
        pytest.skip("native loops not built here")
    w = torch.randint(
        0, 256, (E, 16 * n16, 32 * kb32), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8
    )
    packed = th.hopper_value_swizzle(w)
    assert torch.equal(packed, th.hopper_values_numpy(w))
    assert torch.equal(th.hopper_value_unswizzle(packed), w)
    assert torch.equal(th.hopper_values_unpack_numpy(packed), w)
    if native.simd():  # and the portable C loop, where the above ran the AVX-512 one
        with pytest.MonkeyPatch.context() as m:
            m.setenv("MXREPACK_NATIVE", "scalar")
            assert torch.equal(th.hopper_value_swizzle(w), packed)
            assert torch.equal(th.hopper_value_unswizzle(packed), w)


@settings(max_examples=10, deadline=None)
@given(
    E=st.integers(1, 2),
    n=st.integers(1, 150),
    kb8=st.integers(1, 20),
    pad_n=st.integers(0, 2),
    pad_k=st.integers(0, 3),
    seed=st.integers(0, 2**31),
)
def test_marlin_weights_native_equals_numpy(E, n, kb8, pad_n, pad_k, seed):
    """The compiled Marlin weight loop gives the delta-swap path's bytes, padding included."""
    from mxrepack import native
    from mxrepack.layouts import marlin

    if native.library() is None:
        pytest.skip("native loops not built here")
    w = torch.randint(0, 256, (E, n, 8 * kb8), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    rows, kbytes = 64 * (-(-n // 64) + pad_n), 8 * (kb8 + pad_k)
    packed = marlin.repack_weight(w, rows, kbytes)
    assert torch.equal(packed, marlin.repack_weight_numpy(w, rows, kbytes))
    assert torch.equal(marlin.unrepack_weight(packed)[:, :n, : 8 * kb8], w)
    if native.simd():  # and the portable C loop, where the above ran the AVX-512 one
        with pytest.MonkeyPatch.context() as m:
            m.setenv("MXREPACK_NATIVE", "scalar")
            assert torch.equal(marlin.repack_weight(w, rows, kbytes), packed)


def test_native_simd_loops_with_an_unaligned_output(monkeypatch):
    """The AVX-512 loops write whole 64-byte lines with streaming stores; into an output that does not start
    on a line they store plainly, and give the same bytes."""
    import numpy as np

    from mxrepack import native
    from mxrepack.layouts import marlin
    from mxrepack.layouts import triton_hopper as th

    if not native.simd():
        pytest.skip("no AVX-512 VBMI here (or the native loops are not built)")
    g = torch.Generator().manual_seed(3)
    w = torch.randint(0, 256, (2, 144, 160), generator=g, dtype=torch.uint8)
    hopper, marlin_words = th.hopper_value_swizzle(w), marlin.repack_weight(w, 192, 192)
    aligned = native.empty

    def unaligned(shape, dtype):
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return aligned(n + 4, np.uint8)[4:].view(dtype).reshape(shape)

    monkeypatch.setattr(native, "empty", unaligned)
    assert torch.equal(th.hopper_value_swizzle(w), hopper)
    assert torch.equal(marlin.repack_weight(w, 192, 192), marlin_words)
    assert torch.equal(marlin_words, marlin.repack_weight_numpy(w, 192, 192))


def test_triton_hopper_bit_twiddle_lets_a_mask_read_bf16():
    """The documented property of the Hopper value twiddle: ``(word << 3j) & 0x81C081C0`` is code j of
    both halves as bf16 sign + exponent/mantissa bits (j < 3)."""
    from mxrepack.layouts.triton_hopper import twiddle_bits, untwiddle_bits

    x = torch.randint(0, 256, (64, 4), dtype=torch.uint8)
    words = twiddle_bits(x).view(torch.int32).reshape(-1).to(torch.int64) & 0xFFFFFFFF
    for j in range(3):
        got = (words << (3 * j)) & 0x81C081C0
        lo, hi = x[:, j].to(torch.int64) & 15, x[:, j].to(torch.int64) >> 4
        want = ((lo & 8) << 12) | ((lo & 7) << 6) | ((hi & 8) << 28) | ((hi & 7) << 22)
        assert torch.equal(got, want)
    assert torch.equal(untwiddle_bits(twiddle_bits(x)), x)


@pytest.mark.parametrize("name", ALL_LAYOUTS)
@settings(max_examples=12, deadline=None)
@given(E=st.integers(1, 3), h=st.integers(1, 10), i=st.integers(1, 10), seed=st.integers(0, 2**31))
def test_roundtrip_is_byte_exact(name, E, h, i, seed):
    layout = _layout(name)
    dims = ExpertDims(E, 32 * h, 32 * i)  # multiples of 32, mostly not of 128
    parts = _random_parts(E, dims.hidden, dims.intermediate, seed)
    stored = _pack(layout, parts, dims)
    for o in layout.outputs(dims):
        shape = (E, *o.shape) if layout.per_expert else o.shape
        assert tuple(stored[o.suffix].shape) == shape and stored[o.suffix].dtype == o.dtype
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


@pytest.mark.parametrize("name", ALL_LAYOUTS)
@settings(max_examples=4, deadline=None)
@given(h=st.integers(1, 6), i=st.integers(1, 6), seed=st.integers(0, 2**31))
def test_reference_gemm_on_padded_layout_equals_unpadded(name, h, i, seed):
    """A whole MoE block computed from the padded stored tensors (zero-padded activations, output
    cropped) equals the same block on the unpadded source parts.

    Tolerance: 1e-5 relative. Every product is exact in fp32 up to accumulation order; padded K adds
    exact zeros, but BLAS may block a longer K differently, so sums can differ by fp32 reassociation
    (~1e-7 relative per add). A layout bug (wrong row, nibble or scale) gives O(1) errors. Scales are
    drawn from 2^-12..2^0 as in real checkpoints: with 2^13-sized weights an fp32 ulp of the first
    projection, amplified through the SwiGLU and a huge down weight, would swamp any tolerance.
    """
    from mxrepack.kernels.reference import layout_moe_reference

    E, T, k = 3, 6, 2
    dims = ExpertDims(E, 32 * h, 32 * i)
    parts = _random_parts(E, dims.hidden, dims.intermediate, seed, scales=(115, 128))
    layout = _layout(name)
    stored = _pack(layout, parts, dims)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, dims.hidden, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    wts = torch.softmax(torch.randn(T, k, generator=g), -1)
    mxfp4 = get_layout("mxfp4")
    want = layout_moe_reference(x, _pack(mxfp4, parts, dims), mxfp4, dims, ids, wts, padded=False)
    got = layout_moe_reference(x, stored, layout, dims, ids, wts, padded=True)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_flashinfer_cutlass_matches_vllm_cutlass_mxfp8_conversion(golden):
    """What vLLM 0.33.0's FLASHINFER_CUTLASS_MXFP4_MXFP8 backend computes with on sm_12x, byte for byte; the former
    name ``b12x`` still reaches it."""
    g = golden("flashinfer_cutlass_sm12x.safetensors")
    out = _pack(get_layout("flashinfer-cutlass"), _inputs(g), GOLDEN_DIMS)
    for name in ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale", "w13_bias", "w2_bias"):
        ref = g[f"ficutlass_mxfp8.out.{name}"]
        assert out[name].dtype == ref.dtype and torch.equal(out[name], ref), name
    assert get_layout("b12x") is get_layout("flashinfer-cutlass")


def test_flashinfer_cutlass_rows_are_up_then_gate_padded_per_half():
    dims = ExpertDims(1, 160, 96)
    parts = _random_parts(1, 160, 96, 3)
    out = _pack(get_layout("flashinfer-cutlass"), parts, dims)
    w = parts["gate_up_proj_blocks"].flatten(2)
    Ip, Hp = 128, 256
    assert out["w13_weight"].shape == (1, 2 * Ip, Hp // 2)
    assert torch.equal(out["w13_weight"][0, :96, :80], w[0, 1::2])  # up
    assert torch.equal(out["w13_weight"][0, Ip : Ip + 96, :80], w[0, 0::2])  # gate
    assert not out["w13_weight"][0, 96:Ip].any() and not out["w13_weight"][0, :, 80:].any()


def test_layout_options_are_checked():
    from mxrepack.errors import MxRepackError
    from mxrepack.layouts import make_layout

    with pytest.raises(MxRepackError, match="not accepted by layout 'marlin'"):
        make_layout("marlin", {"tile": 64})
    # vLLM's FP8-activation Marlin repacks with is_a_8bit (other tiles and scale permutation, by vLLM 0.33's source):
    # the option that wrote BF16 tiles with +6 scales for it, which the plugin served on the BF16 kernel (misread
    # scales), went (stop 46)
    with pytest.raises(MxRepackError, match="not accepted by layout 'marlin'"):
        make_layout("marlin", {"fp8_activations": True})
    with pytest.raises(MxRepackError, match="value='tma'"):
        make_layout("triton-hopper", {"value": "tma"})


def test_strided_rows_are_k_tiled_program_blocks():
    """strided: w13 row tile i = gate rows 32i.. then the same up rows, w2 tiles of 16 rows, each stored as
    [R, 64]-byte blocks per 128-code K step, so one decode program's K step is one contiguous block."""
    from mxrepack.layouts import strided

    dims = ExpertDims(2, 160, 96)  # padded to 256 / 128: two K tiles of 64 bytes, w13 four row tiles of 64
    parts = _random_parts(2, 160, 96, 5)
    out = _pack(get_layout("strided"), parts, dims)
    w13 = parts["gate_up_proj_blocks"].flatten(2)  # [E, 2I, 80] gate/up interleaved
    w2 = parts["down_proj_blocks"].flatten(2)  # [E, 160, 48]
    Ip, Hp = 128, 256
    tiles13 = out["w13_weight"].reshape(2, Ip // 32, Hp // 128, 64, 64)  # [E, row tile, K tile, row, byte]
    assert torch.equal(tiles13[1, 1, 0, :32], w13[1, 64:128:2, :64])  # gate rows 32..63, bytes 0..63
    assert torch.equal(tiles13[1, 1, 0, 32:], w13[1, 65:128:2, :64])  # up rows 32..63
    assert torch.equal(tiles13[1, 1, 1, :32, :16], w13[1, 64:128:2, 64:])  # the partial K tile, zero-padded
    assert not tiles13[:, :, 1, :, 16:].any() and not tiles13[:, 3].any()  # intermediate 96..127 is padding
    tiles2 = out["w2_weight"].reshape(2, Hp // 16, 1, 16, 64)
    assert torch.equal(tiles2[0, 3, 0, :, :48], w2[0, 48:64]) and not tiles2[:, :, :, :, 48:].any()
    assert not tiles2[:, 10:].any()  # hidden 160..255 is padding
    # scales: row-major in the weights' row order
    assert torch.equal(out["w13_weight_scale"][0, 64:96, :5], parts["gate_up_proj_scales"][0, 64:128:2])
    assert torch.equal(out["w13_weight_scale"][0, 96:128, :5], parts["gate_up_proj_scales"][0, 65:128:2])
    # the benchmarks' row-major helpers are exact inverses
    rm = strided.to_row_major(out)
    back = strided.from_row_major(rm)
    assert all(torch.equal(back[n], out[n]) for n in out)
    assert torch.equal(rm["w13_weight"][0, Ip + 5, :80], w13[0, 11])  # up row 5 in the [gate | up] form


def _wgmma_chunk(rows: torch.Tensor) -> torch.Tensor:
    """16 rows x 64 bytes -> wgmma's A-fragment order, by the definition (fragment_order_probe.fragment_order): byte
    8s + 4kh + t of row 8c + g at 32 (4g + t) + 4s + 2c + kh; then each 32-bit word's bits placed, bit j of nibble h
    of byte p at ``strided.word_bit(p, h, j)``."""
    out = torch.empty(1024, dtype=torch.uint8)
    for c in range(2):
        for g in range(8):
            for s in range(8):
                for kh in range(2):
                    for t in range(4):
                        out[32 * (4 * g + t) + 4 * s + 2 * c + kh] = rows[8 * c + g, 8 * s + 4 * kh + t]
    return _place_word_bits(out)


def _mma2_chunk(rows: torch.Tensor) -> torch.Tensor:
    """16 rows x 64 bytes -> the mma2 order, by the definition (mma2_order_probe.mma2_order): byte 16q + 4t + e of
    row 8c + g at 32 (4g + t) + 8q + 4c + e; then each word's bits placed as in the wgmma order."""
    out = torch.empty(1024, dtype=torch.uint8)
    for c in range(2):
        for g in range(8):
            for q in range(4):
                for t in range(4):
                    for e in range(4):
                        out[32 * (4 * g + t) + 8 * q + 4 * c + e] = rows[8 * c + g, 16 * q + 4 * t + e]
    return _place_word_bits(out)


def _place_word_bits(out: torch.Tensor) -> torch.Tensor:
    """Each 32-bit word's bits placed: bit j of nibble h of byte p at ``strided.word_bit(p, h, j)``."""
    from mxrepack.layouts.strided import word_bit

    for i in range(0, 1024, 4):
        word = int.from_bytes(bytes(out[i : i + 4].tolist()), "little")
        placed = sum(
            1 << word_bit(p, h, j)
            for p in range(4)
            for h in range(2)
            for j in range(4)
            if word >> (8 * p + 4 * h + j) & 1
        )
        out[i : i + 4] = torch.tensor(list(placed.to_bytes(4, "little")), dtype=torch.uint8)
    return out


def _wgmma_scale_piece(scales: torch.Tensor) -> torch.Tensor:
    """16 rows x 4 scale groups -> the 64 bytes of the wgmma order: scale (row 8c + g, group j) at 8g + 2j + c."""
    out = torch.empty(64, dtype=torch.uint8)
    for c in range(2):
        for g in range(8):
            for j in range(4):
                out[8 * g + 2 * j + c] = scales[8 * c + g, j]
    return out


def _padded(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    out = torch.zeros(rows, cols, dtype=x.dtype)
    out[: x.shape[0], : x.shape[1]] = x
    return out


def test_strided_wgmma_order_is_the_fragment_order_of_each_chunk():
    """order wgmma: every 16-row x 64-byte chunk of a K tile holds its bytes in wgmma's A-fragment order, and its 64
    scales in the quad order, checked against the definition on the source rows (the partial K tile, an up block
    and padding rows included); the shapes are those of the order rows."""
    from mxrepack.layouts import make_layout

    dims = ExpertDims(2, 160, 96)  # padded to 256 / 128: w2 two K tiles of 64 bytes (the second partial)
    parts = _random_parts(2, 160, 96, 7)
    layout = make_layout("strided", {"order": "wgmma"})
    out = _pack(layout, parts, dims)
    rows_out = _pack(get_layout("strided"), parts, dims)
    assert {n: x.shape for n, x in out.items()} == {n: x.shape for n, x in rows_out.items()}
    assert torch.equal(out["w13_bias"], rows_out["w13_bias"]) and torch.equal(out["w2_bias"], rows_out["w2_bias"])
    Ip, Hp = 128, 256
    w2 = parts["down_proj_blocks"].flatten(2)  # [E, 160, 48]
    s2 = parts["down_proj_scales"]  # [E, 160, 3]
    chunks2 = out["w2_weight"].reshape(2, Hp // 16, Ip // 128, 1024)  # [E, row tile, K tile, chunk]
    pieces2 = out["w2_weight_scale"].reshape(2, Hp // 16, Ip // 128, 64)
    for e, tile in ((0, 0), (1, 3), (1, 9), (0, 12)):  # tile 12: hidden 192.. is padding
        rows = _padded(w2[e, 16 * tile : 16 * tile + 16], 16, Ip // 2)
        srows = _padded(s2[e, 16 * tile : 16 * tile + 16], 16, Ip // 32)
        assert torch.equal(chunks2[e, tile, 0], _wgmma_chunk(rows))
        assert torch.equal(pieces2[e, tile, 0], _wgmma_scale_piece(srows))
    w13 = parts["gate_up_proj_blocks"].flatten(2)  # [E, 2I, 80] gate/up interleaved
    s13 = parts["gate_up_proj_scales"]  # [E, 2I, 5]
    chunks13 = out["w13_weight"].reshape(2, Ip // 32, Hp // 128, 4, 1024)  # [E, row tile, K tile, 16-row block]
    pieces13 = out["w13_weight_scale"].reshape(2, Ip // 32, Hp // 128, 4, 64)
    # row tile 1, K tile 1 (bytes 64..79 real), block 3: up rows 48..63 = interleaved rows 97, 99, .., 127
    rows = _padded(w13[1, 97:128:2, 64:], 16, 64)
    assert torch.equal(chunks13[1, 1, 1, 3], _wgmma_chunk(rows))
    assert torch.equal(pieces13[1, 1, 1, 3], _wgmma_scale_piece(_padded(s13[1, 97:128:2, 4:], 16, 4)))
    # row tile 0, K tile 0, block 1: gate rows 16..31 = interleaved rows 32, 34, .., 62
    assert torch.equal(chunks13[0, 0, 0, 1], _wgmma_chunk(w13[0, 32:64:2, :64]))
    assert torch.equal(pieces13[0, 0, 0, 1], _wgmma_scale_piece(s13[0, 32:64:2, :4]))
    assert not chunks13[:, 3].any() and not pieces13[:, 3].any()  # intermediate 96..127 is padding
    # the torch permutation the GPUs run gives the CPU loop's bytes, both ways
    from mxrepack.layouts import strided

    k_tiled = rows_out["w13_weight"]
    assert torch.equal(strided._wgmma_chunks_torch(k_tiled, inverse=False), out["w13_weight"])
    assert torch.equal(strided._wgmma_chunks_torch(out["w13_weight"], inverse=True), k_tiled)
    assert torch.equal(strided.wgmma_order(k_tiled), out["w13_weight"])


def test_strided_mma2_order_is_the_mma_sync_operand_order_of_each_chunk():
    """order mma2: every 16-row x 64-byte chunk of a K tile holds its bytes in the order of mma.sync's kWidth-8
    operand (4 consecutive bytes of one row a word), each word's bits placed as in order wgmma, and its 64 scales in
    the same quad order, checked against the definition on the source rows (a partial K tile, an up block, padding);
    the GPUs' torch permutation gives the CPU loop's bytes both ways."""
    from mxrepack.layouts import make_layout, strided

    dims = ExpertDims(2, 160, 96)
    parts = _random_parts(2, 160, 96, 7)
    out = _pack(make_layout("strided", {"order": "mma2"}), parts, dims)
    rows_out = _pack(get_layout("strided"), parts, dims)
    assert {n: x.shape for n, x in out.items()} == {n: x.shape for n, x in rows_out.items()}
    Ip, Hp = 128, 256
    w2, s2 = parts["down_proj_blocks"].flatten(2), parts["down_proj_scales"]
    chunks2 = out["w2_weight"].reshape(2, Hp // 16, Ip // 128, 1024)
    pieces2 = out["w2_weight_scale"].reshape(2, Hp // 16, Ip // 128, 64)
    for e, tile in ((0, 0), (1, 9), (0, 12)):  # tile 12: padding
        rows = _padded(w2[e, 16 * tile : 16 * tile + 16], 16, Ip // 2)
        assert torch.equal(chunks2[e, tile, 0], _mma2_chunk(rows))
        assert torch.equal(pieces2[e, tile, 0], _wgmma_scale_piece(_padded(s2[e, 16 * tile : 16 * tile + 16], 16, 4)))
    w13, s13 = parts["gate_up_proj_blocks"].flatten(2), parts["gate_up_proj_scales"]
    chunks13 = out["w13_weight"].reshape(2, Ip // 32, Hp // 128, 4, 1024)
    pieces13 = out["w13_weight_scale"].reshape(2, Ip // 32, Hp // 128, 4, 64)
    assert torch.equal(chunks13[1, 1, 1, 3], _mma2_chunk(_padded(w13[1, 97:128:2, 64:], 16, 64)))  # up, partial K
    assert torch.equal(pieces13[1, 1, 1, 3], _wgmma_scale_piece(_padded(s13[1, 97:128:2, 4:], 16, 4)))
    k_tiled = rows_out["w13_weight"]
    assert torch.equal(strided._mma2_chunks_torch(k_tiled, inverse=False), out["w13_weight"])  # the GPUs' path
    assert torch.equal(strided._mma2_chunks_torch(out["w13_weight"], inverse=True), k_tiled)
    assert torch.equal(strided.k_tiled_from_mma2(out["w13_weight"]), k_tiled)


@pytest.mark.parametrize("order", ["wgmma", "mma2"])
def test_strided_chunk_order_round_trip_and_row_major_helpers(order):
    """A chunk order (wgmma, mma2) unpacks to the source exactly at gpt-oss-like widths that are not multiples of 128
    (2880 / 2880 scaled down: 288 / 160), for any expert range; the benchmarks' row-major helpers take the order and
    invert each other, and from_row_major(order=...) gives the layout's pack."""
    from mxrepack.layouts import make_layout, strided

    dims = ExpertDims(3, 288, 160)
    parts = _random_parts(3, 288, 160, 11)
    layout = make_layout("strided", {"order": order})
    assert layout.order == order and get_layout("strided").order == "rows"
    out = _pack(layout, parts, dims)
    back = layout.unpack(out, dims)
    assert all(torch.equal(back[k], parts[k]) for k in parts)
    part = layout.unpack({k: v[1:2] for k, v in out.items()}, dims)
    assert all(torch.equal(part[k], parts[k][1:2]) for k in parts)
    rows_out = _pack(get_layout("strided"), parts, dims)
    rm = strided.to_row_major(rows_out)
    assert torch.equal(strided.to_row_major(out, order=order)["w2_weight_scale"], rows_out["w2_weight_scale"])
    wg = strided.from_row_major(rm, order=order)
    assert all(torch.equal(wg[n], out[n]) for n in out)
    again = strided.to_row_major(wg, order=order)
    assert all(torch.equal(again[n], rm[n]) for n in rm)
    assert all(torch.equal(strided.from_row_major(rm)[n], rows_out[n]) for n in rows_out)  # the default: rows
    assert "sm_90" in layout.description and "sm_12x" in layout.description


def test_strided_order_option_is_checked():
    from mxrepack.layouts import make_layout

    with pytest.raises(MxRepackError, match=r"strided option order='bogus': expected one of rows, wgmma, mma2") as e:
        make_layout("strided", {"order": "bogus"})
    assert "\n" not in str(e.value)
    from mxrepack.layouts import strided

    with pytest.raises(MxRepackError, match="order='mma'"):
        strided.from_row_major({}, order="mma")
