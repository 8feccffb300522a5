"""Triton kernels against their torch references (CPU, TRITON_INTERPRET=1), and the sm_12x build proof.

Fresh random inputs each run (no fixed seed); outputs are poisoned with NaN before each launch, so an
element a kernel fails to write shows up as NaN. Error bounds, relative Frobenius ``|y - ref| / |ref|``:

* W4A16 vs the fp32 product of bf16 x and the dequantized weight: <= 1e-2. The only error is the bf16
  output rounding (relative 2^-9 rms) and fp32 accumulation order.
* W4A8 / W4A4 vs the same product with x first quantized by the torch codec (the bytes the kernel's
  quantizer writes are asserted equal to the codec's): <= 1e-2 -- the kernel must be exact up to
  output rounding once its activation quantization is accounted for.
* MoE (bf16 intermediate between the two GEMMs): bf16 <= 1e-2; with on-the-fly activation quantization,
  vs the bf16 reference: e4m3 <= 0.15, e2m1 <= 0.4 (measured ~0.06 / ~0.18: the quantization error of
  the activations themselves, twice); a layout or indexing bug gives O(1).
"""

import dataclasses
import functools
import itertools
import json
import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

from mxrepack.kernels.dequant_mxfp4 import (
    DequantConfig,
    dequant_pairs,
    dequantize_mxfp4_rows,
    e8m0_to_bf16,
    e8m0_to_bf16_folded,
    with_fold,
    without_fold,
)
from mxrepack.kernels.gemv_mxfp4 import GemvConfig, pick_gemv_config
from mxrepack.kernels.linear_mxfp4 import CONFIGS, LinearConfig, linear_mxfp4, pick_config, use_dequant_gemm, use_gemv
from mxrepack.kernels.moe_mxfp4 import (
    CHUNK_GEMV_MAX_ASSIGNMENTS,
    CHUNK_GEMVS,
    MMA2_GEMV,
    MOE_CONFIGS,
    MOE_CONFIGS_MMA2,
    MOE_CONFIGS_WGMMA,
    MOE_GEMV,
    MOE_TILES,
    MOE_TILES_WGMMA,
    ChunkGemvConfig,
    MoeConfig,
    MoeGemvConfig,
    moe_mxfp4,
    moe_schedule,
    pick_moe,
    pick_moe_config,
    pick_moe_gemv_config,
)
from mxrepack.kernels.mx_quant import quantize_activations
from mxrepack.kernels.reference import layout_moe_reference, mxfp4_linear
from mxrepack.layouts import ExpertDims, get_layout, make_layout
from mxrepack.quant import FP4_VALUES, dequantize_mxfp4, dequantize_mxfp8, quantize_mxfp4, quantize_mxfp8


def rel(y, ref):
    return float((y.float() - ref).norm() / ref.norm())


@pytest.mark.parametrize("fmt", ["e2m1", "e4m3"])
def test_activation_quantizer_matches_codec_bytes(fmt):
    x = (torch.randn(21, 192) * torch.logspace(-4, 4, 192)).to(torch.bfloat16)
    x[2, :32] = 0
    x[3, 4] = -0.0
    q, s = quantize_activations(x, fmt)
    rq, rs = (quantize_mxfp4 if fmt == "e2m1" else quantize_mxfp8)(x.float())
    assert torch.equal(s, rs)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8))


def _small(cfg: LinearConfig) -> LinearConfig:  # interpreter-sized tiles, same schedule
    return LinearConfig(
        min(cfg.block_m, 32),
        min(cfg.block_n, 32),
        min(cfg.block_k, 128),
        cfg.split_k,
        manual_dequant=cfg.manual_dequant,
        swap_ab=cfg.swap_ab,
    )


# the shipped configurations, and the swapped operands with and without split-K (K = 288: three 128-code tiles,
# the last half padding) whether or not one is shipped
_SWAPPED = {
    "swapped": LinearConfig(16, 32, 128, swap_ab=True),
    "swapped_split": LinearConfig(16, 32, 128, 2, swap_ab=True),
}


@pytest.mark.parametrize("mode", ["w4a16", "w4a8", "w4a4"])
@pytest.mark.parametrize("config", sorted(CONFIGS | _SWAPPED))
def test_linear_mxfp4_matches_reference(mode, config):
    N, K = 80, 288  # neither a multiple of the tiles: masks on N and K are exercised
    w, ws = quantize_mxfp4(torch.randn(N, K) * 0.05)
    bias = torch.randn(N).to(torch.bfloat16)
    for M in (1, 7, 33):
        x = torch.randn(M, K).to(torch.bfloat16)
        if mode == "w4a16":
            xd = x.float()
        elif mode == "w4a8":
            xd = dequantize_mxfp8(*quantize_mxfp8(x.float()), torch.float32)
        else:
            xd = dequantize_mxfp4(*quantize_mxfp4(x.float()), torch.float32)
        ref = xd @ dequantize_mxfp4(w, ws, torch.float32).T + bias.float()
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
        cfg = _small((CONFIGS | _SWAPPED)[config])
        y = linear_mxfp4(x, w, ws, bias, mode, cfg, out=out)
        assert y is out and not torch.isnan(y).any()
        assert rel(y, ref) <= 1e-2, (M, rel(y, ref))
        if cfg.split_k > 1:  # split partials summed in split order by the last to arrive, counters back at zero
            assert torch.equal(linear_mxfp4(x, w, ws, bias, mode, cfg), y)


def test_linear_without_bias_and_config_choice():
    w, ws = quantize_mxfp4(torch.randn(64, 128))
    x = torch.randn(3, 128).to(torch.bfloat16)
    y = linear_mxfp4(x, w, ws, None, "w4a16", LinearConfig(16, 32, 64))
    assert rel(y, mxfp4_linear(x, w, ws)) <= 1e-2
    assert pick_config(1, 201088, 2880).split_k == 1 and pick_config(4, 201088, 2880).swap_ab  # lm_head: enough N tiles
    assert not pick_config(4, 201088, 2880, mode="w4a8").swap_ab  # the swap decodes W for bf16 activations only
    assert pick_config(1, 512, 2880).split_k > 1 and not pick_config(1, 512, 2880).swap_ab  # k/v proj: split K
    assert pick_config(4096, 4096, 2880).block_m == 128
    # 17-64 rows on q/k/v/o: split-K tiles to about two programs per SM, not dequantize + cuBLAS; lm_head keeps its tile
    assert (pick_config(64, 2880, 4096).split_k, pick_config(32, 5120, 2880).split_k) == (8, 4)
    assert not use_dequant_gemm(64, 2880) and use_dequant_gemm(65, 2880) and not use_dequant_gemm(64, 201088)
    # a layer between (too wide for split-K, under 65536 rows) keeps dequantize + cuBLAS, as do q/k/v/o on 20 SMs
    assert use_dequant_gemm(32, 20000) and use_dequant_gemm(32, 5120, sm_count=20) and not use_dequant_gemm(16, 20000)
    assert pick_config(64, 201088, 2880).split_k == 1 and pick_config(64, 2880, 4096, mode="w4a8").split_k == 1
    with pytest.raises(ValueError, match="do not fit"):
        linear_mxfp4(x, w[:, :10], ws)


@pytest.mark.parametrize("N,K", [(80, 288), (37, 96), (16, 512), (9, 160)])
def test_gemv_matches_reference(N, K):
    """The decode GEMVs, fp32 and f16x2 math (their portable twins under the interpreter): full K tiles, a
    masked partial tile (288 = 2 x 128 + 32; 96 < 128) and none (512), N not a multiple of the rows per
    program, every code, the E8M0 extremes 0 (2^-127) and 254, and activation groups that are tiny, large
    or all zero (the f16x2 path rescales each group of 32 into fp16's range)."""
    w, ws = quantize_mxfp4(torch.randn(N, K) * 0.05)
    w[0, :8] = torch.arange(0, 256, 32, dtype=torch.uint8) + torch.arange(8, dtype=torch.uint8)  # all 16 codes
    ws[1, 0], ws[2, 1] = 0, 254
    w[2, 16:32] = 0x11  # 0.5 * 2^127 stays finite
    x = torch.randn(5, K).to(torch.bfloat16)
    x[:, 32:64] *= 2.0**-100  # meets scale 254 in row 2 without overflowing fp32
    x[0, :32] *= 3000.0  # past fp16's range before the group's rescale
    x[1, -32:] = 0.0
    bias = torch.randn(N).to(torch.bfloat16)
    ref = x.float() @ dequantize_mxfp4(w, ws, torch.float32).T + bias.float()
    configs = (
        GemvConfig(16, 128, 4, 1, "ops"),
        GemvConfig(16, 128, 4, 1, "f16x2-ops"),
        GemvConfig(16, 128, 4, 1, "f16x2-ops", prefetch=2),
        # rows of x per program, each weight decoded once: M = 3 and 5 end in a shifted block, M < 4 has fewer
        GemvConfig(16, 128, 4, 1, "f16x2-ops", rows=2),
        GemvConfig(8, 128, 4, 1, "f16x2-ops", prefetch=2, rows=4),
    )  # 0, 2 and 4 full tiles: each branch
    for M in (1, 2, 3, 4, 5):
        for cfg in configs:
            out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
            y = linear_mxfp4(x[:M], w, ws, bias, "w4a16", cfg, out=out)
            assert y is out and not torch.isnan(y).any()
            assert rel(y, ref[:M]) <= 1e-2, (M, cfg, rel(y, ref[:M]))
        assert rel(linear_mxfp4(x[:M], w, ws, bias), ref[:M]) <= 1e-2  # shape-chosen path, whichever it is
    assert pick_gemv_config(201088, cuda=False).decode == "f16x2-ops" and pick_gemv_config(5120).decode == "asm"
    assert pick_gemv_config(5120, M=4).rows == 4 and pick_gemv_config(2880, M=2, cuda=False).decode == "f16x2-ops"
    assert use_gemv(1, 201088) and not use_gemv(2, 201088) and use_gemv(2, 2880) and not use_gemv(3, 5120)
    assert use_gemv(4, 5120) and not use_gemv(4, 2880) and not use_gemv(4, 201088)  # 4 rows: qkv, not o or lm_head
    for n, sms, m in itertools.product((2880, 5120, 40000, 201088), (20, 48, 132), (2, 3, 4, 5)):
        if use_gemv(m, n, sms):  # several rows reach the GEMV only where it runs them in one program
            assert pick_gemv_config(n, sms, M=m).launched(m).rows == m, (n, sms, m)
    # several rows in one program, no bias, a strided fp32 out: only its N columns written
    wide = torch.full((4, N + 3), float("nan"))
    y = linear_mxfp4(x[:4], w, ws, None, "w4a16", GemvConfig(8, 128, 4, 1, "f16x2-ops", rows=4), out=wide[:, :N])
    assert rel(y, ref[:4] - bias.float()) <= 1e-2 and wide[:, N:].isnan().all()
    # as launched: a row block never passes M, and one row is the one-row kernel
    assert [GemvConfig(8, 128, 4, 1, "f16x2", rows=4).launched(m).rows for m in (1, 2, 3, 4, 9)] == [0, 2, 2, 4, 4]
    with pytest.raises(ValueError, match="rows=3"):
        GemvConfig(16, 128, 4, 1, "f16x2-ops", rows=3)
    with pytest.raises(ValueError, match="rows=2"):  # several rows run on prepared activations only
        GemvConfig(16, 128, 4, 1, "ops", rows=2)
    with pytest.raises(ValueError, match="pdl"):  # programmatic dependent launch is the f16x2 PTX path's
        GemvConfig(16, 128, 4, 1, "asm", pdl=1)
    assert GemvConfig(16, 128, 4, 1, "f16x2", pdl=1).portable() == GemvConfig(16, 128, 4, 1, "f16x2-ops")
    with pytest.raises(ValueError, match="W4A16 only"):
        linear_mxfp4(x[:1], w, ws, None, "w4a8", GemvConfig())


def test_dequantize_rows_is_exact():
    """The GPU dequantization (prefill path) is bit-identical to the codec's: every code, E8M0 254, and
    byte 0 on a zero group (nonzero codes at 2^-127 are BF16 subnormals, which the interpreter's
    float -> bf16 cast flushes to zero; the GPU's cvt keeps them)."""
    N, K = 37, 288
    w, ws = quantize_mxfp4(torch.randn(N, K))
    w[0, :8] = torch.arange(0, 256, 32, dtype=torch.uint8) + torch.arange(8, dtype=torch.uint8)
    w[1, :16] = 0
    ws[1, 0], ws[2, 1] = 0, 254
    out = torch.full((N, K), float("nan"), dtype=torch.bfloat16)
    y = dequantize_mxfp4_rows(w, ws, out, DequantConfig(16, 128))
    assert y is out and torch.equal(y, dequantize_mxfp4(w, ws, torch.bfloat16))


