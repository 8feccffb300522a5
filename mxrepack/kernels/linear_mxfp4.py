"""Dense MXFP4 GEMM ``y = x @ W.T + b`` in Triton, for any K % 32 == 0 and any N (gpt-oss: 2880 wide).

W is MXFP4 in the plain ``strided`` form: packed E2M1 bytes ``[N, K/2]`` (low nibble = even k) and raw
E8M0 scales ``[N, K/32]``, row-major, no TMA descriptors and no swizzled shared-memory layouts, so the
same kernel compiles for sm_90a, sm_100a and sm_120a/sm_121a (``repack kernels check``). Modes:

* ``w4a16`` -- BF16 activations: ``tl.dot_scaled(bf16, e2m1)``; Triton upcasts W in registers;
* ``w4a8``  -- activations quantized on the fly to MXFP8 E4M3 with E8M0 group scales (``mx_quant``);
* ``w4a4``  -- activations quantized to MXFP4: e2m1 x e2m1, the native FP4 tensor-core MMA on sm_12x
  (``mma.sync ... kind::mxf4nvf4.block_scale``).

One kernel, two schedules: prefill tiles M and N; decode (M <= 16) uses a 16-row tile and split-K, so
that a narrow layer (k/v: N = 512) still puts enough CTAs in flight to stream the weights at full
bandwidth; each split stores its fp32 partial and the last split of a tile to finish sums them in split
order, adds the bias and writes the output (:mod:`mxrepack.kernels.arrival`: one launch, the same bits
every run). W4A16 at 17-64 rows on a narrow layer splits K too (64-row tiles). W4A16 with few rows
(:func:`use_gemv`) goes to the CUDA-core GEMV of :mod:`mxrepack.kernels.gemv_mxfp4` instead, and W4A16 past
decode otherwise (:func:`use_dequant_gemm`) dequantizes W a slab at a time and calls cuBLAS
(:mod:`mxrepack.kernels.dequant_mxfp4`).
W4A16 on weights in a chunk order (the dense layout's ``order`` "wgmma" / "mma2", padded to 16 rows and 128 codes)
runs :func:`linear_chunks` instead: the MoE tiles' decode straight into the MMA's first operand, K split at decode,
dequantize + cuBLAS past 64 rows.
The torch reference is :func:`mxrepack.kernels.reference.mxfp4_linear`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mxrepack.kernels import cdiv
from mxrepack.kernels.arrival import arrival_counters, last_to_arrive, reset_counter
from mxrepack.kernels.dequant_mxfp4 import (
    DEQUANT,
    DequantConfig,
    check_chunk_build,
    check_fold_scale,
    check_order,
    chunk_dots,
    dot_bf16_mxfp4,
    dot_w_mxfp4,
    interpreting,
    linear_dequant_gemm,
    load_split,
    mma_reads_registers_async,
    mma_v3_disabled,
    runs_ptx,
    split_pairs,
    wgmma_chunks,
    with_fold,
)
from mxrepack.kernels.gemv_mxfp4 import GemvConfig, fills_with_rows, gemv_mxfp4, is_wide, pick_gemv_config, sm_count
from mxrepack.kernels.launch import Launcher
from mxrepack.kernels.mx_quant import quantize_activations

MODES = {"w4a16": "bf16", "w4a8": "e4m3", "w4a4": "e2m1"}


def fills_gpu(N: int, sm_count: int = 132) -> bool:
    """Enough 64-row N tiles to fill the GPU (two per SM) without split-K: lm_head, not q/k/v/o."""
    return cdiv(N, DECODE.block_n) >= 2 * sm_count


def use_dequant_gemm(M: int, N: int, sm_count: int = 132) -> bool:
    """W4A16 shapes that dequantize W slab by slab and multiply with cuBLAS (dequant_mxfp4) instead of the
    tile kernel: past decode the GEMM is math-bound and Hopper has no BF16 x E2M1 tensor-core MMA to do it
    in one kernel. H100, graph-timed (docs/PERF_LOG.md): from 17 rows on layers under 65536 rows, but not at 17-64
    rows on a layer that does not :func:`fills_gpu` (q/k/v/o), where split-K's :data:`MID_SPLIT` tiles win; from 256
    on lm_head (at 64-128 rows its 1.2 GB BF16 round trip still costs more than the tile kernel's upcasts)."""
    if M <= 16:
        return False
    return M >= 256 or (N < 65536 and (M > MID_SPLIT.block_m or fills_gpu(N, sm_count)))


def use_gemv(M: int, N: int, sm_count: int = 132) -> bool:
    """W4A16 shapes where the CUDA-core GEMV beats the 16-row tensor-core tile (same-run sweeps, docs/PERF_LOG.md):
    one row always; on narrow layers (not ``gemv_mxfp4.is_wide``) two rows, and four where the layer has rows enough to
    fill the GPU with them (``gemv_mxfp4.fills_with_rows``: qkv, not o). Not lm_head past one row: its 4-row GEMV took
    0.24 ms against the swapped tile's 0.158 (its M = 2 one 0.161)."""
    return M == 1 or (not is_wide(N, sm_count) and (M == 2 or (M == 4 and fills_with_rows(N, sm_count))))


@dataclass(frozen=True)
class LinearConfig:
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    manual_dequant: bool = False  # W4A16 only: integer-op dequant + tl.dot instead of tl.dot_scaled
    # W4A16 only: W the MMA's first operand, decoded in registers (dequant_mxfp4.dot_w_mxfp4), x in split order
    swap_ab: bool = False
    # swap_ab on CUDA, weights with E8M0 scales <= 128 only: E2M1's 2^126 folded into the scale (MoeConfig.fold_scale)
    fold_scale: bool = False

    def __post_init__(self):
        if self.fold_scale and not self.swap_ab:
            raise ValueError("fold_scale is a decode of the swapped operands: it needs swap_ab")
        if self.swap_ab and (self.block_k != 128 or self.manual_dequant):
            raise ValueError(
                f"swap_ab reads one 128-code K tile per step and decodes W itself: block_k must be 128 "
                f"and manual_dequant off, got {self.block_k} and {self.manual_dequant}"
            )

    def name(self) -> str:
        return (
            f"m{self.block_m}n{self.block_n}k{self.block_k}s{self.split_k}w{self.num_warps}st{self.num_stages}"
            + ("d" if self.manual_dequant else "")
            + ("x" if self.swap_ab else "")
            + ("f" if self.fold_scale else "")
        )

    @property
    def math(self) -> str:
        """The decode on CUDA: ``dequant_mxfp4.dequant_pairs``' MATH (the interpreter and CPU take "ops")."""
        return "asm-fold" if self.fold_scale else "asm"


# The shipped configurations (``repack kernels check`` compiles each for every arch). Stages are kept
# so that every one fits sm_12x's 101376 bytes of shared memory.
# Decode: the best of a 72-config sweep on lm_head M=1 (H200, docs/PERF_LOG.md): integer-op dequant + tl.dot.
DECODE = LinearConfig(16, 64, 256, split_k=1, num_warps=4, num_stages=3, manual_dequant=True)
DECODE_SPLIT = LinearConfig(16, 64, 256, split_k=4, num_warps=4, num_stages=3, manual_dequant=True)
# W4A16 decode on a layer wide enough to fill the GPU without split-K (lm_head): the swapped operands (W decoded
# in registers as the MMA's first operand), pipelined on wgmma (each wgmma waited for before the next decode:
# dequant_mxfp4.mma_done, triton-lang/triton#9433). H100, lm_head, benchmarks/peers.py --sweep-dense 4,16,64
# --sweep-kind swap / swap-deep (2026-11-25, 6be01f8 and 2c2c09a, docs/bench/dense_sweep_swap_fenced_h100_2026-11-25_
# 6be01f8.json, ..._deep_lm_head_h100_2026-11-25_2c2c09a.json): 0.175 vs 0.201 ms at M = 4 and 0.182-0.187 vs
# 0.210-0.213 at M = 16 for the 2-warp mma.sync tile shipped before. On the split-K layers the swap lost on qkv
# (0.0177 vs 0.0162 ms at M = 4) and tied on o (0.0142 vs 0.0145): they keep DECODE. MXFP8/MXFP4 activations keep
# DECODE too. For a weight whose scales fit (dequant_mxfp4.fits_fold), this tile and PREFILL_SMALL run with the
# scale folded (``fold_scale``, pick_config), same bits: lm_head M = 4/16/64 0.1688/0.1746/0.2781 ms against
# 0.1756/0.1860/0.2968 unfolded (H100, same run, peers.py --sweep-dense 4,16,64 --sweep-kind fold, 8860140,
# docs/bench/dense_sweep_fold_h100_2026-11-25_8860140.json).
DECODE_WIDE = LinearConfig(16, 64, 128, split_k=1, num_warps=4, num_stages=3, swap_ab=True)
PREFILL = LinearConfig(128, 128, 128, num_warps=8, num_stages=3)
# W4A16 at 17-64 rows on a layer too narrow to fill the GPU (q/k/v/o), split-K to about two programs per SM as in
# decode (this is qkv's 4 splits; o takes 8): against the dequantize + cuBLAS path shipped before, H100, same run,
# peers.py --sweep-dense 24,32,48,64 --sweep-kind stream-k --sweep-shapes qkv,o at 127bdda (its split-K tiles; the
# kind went with the stream-K decode, which lost), docs/bench/dense_sweep_mid_h100_2026-11-25_127bdda.json: o
# 0.0153-0.0157 ms against 0.0192-0.0203 at M = 24-64 (8 splits; 4: 0.0173-0.0180), qkv 0.0176-0.0180 against
# 0.0196-0.0202 (4 splits; 8: 0.0185-0.0195)
MID_SPLIT = LinearConfig(64, 64, 128, split_k=4, num_warps=4, num_stages=3)
# Between decode and the dequantize + cuBLAS path (lm_head at 17-255 rows): the swapped operands, pipelined as
# DECODE_WIDE, 0.298 vs 0.367 ms at M = 64 for the integer-op dequant shipped before (same sweeps; 64 x 64: 0.362).
# MXFP8/MXFP4 activations take tl.dot_scaled in the same tile.
PREFILL_SMALL = LinearConfig(64, 128, 128, num_warps=4, num_stages=3, swap_ab=True)
CONFIGS = {
    "decode": DECODE,
    "decode_split": DECODE_SPLIT,
    "decode_wide": DECODE_WIDE,
    "prefill": PREFILL,
    "prefill_small": PREFILL_SMALL,
    "mid_split": MID_SPLIT,
}

# W4A16 on weights in a chunk order (the dense layout's ``order`` "wgmma" / "mma2": row tiles of 16, each K tile's
# 16 x 64-byte chunk in the MMA operand's order, the MoE tiles' decode of 8 codes in about 13 instructions), the tokens
# the MMA's second operand, K split as the plain order's decode tiles: to about two programs per SM at up to 16 rows,
# at most 4 splits at 17-64 rows; past 64 rows dequantize + cuBLAS (the 128 x 128 chunk tile took 0.127 / 0.101 ms
# at M = 2048 against cuBLAS BF16's 0.092 / 0.076). From a same-run sweep of up to 48 tiles a size (H100,
# benchmarks/experiments/dense_chunk_probe.py, 2026-11-28, docs/bench/dense_chunk_probe_{wgmma,mma2}_h100_2026-11-28_
# c392dd9.json; the wgmma order on Hopper, the mma2 order under DISABLE_MMA_V3): 16 x 64 best at M = 4 and 16 (qkv 4
# splits, o 8: 0.0075-0.0087 ms against the plain order's shipped 0.0117-0.0143), 32 x 64 with 4 splits at M = 64
# (wgmma: qkv 0.0116, o 0.0105 against 0.0185 / 0.0163; 8 splits slower; keeping the wgmmas in flight within 1-3%);
# since 6210126 qkv's 33-64 rows take CHUNK_MID64 (below).
CHUNK_DECODE = LinearConfig(16, 64, 128, num_warps=4, num_stages=3, swap_ab=True)
CHUNK_MID = LinearConfig(32, 64, 128, num_warps=4, num_stages=3, swap_ab=True)
CHUNK_MID_MAX_SPLIT = 4
# At 33-64 rows, W decoded once per 64 tokens (one 64-row tile, not two of 32) with K split to about 8 K tiles a
# program, where that still launches 1.5 programs per SM (qkv on an H200, not o); else CHUNK_MID as above. That bound
# is fitted to these two layers on 132 SMs: with fewer SMs (GB10's 48, an H100 PCIe's 114) o takes the 64-row tile too,
# unmeasured there, though on the H200 o's 64-row tile lost to CHUNK_MID at every split from 2 to 8. Same-run
# probe of 2-6 and 8 splits (H200, 2026-11-28, c81987d, ``dense_chunk_probe.py time OUT qkv,o 1,16,64 splits``,
# docs/bench/dense_chunk_probe_splits_{wgmma,mma2}_h200_2026-11-28_c81987d.json), ms at 64 rows: qkv (23 K tiles) 64 x
# 64 with 3 splits 0.0104 against CHUNK_MID's 4 splits 0.0110 (wgmma; cuBLAS BF16 0.0101) and 0.0126 against 0.0152
# (mma2); o (32 K tiles, 45 column tiles: 180 programs at 64 rows) best on CHUNK_MID with 4 splits (0.0098; 64 x 64
# with 4 splits 0.0109)
CHUNK_MID64 = LinearConfig(64, 64, 128, num_warps=4, num_stages=3, swap_ab=True)
CHUNK_MID64_K_TILES = 8
# The wgmma order (Hopper only) takes that tile on 5 stages: about 100 KB of shared memory a program, so two still fit
# an SM's 228 KB (6 stages, about 123 KB, leave room for one: 39% longer). cuBLAS's own form at 64 rows, few programs
# on a deep pipeline (80 blocks of 64 x 64 unsplit, 13 stages: bf16_gemm_probe.py kernels), lost here at every depth
# unsplit (0.0134-0.0145 ms, dense_chunk_probe_stages_wgmma_h200_2026-11-29_1b68cb3.json). Same-run probe of the
# dispatch's tiles on 2-6 stages, each twice (H200, 2026-11-29, 1b68cb3, ``dense_chunk_probe.py time OUT qkv,o,lm_head
# 4,16,32,48,64 pick-stages``, docs/bench/dense_chunk_probe_pick_stages_{wgmma,mma2}_h200_2026-11-29_1b68cb3.json), qkv
# at 48 / 64 rows, ms: 3 stages 0.01000 / 0.01041, 4 0.00988 / 0.01033, 5 0.00969 / 0.01015, 6 0.01347 / 0.01407 (cuBLAS
# BF16 0.0101); the mma2 order's best on 3 (4 and 5 2-5% slower); the other q/k/v/o tiles, both orders, best on 3 or
# within 2% of it (o's 32-row tile at 32 rows 2% faster on 4 in the wgmma order, not taken). A/B of the two
# dispatches, twice each, in one call on another H200 (dense_chunk_ab_stages_{wgmma,mma2}_h200_2026-11-29_1b68cb3.json):
# qkv at 48 / 64 rows 0.0100 / 0.0103 -> 0.0097 / 0.0101 ms (cuBLAS 0.0101), everything else within 1%
CHUNK_MID64_WGMMA = dataclasses.replace(CHUNK_MID64, num_stages=5)
# On a layer that fills the GPU unsplit (lm_head): 128 columns a tile, and as many rows as M needs up to 64, so that W
# is decoded once per 64 tokens rather than once per 32. Same-run probe (H200, 2026-11-28, 21c0cdf, docs/bench/
# dense_chunk_probe_{wgmma,mma2}_h200_2026-11-28_21c0cdf.json), lm_head, ms, the 64-column tile -> these: wgmma
# M = 4 0.1053 -> 0.1015, 32 0.1389 -> 0.1292, 64 0.2703 -> 0.1874; mma2 M = 4 0.1173 -> 0.1107, 32 0.1887 -> 0.1592,
# 64 0.3658 -> 0.2546 (Marlin's 0.308 in the same session). On 4 stages the 16- and 32-row ones took 2-5% less in
# the pick-stages probe (CHUNK_MID64_WGMMA's comment), which an A/B of the two dispatches did not repeat (within 1% in
# both orders): kept on 3
CHUNK_WIDE = {m: LinearConfig(m, 128, 128, num_warps=4, num_stages=3, swap_ab=True) for m in (16, 32, 64)}
CHUNK_CONFIGS = {
    "chunk_decode": CHUNK_DECODE,
    "chunk_mid": CHUNK_MID,
    "chunk_mid64": CHUNK_MID64,
    "chunk_mid64_wgmma": CHUNK_MID64_WGMMA,
} | {f"chunk_wide{m}": cfg for m, cfg in CHUNK_WIDE.items()}


def pick_config(
    M: int, N: int, K: int, sm_count: int = 132, mode: str = "w4a16", fold_scale: bool = False
) -> LinearConfig:
    """The tile for M rows: decode for M <= 16 (on a layer that :func:`fills_gpu`: the swapped operands for W4A16,
    else one split; otherwise split-K), :data:`MID_SPLIT` split-K for W4A16 at 17-64 rows on a layer that does not,
    prefill otherwise; a swapped W4A16 tile with the scale folded where ``fold_scale`` (the weight's scales fit it:
    ``dequant_mxfp4.fits_fold``). W4A16 shapes that :func:`use_gemv` or :func:`use_dequant_gemm` take do not come
    here."""
    return with_fold(_pick_config(M, N, K, sm_count, mode), mode == "w4a16", fold_scale)


def _two_per_sm(tile: LinearConfig, N: int, K: int, sm_count: int) -> LinearConfig:
    """``tile`` split over K to about two programs per SM (whole K tiles each). With the splits summed in-kernel
    (arrival counters), H100 same-run sweep (peers.py --sweep-dense 4,16,64 --sweep-shapes qkv,o, 6259f2a, docs/bench/
    dense_sweep_splitk_fused_h100_2026-11-25_6259f2a.json): o M = 4 0.0116 ms at 8 splits vs 0.0137 at 16 (about four
    per SM, the rule before), qkv 0.0144 at 4 vs 0.0153 at 8."""
    tiles = cdiv(N, tile.block_n)
    k_tiles = cdiv(K, tile.block_k)
    return dataclasses.replace(tile, split_k=max(1, min(k_tiles, triton.next_power_of_2(cdiv(2 * sm_count, tiles)))))


def _pick_config(M: int, N: int, K: int, sm_count: int, mode: str) -> LinearConfig:
    if M <= 16:
        if fills_gpu(N, sm_count):
            return DECODE_WIDE if mode == "w4a16" else DECODE
        return _two_per_sm(DECODE, N, K, sm_count)
    if M <= MID_SPLIT.block_m and not fills_gpu(N, sm_count) and mode == "w4a16":
        return _two_per_sm(MID_SPLIT, N, K, sm_count)
    return PREFILL if M >= 1024 else PREFILL_SMALL


# Row counts that compile every kernel linear_mxfp4 launches for a layer, at load (the vLLM plugin's warm-up): rows at
# which the kernels differ for some layer (the GEMV at 1, 2 and 4; the split-K and swapped tiles to 16 and
# 17-64 or -255; the chunk orders' lm_head tiles of 16 / 32 / 64 rows and q/k/v's 64-row tile: 17 and 33 start them;
# dequantize + cuBLAS past that) and at which Triton specializes (1, multiples of 16, the rest).
WARM_ROWS = (1, 2, 3, 4, 16, 17, 32, 33, 64, 65, 256)


@functools.lru_cache(maxsize=4096)  # asked per launch; lm_head's runs outside vLLM's graphs, each step
def pick_chunk_config(
    M: int, N: int, K: int, sm_count: int = 132, fold_scale: bool = False, *, order: str
) -> LinearConfig | None:
    """The tile for M rows on weights in chunk order ``order``: on a layer with two 128-column tiles per SM (lm_head),
    :data:`CHUNK_WIDE`'s of M's size, unsplit; else :data:`CHUNK_DECODE` up to 16 rows, :data:`CHUNK_MID` to 64
    (:data:`CHUNK_MID64` at 33-64 rows where it fills the GPU, :data:`CHUNK_MID64_WGMMA` in the wgmma order), K split as
    there said; folded where ``fold_scale``; None past 64 rows (dequantize + cuBLAS)."""
    if order not in ("wgmma", "mma2"):
        raise ValueError(f"chunk order must be wgmma or mma2, got {order!r}")
    split64 = max(1, min(CHUNK_MID_MAX_SPLIT, (cdiv(K, 128) + CHUNK_MID64_K_TILES // 2) // CHUNK_MID64_K_TILES))
    if M <= 64 and cdiv(N, 128) >= 2 * sm_count:
        tile = CHUNK_WIDE[16 if M <= 16 else 32 if M <= 32 else 64]
    elif M <= CHUNK_DECODE.block_m:
        tile = _two_per_sm(CHUNK_DECODE, N, K, sm_count)
    elif CHUNK_MID.block_m < M <= 64 and 2 * cdiv(N, CHUNK_MID64.block_n) * split64 >= 3 * sm_count:
        tile = dataclasses.replace(CHUNK_MID64_WGMMA if order == "wgmma" else CHUNK_MID64, split_k=split64)
    elif M <= 64:
        tile = _two_per_sm(CHUNK_MID, N, K, sm_count)
        tile = dataclasses.replace(tile, split_k=min(tile.split_k, CHUNK_MID_MAX_SPLIT))
    else:
        return None
    return with_fold(tile, True, fold_scale)


@triton.jit
def _linear_mxfp4_kernel(
    x_ptr,
    xs_ptr,
    w_ptr,
    ws_ptr,
    b_ptr,
    y_ptr,
    part_ptr,
    count_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xsm,
    stride_wn,
    stride_wsn,
    stride_ym,
    A_FMT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MANUAL_DEQUANT: tl.constexpr,
    INTERPRETER: tl.constexpr,
    SWAP_AB: tl.constexpr,
    MATH: tl.constexpr,
    WAIT_MMA: tl.constexpr,
):
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    rkb = tl.arange(0, BLOCK_K // 2)  # packed bytes
    rks = tl.arange(0, BLOCK_K // 32)  # scale groups
    m_ok, n_ok = rm < M, rn < N
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    if SWAP_AB:  # W @ x.T into [BLOCK_N, BLOCK_M]; x in split order, zero-padded to whole K tiles (split_pairs)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(pid_k * per_split, tl.minimum(k_tiles, (pid_k + 1) * per_split)):
        k0 = kt * BLOCK_K
        kb_ok = (k0 // 2 + rkb) < K // 2
        ks_ok = (k0 // 32 + rks) < K // 32
        # weights: [BLOCK_N, BLOCK_K/2] bytes (zero past K: code 0 is 0.0), scales [BLOCK_N, BLOCK_K/32]
        w = tl.load(
            w_ptr + rn[:, None] * stride_wn + (k0 // 2 + rkb)[None, :], mask=n_ok[:, None] & kb_ok[None, :], other=0
        )
        ws = tl.load(
            ws_ptr + rn[:, None] * stride_wsn + (k0 // 32 + rks)[None, :],
            mask=n_ok[:, None] & ks_ok[None, :],
            other=127,
        )
        if SWAP_AB:
            a_even, a_odd = load_split(x_ptr, rm, m_ok, k0, stride_xm, BLOCK_K)
            acc = dot_w_mxfp4(w, ws, a_even, a_odd, acc, BLOCK_N, BLOCK_K, MATH, INTERPRETER, WAIT_MMA)
        elif A_FMT == "bf16":
            a = tl.load(
                x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :],
                mask=m_ok[:, None] & ((k0 + rk) < K)[None, :],
                other=0.0,
            )
            acc = dot_bf16_mxfp4(a, w, ws, acc, BLOCK_N, BLOCK_K, MANUAL_DEQUANT, INTERPRETER)
        else:
            if A_FMT == "e2m1":
                a = tl.load(
                    x_ptr + rm[:, None] * stride_xm + (k0 // 2 + rkb)[None, :],
                    mask=m_ok[:, None] & kb_ok[None, :],
                    other=0,
                )
            else:
                a = tl.load(
                    x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :],
                    mask=m_ok[:, None] & ((k0 + rk) < K)[None, :],
                    other=0.0,
                )
            xs = tl.load(
                xs_ptr + rm[:, None] * stride_xsm + (k0 // 32 + rks)[None, :],
                mask=m_ok[:, None] & ks_ok[None, :],
                other=127,
            )
            acc = tl.dot_scaled(a, xs, A_FMT, w.T, ws, "e2m1", acc)
    if SWAP_AB:
        acc = tl.trans(acc)
    counter = count_ptr + pid_m * tl.num_programs(1) + pid_n
    _store_split(acc, part_ptr, counter, pid_k, b_ptr, y_ptr, rm, rn, M, N, stride_ym, HAS_BIAS, SPLIT_K)


@triton.jit
def _linear_chunks_kernel(
    x_ptr,
    w_ptr,
    ws_ptr,
    b_ptr,
    y_ptr,
    part_ptr,
    count_ptr,
    M,
    N,
    K,
    Np,
    stride_xm,
    stride_wn,
    stride_wsn,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOTS: tl.constexpr,
    MATH: tl.constexpr,
    ORDER: tl.constexpr,
    INTERPRETER: tl.constexpr,
    WAIT_MMA: tl.constexpr,
):
    """``x @ W.T`` for W in a chunk order (``ORDER``), program (M tile, N tile, K split): the MoE tiles' K loop
    (``chunk_dots``) on x's rows in order over this split's K tiles, the splits summed as ``_linear_mxfp4_kernel``'s."""
    # the row tiles of one column tile are neighbours in launch order: they read the same W tile together, from L2
    # after the first (the W stream is read once from memory where it does not fit L2: lm_head's 290 MB)
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    k_tiles = tl.cdiv(K, 128)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    kt0 = pid_k * per_split
    # a last N tile past the padded rows loads the last 16 rows again (not stored)
    blocks = tl.minimum(pid_n * BLOCK_N + 16 * tl.arange(0, BLOCK_N // 16), Np - 16)
    w_off, s_off = wgmma_chunks(blocks, stride_wn, stride_wsn, 16)
    acc = chunk_dots(
        x_ptr + kt0 * 128,
        x_ptr,
        pid_m * BLOCK_M,
        M,
        1,
        K - kt0 * 128,
        stride_xm,
        w_ptr,
        ws_ptr,
        w_off + kt0 * 1024,
        s_off + kt0 * 64,
        1024,
        64,
        tl.minimum(k_tiles, kt0 + per_split) - kt0,
        BLOCK_N // 16,
        BLOCK_M,
        DOTS,
        False,
        MATH,
        ORDER,
        INTERPRETER,
        WAIT_MMA,
        0,
        True,
    )
    acc = tl.trans(acc)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    counter = count_ptr + pid_n * tl.num_programs(0) + pid_m
    _store_split(acc, part_ptr, counter, pid_k, b_ptr, y_ptr, rm, rn, M, N, stride_ym, HAS_BIAS, SPLIT_K)


# the chunk tile's builds checked before they are kept (a CUDA build: under the interpreter, Triton's launch every call)
_LAUNCH_CHUNKS = Launcher(_linear_chunks_kernel, check=check_chunk_build)
_LAUNCH_ROWS = Launcher(_linear_mxfp4_kernel)


@triton.jit
def _store_split(
    acc, part_ptr, counter, pid_k, b_ptr, y_ptr, rm, rn, M, N, stride_ym, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr
):
    """Output tile ``acc`` (rows ``rm``, columns ``rn``) of K split ``pid_k`` of ``SPLIT_K``: unsplit, stored (+ bias);
    split, its fp32 partial stored in ``part_ptr`` ``[SPLIT_K, M, N]`` and the tile's last split to arrive at
    ``counter`` sums them in split order and stores that (:mod:`mxrepack.kernels.arrival`)."""
    n_ok = rn < N
    ok = (rm < M)[:, None] & n_ok[None, :]
    y = y_ptr + rm[:, None] * stride_ym + rn[None, :]
    if SPLIT_K > 1:
        part = part_ptr + rm[:, None] * N + rn[None, :]
        tl.store(part + pid_k.to(tl.int64) * M * N, acc, mask=ok)  # int64: SPLIT_K * M * N may pass 2^31
        if last_to_arrive(counter, SPLIT_K):
            acc = tl.zeros(acc.shape, dtype=tl.float32)
            for _ in range(SPLIT_K):
                acc += tl.load(part, mask=ok, other=0.0, cache_modifier=".cg")
                part += M * N
            _store_output(acc, b_ptr, y, rn, n_ok, ok, HAS_BIAS)
            reset_counter(counter)
    else:
        _store_output(acc, b_ptr, y, rn, n_ok, ok, HAS_BIAS)


@triton.jit
def _store_output(acc, b_ptr, y, rn, n_ok, ok, HAS_BIAS: tl.constexpr):
    """``acc`` (+ bias) stored at ``y`` in the output's dtype."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y, acc.to(y.dtype.element_ty), mask=ok)


def linear_mxfp4(
    x: torch.Tensor,
    w_packed: torch.Tensor,
    w_scales: torch.Tensor,
    bias: torch.Tensor | None = None,
    mode: str = "w4a16",
    config: LinearConfig | GemvConfig | None = None,
    out: torch.Tensor | None = None,
    fold_scale: bool = False,
    order: str = "rows",
) -> torch.Tensor:
    """``x [M, K]`` (bf16) times MXFP4 ``W [N, K]`` -> ``[M, N]`` bf16 (into ``out`` when given).

    ``order``: W's byte order, the dense layout's option: "rows" (plain ``[N, K/2]`` / ``[N, K/32]``, every mode) or a
    chunk order, "wgmma" (sm_90) or "mma2" (sm_12x, sm_8x) (W4A16; ``[Np, Kp/2]`` / ``[Np, Kp/32]`` padded to 16 rows
    and 128 codes: :func:`linear_chunks`).

    ``config``: a :class:`LinearConfig` (tensor-core kernel), a :class:`GemvConfig` (W4A16 GEMV), a
    :class:`DequantConfig` (W4A16 dequantize + cuBLAS), or None to choose by shape. ``fold_scale``: ``w_scales``
    fit the folded decode, as ``dequant_mxfp4.fits_fold`` found where the weight was loaded; a chosen swapped tile
    then folds (same bits, faster) and nothing is checked per call."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if order != "rows":
        if mode != "w4a16":
            check_order(order, MODES[mode], x.device)  # refuses it: the chunk orders are read with BF16 only
        return linear_chunks(x, w_packed, w_scales, order, bias, config, out, fold_scale)
    M, K = x.shape
    call = _rows_call(M, K, w_packed.shape, w_scales.shape, mode, config, fold_scale, *_call_context(x, out, bias))
    if out is None:
        out = torch.empty(M, call.n, dtype=torch.bfloat16, device=x.device)
    cfg = call.config
    if isinstance(cfg, GemvConfig):
        return gemv_mxfp4(x, w_packed, w_scales, bias, out, cfg)
    if isinstance(cfg, DequantConfig):
        return linear_dequant_gemm(x.contiguous(), w_packed, w_scales, bias, out, cfg)
    swap = call.constants["SWAP_AB"]
    if swap and cfg.fold_scale and not fold_scale:  # a folded tile chosen by hand: its precondition checked here
        check_fold_scale(w_scales)
    a_fmt = MODES[mode]
    if swap:
        a, a_scales = split_pairs(x, cdiv(K, 128) * 128), None
    elif a_fmt == "bf16":
        a, a_scales = x.contiguous(), None
    else:
        a, a_scales = quantize_activations(x, a_fmt)
    part, counters = _split_k_buffers(call, M, out)
    _LAUNCH_ROWS(
        call.grid,
        a,
        a_scales if a_scales is not None else w_scales,
        w_packed,
        w_scales,
        bias if bias is not None else w_scales,
        out,
        part,
        counters,
        M,
        call.n,
        K,
        a.stride(0),
        a_scales.stride(0) if a_scales is not None else 0,
        w_packed.stride(0),
        w_scales.stride(0),
        out.stride(0),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **call.constants,
    )
    return out


def _call_context(x: torch.Tensor, out: torch.Tensor | None, bias: torch.Tensor | None) -> tuple:
    """The rest of a call's shape for :func:`_rows_call` / :func:`_chunk_call`: ``out``'s (shape, dtype, strides) or
    None, the bias's shape or None, the device, and the environment the dispatch reads (Triton's interpreter, and
    ``DISABLE_MMA_V3``, which the tiles' WAIT_MMA reads), so that a change of it is a new shape."""
    return (
        None if out is None else (out.shape, out.dtype, out.stride()),
        None if bias is None else bias.shape,
        x.device,
        interpreting(),
        mma_v3_disabled(),
    )


def _split_k_buffers(call: _Call, M: int, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A split-K tile's fp32 partial sums and its tiles' arrival counters (:mod:`mxrepack.kernels.arrival`); ``out``
    twice, unused, for an unsplit one."""
    if call.config.split_k == 1:
        return out, out
    part = torch.empty(call.config.split_k, M, call.n, dtype=torch.float32, device=out.device)
    return part, arrival_counters(out.device, call.grid[0] * call.grid[1], "linear")


@dataclass(frozen=True)
class _Call:
    """What :func:`linear_mxfp4` (rows order: :func:`_rows_call`) or :func:`linear_chunks` (:func:`_chunk_call`) runs
    for one shape of call: worked out, and the call checked, once per shape, since vLLM runs lm_head outside its CUDA
    graphs and each step pays the call's host time (PERF_LOG stops 44 and 49)."""

    config: LinearConfig | GemvConfig | DequantConfig
    n: int  # output columns
    grid: tuple[int, int, int]  # the tile's (a GEMV works out its own; none for dequantize + cuBLAS)
    constants: dict  # the tile's constexpr arguments


@functools.lru_cache(maxsize=4096)
def _rows_call(
    M: int,
    K: int,
    w_shape: tuple[int, int],
    scales_shape: tuple[int, int],
    mode: str,
    config: LinearConfig | GemvConfig | DequantConfig | None,
    fold_scale: bool,
    out: tuple | None,
    bias_shape: tuple | None,
    device: torch.device,
    interpreter: bool,
    mma_v3_off: bool,
) -> _Call:
    """The checks and the dispatch of :func:`linear_mxfp4` on rows-order weights for a call of this shape (arguments as
    :func:`_chunk_call`'s; ``mma_v3_off`` sets the tile's WAIT_MMA). Raises as the call would."""
    N = w_shape[0]
    if w_shape != (N, K // 2) or scales_shape != (N, K // 32) or K % 32:
        raise ValueError(
            f"weights {tuple(w_shape)}/{tuple(scales_shape)} do not fit x {(M, K)}: "
            f"expected [N, {K // 2}] packed and [N, {K // 32}] scales, K % 32 == 0"
        )
    _check_shapes(out or ((M, N), torch.bfloat16, (N, 1)), bias_shape, M, N, N)
    sms = sm_count(device)
    if isinstance(config, GemvConfig) or (config is None and mode == "w4a16" and use_gemv(M, N, sms)):
        if mode != "w4a16":
            raise ValueError(f"the GEMV runs W4A16 only, not {mode}")
        return _Call(config or pick_gemv_config(N, sms, device.type == "cuda", M), N, (0, 0, 0), {})
    if isinstance(config, DequantConfig) or (config is None and mode == "w4a16" and use_dequant_gemm(M, N, sms)):
        if mode != "w4a16":
            raise ValueError(f"the dequantize + cuBLAS path runs W4A16 only, not {mode}")
        return _Call(config or DEQUANT, N, (0, 0, 0), {})
    cfg = config or pick_config(M, N, K, sms, mode, fold_scale)
    a_fmt = MODES[mode]
    swap = cfg.swap_ab and a_fmt == "bf16"
    ptx = not interpreter and device.type == "cuda"
    constants = dict(
        A_FMT=a_fmt,
        HAS_BIAS=bias_shape is not None,
        SPLIT_K=cfg.split_k,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        MANUAL_DEQUANT=cfg.manual_dequant and a_fmt == "bf16",
        INTERPRETER=interpreter,
        SWAP_AB=swap,
        MATH=(cfg.math if swap else "asm") if ptx else "ops",
        WAIT_MMA=swap and not interpreter and mma_reads_registers_async(device),
    )
    return _Call(cfg, N, (cdiv(M, cfg.block_m), cdiv(N, cfg.block_n), cfg.split_k), constants)


def _check_shapes(out: tuple, bias_shape: tuple | None, M: int, N: int, max_n: int) -> None:
    """``out`` (its shape, dtype, strides) a float ``[M, N]`` (the kernels store in its dtype) with unit column stride
    (they store rows at ``out.stride(0)``) and N at most ``max_n`` (W's rows); ``bias_shape`` None or ``[N]``: else
    one line."""
    shape, dtype, strides = out
    floats = (torch.bfloat16, torch.float16, torch.float32)
    shape_ok = len(shape) == 2 and tuple(shape) == (M, N) and 0 < N <= max_n
    if dtype not in floats or not shape_ok or (N > 1 and strides[1] != 1):
        raise ValueError(
            f"out {dtype} {tuple(shape)} strides {strides}: expected [{M}, N <= {max_n}] of bfloat16, "
            "float16 or float32 with unit column stride"
        )
    if bias_shape is not None and tuple(bias_shape) != (N,):
        raise ValueError(f"bias {tuple(bias_shape)}: expected [{N}] (one per output column)")


def linear_chunks(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scales: torch.Tensor,
    order: str,
    bias: torch.Tensor | None = None,
    config: LinearConfig | DequantConfig | None = None,
    out: torch.Tensor | None = None,
    fold_scale: bool = False,
) -> torch.Tensor:
    """W4A16 ``x [M, K]`` (bf16) times W in chunk order ``order`` (the dense layout's "wgmma" / "mma2": ``w``
    ``[Np, Kp/2]`` bytes in row tiles of 16, K-tiled, ``w_scales`` ``[Np, Kp/32]`` quad-ordered) -> ``[M, N]`` bf16,
    N = ``out``'s columns (default Np). ``config``: a swapped :class:`LinearConfig` (:data:`CHUNK_CONFIGS`), a
    :class:`DequantConfig` (dequantize + cuBLAS), or None: :func:`pick_chunk_config`. ``fold_scale`` as
    :func:`linear_mxfp4`'s. Refuses an order this GPU's MMA does not read (:func:`check_order`)."""
    M, K = x.shape
    call = _chunk_call(M, K, w.shape, w_scales.shape, order, config, fold_scale, *_call_context(x, out, bias))
    if out is None:
        out = torch.empty(M, call.n, dtype=torch.bfloat16, device=x.device)
    cfg = call.config
    if isinstance(cfg, DequantConfig):
        return linear_dequant_gemm(x.contiguous(), w, w_scales, bias, out, cfg, order)
    if cfg.fold_scale and not fold_scale:  # a folded tile chosen by hand: its precondition checked here
        check_fold_scale(w_scales)
    x = x.contiguous()
    part, counters = _split_k_buffers(call, M, out)
    _LAUNCH_CHUNKS(
        call.grid,
        x,
        w,
        w_scales,
        bias if bias is not None else w_scales,
        out,
        part,
        counters,
        M,
        call.n,
        K,
        w.shape[0],
        x.stride(0),
        w.stride(0),
        w_scales.stride(0),
        out.stride(0),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **call.constants,
    )
    return out


@functools.lru_cache(maxsize=4096)
def _chunk_call(
    M: int,
    K: int,
    w_shape: tuple[int, int],
    scales_shape: tuple[int, int],
    order: str,
    config: LinearConfig | DequantConfig | None,
    fold_scale: bool,
    out: tuple | None,
    bias_shape: tuple | None,
    device: torch.device,
    interpreter: bool,
    mma_v3_off: bool,
) -> _Call:
    """The checks and the dispatch of :func:`linear_chunks` for a call of this shape: ``out`` its (shape, dtype,
    strides) or None; ``interpreter`` / ``mma_v3_off`` the environment they read, so that a change of it is a new
    shape. Raises as the call would."""
    check_order(order, "bf16", device)
    Np, Kp = w_shape[0], w_shape[1] * 2
    N = out[0][-1] if out is not None and len(out[0]) else Np
    if Np % 16 or Kp % 128 or scales_shape != (Np, Kp // 32) or Kp != cdiv(K, 128) * 128 or N > Np:
        raise ValueError(
            f"{order}-order weights {tuple(w_shape)} / scales {tuple(scales_shape)} do not fit x {(M, K)}"
            f"{'' if out is None else f' and out {tuple(out[0])}'}: expected [Np, {cdiv(K, 128) * 64}] bytes "
            f"and [Np, {cdiv(K, 128) * 4}] scales, Np a multiple of 16 and at least N"
        )
    _check_shapes(out or ((M, N), torch.bfloat16, (N, 1)), bias_shape, M, N, Np)
    cfg = config or pick_chunk_config(M, N, K, sm_count(device), fold_scale, order=order)
    if cfg is None or isinstance(cfg, DequantConfig):
        return _Call(cfg or DEQUANT, N, (0, 0, 0), {})
    if not cfg.swap_ab:
        raise ValueError(f"config {cfg.name()}: the chunk orders decode W as the MMA's first operand (swap_ab)")
    ptx = runs_ptx(device)
    constants = dict(
        HAS_BIAS=bias_shape is not None,
        SPLIT_K=cfg.split_k,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        # mma.sync's warps split W's rows only with the tokens in dots of 16 or 32 (MoeConfig.token_dots)
        DOTS=cfg.block_m // (16 if cfg.block_m <= 32 else 32) if order == "mma2" else 1,
        MATH=cfg.math if ptx else "ops",
        ORDER=order,
        INTERPRETER=interpreter,
        WAIT_MMA=ptx and mma_reads_registers_async(device),
    )
    return _Call(cfg, N, (cdiv(M, cfg.block_m), cdiv(N, cfg.block_n), cfg.split_k), constants)