@triton.jit
def _pairs_kernel(
    w_ptr, s_ptr, even_ptr, odd_ptr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MATH: tl.constexpr = "ops"
):
    rn = tl.arange(0, BLOCK_N)
    rb = tl.arange(0, BLOCK_K // 2)
    w = tl.load(w_ptr + rn[:, None] * (BLOCK_K // 2) + rb[None, :])
    ws = tl.load(s_ptr + rn[:, None] * (BLOCK_K // 32) + tl.arange(0, BLOCK_K // 32)[None, :])
    even, odd = dequant_pairs(w, ws, BLOCK_N, BLOCK_K, MATH)
    tl.store(even_ptr + rn[:, None] * (BLOCK_K // 2) + rb[None, :], even)
    tl.store(odd_ptr + rn[:, None] * (BLOCK_K // 2) + rb[None, :], odd)


def test_dequant_pairs_is_exact():
    """The swapped-operand decode's portable twin (the PTX one is emulated in the review of 0492766): every byte under
    every E8M0 scale 0-255 gives code value * 2^(E-127) as bf16, bit for bit, subnormals at E = 0-1 included (the
    product's top 16 bits, not a cast the interpreter would flush); E = 255 gives inf, and NaN for code 0."""
    w = torch.arange(256, dtype=torch.uint8).repeat(256, 2)  # [256 scales, 512 bytes]: every byte twice
    ws = torch.arange(256, dtype=torch.uint8)[:, None].repeat(1, 32)
    even, odd = (torch.empty(256, 512, dtype=torch.bfloat16) for _ in range(2))
    _pairs_kernel[(1,)](w, ws, even, odd, BLOCK_N=256, BLOCK_K=1024)
    scale = torch.exp2(torch.arange(256, dtype=torch.float64) - 127)[:, None]
    values = torch.tensor(FP4_VALUES, dtype=torch.float64)
    for got, codes in ((even, w & 15), (odd, w >> 4)):
        want = (values[codes.long()] * scale).to(torch.float32).to(torch.bfloat16)
        want[255] = values[codes[255].long()].to(torch.float32) * float("inf")  # 0 * inf: NaN
        assert torch.equal(got[:255].view(torch.int16), want[:255].view(torch.int16))
        assert torch.equal(got[255].isnan(), want[255].isnan()) and torch.equal(
            got[255][~got[255].isnan()], want[255][~want[255].isnan()]
        )


@triton.jit
def _scale_kernel(s_ptr, out_ptr, folded_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    tl.store(out_ptr + r, e8m0_to_bf16(tl.load(s_ptr + r)))
    tl.store(folded_ptr + r, e8m0_to_bf16_folded(tl.load(s_ptr + r)))


def _bf16_bits(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).to(torch.bfloat16).view(torch.int16)


def test_folded_scale_decode_gives_the_same_bits():
    """``MATH="asm-fold"`` (PAIRS_ASM_FOLDED): E2M1's 2^126 folded into the scale. The folded scale is bf16 2^(E-1)
    for every E8M0 code 0-128 (past it the bits wrap: 129 is inf, 130 -0, then negative: hence the precondition), and
    the PTX's multiplies, emulated on its decoded codes (bf16 bits ``sign << 15 | (code & 7) << 6`` = value * 2^-126),
    give the bits of the unfolded decode (x 2^126, then x the scale ``e8m0_to_bf16`` makes) for all 16 codes and
    E = 0-128. Each fma adds -0 to an exact product (powers of two within bf16's range), which changes nothing but keeps
    a -0 code's sign: a plain product here. The decode's integer steps are shared by both PTX strings."""
    s = torch.arange(256, dtype=torch.uint8)
    scale, folded_scale = (torch.empty(256, dtype=torch.bfloat16) for _ in range(2))
    _scale_kernel[(1,)](s, scale, folded_scale, N=256)
    e = torch.arange(256, dtype=torch.float64)
    assert torch.equal(folded_scale[:129].view(torch.int16), _bf16_bits(torch.exp2(e[:129] - 1)))
    assert folded_scale[129].isinf() and folded_scale[130] == 0 and (folded_scale[131:] < 0).all()
    code = torch.arange(16)
    bits = ((code & 8) << 12) | ((code & 7) << 6)
    decoded = bits.to(torch.int16).view(torch.bfloat16).double()  # value * 2^-126 (subnormal for 0.5)
    values = torch.tensor(FP4_VALUES, dtype=torch.float64)
    assert torch.equal(decoded * 2.0**126, values)
    for E in range(129):
        unfolded = _bf16_bits(_bf16_bits(decoded * 2.0**126).view(torch.bfloat16).double() * scale[E].double())
        folded = _bf16_bits(decoded * folded_scale[E].double())
        assert torch.equal(folded, unfolded) and torch.equal(folded, _bf16_bits(values * 2.0 ** (E - 127))), E


def _run_word_asm(asm: str, word: int) -> list[int]:
    """The integer part of a wgmma-order word decode (:data:`WORD_ASM_FOLDED`), emulated instruction by instruction on
    one stored word: each output register as it enters its scale multiply (bf16 pair bits, value x 2^-126)."""
    regs, out = {"$4": word}, []
    for line in asm.splitlines():
        op, *args = line.rstrip(";").replace(",", " ").split()
        val = {a: regs[a] if a in regs else int(a, 0) for a in args[1:] if a in regs or a[0].isdigit()}
        if op == "mov.b32":
            regs[args[0]] = val[args[1]]
        elif op == "shf.l.wrap.b32":
            assert args[1] == args[2] == "$4"
            x, r = val[args[1]], val[args[3]]
            regs[args[0]] = ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF
        elif op == "and.b32":
            regs[args[0]] = val[args[1]] & val[args[2]]
        elif op == "lop3.b32":
            assert args[4] == "0xEA"  # (a & b) | c
            regs[args[0]] = (val[args[1]] & val[args[2]]) | val[args[3]]
        elif op == "fma.rn.bf16x2":
            if args[2] != "c":  # the scale multiply: the pair is decoded
                out.append(regs[args[0]])
        else:
            assert op in ("{", "}", ".reg"), line
    return out


def test_wgmma_word_bits_decode_in_the_kernels_ptx(monkeypatch):
    """The strided layout's wgmma-order word bits and the kernels' decode of them agree: for random fragment words,
    the layout's placement (the compiled loop, the numpy gathers, the torch gathers of a GPU path, and the inverse
    back) and the PTX's rotations and masks, emulated, give each pair's two codes as bf16 bits
    ``sign << 15 | (code & 7) << 6`` per half -- what the scale multiply expects (its folded and unfolded texts share
    these instructions)."""
    import numpy as np

    from mxrepack import native
    from mxrepack.kernels.dequant_mxfp4 import WORD_ASM, WORD_ASM_FOLDED
    from mxrepack.layouts import strided

    fragment = np.random.default_rng(0).integers(0, 1 << 32, 4096, dtype=np.uint64).astype(np.uint32)
    fragment[:256] = np.arange(256, dtype=np.uint32) * 0x01010101  # every byte value in every pair
    stored = fragment.copy()
    strided._permute_word_bits(stored, inverse=False)  # native where built
    on_torch = strided._permute_word_bits_torch(torch.from_numpy(fragment.view(np.int32)), inverse=False)
    assert np.array_equal(on_torch.numpy().view(np.uint32), stored)
    back = stored.copy()
    strided._permute_word_bits(back, inverse=True)
    assert np.array_equal(back, fragment)
    monkeypatch.setattr(native, "library", lambda: None)  # the numpy twin: the same words
    numpy_stored = fragment.copy()
    strided._permute_word_bits(numpy_stored, inverse=False)
    assert np.array_equal(numpy_stored, stored)
    strided._permute_word_bits(numpy_stored, inverse=True)
    assert np.array_equal(numpy_stored, fragment)

    def bf16_pair(byte: int) -> int:
        half = [((c & 8) << 12) | ((c & 7) << 6) for c in (byte & 15, byte >> 4)]
        return half[0] | half[1] << 16

    for asm in (WORD_ASM, WORD_ASM_FOLDED):
        asm = getattr(asm, "value", asm)
        for f, w in zip(fragment[:600].tolist(), stored[:600].tolist(), strict=True):
            assert _run_word_asm(asm, w) == [bf16_pair(f >> (8 * p) & 255) for p in range(4)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX decodes need a CUDA device")
def test_ptx_decodes_agree_on_a_gpu():
    """Every byte under every E8M0 scale 0-128: the PTX decode, its folded twin and the portable one, bit for bit."""
    w = torch.arange(256, dtype=torch.uint8).repeat(256, 2).cuda()
    ws = (torch.arange(256) % 129).to(torch.uint8)[:, None].repeat(1, 32).cuda()  # rows: scales 0-128, 0-126
    outs = {}
    for math in ("ops", "asm", "asm-fold"):
        even, odd = (torch.empty(256, 512, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        _pairs_kernel[(1,)](w, ws, even, odd, BLOCK_N=256, BLOCK_K=1024, MATH=math)
        outs[math] = torch.cat([even, odd]).view(torch.int16)
    assert torch.equal(outs["asm"], outs["ops"]) and torch.equal(outs["asm-fold"], outs["ops"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX GEMVs need a CUDA device")
def test_multi_row_gemv_is_the_one_row_gemv_on_a_gpu():
    """The GEMV with several rows per program (one decode, a sum per row: two PTX texts) gives the bits of the one-row
    f16x2 GEMV (one PTX text), row for row: the shipped NARROW_ROWS configurations, on a layer with a partial K tile."""
    from mxrepack.kernels.gemv_mxfp4 import NARROW_ROWS, gemv_mxfp4

    w, ws = quantize_mxfp4(torch.randn(520, 1056) * 0.05)
    w, ws = w.cuda(), ws.cuda()
    x = torch.randn(4, 1056, device="cuda").to(torch.bfloat16)
    for M, cfg in NARROW_ROWS.items():
        out = torch.empty(M, 520, dtype=torch.bfloat16, device="cuda")
        rows = gemv_mxfp4(x[:M], w, ws, None, out.clone(), cfg)
        one = gemv_mxfp4(x[:M], w, ws, None, out.clone(), dataclasses.replace(cfg, rows=0))
        assert torch.equal(rows, one), cfg.name()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the rows order's launches reuse CUDA builds")
def test_linear_rows_order_launches_on_a_gpu():
    """The rows order's kernels launch through launch.Launcher since stop 49 (vLLM runs lm_head outside its graphs): at
    every path's row count (the GEMVs, the split-K and swapped tiles, dequantize + cuBLAS) on a layer that takes the
    wide GEMV and on a narrow one, right against the reference, the same bits on repeats that reuse the first call's
    builds, an activation 2 bytes off the 16-byte alignment Triton specializes on in its own build, and in a CUDA
    graph."""
    import mxrepack.kernels.gemv_mxfp4 as gemv
    import mxrepack.kernels.linear_mxfp4 as lin

    launchers = (lin._LAUNCH_ROWS, gemv._LAUNCH_F16X2, gemv._LAUNCH_PREPARE, gemv._LAUNCH_GEMV)
    # wide as lm_head: the wide GEMV (gemv_mxfp4.is_wide) and, at 17-64 rows, the swapped tile (not use_dequant_gemm)
    wide = max(65544, 256 * torch.cuda.get_device_properties(0).multi_processor_count + 8)
    torch.manual_seed(5)
    for N, K in ((wide, 288), (520, 1056)):
        w, s = quantize_mxfp4(torch.randn(N, K) * 0.05)
        w, s = w.cuda(), s.cuda()
        bias = torch.randn(N, device="cuda").to(torch.bfloat16)
        for M in (1, 2, 4, 16, 40, 64, 300):
            flat = torch.randn(M * K + 1, device="cuda").to(torch.bfloat16)
            for x in (flat[: M * K].view(M, K), flat[1:].view(M, K)):
                y = linear_mxfp4(x, w, s, bias)
                ref = mxfp4_linear(x.cpu(), w.cpu(), s.cpu(), bias.cpu()).float()
                assert rel(y.cpu(), ref) <= 1e-2, (N, M, x.data_ptr() % 16, rel(y.cpu(), ref))
                kept = [set(launch._runs) for launch in launchers]
                assert all(torch.equal(linear_mxfp4(x, w, s, bias), y) for _ in range(2)), (N, M)
                assert [set(launch._runs) for launch in launchers] == kept, (N, M)  # the repeats reused the builds
                out = torch.empty_like(y)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    linear_mxfp4(x, w, s, bias, out=out)
                graph.replay()
                assert torch.equal(out, y), (N, M)


def test_fold_scale_refuses_larger_scales():
    from mxrepack.kernels.dequant_mxfp4 import check_fold_scale

    scales = torch.tensor([0, 127, 128], dtype=torch.uint8)
    check_fold_scale(scales)
    with pytest.raises(ValueError, match="fold_scale needs E8M0 scales <= 128.*got 129"):
        check_fold_scale(torch.tensor([0, 129], dtype=torch.uint8))
    scales[0] = 200  # checked on every call, not remembered per tensor
    with pytest.raises(ValueError, match="got 200"):
        check_fold_scale(scales)


def test_fold_scale_is_a_swapped_decode_only():
    with pytest.raises(ValueError, match="needs swap_ab"):
        MoeConfig(16, 64, 128, fold_scale=True)
    with pytest.raises(ValueError, match="needs swap_ab"):
        LinearConfig(16, 64, 128, fold_scale=True)
    folded = MoeConfig(16, 64, 128, swap_ab=True, fold_scale=True)
    assert folded.math == "asm-fold" and folded.name().endswith("sf") and MoeConfig(16, 64, 128).math == "asm"
    # the tables hold the unfolded tiles: the dispatch folds them for weights whose scales fit
    assert not any(c.fold_scale for c in (*MOE_CONFIGS.values(), *CONFIGS.values()))


def test_fits_fold_is_scales_up_to_2():
    from mxrepack.kernels.dequant_mxfp4 import fits_fold

    assert fits_fold(torch.tensor([0, 127, 128], dtype=torch.uint8), torch.empty(0, dtype=torch.uint8))
    assert not fits_fold(torch.tensor([0, 127], dtype=torch.uint8), torch.tensor([129], dtype=torch.uint8))
    assert fits_fold(torch.tensor([128], dtype=torch.uint8).view(torch.float8_e8m0fnu))  # vLLM's dtype for them
    assert fits_fold()


def test_fold_shift_takes_scales_above_128_down_to_128():
    from mxrepack.kernels.dequant_mxfp4 import MAX_SCALE_SHIFT, fold_shift

    u8 = lambda *v: torch.tensor(v, dtype=torch.uint8)  # noqa: E731
    assert fold_shift(u8(0, 127, 128), torch.empty(0, dtype=torch.uint8)) == 0 and fold_shift() == 0
    assert fold_shift(u8(119, 127), u8(129)) == 1  # the 12-layer fixture's tail
    assert fold_shift(u8(3, 131)) == 3 and fold_shift(u8(2, 131)) is None  # a scale under the shift would underflow
    assert fold_shift(u8(0, 120, 131)) == 3  # but 0, the layouts' padding
    assert fold_shift(u8(120, 128 + MAX_SCALE_SHIFT)) == MAX_SCALE_SHIFT
    assert fold_shift(u8(120, 129 + MAX_SCALE_SHIFT)) is None
    assert fold_shift(u8(130).view(torch.float8_e8m0fnu)) == 2  # vLLM's dtype for them


@pytest.mark.parametrize("order", ["rows", "mma2"])
def test_scale_shift_gives_the_unshifted_bits(order):
    """Weights with scales above 128 (here 131: ``fold_shift`` 3) through the kernels that fold, with the scales read
    3 lower and the sums multiplied back (``scale_shift``): the same bits as the unshifted decode, for the swapped
    tiles (a remainder tile too) and a chunk order's tile and GEMVs (portable decode here; the PTX one on a GPU below,
    for every order the GPU runs). The wgmma order shares the chunk orders' shift code (``chunk_tile``,
    ``gemv_chunks``, before their order branches): left to the GPU test, for the suite's time."""
    from mxrepack.kernels.dequant_mxfp4 import fold_shift

    torch.manual_seed(1)
    E, H, I, k = 4, 288, 96, 2
    _, w, _ = _strided_layer(E, H, I, order=order)
    w["w13_weight_scale"].view(-1)[5] = 131
    w["w2_weight_scale"].view(-1)[7] = 130
    shift = fold_shift(w["w13_weight_scale"], w["w2_weight_scale"])
    assert shift == 3
    # (tokens, config): a tile with a remainder tile (on the rows order: the chunk orders' tiles take the same
    # shift argument and are slow under the interpreter), a tile, the chunk orders' GEMVs
    tile = MoeConfig(16, 64, 128, swap_ab=True, order=order)
    cases = [(3, tile)] if order != "rows" else [(9, dataclasses.replace(tile, block_m=32, remainder=tile))]
    cases += [(1, CHUNK_GEMVS[order])] if order != "rows" else []
    for T, cfg in cases:
        x = torch.randn(T, H).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E)[:k] for _ in range(T)])
        wts = torch.softmax(torch.randn(T, k), -1)
        plain = moe_mxfp4(x, ids, wts, w, "bf16", cfg, order=order)
        folded = with_fold(cfg, True, True) if isinstance(cfg, MoeConfig) else cfg
        shifted = moe_mxfp4(x, ids, wts, w, "bf16", folded, fold_scale=True, order=order, scale_shift=shift)
        assert torch.isfinite(plain).all() and torch.equal(shifted, plain), (T, cfg)
    with pytest.raises(ValueError, match="scale_shift is the folded decode's"):
        moe_mxfp4(x, ids, wts, w, "bf16", tile, order=order, scale_shift=3)
    with pytest.raises(ValueError, match="fold_scale needs E8M0 scales <= 128.*got 131"):
        moe_mxfp4(x, ids, wts, w, "bf16", with_fold(tile, True, True), order=order)  # by hand: checked
    with pytest.raises(ValueError, match="scale_shift must be 0 to 30"):
        moe_mxfp4(x, ids, wts, w, "bf16", tile, fold_scale=True, order=order, scale_shift=31)


def test_the_dispatch_folds_the_swapped_tiles_of_weights_that_fit():
    """``fold_scale`` (the weights fit, asked once at load) turns each swapped W4A16 tile the dispatch picks into
    its folded twin; the GEMVs, the unswapped tiles and MXFP8/MXFP4 activations are left as they are."""
    for tokens in (48, 64, 512, 4096, 65536):
        plain = pick_moe_config(tokens, 4, 128)
        folded = pick_moe_config(tokens, 4, 128, fold_scale=True)
        assert folded == (with_fold(plain, True, True) if plain.swap_ab else plain) and without_fold(folded) == plain
        assert folded.remainder is None or folded.remainder.fold_scale == folded.fold_scale
        assert pick_moe_config(tokens, 4, 128, "e4m3", fold_scale=True) == pick_moe_config(tokens, 4, 128, "e4m3")
    assert pick_moe_config(65536, 4, 128, fold_scale=True) == MOE_TILES[-1][1]  # 128 x 128 unswapped
    assert isinstance(pick_moe(8, 4, 128, 2880, fold_scale=True), MoeGemvConfig)
    for M, N in ((4, 201088), (64, 201088), (4, 5120), (2048, 5120)):
        plain, folded = pick_config(M, N, 2880), pick_config(M, N, 2880, fold_scale=True)
        assert folded == (dataclasses.replace(plain, fold_scale=True) if plain.swap_ab else plain)
        assert pick_config(M, N, 2880, mode="w4a8", fold_scale=True) == pick_config(M, N, 2880, mode="w4a8")
    assert pick_config(4, 201088, 2880, fold_scale=True).fold_scale  # lm_head decode: DECODE_WIDE folded


def test_moe_out_must_have_xs_shape():
    """``out`` of another shape is refused before anything is written (the combine would write past its end)."""
    E, H, I, k, T = 4, 128, 128, 2, 8
    _, w, _ = _strided_layer(E, H, I)
    x = torch.randn(T, H).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E)[:k] for _ in range(T)]).to(torch.int32)
    wts = torch.softmax(torch.randn(T, k), -1)
    big = torch.zeros(T + 3, H, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"out must be \[8, 128\]"):
        moe_mxfp4(x, ids, wts, w, config=MoeConfig(16, 64, 128, swap_ab=True), out=big[: T - 2])
    assert not big.any()


def test_a_folded_tile_is_checked_unless_the_caller_vouches_for_the_scales():
    """A folded config chosen by hand is checked against the scales on every call; ``fold_scale=True`` is the
    caller's answer from ``fits_fold`` at load, so nothing is checked per call."""
    torch.manual_seed(0)
    E, H, I, k, T = 4, 128, 128, 2, 8
    _, w, _ = _strided_layer(E, H, I)
    w["w2_weight_scale"].view(-1)[0] = 129
    x = torch.randn(T, H).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E)[:k] for _ in range(T)]).to(torch.int32)
    wts = torch.softmax(torch.randn(T, k), -1)
    folded = MoeConfig(16, 64, 128, swap_ab=True, fold_scale=True)
    with pytest.raises(ValueError, match="got 129"):
        moe_mxfp4(x, ids, wts, w, config=folded)
    # off CUDA the decode is the portable one either way: the same result, and no check when vouched for
    y = moe_mxfp4(x, ids, wts, w, config=folded, fold_scale=True)
    assert torch.equal(y, moe_mxfp4(x, ids, wts, w, config=without_fold(folded)))


def test_prefill_dequant_gemm_matches_reference():
    """W4A16 prefill: slabs of rows (chunk_bytes forces 128-row slabs over N = 300, the last one partial)
    written into column slices of the output, with and without bias; chosen by shape past decode."""
    N, K = 300, 96
    w, ws = quantize_mxfp4(torch.randn(N, K) * 0.05)
    bias = torch.randn(N).to(torch.bfloat16)
    x = torch.randn(5, K).to(torch.bfloat16)
    cfg = DequantConfig(32, 64, chunk_bytes=128 * 2 * K)
    for b in (bias, None):
        ref = x.float() @ dequantize_mxfp4(w, ws, torch.float32).T + (0 if b is None else b.float())
        out = torch.full((5, N), float("nan"), dtype=torch.bfloat16)
        y = linear_mxfp4(x, w, ws, b, "w4a16", cfg, out=out)
        assert y is out and not torch.isnan(y).any()
        assert rel(y, ref) <= 1e-2
    assert use_dequant_gemm(2048, 201088) and not use_dequant_gemm(128, 201088)
    assert use_dequant_gemm(128, 5120) and not use_dequant_gemm(64, 5120)
    with pytest.raises(ValueError, match="W4A16 only"):
        linear_mxfp4(x, w, ws, None, "w4a4", cfg)


def test_moe_schedule_covers_every_assignment_once():
    ids = torch.tensor([[3, 1], [1, 0], [3, 1], [2, 3], [1, 2]])
    order, blk_e, blk_s, blk_end = moe_schedule(ids, experts=5, block_m=2)
    flat = ids.flatten()
    seen = []
    for e, s, end in zip(blk_e.tolist(), blk_s.tolist(), blk_end.tolist()):
        if e < 0:
            continue
        rows = order[s : min(s + 2, end)].tolist()
        assert all(flat[r] == e for r in rows)
        seen += rows
    assert sorted(seen) == list(range(flat.numel()))
    # the grid bound: cdiv(10 assignments + 1 * min(5 experts, 10), 2) = 8 blocks; 1 + 2 + 1 + 2 are real
    assert blk_e.numel() == 8 and (blk_e >= 0).sum() == 6


def _schedule_reference(topk_ids, experts, block_m):
    """The schedule by torch ops (the implementation before the Triton kernels): a stable argsort by expert, then
    each block's expert by a search over the experts' cumulative block counts."""
    flat = topk_ids.flatten().to(torch.int64)
    order = torch.argsort(flat, stable=True).to(torch.int32)
    counts = torch.bincount(flat, minlength=experts)
    blocks = (counts + block_m - 1) // block_m
    cum_blocks, starts = torch.cumsum(blocks, 0), torch.cumsum(counts, 0) - counts
    n = flat.numel()
    b = torch.arange(max(1, -(-(n + (block_m - 1) * min(experts, n)) // block_m)))
    expert = torch.searchsorted(cum_blocks, b, right=True)
    e = expert.clamp(max=experts - 1)
    start = starts[e] + (b - (cum_blocks[e] - blocks[e])) * block_m
    return order, torch.where(expert < experts, expert, -1), start, starts[e] + counts[e]


@pytest.mark.parametrize(
    "tokens,k,experts,block_m",
    [
        (0, 4, 128, 16),
        (1, 4, 128, 16),
        (3, 4, 7, 16),
        (64, 4, 128, 16),
        (300, 4, 32, 64),
        (1100, 4, 128, 64),
        (4096, 4, 128, 128),
    ],
)
def test_moe_schedule_is_a_stable_sort_by_expert(tokens, k, experts, block_m):
    # 1100 x 4 assignments take several chunks of the count and placement kernels, 4096 x 4 all SCHEDULE_CHUNKS of
    # them, two pieces each (the placing kernel's largest counts tile)
    g = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)]) if tokens else None
    ids = (ids if ids is not None else torch.zeros(0, k, dtype=torch.int64)).to(torch.int32)
    got, want = moe_schedule(ids, experts, block_m), _schedule_reference(ids, experts, block_m)
    for name, a, b in zip(("order", "expert", "start", "end"), got, want):
        assert torch.equal(a.long(), b.long()), name


def test_programmatic_dependent_launch_only_from_sm90(monkeypatch):
    """ptxas refuses ``griddepcontrol`` below sm_90 while the strided kernels build for sm_80+: the MoE GEMV pair and
    the remainder tiles' overlap launch one after the other there (both ask ``launches_dependents``)."""
    from mxrepack.kernels import dequant_mxfp4

    gpu = torch.device("cuda", 0)
    for major, pdl in ((8, False), (9, True), (12, True)):
        monkeypatch.setattr(dequant_mxfp4, "_capability", lambda index, major=major: (major, 0))
        assert dequant_mxfp4.launches_dependents(gpu) is pdl
    assert not dequant_mxfp4.launches_dependents(torch.device("cpu"))
    monkeypatch.setenv("MXREPACK_PDL", "0")  # the way out, on any GPU
    assert not dequant_mxfp4.launches_dependents(gpu)
    assert MOE_GEMV.gate_up.pdl and not any(c.pdl for c in (MOE_GEMV.each(pdl=0).gate_up, MOE_GEMV.each(pdl=0).down))


def test_moe_schedule_reads_strided_ids():
    """A column of a wider id tensor (k = 1) and every other column: flatten() of these is a strided view."""
    base = torch.randint(0, 32, (200, 8))
    for ids in (base[:, 2:3], base[:1, ::2], base.T):
        got, want = moe_schedule(ids, 32, 16), _schedule_reference(ids, 32, 16)
        assert all(torch.equal(a.long(), b.long()) for a, b in zip(got, want))


def _strided_layer(E, H, I, order="rows"):
    gu, gus = quantize_mxfp4(torch.randn(E, 2 * I, H) * 0.05)
    dn, dns = quantize_mxfp4(torch.randn(E, H, I) * 0.05)
    parts = {
        "gate_up_proj_blocks": gu.view(E, 2 * I, H // 32, 16),
        "gate_up_proj_scales": gus,
        "gate_up_proj_bias": (torch.randn(E, 2 * I) * 0.1).to(torch.bfloat16),
        "down_proj_blocks": dn.view(E, H, I // 32, 16),
        "down_proj_scales": dns,
        "down_proj_bias": (torch.randn(E, H) * 0.1).to(torch.bfloat16),
    }
    dims = ExpertDims(E, H, I)
    pack = lambda layout: {o.suffix: o.pack(**{n: parts[n] for n in o.inputs}) for o in layout.outputs(dims)}  # noqa: E731
    return dims, pack(make_layout("strided", {"order": order})), pack(get_layout("mxfp4"))


# bf16 in two halves (the shipped tiles' forms; the integer-op and swapped tiles and the GEMVs, which take most of the
# time under the interpreter), so that the suite's workers (pytest-xdist) share it
@pytest.mark.parametrize(
    "activations,bound,part",
    [("bf16", 1e-2, "tiles"), ("bf16", 1e-2, "more"), ("e4m3", 0.15, "all"), ("e2m1", 0.4, "all")],
)
def test_moe_mxfp4_matches_reference(activations, bound, part):
    E, H, I, k = 4, 288, 96, 2  # 288 and 96: padded to 384 and 128 inside the strided layout
    dims, strided, native = _strided_layer(E, H, I)
    for T in (1, 9):
        x = torch.randn(T, H).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E)[:k] for _ in range(T)])
        wts = torch.softmax(torch.randn(T, k), -1)
        ref = layout_moe_reference(x, native, get_layout("mxfp4"), dims, ids, wts, padded=False)
        # one GEMV config for both kernels (16 rows: half a w13 row tile), and a pair (the f16x2 gate_up at 32
        # rows, two K tiles ahead); scheduled tiles of one 128-code K tile of the layout, and of two
        gemv = (
            (
                GemvConfig(16, 128, 4, 1, "ops"),
                MoeGemvConfig(
                    GemvConfig(32, 128, 4, 1, "f16x2-ops", prefetch=2), GemvConfig(16, 128, 4, 1, "f16x2-ops")
                ),
            )
            if activations == "bf16"
            else ()
        )
        # integer-op dequant + tl.dot (bf16 only; other activations take dot_scaled whatever the flag says)
        manual = (
            (MoeConfig(16, 64, 128, manual_dequant=True), MoeConfig(32, 32, 256, manual_dequant=True))
            if activations == "bf16"
            else ()
        )
        # W as the MMA's first operand, decoded in registers, activations in split order (the portable decode
        # here; the PTX one is compiled for every arch in the kernels check); e4m3/e2m1 ignore the flag
        manual += (MoeConfig(16, 64, 128, swap_ab=True), MoeConfig(32, 128, 128, num_warps=8, swap_ab=True))
        tiles = (MoeConfig(16, 64, 128), MoeConfig(32, 128, 128), MoeConfig(16, 32, 256)) + manual
        if T == 1:  # one token: the GEMVs' size; of the tiles, one of each operand form (a row per block)
            tiles = (MoeConfig(16, 64, 128), MoeConfig(16, 64, 128, swap_ab=True))
        if part == "tiles":
            tiles, gemv = tiles[:3], ()
        elif part == "more":
            tiles = tiles[3:] if T > 1 else ()
        for cfg in tiles + gemv:
            out = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
            y = moe_mxfp4(x, ids, wts, strided, activations, cfg, out=out)
            assert y is out and not torch.isnan(y).any()
            assert rel(y, ref) <= bound, (T, cfg, rel(y, ref))
            # the combine's arrival counters are back at zero: same result again (at one token: under the interpreter
            # the pair of GEMVs takes a minute a call at 9)
            if gemv and cfg is gemv[-1] and T == 1:
                assert torch.equal(moe_mxfp4(x, ids, wts, strided, activations, cfg), y)
                # int32 ids are read as they come, as int64 ones are
                assert torch.equal(moe_mxfp4(x, ids.to(torch.int32), wts, strided, activations, cfg), y)
    assert pick_moe_gemv_config(4) == MOE_GEMV == pick_moe_gemv_config(256)
    f16x2 = GemvConfig(16, 128, 4, 1, "f16x2-ops")
    with pytest.raises(ValueError, match="both use prepared"):
        MoeGemvConfig(GemvConfig(32, 128, 4, 1, "ops"), f16x2)
    with pytest.raises(ValueError, match="multiple of 32"):  # the prepared intermediate is whole groups
        MoeGemvConfig(f16x2, f16x2)
    with pytest.raises(ValueError, match="multiple of 128"):  # whole K tiles of the strided layout
        MoeGemvConfig(GemvConfig(32, 64, 4, 1, "f16x2-ops"), f16x2)
    with pytest.raises(ValueError, match="multiple of 128"):
        MoeConfig(16, 64, 64)
    with pytest.raises(ValueError, match="swap_ab reads one 128-code K tile"):
        MoeConfig(16, 64, 256, swap_ab=True)
    assert MoeGemvConfig.from_single(f16x2) == MoeGemvConfig(GemvConfig(32, 128, 4, 1, "f16x2-ops"), f16x2)
    # tile shapes grow with the rows per expert: 120b (128 experts, top-4) at T = 64, 512, 4096, 8192; up to 128
    # rows the swapped operands, pipelined (each wgmma waited for: dequant_mxfp4.mma_done)
    assert [pick_moe_config(T, 4, 128).block_m for T in (64, 512, 1024, 4096, 8192)] == [16, 32, 64, 64, 128]
    assert all(pick_moe_config(T, 4, 128).swap_ab for T in (64, 512, 1024, 4096))
    assert all(pick_moe_config(T, 4, 128).num_stages > 1 for T in (64, 512, 1024, 4096))
    assert not pick_moe_config(8192, 4, 128).swap_ab and pick_moe_config(8192, 4, 128).block_n == 128
    assert not any(pick_moe_config(T, 4, 128, act).swap_ab for T in (64, 1024) for act in ("e4m3", "e2m1"))
    assert isinstance(pick_moe(16, 4, 128, 2880), MoeGemvConfig) and isinstance(pick_moe(17, 4, 128, 2880), MoeConfig)
    assert pick_moe_gemv_config(4, cuda=False) == MOE_GEMV.portable()


def test_moe_remainder_tile_matches_reference():
    """A tile with a remainder tile (``MoeConfig.remainder``): blocks of at most its rows (an expert's last partial
    block, or all of a small expert) run on it, the others on the main tile, on one schedule; both orders. Experts of
    40 (32 + 8), 20, 12 and 8 rows: each kind of block."""
    E, H, I, k, T = 4, 288, 96, 2, 40
    second = torch.tensor([1] * 20 + [2] * 12 + [3] * 8)
    ids = torch.stack([torch.zeros(T, dtype=torch.long), second[torch.randperm(T)]], 1)
    wts = torch.softmax(torch.randn(T, k), -1)
    x = torch.randn(T, H).to(torch.bfloat16)
    for order in ("rows", "wgmma"):
        dims, strided, native = _strided_layer(E, H, I, order=order)
        ref = layout_moe_reference(x, native, get_layout("mxfp4"), dims, ids, wts, padded=False)
        small = MoeConfig(16, 64, 128, swap_ab=True, order=order)
        cfg = MoeConfig(32, 64, 128, swap_ab=True, order=order, remainder=small)
        y = moe_mxfp4(x, ids, wts, strided, "bf16", cfg, order=order)
        assert rel(y, ref) <= 1e-2, (order, rel(y, ref))
        plain = moe_mxfp4(x, ids, wts, strided, "bf16", dataclasses.replace(cfg, remainder=None), order=order)
        assert rel(y, plain) <= 1e-3, (order, rel(y, plain))
    # blocks of exactly the remainder's rows, of exactly the main tile's, and an expert with none
    T = 48
    second = torch.tensor([1] * 32 + [2] * 16)
    ids = torch.stack([torch.zeros(T, dtype=torch.long), second[torch.randperm(T)]], 1)
    wts = torch.softmax(torch.randn(T, k), -1)
    x = torch.randn(T, H).to(torch.bfloat16)
    ref = layout_moe_reference(x, native, get_layout("mxfp4"), dims, ids, wts, padded=False)
    assert rel(moe_mxfp4(x, ids, wts, strided, "bf16", cfg, order=order), ref) <= 1e-2
    assert cfg.name().endswith("+rm16n64k128w4st3s-wgmma")
    # the shipped remainder tiles are tiles of their own table but for a wider down tile (down_block_n) and, where
    # their main tile keeps its wgmmas in flight, theirs too (wait_mma), folded with the main; the kernels check builds
    # each of them
    from mxrepack.kernels.check import shipped_kernels

    built = {name.split(":", 1)[1] for kernel, name, *_ in shipped_kernels() if kernel == "moe_down_combine"}
    for table in (MOE_TILES, MOE_TILES_WGMMA):
        tiles = [dataclasses.replace(c, remainder=None, down_block_n=0, wait_mma=True) for _, c in table]
        remainders = [(c, c.remainder) for _, c in table if c.remainder is not None]
        assert all(r.wait_mma == c.wait_mma for c, r in remainders)
        remainders = [r for _, r in remainders]
        assert all(dataclasses.replace(r, down_block_n=0, wait_mma=True) in tiles for r in remainders)
        assert all(r.name() in built and with_fold(r, True, True).name() in built for r in remainders)
    folded = pick_moe_config(1024, 4, 128, fold_scale=True, order="wgmma")
    assert folded.remainder.block_m == 32 and folded.fold_scale and folded.remainder.fold_scale
    with pytest.raises(ValueError, match="must be a smaller tile"):
        MoeConfig(16, 64, 128, swap_ab=True, remainder=small)
    with pytest.raises(ValueError, match="must be a smaller tile"):  # the other order
        MoeConfig(32, 64, 128, swap_ab=True, remainder=MoeConfig(16, 64, 128, swap_ab=True, order="wgmma"))
    with pytest.raises(ValueError, match="must be a smaller tile"):  # folded one and not the other
        MoeConfig(32, 64, 128, swap_ab=True, remainder=MoeConfig(16, 64, 128, swap_ab=True, fold_scale=True))
    with pytest.raises(ValueError, match="multiples of the row tiles"):  # the remainder's rows fit the widths too
        moe_mxfp4(
            x,
            ids,
            wts,
            strided,
            "bf16",
            dataclasses.replace(cfg, remainder=MoeConfig(16, 256, 128, swap_ab=True, order=order)),
            order=order,
        )


def test_moe_wgmma_order_matches_reference():
    """The strided layout's wgmma order (Hopper's A-fragment byte order) through the scheduled tiles that read it, at
    every T, decode included (portable decode here; the PTX one is compiled in the kernels check and run by the GPU
    test below): gate and up rows one operand, the intermediate in natural order. A GEMV config, a tile config for the
    other order, other activations, or a GPU without wgmma is refused."""
    E, H, I, k = 4, 288, 96, 2
    dims, wgmma, native = _strided_layer(E, H, I, order="wgmma")
    _, rows, _ = _strided_layer(E, H, I)  # other random weights: only for the refusals
    for T in (1, 9):
        x = torch.randn(T, H).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E)[:k] for _ in range(T)])
        wts = torch.softmax(torch.randn(T, k), -1)
        ref = layout_moe_reference(x, native, get_layout("mxfp4"), dims, ids, wts, padded=False)
        for cfg in (
            None,  # the shipped tile at these T (decode sizes included)
            MoeConfig(16, 64, 128, swap_ab=True, order="wgmma"),
            MoeConfig(32, 128, 128, swap_ab=True, order="wgmma", wait_mma=False),
            # a down tile wider than block_n that does not divide Hp (384): its last tile's rows past Hp not stored;
            # and on a remainder tile
            MoeConfig(16, 64, 128, swap_ab=True, order="wgmma", down_block_n=256),
            MoeConfig(
                32,
                64,
                128,
                swap_ab=True,
                order="wgmma",
                down_block_n=128,
                remainder=MoeConfig(16, 64, 128, swap_ab=True, order="wgmma", down_block_n=256),
            ),
        ):
            out = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
            y = moe_mxfp4(x, ids, wts, wgmma, "bf16", cfg, out=out, order="wgmma")
            assert y is out and not torch.isnan(y).any()
            assert rel(y, ref) <= 1e-2, (T, cfg, rel(y, ref))
    # its own decode GEMVs to T x k = 8 (T <= 2 at top-4: test_moe_chunk_order_gemvs_match_reference), then the tiles
    for T in (1, 2):
        assert pick_moe(T, 4, 128, 2880, order="wgmma") == pick_moe(T, 4, 128, 2880, order="wgmma", cuda=False)
        assert pick_moe(T, 4, 128, 2880, order="wgmma") == CHUNK_GEMVS["wgmma"]
    for T in (3, 32):
        cfg = pick_moe(T, 4, 128, 2880, order="wgmma")
        assert isinstance(cfg, MoeConfig) and cfg.order == "wgmma", (T, cfg)
    assert pick_moe(3, 4, 128, 2880, order="wgmma", cuda=False) == MOE_TILES_WGMMA[0][1]
    for gemv in (GemvConfig(16, 128, 4, 1, "ops"), MOE_GEMV.portable()):
        with pytest.raises(ValueError, match="wgmma order runs its scheduled tiles"):
            moe_mxfp4(x, ids, wts, wgmma, "bf16", gemv, order="wgmma")
    tiles = [pick_moe_config(T, 4, 128, order="wgmma") for T in (1, 64, 512, 1024, 4096, 8192)]
    assert all(c.order == "wgmma" for c in tiles) and [c.block_m for c in tiles] == sorted(c.block_m for c in tiles)
    with pytest.raises(ValueError, match="reads the rows order"):
        moe_mxfp4(x, ids, wts, wgmma, "bf16", MoeConfig(16, 64, 128, swap_ab=True), order="wgmma")
    with pytest.raises(ValueError, match="reads the wgmma order"):
        moe_mxfp4(x, ids, wts, rows, "bf16", MoeConfig(16, 64, 128, swap_ab=True, order="wgmma"))
    with pytest.raises(ValueError, match="BF16 activations only"):
        moe_mxfp4(x, ids, wts, wgmma, "e4m3", order="wgmma")
    with pytest.raises(ValueError, match="order must be rows, wgmma or mma2"):
        moe_mxfp4(x, ids, wts, rows, order="mma_sync")
    with pytest.raises(ValueError, match="64-row operands"):  # down's 32 rows would be an mma.sync operand on sm_90
        MoeConfig(16, 32, 128, swap_ab=True, order="wgmma")
    with pytest.raises(ValueError, match="wgmma order's tiles only"):
        MoeConfig(16, 64, 128, swap_ab=True, wait_mma=False)
    for order, down in (("rows", 128), ("wgmma", 96), ("wgmma", 192), ("wgmma", 32)):
        with pytest.raises(ValueError, match="down_block_n is a wider tile of a chunk order's down kernel"):
            MoeConfig(16, 64, 128, swap_ab=True, order=order, down_block_n=down)


def test_kernels_check_sources_follow_the_kernels_arguments():
    """Every source the kernels check builds lists its arguments in the kernel's order (Triton 3.9 keys constexprs and
    alignment facts by argument index), and each MoE tile's ORDER is its table's: the check builds the wgmma order for
    sm_90a only and the mma2 order for sm_12x only, and checks the decode's packing of both, by that constant."""
    from mxrepack.kernels import check

    for kernel, config, _, src, _, _ in check.shipped_kernels():
        assert list(src.signature) == list(src.fn.arg_names), (kernel, config)
        if kernel.startswith("moe_") and "ORDER" in src.fn.arg_names:
            label = config.split(" ")[0]
            assert check._constant(src, "ORDER") == (label if label in ("wgmma", "mma2") else "rows"), config


def test_warm_counts_compile_what_every_call_size_launches():
    """The plugin's load-time warm-up: the token counts it runs cover every variant (dispatch choice, schedule counts
    tile, Triton's integer specializations) that a call of 1 to max_tokens tokens compiles, each once; the schedule's
    sizes are the ones moe_schedule launches with. At 120b and 20b shapes a few dozen calls stand for 8192 sizes."""
    from mxrepack.kernels import moe_mxfp4 as moe

    for experts, order in ((128, "rows"), (32, "wgmma"), (32, "mma2")):
        counts = moe.warm_token_counts(4, experts, 2880, 8192, True, order)
        assert counts[0] == 1 and counts == sorted(set(counts)) and len(counts) < 64, (experts, order, len(counts))
        variants = {moe.launch_variant(t, 4, experts, 2880, True, order) for t in counts}
        assert len(variants) == len(counts)  # each count compiles something the others do not
        for t in (2, 16, 17, 100, 513, 1000, 4096, 8191):
            assert moe.launch_variant(t, 4, experts, 2880, True, order) in variants, (experts, order, t)
    # on the interpreter: the warm-up's calls run (a strided layer's rows and mma2 orders), and a small max_tokens
    # needs few of them
    for order in ("rows", "mma2"):
        _, w, _ = _strided_layer(4, 288, 96, order=order)
        ran = moe.warm_moe(w, 2, 288, 24, order=order)
        assert ran == moe.warm_token_counts(2, 4, 288, 24, order=order) and len(ran) <= 8, ran


_WARM_COVERAGE = """
import json, sys, torch
from triton.runtime import jit as tjit
from triton.backends.nvidia.compiler import CUDABackend
from mxrepack.kernels import gemv_mxfp4, moe_mxfp4 as moe

# every launch recorded as Triton's own binder specializes it (kernel, argument specialization, options), not run
launched, binders = [], {}
def record(self, *args, grid, warmup, **kwargs):
    b = binders.get(id(self))
    if b is None:
        b = binders[id(self)] = tjit.create_function_from_signature(self.signature, self.params, CUDABackend)
    _, spec, opts = b(*args, **kwargs)
    launched.append((self.fn.__name__, str(spec), str(sorted(opts.items()))))
tjit.JITFunction.run = record
pick = moe.pick_moe  # the dispatch as on CUDA, the launches as on a GPU with PDL
moe.pick_moe = lambda T, k, E, H, a="bf16", c=True, f=False, o="rows": pick(T, k, E, H, a, True, f, o)
moe.launches_dependents = gemv_mxfp4.launches_dependents = lambda device: True
out = {}
for order, E, max_tokens in json.loads(sys.argv[1]):
    k, H, P = 4, 2880, 2944
    meta = lambda *shape, dtype=torch.uint8: torch.empty(*shape, dtype=dtype, device="meta")
    w = {"w13_weight": meta(E, 2 * P, P // 2), "w13_weight_scale": meta(E, 2 * P, P // 32),
         "w13_bias": meta(E, 2 * P, dtype=torch.float32), "w2_weight": meta(E, P, P // 2),
         "w2_weight_scale": meta(E, P, P // 32), "w2_bias": meta(E, P, dtype=torch.float32)}
    x, ids = torch.zeros(max_tokens, H, dtype=torch.bfloat16), (torch.arange(max_tokens * k) % E).int().view(-1, k)
    wts = torch.full(ids.shape, 0.25)
    by_size = {}
    for t in range(1, max_tokens + 1):
        launched.clear()
        moe.moe_mxfp4(x[:t], ids[:t], wts[:t], w, fold_scale=True, order=order)
        by_size[t] = set(launched)
    warm = set().union(*(by_size[t] for t in moe.warm_token_counts(k, E, H, max_tokens, True, order)))
    out[f"{order} {E}"] = [t for t, s in by_size.items() if s - warm]
print(json.dumps(out))
"""


def test_warm_counts_compile_what_triton_specializes():
    """The warm-up's key model against Triton itself: every launch moe_mxfp4 makes at 1 to 2048 tokens, specialized
    by Triton's own binder (kernel, constexprs, integer and pointer specializations, launch options), is among those
    the warm-up's counts make; so a kernel that gains a size-dependent argument fails here, not while serving. CPU: the
    launches are recorded, not run (weights on the meta device)."""
    from triton.runtime import jit as tjit

    if not hasattr(tjit, "create_function_from_signature"):
        pytest.skip("this Triton has no create_function_from_signature (the binder the recorder calls)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cases = [["rows", 128, 2048], ["wgmma", 32, 2048], ["mma2", 32, 2048]]
    proc = subprocess.run(
        [sys.executable, "-c", _WARM_COVERAGE, json.dumps(cases)], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    missing = json.loads(proc.stdout.strip().splitlines()[-1])
    assert missing == {f"{o} {e}": [] for o, e, _ in cases}, missing


_DENSE_WARM_COVERAGE = """
import json, sys, torch
from triton.runtime import jit as tjit
from triton.backends.nvidia.compiler import CUDABackend
from mxrepack.kernels import gemv_mxfp4, linear_mxfp4 as lin

launched, binders = [], {}
def record(self, *args, grid, warmup, **kwargs):  # as _WARM_COVERAGE's: Triton's own specialization, not run
    b = binders.get(id(self))
    if b is None:
        b = binders[id(self)] = tjit.create_function_from_signature(self.signature, self.params, CUDABackend)
    _, spec, opts = b(*args, **kwargs)
    launched.append((self.fn.__name__, str(spec), str(sorted(opts.items()))))
    return type("Compiled", (), {"hash": 0})()
tjit.JITFunction.run = record
gemv_mxfp4.launches_dependents = lambda device: True
out = {}
for order, name, n, k, has_bias in json.loads(sys.argv[1]):
    np_, kp = (n, k) if order == "rows" else (-(-n // 16) * 16, -(-k // 128) * 128)
    w = torch.empty(np_, kp // 2, dtype=torch.uint8, device="meta")
    s = torch.empty(np_, kp // 32, dtype=torch.uint8, device="meta")
    bias = torch.empty(n, dtype=torch.bfloat16, device="meta") if has_bias else None
    x = torch.empty(max(max(lin.WARM_ROWS), 300), k, dtype=torch.bfloat16, device="meta")
    by_rows = {}
    for m in range(1, 301):
        launched.clear()
        y = torch.empty(m, n, dtype=torch.bfloat16, device="meta")
        lin.linear_mxfp4(x[:m], w, s, bias, fold_scale=True, order=order, out=y)
        by_rows[m] = set(launched)
    warm = set().union(*(by_rows[m] for m in lin.WARM_ROWS))
    out[f"{order} {name}"] = [m for m, got in by_rows.items() if got - warm]
print(json.dumps(out))
"""


def test_dense_warm_rows_compile_what_triton_specializes():
    """The dense warm-up's rows (``linear_mxfp4.WARM_ROWS``, what the vLLM plugin runs at load) against Triton itself:
    every launch ``linear_mxfp4`` makes at 1 to 300 rows on gpt-oss's q/k/v (with its bias), o and lm_head, in each
    byte order, specialized by Triton's own binder, is among those the warm-up's rows make; so a new tile or a
    size-dependent argument fails here, not as a compile while serving. CPU: launches recorded, not run (meta
    tensors)."""
    from triton.runtime import jit as tjit

    if not hasattr(tjit, "create_function_from_signature"):
        pytest.skip("this Triton has no create_function_from_signature (the binder the recorder calls)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    layers = [["qkv", 5120, 2880, True], ["o", 2880, 4096, True], ["lm_head", 201088, 2880, False]]
    cases = [[order, *layer] for order in ("rows", "wgmma", "mma2") for layer in layers]
    proc = subprocess.run(
        [sys.executable, "-c", _DENSE_WARM_COVERAGE, json.dumps(cases)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    missing = json.loads(proc.stdout.strip().splitlines()[-1])
    assert missing == {f"{c[0]} {c[1]}": [] for c in cases}, missing


def test_moe_mma2_order_matches_reference():
    """The strided layout's mma2 order (mma.sync's kWidth-8 operand order, sm_12x / sm_8x) through the scheduled tiles
    that read it, decode sizes included (portable decode here; the PTX one is compiled for sm_121a in the kernels check
    and run by the GPU test below): the tokens in 1, 2 or 4 dots a K tile, a remainder tile, a down tile wider than
    block_n (its decode GEMVs: :func:`test_moe_chunk_order_gemvs_match_reference`). Other activations are refused."""
    E, H, I, k = 4, 288, 96, 2
    dims, mma2, native = _strided_layer(E, H, I, order="mma2")
    assert [MoeConfig(m, 64, 128, swap_ab=True, order="mma2").token_dots for m in (16, 32, 64, 128)] == [1, 2, 2, 4]
    for T in (1, 40):
        x = torch.randn(T, H).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E)[:k] for _ in range(T)])
        wts = torch.softmax(torch.randn(T, k), -1)
        ref = layout_moe_reference(x, native, get_layout("mxfp4"), dims, ids, wts, padded=False)
        for cfg in (
            None,
            MoeConfig(32, 64, 128, swap_ab=True, order="mma2"),
            MoeConfig(
                128, 64, 128, swap_ab=True, order="mma2", remainder=MoeConfig(16, 64, 128, swap_ab=True, order="mma2")
            ),
            MoeConfig(64, 64, 128, 8, swap_ab=True, order="mma2", down_block_n=256),
        ):
            y = moe_mxfp4(x, ids, wts, mma2, "bf16", cfg, order="mma2")
            assert rel(y, ref) <= 1e-2, (T, cfg, rel(y, ref))
    # past 96 rows per expert (2 experts, both taken by every token): every dot of the 128-token tile has rows
    dims2, mma2_2, native2 = _strided_layer(2, H, I, order="mma2")
    x2 = torch.randn(100, H).to(torch.bfloat16)
    ids2 = torch.stack([torch.randperm(2) for _ in range(100)])
    wts2 = torch.softmax(torch.randn(100, 2), -1)
    ref2 = layout_moe_reference(x2, native2, get_layout("mxfp4"), dims2, ids2, wts2, padded=False)
    for cfg in (
        MoeConfig(128, 64, 128, swap_ab=True, order="mma2"),
        MoeConfig(64, 64, 128, swap_ab=True, order="mma2"),
    ):
        assert rel(moe_mxfp4(x2, ids2, wts2, mma2_2, "bf16", cfg, order="mma2"), ref2) <= 1e-2, cfg
    with pytest.raises(ValueError, match="BF16 activations only"):
        moe_mxfp4(x, ids, wts, mma2, "e4m3", order="mma2")
    with pytest.raises(ValueError, match="16, 32, 64 or 128 tokens"):
        MoeConfig(48, 64, 128, swap_ab=True, order="mma2")


@pytest.mark.parametrize("order", ["mma2", "wgmma"])
def test_moe_chunk_order_gemvs_match_reference(order):
    """A chunk order's own decode GEMVs (:class:`ChunkGemvConfig`: x read unpadded, a partial last K tile, the k slots
    combined in the down kernel; the dispatch's at T x k <= 8) against the reference, portable decode (the PTX one is
    compiled in the kernels check and run by the GPU tests); the rows order's GEMVs and another order's are refused."""
    E, H, I, k = 4, 288, 96, 2
    dims, chunked, native = _strided_layer(E, H, I, order=order)
    gemv = CHUNK_GEMVS[order]
    assert gemv.order == order and CHUNK_GEMV_MAX_ASSIGNMENTS == 8  # T <= 2 at top-4
    assert [T for T in (1, 2, 3, 4, 8, 16) if pick_moe(T, 4, 128, 2880, order=order) == gemv] == [1, 2]
    assert all(isinstance(pick_moe(T, 4, 128, 2880, order=order), MoeConfig) for T in (3, 16, 4096))
    empty = torch.zeros(0, H).to(torch.bfloat16)  # no tokens: an empty output, no launch
    no_ids, no_wts = torch.zeros(0, k, dtype=torch.int64), torch.zeros(0, k)
    assert moe_mxfp4(empty, no_ids, no_wts, chunked, "bf16", gemv, order=order).shape == (0, H)
    for T in (1, 3):
        x = torch.randn(T, H).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E)[:k] for _ in range(T)])
        wts = torch.softmax(torch.randn(T, k), -1)
        ref = layout_moe_reference(x, native, get_layout("mxfp4"), dims, ids, wts, padded=False)
        for cfg in (ChunkGemvConfig(order, 2, 4, 2, 1, pdl=False), gemv):
            y = moe_mxfp4(x, ids, wts, chunked, "bf16", cfg, order=order)
            assert rel(y, ref) <= 1e-2, (T, cfg)
    # the shipped GEMVs' combine counters are back at zero: the next call's result is the same
    assert torch.equal(moe_mxfp4(x, ids, wts, chunked, "bf16", gemv, order=order), y)
    _, rows, _ = _strided_layer(E, H, I)
    with pytest.raises(ValueError, match=f"reads the {order} order, the weights are rows"):
        moe_mxfp4(x, ids, wts, rows, "bf16", gemv)
    other = ChunkGemvConfig("wgmma" if order == "mma2" else "mma2")
    with pytest.raises(ValueError, match=f"reads the {other.order} order, the weights are {order}"):
        moe_mxfp4(x, ids, wts, chunked, "bf16", other, order=order)
    with pytest.raises(ValueError, match=rf"{order} order runs its scheduled tiles .* or its GEMVs \(ChunkGemvConfig"):
        moe_mxfp4(x, ids, wts, chunked, "bf16", MOE_GEMV.portable(), order=order)
    with pytest.raises(ValueError, match="pdl must be True or False"):
        ChunkGemvConfig(order, pdl=1)
    with pytest.raises(ValueError, match="order must be mma2 or wgmma"):
        ChunkGemvConfig("rows")


@pytest.mark.parametrize(
    "cap,disabled,runs",
    [((12, 1), "", True), ((8, 9), "", True), ((9, 0), "", False), ((9, 0), "1", True), ((10, 0), "1", False)],
)
def test_mma2_order_runs_where_triton_builds_mma_sync(monkeypatch, cap, disabled, runs):
    """The mma2 order is mma.sync's operand: accepted on sm_12x and sm_8x, and on sm_90 only under Triton's
    DISABLE_MMA_V3 (the H100 stand-in for sm_12x's code path); refused in one line elsewhere."""
    from mxrepack.kernels import dequant_mxfp4
    from mxrepack.kernels import moe_mxfp4 as moe

    monkeypatch.setattr(dequant_mxfp4, "device_capability", lambda device: cap)
    monkeypatch.setenv("DISABLE_MMA_V3", disabled)
    if runs:
        moe.check_order("mma2", "bf16", torch.device("cuda"))
    else:
        with pytest.raises(ValueError, match=r"mma2 order is mma\.sync's operand .*sm90-strided .*order rows") as e:
            moe.check_order("mma2", "bf16", torch.device("cuda"))
        assert "\n" not in str(e.value)
    # the wgmma order is the other way round: where Triton builds wgmma only
    if cap[0] == 9 and not disabled:
        moe.check_order("wgmma", "bf16", torch.device("cuda"))
    else:
        with pytest.raises(ValueError, match=r"wgmma order is Hopper's .*sm121-strided \(the mma2 order.*order rows"):
            moe.check_order("wgmma", "bf16", torch.device("cuda"))
    # the GPU's own chunk order (what the plugin's advice names) is one check_order accepts: mma2 where it runs, wgmma
    # on sm_90, rows on sm_100 and the CPU
    native = dequant_mxfp4.native_order(torch.device("cuda"))
    assert native == ("mma2" if runs else "wgmma" if cap[0] == 9 and not disabled else "rows")
    moe.check_order(native, "bf16", torch.device("cuda"))
    assert dequant_mxfp4.native_order(torch.device("cpu")) == "rows"


@pytest.mark.skipif(
    not torch.cuda.is_available()
    or not (
        torch.cuda.get_device_capability()[0] in (8, 12)
        or (torch.cuda.get_device_capability()[0] == 9 and os.environ.get("DISABLE_MMA_V3") == "1")
    ),
    reason="the mma2 order's PTX decode feeds mma.sync (sm_8x, sm_12x, or a Hopper under DISABLE_MMA_V3)",
)
def test_moe_mma2_order_on_mma_sync():
    """On a GPU that builds mma.sync: the mma2 order's shipped tiles (folded and not) against the reference at
    gpt-oss's widths, decode sizes included, the same bits on every repeat."""
    E, H, I, k = 8, 2880, 2880, 4
    dims, mma2, native = _strided_layer(E, H, I, order="mma2")
    mma2 = {n: t.cuda() for n, t in mma2.items()}
    for T in (1, 5, 64, 300):
        x = torch.randn(T, H).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E)[:k] for _ in range(T)])
        wts = torch.softmax(torch.randn(T, k), -1)
        ref = layout_moe_reference(x, native, get_layout("mxfp4"), dims, ids, wts, padded=False)
        x, ids, wts = x.cuda(), ids.cuda(), wts.cuda()
        tiles = (*MOE_CONFIGS_MMA2.values(), *(with_fold(c, True, True) for c in MOE_CONFIGS_MMA2.values()))
        for cfg in (None, *tiles, MMA2_GEMV):
            y = moe_mxfp4(x, ids, wts, mma2, "bf16", cfg, order="mma2")
            assert rel(y.cpu(), ref) <= 1e-2, (T, cfg, rel(y.cpu(), ref))
            assert all(torch.equal(moe_mxfp4(x, ids, wts, mma2, "bf16", cfg, order="mma2"), y) for _ in range(3))
        if T <= 16:  # the decode GEMVs with the scale folded (these random scales fit), and launched one after the
            # other (no PDL): the same bits
            folded = moe_mxfp4(x, ids, wts, mma2, "bf16", MMA2_GEMV, fold_scale=True, order="mma2")
            assert torch.equal(folded, moe_mxfp4(x, ids, wts, mma2, "bf16", MMA2_GEMV, order="mma2"))
            serial = dataclasses.replace(MMA2_GEMV, pdl=not MMA2_GEMV.pdl)
            assert torch.equal(folded, moe_mxfp4(x, ids, wts, mma2, "bf16", serial, order="mma2"))


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
    reason="the wgmma order's PTX decode feeds Hopper's wgmma",
)
def test_moe_wgmma_order_on_hopper():
    """On an H100/H200: the wgmma order's tiles with the PTX decode (scales folded and not, each wgmma waited for and
    one kept in flight while the next K tile decodes) and its decode GEMVs against the reference at gpt-oss's
    widths, decode sizes included, and the same bits on every repeat (a register race shows as non-finite or differing
    outputs)."""
    E, H, I, k = 8, 2880, 2880, 4
    dims, wgmma, native = _strided_layer(E, H, I, order="wgmma")
    wgmma = {n: t.cuda() for n, t in wgmma.items()}
    for T in (1, 5, 64):
        x = torch.randn(T, H).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E)[:k] for _ in range(T)])
        wts = torch.softmax(torch.randn(T, k), -1)
        ref = layout_moe_reference(x, native, get_layout("mxfp4"), dims, ids, wts, padded=False)
        x, ids, wts = x.cuda(), ids.cuda(), wts.cuda()
        configs = [None, *MOE_CONFIGS_WGMMA.values()]
        for bm, wait, fold in itertools.product((16, 64), (True, False), (True, False)):
            configs.append(MoeConfig(bm, 64, 128, swap_ab=True, fold_scale=fold, order="wgmma", wait_mma=wait))
        # down tiles wider than block_n (2944 = 11.5 x 256: the last one partial)
        configs.append(MoeConfig(128, 128, 128, 8, swap_ab=True, fold_scale=True, order="wgmma", down_block_n=256))
        configs.append(MoeConfig(64, 64, 128, swap_ab=True, order="wgmma", down_block_n=128))
        gemv = CHUNK_GEMVS["wgmma"]  # its decode GEMVs: folded and not, launched with PDL and one after the other
        configs += [gemv, dataclasses.replace(gemv, pdl=not gemv.pdl)]
        for cfg in configs:
            y = moe_mxfp4(x, ids, wts, wgmma, "bf16", cfg, order="wgmma")
            assert rel(y.cpu(), ref) <= 1e-2, (T, cfg, rel(y.cpu(), ref))
            assert all(torch.equal(moe_mxfp4(x, ids, wts, wgmma, "bf16", cfg, order="wgmma"), y) for _ in range(5))
        folded = moe_mxfp4(x, ids, wts, wgmma, "bf16", gemv, fold_scale=True, order="wgmma")
        assert torch.equal(folded, moe_mxfp4(x, ids, wts, wgmma, "bf16", gemv, order="wgmma")), T


def _chunk_dense(N, K, order, device="cpu"):
    """A random MXFP4 weight ``[N, K]`` (plain bytes and scales, logical size) and its stored form in the dense
    layout's chunk ``order`` (padded to 16 rows and 128 columns)."""
    w = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8)
    s = torch.randint(118, 126, (N, K // 32), dtype=torch.uint8)
    return w, s, _chunk_dense_store(w, s, K, order, device)


def _chunk_dense_store(w, s, K, order, device="cpu"):
    """Plain MXFP4 bytes and scales of a weight ``[N, K]`` in the dense layout's chunk ``order``, stored."""
    from mxrepack.layouts.dense import DenseMxLayout

    layout = DenseMxLayout("mxfp4", order=order)
    N, Np = w.shape[0], layout.padded(w.shape[0], K)[0]
    wp, sp = torch.zeros(Np, K // 2, dtype=torch.uint8), torch.zeros(Np, K // 32, dtype=torch.uint8)
    wp[:N], sp[:N] = w, s
    return layout.store(wp, sp, K, "values").to(device), layout.store(wp, sp, K, "scales").to(device)


@pytest.mark.parametrize("order", ["wgmma", "mma2"])
def test_linear_chunk_orders_match_reference(order):
    """Dense W4A16 on weights in a chunk order (the dense layout's option; the interpreter's portable decode): each
    shipped tile, split and not, and the dequantize + cuBLAS path past 64 rows, against the reference, with N not a
    multiple of 16 (the padding rows not stored) and K not of 128; the layout's stored form unpacks to the same
    bytes."""
    from mxrepack.kernels.linear_mxfp4 import CHUNK_CONFIGS, pick_chunk_config
    from mxrepack.layouts.dense import DenseMxLayout

    N, K = 40, 288
    w, s, (wc, sc) = _chunk_dense(N, K, order)
    assert wc.shape == (48, 192) and sc.shape == (48, 12)
    assert all(torch.equal(a, b) for a, b in zip(DenseMxLayout("mxfp4", order=order).unpack(wc, sc, (N, K)), (w, s)))
    bias = torch.randn(N)
    for M in (1, 5, 17, 40, 70):
        x = torch.randn(M, K).to(torch.bfloat16)
        ref = mxfp4_linear(x, w, s, bias).float()
        configs = [None, *CHUNK_CONFIGS.values(), dataclasses.replace(CHUNK_CONFIGS["chunk_decode"], split_k=3)]
        configs.append(dataclasses.replace(CHUNK_CONFIGS["chunk_mid64"], split_k=3))  # partial 64-row tiles, split
        for cfg in configs if M <= 40 else [None]:
            out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
            y = linear_mxfp4(x, wc, sc, bias, config=cfg, out=out, order=order)
            assert rel(y, ref) <= 1e-2, (M, cfg, rel(y, ref))
    pick = functools.partial(pick_chunk_config, order=order)
    assert pick(70, 5120, 2880) is None  # past 64 rows: dequantize + cuBLAS
    assert pick(4, 5120, 2880).split_k == 4 and pick(4, 2880, 4096).split_k == 8
    assert pick(64, 2880, 4096).split_k == 4 and pick(64, 5120, 2880).block_n == 64
    # 33-64 rows: one 64-row tile, about 8 K tiles a split, where it fills the GPU (qkv), else two of 32 rows (o); on 5
    # stages in the wgmma order (Hopper's shared memory)
    stages = 5 if order == "wgmma" else 3
    assert pick(33, 5120, 2880).name() == f"m64n64k128s3w4st{stages}x"
    assert pick(64, 2880, 4096).block_m == 32 and pick(32, 5120, 2880).block_m == 32
    # on GB10's 48 SMs both take it (unmeasured there; o's 64-row tile lost on an H200 at every split: CHUNK_MID64)
    assert [pick(64, n, k, 48).name() for n, k in ((5120, 2880), (2880, 4096))] == [
        f"m64n64k128s3w4st{stages}x",
        f"m64n64k128s4w4st{stages}x",
    ]
    # lm_head fills the GPU unsplit: 128 columns, rows as M needs
    assert [pick(m, 201088, 2880).name() for m in (1, 17, 33)] == [f"m{m}n128k128s1w4st3x" for m in (16, 32, 64)]
    with pytest.raises(ValueError, match="chunk order must be wgmma or mma2, got 'rows'"):
        pick_chunk_config(4, 5120, 2880, order="rows")
    with pytest.raises(ValueError, match=r"wgmma-order weights .* do not fit x"):
        linear_mxfp4(torch.randn(2, 256).to(torch.bfloat16), wc, sc, order="wgmma")
    x = torch.randn(3, K).to(torch.bfloat16)
    bad = (torch.empty(4, N, dtype=torch.bfloat16), torch.empty(3, N, dtype=torch.int32), torch.empty(N, 3).T)
    for out in bad:
        with pytest.raises(ValueError, match=r"out .*: expected \[3, N <= 48\] of bfloat16, float16 or float32 with"):
            linear_mxfp4(x, wc, sc, out=out, order=order)
    with pytest.raises(ValueError, match=r"bias \(48,\): expected \[40\]"):
        linear_mxfp4(x, wc, sc, torch.randn(48), out=torch.empty(3, N, dtype=torch.bfloat16), order=order)
    with pytest.raises(ValueError, match=r"out .*\(3, 5\).*: expected \[3, N <= 40\]"):  # rows order: all of W's rows
        linear_mxfp4(x, w, s, out=torch.empty(3, 5, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"out is torch.float32: the dequantize \+ cuBLAS path .* writes x's"):
        linear_mxfp4(torch.randn(70, K).to(torch.bfloat16), wc, sc, out=torch.empty(70, N), order=order)


@pytest.mark.parametrize("order", ["wgmma", "mma2"])
def test_chunk_order_dequantizer_gives_the_plain_bits(order):
    """The chunk orders' prefill dequantizer (each word decoded on its own, its pairs relabelled to natural order) gives
    the reference's bits: a partial last row tile and K tile, E8M0's subnormal, smallest and largest scales (subnormal
    results kept, which the interpreter's float cast in the plain dequantizer flushes; on a GPU the two agree:
    test_linear_chunk_order_on_a_gpu); an output it cannot read as bf16 pairs is refused."""
    from mxrepack.kernels.dequant_mxfp4 import dequantize_chunks

    N, K = 40, 288
    w, s, _ = _chunk_dense(N, K, order)
    s[0, :3] = torch.tensor([0, 1, 254], dtype=torch.uint8)
    wc, sc = _chunk_dense_store(w, s, K, order)
    assert torch.equal(dequantize_chunks(wc, sc, K, order)[:N], dequantize_mxfp4(w, s).to(torch.bfloat16))
    bad = (  # column-major, odd offset, too few rows
        torch.empty(K, 48, dtype=torch.bfloat16).T,
        torch.empty(48 * K + 1, dtype=torch.bfloat16)[1:].view(48, K),
        torch.empty(16, K, dtype=torch.bfloat16),
    )
    for out in bad:
        with pytest.raises(ValueError, match=r"out torch.bfloat16 \(\d+, \d+\) .*: expected bfloat16 \[48, 288\]"):
            dequantize_chunks(wc, sc, K, order, out)
    with pytest.raises(ValueError, match="K a multiple of 32"):
        dequantize_chunks(wc, sc, 280, order)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the chunk orders' PTX decode feeds the GPU's MMA")
def test_linear_chunk_order_on_a_gpu():
    """On a GPU: dense W4A16 in the chunk order its MMA reads (wgmma on Hopper, mma2 under DISABLE_MMA_V3 or on
    sm_8x / sm_12x) at gpt-oss's widths, every row-count class, folded and not, against the reference; the same
    bits on every repeat (the split-K sums in split order); the prefill's dequantizer gives the plain one's bits."""
    import mxrepack.kernels.linear_mxfp4 as lin
    from mxrepack.kernels.dequant_mxfp4 import dequantize_chunks, mma_v3_disabled

    major = torch.cuda.get_device_capability()[0]
    order = "wgmma" if major == 9 and not mma_v3_disabled() else "mma2"
    for N, K in ((5120, 2880), (2880, 4096)):
        w, s, (wc, sc) = _chunk_dense(N, K, order, "cuda")
        bias = torch.randn(N, device="cuda")
        for M in (1, 4, 16, 17, 40, 64, 300):
            x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
            ref = mxfp4_linear(x.cpu(), w, s, bias.cpu()).float()
            for fold in (False, True):
                y = linear_mxfp4(x, wc, sc, bias, fold_scale=fold, order=order)
                assert rel(y.cpu(), ref) <= 1e-2, (N, M, fold, rel(y.cpu(), ref))
                assert all(
                    torch.equal(linear_mxfp4(x, wc, sc, bias, fold_scale=fold, order=order), y) for _ in range(3)
                )
        # repeats after the first launch go straight to its build (launch.Launcher): an activation 2 bytes off the
        # 16-byte alignment Triton specializes on gets its own build, and each keeps its bits, in a CUDA graph too
        M = 16
        flat = torch.randn(M * K + 1, device="cuda").to(torch.bfloat16)
        aligned, offset = flat[: M * K].view(M, K), flat[1:].view(M, K)
        firsts = [linear_mxfp4(x, wc, sc, bias, order=order) for x in (aligned, offset)]
        ref = mxfp4_linear(offset.cpu(), w, s, bias.cpu()).float()
        assert rel(firsts[1].cpu(), ref) <= 1e-2
        kept = set(lin._LAUNCH_CHUNKS._runs)
        for _ in range(2):
            assert all(
                torch.equal(linear_mxfp4(x, wc, sc, bias, order=order), y) for x, y in zip((aligned, offset), firsts)
            )
        assert set(lin._LAUNCH_CHUNKS._runs) == kept  # the repeats reused the builds kept by the first calls
        out = torch.empty_like(firsts[1])
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            linear_mxfp4(offset, wc, sc, bias, order=order, out=out)
        graph.replay()
        assert torch.equal(out, firsts[1])
    # the prefill's dequantizer: the PTX word decode, which no MMA reads, so both orders on any GPU; a partial row tile,
    # E8M0's subnormal, smallest and largest scales
    for N, K in ((5120, 2880), (2880, 4096), (40, 288)):
        w, s, _ = _chunk_dense(N, K, order)
        s[0, :3] = torch.tensor([0, 1, 254], dtype=torch.uint8)
        plain = dequantize_mxfp4_rows(w.cuda(), s.cuda())
        for o in ("wgmma", "mma2"):
            stored = _chunk_dense_store(w, s, K, o, "cuda")
            assert torch.equal(dequantize_chunks(*stored, K, o)[:N], plain), (N, o)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX decode needs a GPU")
def test_scale_shift_on_a_gpu():
    """Scales above 128 on a GPU (gpt-oss's widths): the dispatch's choice with the folded decode and the shift
    (``fold_shift``) gives the bits of the unfolded decode, for each byte order this GPU runs, at decode and tile
    sizes; the chunk orders' GEMVs too."""
    from mxrepack.kernels.dequant_mxfp4 import fold_shift
    from mxrepack.kernels.moe_mxfp4 import check_order

    def runs(order):
        try:
            check_order(order, "bf16", torch.device("cuda"))
            return True
        except ValueError:
            return False

    E, H, I, k = 8, 2880, 2880, 4
    for order in (o for o in ("rows", "wgmma", "mma2") if runs(o)):
        torch.manual_seed(2)
        _, w, _ = _strided_layer(E, H, I, order=order)
        w["w13_weight_scale"].view(-1)[100] = 131
        w["w2_weight_scale"].view(-1)[200] = 129
        w = {n: t.cuda() for n, t in w.items()}
        shift = fold_shift(w["w13_weight_scale"], w["w2_weight_scale"])
        assert shift == 3
        for T in (1, 5, 64, 300):
            x = torch.randn(T, H, device="cuda").to(torch.bfloat16)
            ids = torch.stack([torch.randperm(E)[:k] for _ in range(T)]).cuda()
            wts = torch.softmax(torch.randn(T, k, device="cuda"), -1)
            plain = moe_mxfp4(x, ids, wts, w, order=order)
            shifted = moe_mxfp4(x, ids, wts, w, fold_scale=True, order=order, scale_shift=shift)
            assert torch.isfinite(plain).all() and torch.equal(shifted, plain), (order, T)
            if order != "rows" and T <= 5:
                gemv = CHUNK_GEMVS[order]
                plain = moe_mxfp4(x, ids, wts, w, "bf16", gemv, order=order)
                shifted = moe_mxfp4(x, ids, wts, w, "bf16", gemv, fold_scale=True, order=order, scale_shift=shift)
                assert torch.equal(shifted, plain), (order, T, "gemv")


_TTGIR_ASM = (
    '%r:2 = tt.elementwise_inline_asm "{ prmt.b32 y, z, $4, 0x4000; }" {constraints = "=r,=r,=r,=r,r,r,r", '
    "packed_element = 4 : i32, pure = true} %wb, %sf : tensor<4x32x32xi8, {enc}>, tensor<4x32x32xbf16, {enc}>"
)


@pytest.mark.parametrize(
    "layout,packed",
    [
        ("#ttg.blocked<{sizePerThread = [1, 1, 16], threadsPerWarp = [1, 2, 16], order = [2, 1, 0]}>", True),
        ("#ttg.blocked<{sizePerThread = [1, 1, 2], threadsPerWarp = [1, 2, 16], order = [2, 1, 0]}>", False),
        ("#ttg.linear<{register = [[0, 0, 1], [0, 0, 2], [0, 0, 4]], lane = [[0, 1, 0]], warp = [[1, 0, 0]]}>", True),
        ("#ttg.linear<{register = [[0, 0, 1], [0, 8, 0], [0, 0, 2]], lane = [[0, 1, 0]], warp = [[1, 0, 0]]}>", False),
        ("#ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 8}>", False),  # a layout the check cannot read: refused
    ],
)
def test_wgmma_words_packed_reads_the_decode_layout(layout, packed):
    """The wgmma order's packing test on the TTGIR text: a decode receiving a word's 4 bytes in 4 consecutive
    registers passes; a register basis that moves a byte within its word, too few bytes a thread, or an unreadable
    layout fails; a kernel without such a decode fails too (nothing to vouch for)."""
    from mxrepack.kernels.dequant_mxfp4 import wgmma_words_packed

    assert wgmma_words_packed(f"#enc = {layout}\n" + _TTGIR_ASM.replace("{enc}", "#enc")) is packed
    assert not wgmma_words_packed(f"#enc = {layout}\n%x = arith.addi %a, %b : tensor<4xi32, #enc>")


def test_kernels_check_builds_for_sm12x_without_tma():
    """The sm_12x proof: every shipped configuration AOT-compiles for sm_121a (GB10) and sm_90a with Triton's ptxas
    (the wgmma order's kernels for sm_90a only: Hopper's fragment), fits 101376 bytes of shared memory, has no TMA,
    and W4A4 uses the native FP4 MMA on sm_12x (the decode GEMVs' inline PTX included). Two of the check's four
    architectures, for the suite's time: `repack kernels check` without ``--arch`` builds sm_100a and sm_120a too,
    and runs whole before each stop (docs/PERF_LOG.md)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "mxrepack.cli", "kernels", "check", "--json", "--arch", "90", "--arch", "121"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = json.loads(proc.stdout)
    assert {r["arch"] for r in records} == {"sm_90a", "sm_121a"}
    assert {r["kernel"] for r in records} == {
        "linear_mxfp4",
        "moe_gate_up_swiglu",
        "moe_down_combine",
        "gemv_mxfp4",
        "gemv_mxfp4_f16x2",
        "gemv_mxfp4_f16x2_rows",
        "gemv_prepare_x",
        "gemv_moe_gate_up_f16x2",
        "gemv_moe_down",
        "gemv_moe_gate_up_mma2",
        "gemv_moe_down_mma2",
        "gemv_moe_gate_up_wgmma",
        "gemv_moe_down_wgmma",
        "dequant_mxfp4",
        "split_pairs",
        "linear_chunks",
        "dequant_chunks",
        "moe_schedule_count",
        "moe_schedule_place",
        "moe_schedule_combine",
    }
    # each chunk order's decode GEMVs built where that order runs
    assert {r["arch"] for r in records if r["kernel"].endswith("_wgmma")} == {"sm_90a"}
    assert {r["arch"] for r in records if r["kernel"].endswith("_mma2")} == {"sm_121a"}
    # the chunk orders' MoE and dense tiles, and the dense tiles' dequantizer, each order built where it runs
    chunk_tiles = [
        r
        for r in records
        if r["kernel"].startswith(("moe_", "linear_chunks")) and any(o in r["config"] for o in ("wgmma", "mma2"))
    ]
    assert {r["arch"] for r in chunk_tiles} == {"sm_90a", "sm_121a"}
    for order, arch in (("wgmma", "sm_90a"), ("mma2", "sm_121a")):
        assert {r["arch"] for r in records if r["kernel"].endswith("_chunks") and order in r["config"]} == {arch}
    for r in chunk_tiles:  # their weight and scale copies modelled, and none over its ideal (stop 37)
        assert r["copies_modelled"] >= 2 and r["copy_wavefronts_over_ideal"] == 1, r
    for r in records:
        assert r["ok"] and not r["tma"], r
        cuda_cores = r["kernel"].startswith(("gemv_", "moe_schedule", "dequant_", "split_pairs"))
        assert bool(r["mma"]) != cuda_cores, r  # the GEMVs, the dequantizers and the activation reorder have no MMA
        if r["arch"] in ("sm_120a", "sm_121a"):
            assert r["shared_bytes"] <= 101376
            if r["mode"] == "w4a4":
                assert any("kind::mxf4nvf4.block_scale" in m for m in r["mma"])


_PIPELINED_SWAP = """
import dataclasses, json, triton
from triton.backends.compiler import GPUTarget
from mxrepack.kernels import check, dequant_mxfp4, moe_mxfp4 as moe
def ptx(s, warps=4):
    return triton.compile(check.specialized(s), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": 3}).asm["ptx"]
def shape(s, warps=4):  # groups left in flight, registers written under one
    p = ptx(s, warps)
    return [check.wgmma_left_in_flight(p), len(dequant_mxfp4.wgmma_register_hazards(p))]
cfg = moe.MoeConfig(16, 64, 128, num_warps=4, num_stages=3, swap_ab=True)
src = check._moe_sources("bf16", cfg)["moe_down_combine"]
plain = check._moe_sources("bf16", dataclasses.replace(cfg, swap_ab=False))["moe_down_combine"]
overlap = moe.MoeConfig(128, 128, 128, 8, 3, swap_ab=True, fold_scale=True, order="wgmma", wait_mma=False)
ov = check._moe_sources("bf16", overlap)["moe_gate_up_swiglu"]
print(json.dumps([triton.__version__, shape(check.for_arch(src, 90)), shape(src), shape(plain), shape(ov, 8)]
                 + [check.check_one("moe_down_combine", cfg.name(), "w4a16", src, 4, 3, cap)["error"]
                    for cap in (90, 100, 121)]
                 + [check.check_one("moe_gate_up_swiglu", overlap.name(), "w4a16", ov, 8, 3, 90)["error"]]))
"""


def test_pipelined_swap_waits_for_every_wgmma():
    """The rows order's swapped-operand tile, pipelined on sm_90a, waits for each wgmma before the next decode
    (dequant_mxfp4.mma_done); built without it, a wgmma stays in flight across the loop's back edge while the next
    decode rewrites its register operand (triton-lang/triton#9433), which the check's hazard walk finds. The unswapped
    tile (W in shared memory) may keep its wgmma in flight, and so may the wgmma order's tile (``wait_mma=False``, the
    wide tiles' choice): its operand copied per k16 step (``dequant_mxfp4.fresh_operand``), no build writes a register
    a pending wgmma reads, under Triton 3.6 (one group a k16 step, waited to depth 7) or 3.9 (two dots)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _PIPELINED_SWAP], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    version, waited, not_waited, plain, overlap, *errors = json.loads(proc.stdout.strip().splitlines()[-1])
    assert waited == [0, 0] and not_waited[0] > 0 and not_waited[1] > 0, (waited, not_waited)
    assert plain[0] > 0 and plain[1] == 0 and overlap[0] > 0, (plain, overlap)
    assert overlap[1] == 0 and errors == [None, None, None, None], (version, overlap, errors)


def test_wgmma_register_hazards_reads_groups_waits_and_back_edges():
    """The hazard walk on hand-written PTX: a write to a pending wgmma's A register or accumulator is found, in the
    same pass or across a loop's back edge (predicated, or ``bra.uni``), whatever its form (a vector destination, a
    predicated write); a wait to depth 0, or one deep enough to leave only later groups, clears it; a wgmma writing
    the accumulator a pending one reads (a chain) is not a hazard; a read of a pending accumulator is; a wgmma reading
    a register written after the last ``wgmma.fence`` is; Triton 3.6's in-flight form without the operand copy (one
    group a k16 step waited to depth 7, the next K tile decoded into the groups' own registers) is, and with each
    step's operand packed just before its own fence it is not; an A operand in shared memory (a descriptor) reads no
    registers; a wgmma whose registers it cannot read raises."""
    from mxrepack.kernels.dequant_mxfp4 import wgmma_register_hazards as walk_ptx

    mma = "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%f1,%f2}, {%r10,%r11,%r12,%r13}, %rd1, p, 1, 1, 0;"
    mma2 = mma.replace("%r10,%r11,%r12,%r13", "%r20,%r21,%r22,%r23")
    fence, commit = "wgmma.fence.sync.aligned;", "wgmma.commit_group.sync.aligned;"
    wait0, wait1 = "wgmma.wait_group.sync.aligned 0;", "wgmma.wait_group.sync.aligned 1;"

    def walk(*lines):
        return walk_ptx("\n".join(lines))

    assert walk(fence, mma, commit, "mov.b32 %r11, %r5;")  # the A operand rewritten in flight
    assert walk(fence, mma, commit, "@%p2 mov.b32 %r11, %r5;")  # predicated
    assert walk(fence, mma, commit, "ld.shared.v2.b32 {%r12, %r13}, [%r7];")  # a vector destination
    assert walk(fence, mma, commit, "add.f32 %f2, %f2, %f3;")  # the accumulator written
    assert walk(fence, mma, commit, "st.shared.f32 [%r7], %f1;")  # ... or read
    assert not walk(fence, mma, commit, wait0, "mov.b32 %r11, %r5;", "st.shared.f32 [%r7], %f1;")
    assert not walk(fence, mma, commit, fence, mma2, commit, wait1, "mov.b32 %r11, %r5;")  # the older group is done
    assert walk(fence, mma, commit, fence, mma2, commit, wait1, "mov.b32 %r21, %r5;")  # the newer one is not
    assert not walk(fence, mma, commit, fence, mma2, commit)  # a chain: the second writes what the first reads
    assert walk("mov.b32 %r11, %r5;", fence, mma, commit, "mov.b32 %r20, %r5;", mma2, commit, wait0)  # unfenced
    loop = ["$L__BB0_1:", "mov.b32 %r11, %r5;", fence, mma, commit, "@%p1 bra $L__BB0_1;", wait0]
    assert walk(*loop)  # in flight at the back edge, rewritten by the next iteration
    assert walk(*[ln.replace("@%p1 bra", "bra.uni") for ln in loop])
    assert not walk(*loop[:5], wait0, *loop[5:])
    # Triton 3.6's in-flight form, 2 k16 steps: the K tile decoded first, each step a group waited to depth 1
    steps = [(f"%r1{k}0", mma.replace("%r10,%r11,%r12,%r13", f"%r1{k}0,%r1{k}1,%r1{k}2,%r1{k}3")) for k in (1, 2)]
    decode = [f"lop3.b32 {r}, %r5, %r6, %r7, 0x96;" for r, _ in steps]
    body = [ln for _, m in steps for ln in (fence, m, commit, wait1)]
    assert walk("$L__BB0_2:", *decode, *body, "@%p1 bra $L__BB0_2;", wait0)
    # the same with each step's operand packed from copies just before its own fence (dequant_mxfp4.fresh_operand)
    packed = [
        ln
        for (r, m), d in zip(steps, decode)
        for ln in (d.replace(r, "%r9"), f"mov.b32 {r}, %r9;", fence, m, commit, wait1)
    ]
    assert not walk("$L__BB0_3:", *packed, "@%p1 bra $L__BB0_3;", wait0)
    smem_a = "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%f1,%f2}, %rd4, %rd1, p, 1, 1, 0;"
    assert not walk(fence, smem_a, commit, "mov.b32 %r11, %r5;")
    with pytest.raises(ValueError, match="cannot read this wgmma"):
        walk(fence, "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {}, {}, %rd1, p, 1, 1, 0;")


def test_shared_copy_wavefronts_models_the_chunk_copies_before_and_after():
    """The bank-conflict model of the kernels check on the layouts Triton 3.6 chose for the 128 x 128 wgmma tile's
    weight and scale copies before stop 37 (a warp across 16 blocks, 1 KB / 256 bytes apart: ncu counted 16 and 32
    wavefronts where 4 and 2 would do) and after (each block one row: ideal); a swizzle spreads the rows' banks."""
    from mxrepack.kernels import check

    copy = (
        "%c = ttg.async_copy_global_to_local %p, %b mask %m {{contiguity = {c} : i32}} : "
        "tensor<{s}x!tt.ptr<i8>, #src> -> <{s}xi8, #dst, #smem, mutable>"
    )

    def wavefronts(src, dst, shape, contiguity):
        ttgir = f"#src = #ttg.blocked<{{{src}}}>\n#dst = #ttg.swizzled_shared<{{{dst}}}>\n"
        line = copy.format(c=contiguity, s=shape)
        ttgir += line if contiguity else line.replace(f"{{contiguity = {contiguity} : i32}} ", "")
        (got,) = check.shared_copy_wavefronts(ttgir)
        return got["wavefronts"], got["ideal"]

    flat3 = "vec = 1, perPhase = 1, maxPhase = 1, order = [2, 1, 0]"
    before_w = "sizePerThread = [1, 1, 16], threadsPerWarp = [16, 1, 2], warpsPerCTA = [1, 8, 1], order = [2, 0, 1]"
    before_s = "sizePerThread = [1, 1, 8], threadsPerWarp = [16, 2, 1], warpsPerCTA = [1, 8, 1], order = [2, 0, 1]"
    assert wavefronts(before_w, flat3, "16x32x32", 16) == (16, 4)
    assert wavefronts(before_s, flat3, "16x32x8", 8) == (16, 2)
    flat2 = "vec = 1, perPhase = 1, maxPhase = 1, order = [1, 0]"
    after_w = "sizePerThread = [1, 16], threadsPerWarp = [1, 32], warpsPerCTA = [4, 2], order = [1, 0]"
    after_s = "sizePerThread = [1, 8], threadsPerWarp = [1, 32], warpsPerCTA = [8, 1], order = [1, 0]"
    assert wavefronts(after_w, flat2, "16x1024", 16) == (4, 4)
    assert wavefronts(after_s, flat2, "16x256", 8) == (2, 2)
    # a swizzled 64 x 64-byte buffer filled 8 bytes a lane, 4 rows a warp: copies of all 8 bytes are ideal; where the
    # pipeliner wrote a contiguity of 4 (a masked copy), each copy moves 4 and spans two wavefronts' banks for one's
    # bytes
    rows = "sizePerThread = [1, 8], threadsPerWarp = [4, 8], warpsPerCTA = [4, 1], order = [1, 0]"
    swizzled = "vec = 8, perPhase = 2, maxPhase = 4, order = [1, 0]"
    assert wavefronts(rows, swizzled, "64x64", 8) == (2, 2)
    assert wavefronts(rows, swizzled, "64x64", 4) == (2, 1)
    assert wavefronts(rows, swizzled, "64x64", None) == (2, 2)  # no contiguity written: the thread's whole run


_FOLDED_PTX = """
import dataclasses, json, triton
from triton.backends.compiler import GPUTarget
from mxrepack.kernels import check, linear_mxfp4 as lin
out = []
for fold in (False, True):
    cfg = dataclasses.replace(lin.DECODE_WIDE, fold_scale=fold)
    src = check.for_arch(check._linear_source("w4a16", cfg), 90)
    ptx = triton.compile(check.specialized(src), target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}).asm["ptx"]
    out.append([ptx.count("fma.rn.bf16x2"), "0x7e807e80" in ptx])
print(json.dumps(out))
"""


def test_folded_decode_halves_the_packed_multiplies():
    """The swapped lm_head decode tile built with ``fold_scale``: half the packed bf16 multiplies, and no 2^126."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _FOLDED_PTX], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (plain, bias), (folded, folded_bias) = json.loads(proc.stdout.strip().splitlines()[-1])
    assert bias and not folded_bias and folded * 2 == plain > 0


_VECTOR_LOADS = """
import json, re, triton
from triton.backends.compiler import GPUTarget
from mxrepack.kernels import check, moe_mxfp4 as moe
cfg = moe.MOE_GEMV.gate_up
src = check._moe_gemv_sources(moe.MOE_GEMV)["gemv_moe_gate_up_f16x2"]
ptx = {name: triton.compile(s, target=GPUTarget("cuda", 90, 32), options=cfg.launch_options()).asm["ptx"]
       for name, s in (("launched", check.specialized(src)), ("bare", src))}
print(json.dumps({name: len(re.findall(r"ld\\.global[\\w.:]*\\.v4", p)) for name, p in ptx.items()}))
"""


def test_kernels_check_compiles_as_launched():
    """The check compiles each kernel with a gpt-oss launch's alignment facts: there, the MoE GEMV's weight
    and activation loads are 16 bytes wide, as they run; without them Triton cannot prove it and narrows them."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _VECTOR_LOADS], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    v4 = json.loads(proc.stdout.strip().splitlines()[-1])
    assert v4["launched"] > 0 and v4["bare"] < v4["launched"], v4


def test_decode_counters_reserved_for_every_gemv_call():
    """The vLLM plugin reserves the decode combine's arrival counters at load, before CUDA graph capture: every T the
    GEMV path takes then finds them allocated (a capture would record their zeroing without running it)."""
    from mxrepack.kernels import arrival
    from mxrepack.kernels.moe_mxfp4 import GEMV_MAX_ASSIGNMENTS, reserve_decode_counters

    dev = torch.device("cpu")
    buf = reserve_decode_counters(dev, 2944)  # returned for the plugin to keep among the layer's buffers
    assert buf is arrival._COUNTERS[(dev, "moe_combine")]
    most = GEMV_MAX_ASSIGNMENTS * (2944 // MOE_GEMV.down.block_n)  # T <= T * k <= GEMV_MAX_ASSIGNMENTS
    assert arrival.arrival_counters(dev, most, "moe_combine") is buf and not buf.any()
    # the chunk orders' GEMVs: a counter per token and down row tile (16 rows a block)
    for gemv in CHUNK_GEMVS.values():
        most_chunks = CHUNK_GEMV_MAX_ASSIGNMENTS * (2944 // (16 * gemv.down_blocks))
        assert arrival.arrival_counters(dev, most_chunks, "moe_combine") is buf


def test_split_pairs_kernel_is_the_reshape():
    """split_pairs' kernel against the reshape it replaced (stop 49): each 128-column tile's even columns then its odd
    ones, zero-padded to the width; a K of no whole tile, a strided view, a wider width, no rows."""
    from mxrepack.kernels.dequant_mxfp4 import split_pairs

    def reference(x, width):
        T, K = x.shape
        x = torch.nn.functional.pad(x, (0, width - K))
        return x.reshape(T, width // 128, 64, 2).transpose(2, 3).reshape(T, width)

    torch.manual_seed(6)
    x = torch.randn(5, 2 * 288).to(torch.bfloat16)
    for view, width in (
        (x[:, :288], 384),
        (x[:, ::2], 384),
        (x[:3, :256], 256),
        (x[:3, :256], 512),
        (x[:0, :288], 384),
    ):
        got = split_pairs(view, width)
        assert got.shape == (view.shape[0], width) and torch.equal(got, reference(view, width)), (view.stride(), width)
    with pytest.raises(ValueError, match="multiple of 128 and at least 288"):
        split_pairs(x[:, :288], 256)


def test_launch_call_key():
    """A known build is reused only for a call Triton would give the same build (launch.call_key): a tensor's dtype
    and its address modulo 256 (16-byte divisibility is Triton's specialization), an integer's value, a bool apart
    from an int, each constant and the launch shape all tell calls apart; another view at the same address does not."""
    from mxrepack.kernels.launch import call_key

    buf = torch.zeros(64, dtype=torch.bfloat16)
    args = (buf[:16], 5, True)
    base = call_key((1, 2, 1), args, 4, 3, {"ORDER": "wgmma"})
    assert call_key((1, 2, 1), (buf[:16], 5, True), 4, 3, {"ORDER": "wgmma"}) == base  # another view, same address
    others = [
        call_key((1, 2, 1), (buf[8:24], 5, True), 4, 3, {"ORDER": "wgmma"}),  # 16 bytes on
        call_key((1, 2, 1), (buf[:16].float(), 5, True), 4, 3, {"ORDER": "wgmma"}),
        call_key((1, 2, 1), (buf[:16], 6, True), 4, 3, {"ORDER": "wgmma"}),
        call_key((1, 2, 1), (buf[:16], 5, 1), 4, 3, {"ORDER": "wgmma"}),
        call_key((1, 2, 1), args, 4, 3, {"ORDER": "mma2"}),
        call_key((1, 2, 2), args, 4, 3, {"ORDER": "wgmma"}),
        call_key((1, 2, 1), args, 8, 3, {"ORDER": "wgmma"}),
        call_key((1, 2, 1), args, 4, 4, {"ORDER": "wgmma"}),
    ]
    assert all(k != base for k in others) and len(set(others)) == len(others)


def test_dequantize_cublas_path_records_no_autograd():
    """Past 64 rows (dequantize + cuBLAS) with a bias and activations that require grad, as vLLM's linear layers
    leave their bias: the product as without, nothing recorded for autograd (as the Triton kernels record nothing),
    where torch's addmm(out=) refused it (the plugin's warm-up at load failed on q/k/v/o; PERF_LOG stop 44)."""
    from mxrepack.kernels.dequant_mxfp4 import DEQUANT

    torch.manual_seed(4)
    N, K, M = 48, 288, 70
    w, s = (
        torch.randint(0, 256, (N, K // 2), dtype=torch.uint8),
        torch.randint(118, 128, (N, K // 32), dtype=torch.uint8),
    )
    x, bias = torch.randn(M, K).to(torch.bfloat16), torch.randn(N).to(torch.bfloat16)
    plain = linear_mxfp4(x, w, s, bias, config=DEQUANT)
    y = linear_mxfp4(x.clone().requires_grad_(), w, s, torch.nn.Parameter(bias.clone()), config=DEQUANT)
    assert torch.equal(y, plain) and not y.requires_grad
    assert rel(y, mxfp4_linear(x, w, s, bias).float()) <= 1e-2


def test_launcher_reuses_only_checked_builds(monkeypatch):
    """launch.Launcher with stand-ins for a compiled kernel and a CUDA tensor (the interpreter never takes the reuse
    path): the first call of a kind through Triton, its build checked and then launched straight with every
    argument in the kernel's order; a new integer value through Triton again; a build the check rejects never kept,
    so each call that would run it raises."""
    from mxrepack.kernels import launch

    log = []

    class Build:
        def __init__(self, n):
            self.n = n

        def __getitem__(self, grid):
            return lambda *args: log.append(("kept", grid, args))

    class Kernel:
        def __getitem__(self, grid):
            def run(*args, num_warps, num_stages, **constants):
                log.append(("triton", grid, args, constants))
                return Build(args[1])

            return run

    class CudaLike(torch.Tensor):
        is_cuda = True

    def check(build):
        if build.n == 13:
            raise RuntimeError("rejected build")

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    launcher = launch.Launcher(Kernel(), check=check)
    launcher.compiled, launcher.names = True, ("x_ptr", "n", "BLOCK", "ORDER")  # as a JITFunction's would be
    x = torch.zeros(64).as_subclass(CudaLike)
    for _ in range(2):
        launcher((4, 1, 1), x, 7, num_warps=4, num_stages=3, ORDER="mma2", BLOCK=16)
    assert [e[0] for e in log] == ["triton", "kept"] and log[1][2][1:] == (7, 16, "mma2")  # signature order
    launcher((4, 1, 1), x, 8, num_warps=4, num_stages=3, ORDER="mma2", BLOCK=16)
    assert log[-1][0] == "triton"
    for _ in range(2):
        with pytest.raises(RuntimeError, match="rejected build"):
            launcher((4, 1, 1), x, 13, num_warps=4, num_stages=3, ORDER="mma2", BLOCK=16)
    assert [e[0] for e in log[-2:]] == ["triton", "triton"]
