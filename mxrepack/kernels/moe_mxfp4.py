"""gpt-oss MoE block with MXFP4 experts in Triton: route, sort, gate_up + SwiGLU, down, combine.

Weights are the ``strided`` layout (``mxrepack.layouts.strided``): w13 ``[E, 2*Ip, Hp/2]`` in row tiles of
32 gate rows then the same 32 up rows, w2 ``[E, Hp, Ip/2]`` in tiles of 16 rows, each row tile K-tiled
(``[R, 64]``-byte blocks, one per 128 codes), E8M0 scales row-major in the same row order, fp32 biases,
hidden and intermediate padded (2880 -> 2944). No TMA anywhere (sm_12x rejects TMA scatter), only plain
loads and stores:

1. ``moe_schedule`` (two small kernels, no host sync): sort the ``T*k`` (token, slot) assignments by expert and cut
   each expert's run into ``BLOCK_M`` row blocks: per block its expert, first and end sorted position.
2. ``_gate_up_kernel``: per (row block, N tile) gather the tokens' rows of x, two accumulators (gate
   rows n and up rows Ip + n of the same expert), + bias, the gpt-oss SwiGLU (alpha 1.702, limit 7:
   gate clamped above, up on both sides, ``(up + 1) * gate * sigmoid(alpha * gate)``), stored in sorted
   order ``[T*k, Ip]`` bf16. Padded rows have zero weights and bias, so they produce exactly 0.
3. ``_down_kernel``: sorted rows times w2 + bias, times the routing weight, stored (plain stores) at the
   assignment's own row ``t*k + slot`` of ``[T*k, H]`` bf16 -- a scatter with ordinary stores.
4. ``_combine_kernel``: the sum over the k slots of each token, in fp32, stored as bf16 (or ``out``'s dtype).

Decode (weights in the rows order, BF16 activations, at most ``GEMV_MAX_ASSIGNMENTS`` (token, slot) pairs) skips
the schedule: one program per (assignment, row tile) runs the CUDA-core GEMV of :mod:`mxrepack.kernels.gemv_mxfp4` on
its expert's rows (``_gate_up_gemv_kernel`` or, on prepared activations with packed fp16 math,
``_gate_up_gemv_f16x2_kernel``; then ``_down_gemv_kernel``), so that no 16-row tile is spent on one token
and only the routed experts' bytes are read. The down kernel also combines: the last of a token's k
programs for a row tile sums the k partials and writes the output, so decode is two or three launches
and no torch ops. Weights in a chunk order (mma2, wgmma) have their own decode GEMVs (``_gate_up_gemv_chunks_kernel``,
``_down_gemv_chunks_kernel``: :data:`CHUNK_GEMVS`, to :data:`CHUNK_GEMV_MAX_ASSIGNMENTS` pairs), two launches, the
same combine.

``activations="e4m3"|"e2m1"`` quantizes x and the intermediate on the fly (MXFP8 / MXFP4), as the dense
kernel's W4A8 / W4A4 modes. Reference: :func:`mxrepack.kernels.reference.layout_moe_reference`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mxrepack.kernels.arrival import arrival_counters, last_to_arrive, reset_counter
from mxrepack.kernels.dequant_mxfp4 import (
    MAX_SCALE_SHIFT,
    check_chunk_build,
    check_fold_scale,
    check_order,
    chunk_dots,
    dot_bf16_mxfp4,
    dot_w_mxfp4,
    in_flight_allowed,
    interpreting,
    launches_dependents,
    load_split,
    mma_reads_registers_async,
    runs_ptx,
    shift_scales,
    split_column,
    split_pairs,
    unshift,
    wgmma_chunks,
    with_fold,
)
from mxrepack.kernels.gemv_mxfp4 import (
    GemvConfig,
    gdc_launch_dependents,
    gdc_wait,
    gemv_chunks,
    gemv_rows,
    gemv_rows_f16x2,
    pack_groups,
    prepare_x,
)
from mxrepack.kernels.mx_quant import quantize_activations
from mxrepack.layouts.strided import DOWN_TILE_ROWS, GATE_UP_TILE, K_TILE_BYTES

# The strided layout's tiles, as the kernels see them: w13 row tiles of 32 gate then 32 up rows, w2 tiles of 16
# rows. ``_w13_rows`` writes 32 and 64 as literals (under the interpreter a Triton constexpr global does not mix
# with the Python ints of loop indices); all are checked against the layout here.
_GU_ROWS = tl.constexpr(64)  # weight rows per w13 row tile
_DOWN_ROWS = tl.constexpr(16)  # w2 rows per row tile
if (GATE_UP_TILE, DOWN_TILE_ROWS, K_TILE_BYTES) != (32, 16, 64):
    raise ImportError("mxrepack.kernels.moe_mxfp4 is written for the strided layout's 32/16-row, 64-byte tiles")

SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0


@dataclass(frozen=True)
class MoeConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    manual_dequant: bool = False  # BF16 activations: integer-op dequant + tl.dot instead of tl.dot_scaled
    # BF16 activations: W is the MMA's first operand, decoded in registers by PTX (``dot_w_mxfp4``), tokens the
    # second; the activations and the intermediate travel in split order (even then odd columns per K tile)
    swap_ab: bool = False
    # swap_ab on CUDA: E2M1's 2^126 folded into the scale, one packed multiply per code pair instead of two
    # (dequant_mxfp4.PAIRS_ASM_FOLDED). For weights whose E8M0 scales are all <= 128 (block scales up to 2:
    # dequant_mxfp4.fits_fold), or larger ones read lowered by moe_mxfp4's scale_shift (dequant_mxfp4.fold_shift);
    # the dispatch folds the swapped MOE_TILES for weights that fit (pick_moe_config)
    fold_scale: bool = False
    # the weights' byte order (the strided layout's ``order``): "rows"; "wgmma" -- each K tile of W decoded from
    # wgmma's fragment order into one dot, the activations in natural order (sm_90 only; swapped operands); "mma2" --
    # the same from mma.sync's kWidth-8 operand order (sm_12x, sm_8x), the tokens in dots of at most 32
    # (:attr:`token_dots`)
    order: str = "rows"
    # the wgmma order on Hopper: wait for each K tile's wgmma before the next decode (dequant_mxfp4.mma_done), as the
    # rows order's swapped tiles always do; False keeps them in flight while the next tile is decoded, the operand
    # copied per k16 step (dequant_mxfp4.fresh_operand) so that no build rewrites a register a pending wgmma reads
    # (the kernels check and each launch walk the build's PTX for one: dequant_mxfp4.wgmma_register_hazards)
    wait_mma: bool = True
    # A chunk order (wgmma, mma2): rows of H per down tile (0: ``block_n``). Gate_up's operand is 2 x block_n rows
    # (gate and up); down's is block_n, so on 8 warps each warpgroup gets half the MMA work a K step of gate_up's, for
    # the same decode and activation tile overheads. A down tile wider than block_n need not divide the padded hidden
    # width (2944 = 23 x 128): the last tile's rows past it repeat the last 16 rows' loads and are not stored.
    down_block_n: int = 0
    # A smaller tile for the blocks of at most ``remainder.block_m`` rows (an expert's last, partial block): launched
    # beside this one on the same schedule, so that a few rows past a multiple of ``block_m`` do not pay a whole
    # ``block_m``-row tile (its MMA and, per row, its decode). Same order and operand form as this tile.
    remainder: MoeConfig | None = None

    def __post_init__(self):
        r = self.remainder
        if r is not None and (
            r.block_m >= self.block_m
            or (r.order, r.swap_ab, r.block_k, r.fold_scale)
            != (self.order, self.swap_ab, self.block_k, self.fold_scale)
            or r.remainder is not None
        ):
            raise ValueError(
                f"remainder {r.name()} must be a smaller tile (block_m under {self.block_m}, got {r.block_m}) of the "
                f"same order, operand form, K step and fold as {self.name()}, without a remainder of its own"
            )
        if self.fold_scale and not self.swap_ab:
            raise ValueError("fold_scale is a decode of the swapped operands: it needs swap_ab")
        if self.order not in ("rows", "wgmma", "mma2"):
            raise ValueError(f"order must be rows, wgmma or mma2, got {self.order!r}")
        if self.order != "rows" and not (self.swap_ab and self.block_n % 64 == 0):
            # wgmma: under 64 weight rows (down's block_n) Triton lowers the dot to mma.sync, whose fragment is other
            # bytes; mma2: 16 weight rows per warp on 4 warps, so that no warp decodes another's rows again
            raise ValueError(
                f"the {self.order} order is read by the swapped tiles on 64-row operands: swap_ab and block_n % 64 "
                f"== 0, got swap_ab={self.swap_ab}, block_n={self.block_n}"
            )
        if self.order == "mma2" and self.block_m not in (16, 32, 64, 128):
            raise ValueError(f"the mma2 order's tiles take 16, 32, 64 or 128 tokens, got block_m {self.block_m}")
        d = self.down_block_n
        if d and (self.order == "rows" or d < max(64, self.block_n) or d & (d - 1)):
            raise ValueError(
                f"down_block_n is a wider tile of a chunk order's down kernel: a power of 2, at least block_n and "
                f"64 (whole 64-row operands), got {d} for order {self.order} and block_n {self.block_n}"
            )
        if not self.wait_mma and self.order != "wgmma":
            raise ValueError(
                "wait_mma=False is a variant of the wgmma order's tiles only (the rows order always waits)"
            )
        if self.block_k % 128 or self.block_k <= 0:
            raise ValueError(f"block_k {self.block_k} must be a multiple of 128 (the strided layout's K tiles)")
        if self.swap_ab and (self.block_k != 128 or self.manual_dequant):
            raise ValueError(
                f"swap_ab reads one 128-code K tile per step and decodes W itself: block_k must be 128 "
                f"and manual_dequant off, got {self.block_k} and {self.manual_dequant}"
            )

    def name(self) -> str:
        return (
            f"m{self.block_m}n{self.block_n}k{self.block_k}w{self.num_warps}st{self.num_stages}"
            + ("d" if self.manual_dequant else "")
            + ("s" if self.swap_ab else "")
            + ("f" if self.fold_scale else "")
            + (f"-{self.order}" if self.order != "rows" else "")
            + ("-overlap" if self.order == "wgmma" and not self.wait_mma else "")
            + (f"-down{self.down_block_n}" if self.down_block_n else "")
            + (f"+r{self.remainder.name()}" if self.remainder is not None else "")
        )

    @property
    def waits(self) -> bool:
        """Whether each K tile's wgmma is waited for before the next decode where wgmma runs (Hopper): the rows order's
        swapped tiles always; the wgmma order's as ``wait_mma`` says, and always under a Triton whose in-flight builds
        were not checked (``dequant_mxfp4.in_flight_allowed``); the mma2 order never (``mma.sync`` is synchronous)."""
        return self.order == "rows" or (self.order == "wgmma" and (self.wait_mma or not in_flight_allowed()))

    @property
    def math(self) -> str:
        """The decode on CUDA: ``dequant_mxfp4.dequant_pairs``' MATH (the interpreter and CPU take "ops")."""
        return "asm-fold" if self.fold_scale else "asm"

    @property
    def down_n(self) -> int:
        """Rows of H per down tile."""
        return self.down_block_n or self.block_n

    @property
    def token_dots(self) -> int:
        """The dots a K tile's decoded W feeds: the mma2 order's tokens in parts of 16 (block_m up to 32) or 32, so
        that Triton's ``mma.sync`` warps split W's rows and not the tokens (warps along the tokens would each load
        and decode the same rows: ``benchmarks/experiments/mma2_order_probe.py``, its ``NSPLIT``); one otherwise."""
        return self.block_m // (16 if self.block_m <= 32 else 32) if self.order == "mma2" else 1


# Scheduled-tile shapes by the mean number of rows (token, slot assignments) per expert, T * k / E: the first
# whose bound is not below it. Up to 128 rows: the swapped operands (``swap_ab``: W decoded in registers as the
# MMA's first operand, ``dequant_mxfp4.dot_w_mxfp4``), pipelined; each wgmma is waited for before the next decode
# (``dequant_mxfp4.mma_done``, triton-lang/triton#9433), which kept them at one stage before. H100, 120b shapes,
# CUDA graphs, ``benchmarks/peers.py --sweep-moe ... --sweep-kind swap`` / ``swap-deep`` (2026-11-25, 6be01f8 and
# 2c2c09a: docs/bench/moe_sweep_swap_fenced_h100_2026-11-25_6be01f8.json, ..._deep_h100_2026-11-25_2c2c09a.json;
# every swapped candidate run 20 times: no non-finite output, identical bits), against the one-stage tiles shipped
# before in the same run: T = 128 0.971 vs 1.217 ms (16 x 64, 4 stages), 512 1.260 vs 1.629 (32 x 64, 4 stages),
# 1024 1.775 vs 1.941 (64 x 128, 3 stages), 4096 4.412 vs 5.113 for the dot_scaled 128 x 64 (64 x 128, 3 stages).
# More stages lost (5-6: 1.007-1.079 at T = 128), 8 warps lost except at 128 x 128. Beyond 128 rows, 128 x 128 on
# 8 warps (8.88 ms at T = 8192, docs/PERF_LOG.md stop 10; the swap not measured there).
# For weights whose scales fit (dequant_mxfp4.fold_shift: at most 128, or with a shift) the swapped tiles run with
# the scale folded (``fold_scale``), same bits: T = 64/128/512/1024/4096 0.851/0.907/1.219/1.690/4.242 ms against
# 0.913/0.971/1.263/1.777/4.428 unfolded (H100, same run, peers.py --sweep-moe ... --sweep-kind fold, 8860140,
# docs/bench/moe_sweep_fold_h100_2026-11-25_8860140.json). triton_kernels' 128 x 128 on 8 warps, swapped, lost there
# at every T (2.38-4.56 ms folded).
# Past 8 rows per expert an expert's rows rarely fill whole blocks: the blocks of at most 16 rows (9-16 rows per
# expert), 32 (17-48) or 16 (49-128) run on the smaller tile (``MoeConfig.remainder``). H100, same run, ``peers.py
# --sweep-moe 1024,2048,4096 --sweep-kind remainder`` (bfc1945, docs/bench/moe_sweep_remainder_h100_2026-11-26_
# bfc1945.json): T = 1024 1.466 ms against 1.586 (16 rows: 1.598), T = 2048 2.256 against 2.365 (32 rows: 2.358),
# T = 4096 4.092 against 4.110 (32 rows: 4.165); T = 512 1.044 against 1.124 (a1df314, ..._a1df314.json).
_SMALL_16 = MoeConfig(16, 64, 128, num_warps=4, num_stages=4, swap_ab=True)
_SMALL_32 = MoeConfig(32, 64, 128, num_warps=4, num_stages=4, swap_ab=True)
MOE_TILES = (
    (8, _SMALL_16),
    (16, dataclasses.replace(_SMALL_32, remainder=_SMALL_16)),
    (48, MoeConfig(64, 128, 128, num_warps=4, num_stages=3, swap_ab=True, remainder=_SMALL_32)),
    (128, MoeConfig(64, 128, 128, num_warps=4, num_stages=3, swap_ab=True, remainder=_SMALL_16)),
    (float("inf"), MoeConfig(128, 128, 128, num_warps=8, num_stages=3)),
)
# MXFP8 / MXFP4 activations (tl.dot_scaled, no swap): the tiles chosen for them before the swap (docs/PERF_LOG.md
# stop 10), unchanged.
MOE_TILES_SCALED = (
    (8, MoeConfig(16, 64, 128, num_warps=4, num_stages=3)),
    (16, MoeConfig(32, 64, 128, num_warps=4, num_stages=3)),
    (32, MoeConfig(64, 128, 128, num_warps=4, num_stages=3)),
    (128, MoeConfig(128, 64, 128, num_warps=4, num_stages=3)),
    (float("inf"), MoeConfig(128, 128, 128, num_warps=8, num_stages=3)),
)
# Weights in the wgmma order (the strided layout's ``order: wgmma``, sm_90): these tiles at every T, decode included.
# Gate_up runs 2 x block_n weight rows (gate and up) as one operand; block_n is whole 64-row wgmma operands
# (``MoeConfig`` checks it). H100, 120b shapes, CUDA graphs, folded, each wgmma waited for (``wait_mma``), same run as
# the rows order's shipped choice (``peers.py --sweep-moe 16,128,1024,4096 --sweep-kind wgmma``, 2026-11-26,
# docs/bench/moe_sweep_wgmma_h100_2026-11-26_de469b5wip.json): T = 128 16 x 64 on 3 stages 0.858 ms (rows order
# 0.901), T = 1024 64 x 64 on 3 stages 1.438 (1.682); 4 stages and 128-token tiles on 4 warps lost. T = 16: 0.419
# against the rows order's GEMV 0.325 -- below 33 tokens the rows order's decode GEMV is faster. Keeping one wgmma in
# flight (``wait_mma=False``) took 0.847 / 1.388 / 4.059 ms: 1-3.5% at T = 128-1024, slower at 4096 (the wide tile
# below keeps them in flight). Past 64 rows per expert, 128 tokens x 128 rows per projection on 8 warps (two
# warpgroups, each 64 rows of W): H200, same run (``--sweep-kind wgmma-wide``, fd048a4,
# docs/bench/moe_sweep_wgmma_wide_h200_2026-11-26_fd048a4.json) T = 4096 3.434 ms against 3.541 for 64 x 128 on 4
# warps, T = 8192 5.839 against 6.406; at T = 2048 (64 rows per expert) 2.332 against 64 x 64's 2.060, and on 8 warps
# every smaller tile lost (also on the H100 at T = 512-4096: ..._h100_2026-11-26_21432ef.json).
# Decode on this order: the 16 x 64 tile beat every decode GEMV written for the order's bytes (14 shapes, one or two
# K tiles in flight) at T = 1, 2 and 4: 0.0580 / 0.0744 / 0.1149 ms against the best GEMV's 0.0680 / 0.0978 / 0.1736
# (H100, same run, ``--sweep-moe 1,2,4 --sweep-kind wgmma``, e98e4de,
# docs/bench/moe_sweep_wgmma_gemv_h100_2026-11-26_e98e4de.json; the rows order's GEMVs 0.0291 / 0.0594 / 0.0871). So
# those GEMVs (``MOE_GEMV_WGMMA``, ``gemv_mxfp4.gemv_rows_wgmma``) were removed in the commit after that record; they
# are in git history at e98e4de. The mma2 order's GEMV, run on this order's words (``gemv_chunks``: each word's values
# accumulated in place across K, reduced once; the k slots combined in the down kernel) took T = 1 from the tile:
# :data:`WGMMA_GEMV`.
# From 9 to 16 rows per expert, 32 tokens: T = 512 (16 rows) 0.982 ms against 16 x 64's 1.165, while at T = 256 (8
# rows) 16 x 64 holds (0.817 against 0.930; H100, same run, ``--sweep-moe 256,512 --sweep-kind wgmma``, 7011f92,
# docs/bench/moe_sweep_wgmma_h100_2026-11-26_7011f92.json): a 16-token tile gives about half the experts a second
# block at 16 rows, whose weights are decoded again.
# Past 8 rows per expert, the blocks of at most 16 rows (9-16 rows per expert), 32 (17-48, and past 64 under the
# 128-token tile) or 64 (49-64, the 64 x 64 tile under the 128-token one) run on the smaller tile
# (``MoeConfig.remainder``): an expert whose rows pass a multiple of the tile by a few no longer pays a whole tile for
# them, and one under half a tile takes the smaller one. H100, same run (the remainder sweeps above): T = 512 0.916 ms
# against 0.952, T = 1024 1.198 against 1.352 (16 rows: 1.367), T = 4096 3.175 against 3.541 (16 rows: 3.197, 64
# rows: 3.351); T = 2048 (64 rows per expert) 128 x 128 + 64 x 64 1.919 against 2.070 for 64 x 64 + 16 and 2.228 for
# 64 x 64 alone (f3d8a12, docs/bench/moe_sweep_remainder_h100_2026-11-26_f3d8a12.json).
# Past 48 rows per expert the down tiles are twice block_n wide (``down_block_n``: 256 rows on the 8-warp tile, whose
# warpgroups then take 128 rows each as in gate_up, 128 on its remainder): T = 4096 2.739 ms against 2.960, T = 2048
# 1.698 against 1.735 (H100, same run, ``--sweep-kind down-wide``, 077546d,
# docs/bench/moe_sweep_down_wide_h100_2026-11-26_077546d.json); at T = 64-1024 no gain past 1%.
_SMALL_16_WGMMA = MoeConfig(16, 64, 128, num_warps=4, num_stages=3, swap_ab=True, order="wgmma")
_SMALL_32_WGMMA = MoeConfig(32, 64, 128, num_warps=4, num_stages=3, swap_ab=True, order="wgmma")
_MID_WGMMA = MoeConfig(64, 64, 128, num_warps=4, num_stages=3, swap_ab=True, order="wgmma")
# Past 48 rows per expert the tiles keep each K tile's wgmmas in flight while the next K tile is decoded
# (``wait_mma=False``; the decoded operand copied per k16 step, ``dequant_mxfp4.fresh_operand``, so that no build writes
# a register a pending wgmma reads: ``dequant_mxfp4.wgmma_register_hazards`` walks every build's PTX in the kernels
# check and at launch; on a Triton outside ``IN_FLIGHT_TRITONS`` they wait). H100, same run against their waiting twins
# (``--sweep-kind overlap``, 66471f5, docs/bench/moe_sweep_overlap_fresh_{e32,e128}_h100_2026-11-27_66471f5.json): 32
# experts T = 512 / 2048 / 4096 / 8192 0.408 / 1.107 / 2.096 / 4.035 ms against 0.426 / 1.159 / 2.204 / 4.257 waiting;
# 128 experts T = 2048 / 4096 1.569 / 2.452 against 1.621 / 2.547; 4 stages lost at each. Below 48 rows the 64 x 64
# tile waits: at 128 experts T = 1024 in flight took 1.041 ms against 1.019
# (moe_sweep_kparts_e128_h100_2026-11-27_b1dc0ea.json, before the copy).
_WIDE_WGMMA = MoeConfig(
    128, 128, 128, num_warps=8, num_stages=3, swap_ab=True, order="wgmma", down_block_n=256, wait_mma=False
)
MOE_TILES_WGMMA = (
    (8, _SMALL_16_WGMMA),
    (16, dataclasses.replace(_SMALL_32_WGMMA, remainder=_SMALL_16_WGMMA)),
    (48, dataclasses.replace(_MID_WGMMA, remainder=_SMALL_32_WGMMA)),
    (64, dataclasses.replace(_WIDE_WGMMA, remainder=dataclasses.replace(_MID_WGMMA, down_block_n=128, wait_mma=False))),
    (
        float("inf"),
        dataclasses.replace(
            _WIDE_WGMMA, remainder=dataclasses.replace(_SMALL_32_WGMMA, down_block_n=128, wait_mma=False)
        ),
    ),
)
# Weights in the mma2 order (the strided layout's ``order: mma2``: sm_12x, sm_8x): these tiles from T x k = 9 (its
# decode GEMVs below that: CHUNK_GEMV_MAX_ASSIGNMENTS), the tokens in dots of 16 or 32 (``MoeConfig.token_dots``), 64
# weight rows a block on 4 warps as in mma2_order_probe.py (whose order, against the rows order's swapped tiles on
# mma.sync, was 1.34-1.52x on a dense stand-in of gate_up:
# docs/bench/mma2_order_time_mmav2_h100_2026-11-27_d29fe89.json). Measured on sm_12x's code path (an H100 under Triton's
# DISABLE_MMA_V3), 120b shapes, CUDA graphs, ``peers.py --sweep-moe 16,64,512,4096 --sweep-kind mma2`` (e7c9cdb,
# docs/bench/moe_sweep_mma2_mmav2_h100_2026-11-27_e7c9cdb.json): each shipped choice best of 14 candidates (16-128
# tokens, 4 or 8 warps, 2 or 3 stages; 8 warps with a 128-row down tile lost at every T): T = 16 0.330 ms, 64 0.691, 512
# 0.920 (the 32-token tile + 16 remainder; 32 alone 1.041, 16 alone 1.088), 4096 3.750 (128 tokens on 2 stages + 32
# remainder; 64 alone 4.283); the rows order's shipped 0.333 / 0.961 / 1.311 / 7.056. The 128-token tile holds 255
# registers with a small spill (gate_up 4 LDL in its loop on sm_121a); 3 stages of it pass sm_12x's shared memory. From
# 48 to 96 rows per expert (never swept at e7c9cdb, which took the 128-token tile from 48 rows on, half of each
# 128-token block empty at 64) the 64-token tile with a 32-token remainder: at gpt-oss-20b's 32 experts, T = 640 / 768
# (80 / 96 rows) 0.728 / 0.803 ms against the 128 + 32's 0.831 / 0.839 and the 64 + 16's 0.778 / 0.905 (c3693bc,
# docs/bench/moe_sweep_remainder_e32_bound_mmav2_h100_2026-11-27_c3693bc.json), T = 512 (64 rows) 0.597 against 0.823
# (the 64 + 16: 0.570, the one size where it led), at 128 experts T = 2048 (64 rows) 2.289 against 3.022 (64 + 16:
# 2.192). At 112 rows and beyond the 128 + 32 leads (T = 896: 0.848 against the 64-token tiles' 0.920-0.930; T = 1024:
# 0.941 against 1.019-1.021). Same code path, ``--sweep-kind remainder`` (92a1bcc and c3693bc,
# docs/bench/moe_sweep_remainder_e{32,128}_mmav2_h100_2026-11-27_92a1bcc.json).
_SMALL_16_MMA2 = MoeConfig(16, 64, 128, num_warps=4, num_stages=3, swap_ab=True, order="mma2")
_SMALL_32_MMA2 = MoeConfig(32, 64, 128, num_warps=4, num_stages=3, swap_ab=True, order="mma2")
_MID_MMA2 = MoeConfig(64, 64, 128, num_warps=4, num_stages=3, swap_ab=True, order="mma2")
_WIDE_MMA2 = MoeConfig(128, 64, 128, num_warps=4, num_stages=2, swap_ab=True, order="mma2")
MOE_TILES_MMA2 = (
    (8, _SMALL_16_MMA2),
    (16, dataclasses.replace(_SMALL_32_MMA2, remainder=_SMALL_16_MMA2)),
    (96, dataclasses.replace(_MID_MMA2, remainder=_SMALL_32_MMA2)),
    (float("inf"), dataclasses.replace(_WIDE_MMA2, remainder=_SMALL_32_MMA2)),
)
MOE_TILES_BY_ORDER = {"wgmma": MOE_TILES_WGMMA, "mma2": MOE_TILES_MMA2}  # the chunk orders' tables
MOE_CONFIGS = {f"rows<={bound:g}": cfg for bound, cfg in MOE_TILES}
MOE_CONFIGS_WGMMA = {f"rows<={bound:g}": cfg for bound, cfg in MOE_TILES_WGMMA}
MOE_CONFIGS_MMA2 = {f"rows<={bound:g}": cfg for bound, cfg in MOE_TILES_MMA2}
MOE_CONFIGS_SCALED = {f"rows<={bound:g}": cfg for bound, cfg in MOE_TILES_SCALED}


# T * k up to which the per-assignment GEMV beats the scheduled tiles, both in CUDA graphs. Against the pipelined
# swapped 16-row tile (the sweeps above): T = 32 GEMV 0.598 vs 0.695 ms, T = 48 0.865 vs 0.778, T = 64 1.119 vs
# 0.909. (Against the one-stage tile the crossing was at T = 64, against the tiles before the swap at T = 80:
# docs/PERF_LOG.md stops 10 and 19.) A token sharing an expert re-reads its weights (the programs of one row tile run
# together and mostly hit L2); the tiles read each expert once. Since the schedule became two Triton kernels (~40 us
# less a call) the tile wins from T = 24: H100, same run, ``peers.py --sweep-moe 24,32,48 --sweep-kind swap``
# (7011f92, docs/bench/moe_sweep_swap_h100_2026-11-26_7011f92.json): T = 24 16 x 64 tile 0.439 ms against the GEMV's
# 0.458, T = 32 0.580 against 0.614; at T = 16 the GEMV (0.329) is ahead of even the wgmma order's 16 x 64 tile (0.359,
# peers_moe_h100_2026-11-26_4766afb.json), which is faster than this order's at T = 24-128. So the GEMVs take
# T * k <= 64 (T <= 16 at top-4).
GEMV_MAX_ASSIGNMENTS = 64


@dataclass(frozen=True)
class MoeGemvConfig:
    """The decode path's two GEMV configs: ``gate_up`` (its ``block_n`` counts intermediate rows: each program
    runs that many gate rows and as many up rows) and ``down``. On prepared activations (f16x2 math) both
    must be prepared, and gate_up writes the intermediate prepared, so its ``block_n`` is whole groups of 32."""

    gate_up: GemvConfig
    down: GemvConfig

    def __post_init__(self):
        if self.gate_up.prepared != self.down.prepared:
            raise ValueError(
                f"gate_up {self.gate_up.name()} and down {self.down.name()} must both use prepared "
                "activations (f16x2) or neither"
            )
        for role, c in (("gate_up", self.gate_up), ("down", self.down)):
            if c.block_k % 128:
                raise ValueError(f"{role} block_k {c.block_k} must be a multiple of 128 (the strided layout's K tiles)")
        if self.gate_up.prepared and self.gate_up.block_n % 32:
            # one program per whole group: fewer rows sharing a group's packing were slower (docs/PERF_LOG.md, stop 11)
            raise ValueError(
                f"the f16x2 gate_up writes whole groups of 32 intermediate values: block_n must be a "
                f"multiple of 32, got {self.gate_up.block_n}"
            )

    @classmethod
    def from_single(cls, cfg: GemvConfig) -> MoeGemvConfig:
        """One GEMV config for both kernels, as before stop 11 (the f16x2 gate_up then ran 32 rows per program)."""
        return cls(dataclasses.replace(cfg, block_n=32) if cfg.prepared else cfg, cfg)

    def each(self, **changes) -> MoeGemvConfig:
        """``changes`` applied to both kernels' configs (``pdl=0``: the same math, launched one after the other)."""
        return MoeGemvConfig(dataclasses.replace(self.gate_up, **changes), dataclasses.replace(self.down, **changes))

    def portable(self) -> MoeGemvConfig:
        return MoeGemvConfig(self.gate_up.portable(), self.down.portable())

    @property
    def prepared(self) -> bool:
        return self.gate_up.prepared

    def name(self) -> str:
        return f"gate_up {self.gate_up.name()} down {self.down.name()}"


# H100, benchmarks/experiments/moe_pair_probe.py (docs/PERF_LOG.md, stop 11): one pair is best or within noise
# of the best at every T from 1 to 64: gate_up 32 intermediate rows (64 weight rows) x 256 k on 8 warps, down
# 16 rows x 512 k on 4 warps. Each GEMV is launched while the kernel before it runs (``pdl``).
MOE_GEMV = MoeGemvConfig(GemvConfig(32, 256, 8, 1, "f16x2", pdl=1), GemvConfig(16, 512, 4, 1, "f16x2", pdl=1))


@dataclass(frozen=True)
class ChunkGemvConfig:
    """A chunk order's decode path (``order`` "mma2" or "wgmma"): per (token, slot) assignment GEMVs straight on the
    stored chunks (``gemv_mxfp4.gemv_chunks``), the down kernel combining the k slots; no schedule.
    ``gate_up_blocks``: 16-row blocks of intermediate rows a gate_up program (it runs as many gate and up blocks);
    ``down_blocks``: of H rows a down program. ``pdl``: the down kernel is launched while the gate_up kernel runs
    (where the GPU can: sm_90 and newer)."""

    order: str
    gate_up_blocks: int = 1
    gate_up_warps: int = 2
    down_blocks: int = 1
    down_warps: int = 4
    pdl: bool = True

    def __post_init__(self):
        if self.order not in ("mma2", "wgmma"):
            raise ValueError(f"ChunkGemvConfig.order must be mma2 or wgmma (a chunk order), got {self.order!r}")
        for name in ("gate_up_blocks", "gate_up_warps", "down_blocks", "down_warps"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1 or v & (v - 1):
                raise ValueError(f"ChunkGemvConfig.{name} must be a power of 2 (a Triton block shape), got {v!r}")
        if not isinstance(self.pdl, bool):
            raise ValueError(f"ChunkGemvConfig.pdl must be True or False, got {self.pdl!r}")

    def name(self) -> str:
        blocks = f"gu{16 * self.gate_up_blocks}w{self.gate_up_warps} d{16 * self.down_blocks}w{self.down_warps}"
        return f"{self.order}-gemv {blocks}{' pdl' if self.pdl else ''}"


# The mma2 order's decode GEMVs against its 16-token tile, on sm_12x's code path (an H100 under DISABLE_MMA_V3), 120b
# shapes, CUDA graphs, ``peers.py --sweep-moe 1,2,4,8,16 --sweep-kind mma2`` (92a1bcc,
# docs/bench/moe_sweep_mma2_gemv_mmav2_h100_2026-11-27_92a1bcc.json), best of 8 GEMV shapes: gate_up 16 intermediate
# rows (32 weight rows) on 2 warps, down 16 rows on 4, the down kernel launched while gate_up runs: T = 1 0.040 ms
# against the tile's 0.056, T = 2 0.059 against 0.069; T = 4 0.104 against 0.103, T = 8 0.191 against 0.197 (ties),
# T = 16 0.370 against 0.331. Launching the down kernel after gate_up instead: 0.0405 against 0.0398 at T = 1 (the
# 4-warp twin). The rows order's GEMVs remain faster at T = 1 (0.030 ms, same run).
MMA2_GEMV = ChunkGemvConfig("mma2", gate_up_blocks=1, gate_up_warps=2, down_blocks=1, down_warps=4)
# The wgmma order's: the same shape, best of 9 at T = 1 and 2 (H100, ``peers.py --sweep-moe 1,2,4,8 --sweep-kind
# wgmma-gemv``, 0f661db, docs/bench/moe_sweep_wgmma_gemv_h100_2026-11-27_0f661db.json): 0.0418 ms against the order's
# 16 x 64 tile's 0.0538 at T = 1, 0.0664 against 0.0677 at T = 2 (a tie); the tile from T = 4 (0.104 against 0.116).
WGMMA_GEMV = ChunkGemvConfig("wgmma", gate_up_blocks=1, gate_up_warps=2, down_blocks=1, down_warps=4)
CHUNK_GEMVS = {"mma2": MMA2_GEMV, "wgmma": WGMMA_GEMV}  # the chunk orders' GEMVs the dispatch runs

# T * k up to which a chunk order's decode GEMVs (:data:`CHUNK_GEMVS`) take a call instead of its tiles: T <= 2 at
# top-4, where the mma2 order's are clearly ahead (above); the tiles from T = 3, ties at T = 4 and 8 going to them.
CHUNK_GEMV_MAX_ASSIGNMENTS = 8


def pick_moe_gemv_config(assignments: int, cuda: bool = True) -> MoeGemvConfig:
    """The decode GEMV configs for ``assignments`` = T * k (portable, without PTX, off CUDA). One pair serves
    every T the GEMV path takes (:data:`GEMV_MAX_ASSIGNMENTS`); the argument stays for the next measurement."""
    return MOE_GEMV if cuda else MOE_GEMV.portable()


def pick_moe_config(
    tokens: int, topk: int, experts: int, activations: str = "bf16", fold_scale: bool = False, order: str = "rows"
) -> MoeConfig:
    """The scheduled-tile shape for ``tokens`` routed to ``topk`` of ``experts`` (:data:`MOE_TILES`; for MXFP8/MXFP4
    activations :data:`MOE_TILES_SCALED`; weights in a chunk ``order`` :data:`MOE_TILES_BY_ORDER`'s); a swapped tile
    with the scale folded where ``fold_scale`` (the weights' scales fit it: ``dequant_mxfp4.fold_shift``)."""
    rows = tokens * topk / experts
    tiles = MOE_TILES_BY_ORDER.get(order) or (MOE_TILES if activations == "bf16" else MOE_TILES_SCALED)
    cfg = next(cfg for bound, cfg in tiles if rows <= bound)
    return with_fold(cfg, activations == "bf16", fold_scale)


def pick_moe(
    tokens: int,
    topk: int,
    experts: int,
    hidden: int,
    activations: str = "bf16",
    cuda: bool = True,
    fold_scale: bool = False,
    order: str = "rows",
) -> MoeConfig | MoeGemvConfig | ChunkGemvConfig:
    """What :func:`moe_mxfp4` runs when given no config: the per-assignment decode GEMVs of the rows order (BF16
    activations, ``hidden % 32 == 0``, at most :data:`GEMV_MAX_ASSIGNMENTS` assignments) or of a chunk order (at
    most :data:`CHUNK_GEMV_MAX_ASSIGNMENTS`: :data:`CHUNK_GEMVS`), else the scheduled tiles
    (:data:`MOE_TILES_BY_ORDER`)."""
    if order == "rows" and activations == "bf16" and tokens * topk <= GEMV_MAX_ASSIGNMENTS and hidden % 32 == 0:
        return pick_moe_gemv_config(tokens * topk, cuda)
    if order in CHUNK_GEMVS and tokens * topk <= CHUNK_GEMV_MAX_ASSIGNMENTS:  # the orders take BF16 activations only
        return CHUNK_GEMVS[order]
    return pick_moe_config(tokens, topk, experts, activations, fold_scale, order)


# The schedule's launch shape: assignments are counted and placed in at most SCHEDULE_CHUNKS chunks (one program
# each, so every program can hold all chunks' counts), each chunk in pieces of ``_schedule_piece`` rows. A program's
# pieces run one after another, each waiting on its load (~2.3 us a piece on an H100): 128 chunks keep that to two
# pieces at T = 4096 (32 chunks took 8: 25 + 19 us for the two kernels).
SCHEDULE_CHUNKS = 128
SCHEDULE_BLOCKS = 64  # row blocks described per program


def schedule_place_warps(max_chunks: int) -> int:
    """Warps of the placing kernel, whose every program holds a [max_chunks, experts] tile of counts."""
    return 4 if max_chunks <= 32 else 8


def _schedule_piece(experts_p2: int) -> int:
    """Assignments a program takes at once: compared with every expert ([piece, experts], at most 8 Ki elements) and
    with each other ([piece, piece], for the ranks): 64, fewer past 128 experts."""
    return max(16, min(64, 8192 // experts_p2))


@triton.jit
def _schedule_count_kernel(ids_ptr, hist_ptr, n, chunk, PIECE: tl.constexpr, E_P2: tl.constexpr):
    """Program c: how many of assignments [c chunk, (c + 1) chunk) go to each expert -> hist[c, :E_P2]."""
    c = tl.program_id(0)
    cols = tl.arange(0, E_P2)
    counts = tl.zeros((E_P2,), dtype=tl.int32)
    for p in range(0, chunk, PIECE):
        i = c * chunk + p + tl.arange(0, PIECE)
        e = tl.load(ids_ptr + i, mask=i < n, other=E_P2).to(tl.int32)  # past n: no expert's column
        counts += tl.sum((e[:, None] == cols[None, :]).to(tl.int32), axis=0)
    tl.store(hist_ptr + c * E_P2 + cols, counts)


@triton.jit
def _schedule_place_kernel(
    ids_ptr,
    hist_ptr,
    order_ptr,
    blk_e_ptr,
    blk_s_ptr,
    blk_end_ptr,
    n,
    experts,
    blocks_total,
    chunk,
    chunks,
    BLOCK_M: tl.constexpr,
    PIECE: tl.constexpr,
    E_P2: tl.constexpr,
    MAX_CHUNKS: tl.constexpr,
    BLOCKS_PER_PROGRAM: tl.constexpr,
):
    """Programs 0 .. chunks - 1: chunk c's assignments at their sorted positions (by expert, then by index: a
    stable sort) in ``order``. The programs after them: BLOCKS_PER_PROGRAM row blocks each (expert or -1, first and
    end sorted position). Every program reads all chunks' counts (``_schedule_count_kernel``)."""
    pid = tl.program_id(0)
    cols = tl.arange(0, E_P2)
    rows = tl.arange(0, MAX_CHUNKS)
    hist = tl.load(hist_ptr + rows[:, None] * E_P2 + cols[None, :], mask=(rows < chunks)[:, None], other=0)
    counts = tl.sum(hist, axis=0)
    starts = tl.cumsum(counts, axis=0) - counts  # each expert's first sorted position
    if pid < chunks:
        # where this chunk's assignments of each expert begin: after the earlier chunks' ones
        base = starts + tl.sum(tl.where((rows < pid)[:, None], hist, 0), axis=0)
        j = tl.arange(0, PIECE)
        for p in range(0, chunk, PIECE):
            i = pid * chunk + p + j
            e = tl.load(ids_ptr + i, mask=i < n, other=E_P2).to(tl.int32)
            hit = (e[:, None] == cols[None, :]).to(tl.int32)
            # earlier assignments of the same expert within the piece: counted by comparing every pair (a 2-D
            # scan in Triton moved the tile through shared memory and took ~40 us on an H100)
            e_earlier = tl.where(j[None, :] < j[:, None], tl.reshape(e, (1, PIECE)), -1)
            rank = tl.sum((e_earlier == e[:, None]).to(tl.int32), axis=1)
            pos = tl.sum(hit * base[None, :], axis=1) + rank
            tl.store(order_ptr + pos, i, mask=i < n)
            base += tl.sum(hit, axis=0)
    else:
        blocks = (counts + BLOCK_M - 1) // BLOCK_M
        cum_blocks = tl.cumsum(blocks, axis=0)
        b = (pid - chunks) * BLOCKS_PER_PROGRAM + tl.arange(0, BLOCKS_PER_PROGRAM)
        # block b is expert e's when e experts' blocks end at or before it (padding columns end at the total)
        expert = tl.sum((cum_blocks[None, :] <= b[:, None]).to(tl.int32), axis=1)
        mine = (tl.minimum(expert, experts - 1)[:, None] == cols[None, :]).to(tl.int32)
        first_block = tl.sum(mine * (cum_blocks - blocks)[None, :], axis=1)
        start = tl.sum(mine * starts[None, :], axis=1) + (b - first_block) * BLOCK_M
        end = tl.sum(mine * (starts + counts)[None, :], axis=1)
        ok = b < blocks_total
        tl.store(blk_e_ptr + b, tl.where(expert < experts, expert, -1), mask=ok)
        tl.store(blk_s_ptr + b, start, mask=ok)
        tl.store(blk_end_ptr + b, end, mask=ok)


def _schedule_shape(n: int, experts: int, block_m: int) -> tuple[int, int, int, int, int, int]:
    """:func:`moe_schedule`'s sizes for ``n`` assignments: (blocks, experts rounded to a power of 2, assignments a
    program compares at once, assignments a chunk, chunks, the chunks' power of 2 every placing program tiles)."""
    nb = max(1, triton.cdiv(n + (block_m - 1) * min(experts, n), block_m))  # one empty block when T = 0
    e_p2 = triton.next_power_of_2(max(experts, 2))
    piece = _schedule_piece(e_p2)
    chunk = max(piece, triton.next_power_of_2(triton.cdiv(max(n, 1), SCHEDULE_CHUNKS)))
    chunks = triton.cdiv(n, chunk)
    max_chunks = triton.next_power_of_2(max(chunks, 2))  # the counts tile every program holds: [max_chunks, e_p2]
    return nb, e_p2, piece, chunk, chunks, max_chunks


def _specialized(v: int) -> int:
    """How Triton specializes an integer argument when it compiles: as the constant 1, as a multiple of 16, or not."""
    return 1 if v == 1 else 16 if v % 16 == 0 else 0


def launch_variant(
    tokens: int, topk: int, experts: int, hidden: int, fold_scale: bool = False, order: str = "rows"
) -> tuple:
    """What :func:`moe_mxfp4` compiles for a call of ``tokens`` tokens (BF16 activations, on CUDA), as far as the
    call's size decides it: the dispatch's choice and, for the scheduled tiles, the schedule's counts tile and
    Triton's specializations of its integer arguments (the tiles' and the GEMVs' own arguments do not depend on
    ``tokens``). Calls with equal variants launch the same compiled kernels."""
    cfg = pick_moe(tokens, topk, experts, hidden, "bf16", True, fold_scale, order)
    if not isinstance(cfg, MoeConfig):
        return (cfg.name(),)
    n = tokens * topk
    nb, _, _, chunk, chunks, max_chunks = _schedule_shape(n, experts, cfg.block_m)
    return (cfg.name(), max_chunks, *map(_specialized, (n, nb, chunk, chunks)))


def warm_token_counts(
    topk: int, experts: int, hidden: int, max_tokens: int, fold_scale: bool = False, order: str = "rows"
) -> list[int]:
    """The fewest token counts whose calls compile what every call of 1 to ``max_tokens`` tokens launches (the first
    count of each :func:`launch_variant`): an engine that runs them at load compiles nothing while it serves."""
    first: dict[tuple, int] = {}
    for t in range(1, max_tokens + 1):
        first.setdefault(launch_variant(t, topk, experts, hidden, fold_scale, order), t)
    return sorted(first.values())


def warm_moe(
    w: dict[str, torch.Tensor],
    topk: int,
    hidden: int,
    max_tokens: int,
    fold_scale: bool = False,
    order: str = "rows",
    scale_shift: int = 0,
) -> list[int]:
    """Run :func:`moe_mxfp4` on zeros at each of :func:`warm_token_counts`' token counts for the strided layer ``w``
    (with ``fold_scale``, ``order`` and ``scale_shift`` as its calls will have them), so that every kernel variant a
    call of 1 to ``max_tokens`` tokens launches is compiled now (the experts each token takes are distinct, as a
    router's top-k). Returns the counts run."""
    experts, device = w["w13_weight"].shape[0], w["w13_weight"].device
    counts = warm_token_counts(topk, experts, hidden, max_tokens, fold_scale, order)
    x = torch.zeros(max(counts), hidden, dtype=torch.bfloat16, device=device)
    ids = (torch.arange(max(counts) * topk, device=device) % experts).to(torch.int32).view(-1, topk)
    wts = torch.full(ids.shape, 1.0 / topk, device=device)
    for t in counts:
        moe_mxfp4(x[:t], ids[:t], wts[:t], w, fold_scale=fold_scale, order=order, scale_shift=scale_shift)
    return counts


def moe_schedule(topk_ids: torch.Tensor, experts: int, block_m: int):
    """(sorted assignment ids, per-block expert, start, end); blocks past the real ones have expert -1.

    Assignments are sorted by expert, stably (by index within an expert), and each expert's run is cut into
    ``block_m``-row blocks. The block count is bounded so that the grid needs no host sync: an expert with c
    assignments takes ceil(c / block_m) <= (c + block_m - 1) / block_m blocks, and at most min(experts, T*k) experts
    have any, so ``cdiv(T*k + (block_m - 1) * min(experts, T*k), block_m)``. Two launches (counts per chunk, then
    placement and blocks), no host sync: the whole MoE call can be captured in a CUDA graph. (Torch's argsort and
    the dozen ops around it took ~48 us on an H100 at 64-1024 tokens: ``benchmarks/experiments/moe_tile_profile.py``.)
    Every id must be in ``[0, experts)``, as a router's top-k are: nothing here checks it (that would take a sync), and
    an id out of range leaves positions of ``order`` unwritten.
    """
    flat = topk_ids.reshape(-1).contiguous()  # a column slice's flatten() is a strided view
    n = flat.numel()
    nb, e_p2, piece, chunk, chunks, max_chunks = _schedule_shape(n, experts, block_m)
    dev = flat.device
    hist = torch.empty(max(chunks, 1), e_p2, dtype=torch.int32, device=dev)
    order = torch.empty(n, dtype=torch.int32, device=dev)
    blk_e, blk_s, blk_end = (torch.empty(nb, dtype=torch.int32, device=dev) for _ in range(3))
    if chunks:
        _schedule_count_kernel[(chunks,)](flat, hist, n, chunk, PIECE=piece, E_P2=e_p2, num_warps=4, num_stages=1)
    _schedule_place_kernel[(chunks + triton.cdiv(nb, SCHEDULE_BLOCKS),)](
        flat,
        hist,
        order,
        blk_e,
        blk_s,
        blk_end,
        n,
        experts,
        nb,
        chunk,
        chunks,
        BLOCK_M=block_m,
        PIECE=piece,
        E_P2=e_p2,
        MAX_CHUNKS=max_chunks,
        BLOCKS_PER_PROGRAM=SCHEDULE_BLOCKS,
        num_warps=schedule_place_warps(max_chunks),
        num_stages=1,
    )
    return order, blk_e, blk_s, blk_end


@triton.jit
def _load_a(a_ptr, rows, row_ok, k0, K, stride_a, A_FMT: tl.constexpr, BLOCK_K: tl.constexpr):
    """One ``[BLOCK_M, BLOCK_K]`` activation tile of gathered rows (packed ``BLOCK_K/2`` bytes for e2m1)."""
    if A_FMT == "e2m1":
        rb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        a = tl.load(
            a_ptr + rows[:, None] * stride_a + rb[None, :], mask=row_ok[:, None] & (rb < K // 2)[None, :], other=0
        )
    else:
        rk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * stride_a + rk[None, :], mask=row_ok[:, None] & (rk < K)[None, :], other=0.0)
    return a


@triton.jit
def _load_a_scales(as_ptr, rows, row_ok, k0, K, stride_as, BLOCK_K: tl.constexpr):
    rs = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    return tl.load(
        as_ptr + rows[:, None] * stride_as + rs[None, :], mask=row_ok[:, None] & (rs < K // 32)[None, :], other=127
    )


@triton.jit
def _dot(
    a,
    as_ptr,
    rows,
    row_ok,
    k0,
    K,
    stride_as,
    w,
    ws,
    acc,
    A_FMT: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MANUAL_DEQUANT: tl.constexpr = False,
    INTERPRETER: tl.constexpr = False,
):
    """``acc + a @ W`` for one K step; ``w`` is the packed ``[BLOCK_N, BLOCK_K/2]`` tile as loaded, ``ws`` its scales.
    ``MANUAL_DEQUANT`` (bf16 only): W dequantized with integer ops (as the dense decode kernel does) and multiplied
    with ``tl.dot``, instead of ``tl.dot_scaled``'s upcast."""
    if A_FMT == "bf16":
        acc = dot_bf16_mxfp4(a, w, ws, acc, w.shape[0], BLOCK_K, MANUAL_DEQUANT, INTERPRETER)
    else:
        acc = tl.dot_scaled(
            a, _load_a_scales(as_ptr, rows, row_ok, k0, K, stride_as, BLOCK_K), A_FMT, w.T, ws, "e2m1", acc
        )
    return acc


@triton.jit
def _w13_rows(n, half):
    """Stored w13 rows of intermediate rows ``n``: gate (``half`` 0) or up (1), in the layout's row tiles
    of 32 gate rows then the same 32 up rows."""
    return (n // 32) * 64 + half * 32 + n % 32


@triton.jit
def _load_w(w_ptr, ws_ptr, rn, k0, Kp, stride_wn, stride_wsn, BLOCK_K: tl.constexpr, TILE_ROWS: tl.constexpr):
    """``[BLOCK_N, BLOCK_K/2]`` packed weights and ``[BLOCK_N, BLOCK_K/32]`` scales,
    for stored rows ``rn`` of a K-tiled matrix (``TILE_ROWS`` rows per tile, 64 bytes per row and 128-code
    K tile). Rows are always in range (the layout pads N to the tile); K past the padded width reads zeros."""
    r_local = rn % TILE_ROWS
    row_base = (rn - r_local) * stride_wn + r_local * 64
    if BLOCK_K == 128:  # one K tile (the shipped shapes)
        # The tile offset is k0 * TILE_ROWS / 2, written without a division of k0: Triton 3.6's software
        # pipeline miscompiled the bf16 x e2m1 dot_scaled loop when the next step's address took k0 // 128
        # (H100, num_stages >= 2: relative error 1.4, right with num_stages=1 and on the interpreter; tiles
        # of 64 codes, which need that division, did the same, so BLOCK_K is whole K tiles).
        rb = k0 // 2 + tl.arange(0, 64)
        off = k0 * (TILE_ROWS // 2) + tl.arange(0, 64)
        w = tl.load(w_ptr + row_base[:, None] + off[None, :], mask=(rb < Kp // 2)[None, :], other=0)
    else:  # whole K tiles: [rows, tiles, 64] bytes, then one row of BLOCK_K / 2
        NT: tl.constexpr = BLOCK_K // 128
        t = tl.arange(0, NT)
        rb = k0 // 2 + t[:, None] * 64 + tl.arange(0, 64)[None, :]
        off = k0 * (TILE_ROWS // 2) + t[:, None] * (TILE_ROWS * 64) + tl.arange(0, 64)[None, :]
        w = tl.load(w_ptr + row_base[:, None, None] + off[None, :, :], mask=(rb < Kp // 2)[None, :, :], other=0)
        w = tl.reshape(w, (rn.shape[0], BLOCK_K // 2))
    rs = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    s = tl.load(ws_ptr + rn[:, None] * stride_wsn + rs[None, :], mask=(rs < Kp // 32)[None, :], other=127)
    return w, s


@triton.jit
def _swiglu(gate, up, alpha, limit):
    """gpt-oss SwiGLU: gate clamped above, up on both sides, ``(up + 1) * gate * sigmoid(alpha * gate)``."""
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    return (up + 1.0) * gate * tl.sigmoid(alpha * gate)


@triton.jit
def _remainder_overlap(PDL: tl.constexpr):
    """Called first thing. ``PDL`` 1 (a tile whose remainder tile's launch follows): let that launch start its
    programs as soon as every program of this one has started, so they fill the SMs this launch's last wave leaves
    idle (the two write disjoint rows). ``PDL`` 2 (that remainder launch): its program 0 waits for the tile's launch
    to complete, so this launch does not complete before it and the kernel after both sees both launches' stores;
    only one program waits, since a waiting program holds its SM slot (every program waiting at its exit, the
    blocks other launches own among them, made the rows order 1% slower at T = 512-4096 on an H100)."""
    if PDL == 1:
        gdc_launch_dependents()
    if PDL == 2:
        if tl.program_id(0) == 0:
            gdc_wait()


@triton.jit
def _tile_of(n_tiles):
    """(row block, N tile) of this program: a block's N tiles are consecutive programs, so the programs in flight
    together share a few blocks' activation rows in L2 (at T = 4096 a 128-row block's are 754 KB, read by 23 gate_up
    tiles; block-minor order had ~130 blocks' rows in flight, past the L2) while each reads its own weight tile."""
    pid = tl.program_id(0)
    return pid // n_tiles, pid % n_tiles


@triton.jit
def _gate_up_kernel(
    x_ptr,
    xs_ptr,
    w_ptr,
    ws_ptr,
    b_ptr,
    h_ptr,
    order_ptr,
    blk_e_ptr,
    blk_s_ptr,
    blk_end_ptr,
    H,
    Hp,
    Ip,
    TOPK,
    stride_x,
    stride_xs,
    stride_we,
    stride_wn,
    stride_wse,
    stride_wsn,
    stride_h,
    alpha,
    limit,
    A_FMT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MANUAL_DEQUANT: tl.constexpr = False,
    INTERPRETER: tl.constexpr = False,
    SWAP_AB: tl.constexpr = False,
    MATH: tl.constexpr = "asm",
    WAIT_MMA: tl.constexpr = False,
    ORDER: tl.constexpr = "rows",
    DOTS: tl.constexpr = 1,
    PDL: tl.constexpr = 0,
    SCALE_SHIFT: tl.constexpr = 0,
    rows_lo=0,
    rows_hi=1 << 30,
):
    """Grid (row blocks x N tiles, the N tiles of a block consecutive: ``_tile_of``): block ``pid_b`` (expert ``e``'s
    sorted rows; padding blocks, expert -1, return) x the ``pid_n``-th BLOCK_N intermediate columns: gate and up over
    the whole K, SwiGLU, stored in the intermediate.
    ``ORDER`` "wgmma" or "mma2" (a chunk order): gate and up rows one ``[2 BLOCK_N, 128]`` operand per K tile, decoded
    once for ``DOTS`` dots of the block's tokens, x in natural order (masked past H), the intermediate stored in
    natural order."""
    _remainder_overlap(PDL)
    pid_b, pid_n = _tile_of(Ip // BLOCK_N)
    e = tl.load(blk_e_ptr + pid_b)
    if e < 0:
        return
    start, end = tl.load(blk_s_ptr + pid_b), tl.load(blk_end_ptr + pid_b)
    if ((end - start) <= rows_lo) | ((end - start) > rows_hi):  # another launch's block (MoeConfig.remainder)
        return
    pos = start + tl.arange(0, BLOCK_M)  # sorted positions
    row_ok = pos < end
    tok = tl.load(order_ptr + pos, mask=row_ok, other=0) // TOPK
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # < Ip (Ip % BLOCK_N == 0)
    w_e = w_ptr + e.to(tl.int64) * stride_we
    s_e = ws_ptr + e.to(tl.int64) * stride_wse
    if ORDER != "rows":
        # gate and up rows one [2 BLOCK_N, 128] operand per K tile (blocks i < NB gate, NB + i up); x in natural order
        NB: tl.constexpr = BLOCK_N // 16
        blk = tl.arange(0, 2 * NB)
        rows = _w13_rows(pid_n * BLOCK_N + 16 * (blk % NB), blk // NB)
        w_off, s_off = wgmma_chunks(rows, stride_wn, stride_wsn, 64)
        acc = chunk_dots(
            x_ptr,
            order_ptr,
            start,
            end,
            TOPK,
            H,
            stride_x,
            w_e,
            s_e,
            w_off,
            s_off,
            64 * 64,
            64 * 4,
            Hp // 128,
            2 * NB,
            BLOCK_M,
            DOTS,
            True,
            MATH,
            ORDER,
            INTERPRETER,
            WAIT_MMA,
            SCALE_SHIFT,
            True,
        )
        gate, up = tl.split(tl.permute(tl.reshape(acc, (2, BLOCK_N, BLOCK_M)), (1, 2, 0)))
    else:
        if SWAP_AB:  # W @ x.T into [BLOCK_N, BLOCK_M]; x split (even | odd columns per K tile) and padded to Hp
            gate = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        else:
            gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, Hp, BLOCK_K):
            if SWAP_AB:
                a_even, a_odd = load_split(x_ptr, tok, row_ok, k0, stride_x, BLOCK_K)
            else:
                a = _load_a(x_ptr, tok, row_ok, k0, H, stride_x, A_FMT, BLOCK_K)
            wg, sg = _load_w(w_e, s_e, _w13_rows(rn, 0), k0, Hp, stride_wn, stride_wsn, BLOCK_K, _GU_ROWS)
            wu, su = _load_w(w_e, s_e, _w13_rows(rn, 1), k0, Hp, stride_wn, stride_wsn, BLOCK_K, _GU_ROWS)
            if SWAP_AB:
                sg, su = shift_scales(sg, SCALE_SHIFT), shift_scales(su, SCALE_SHIFT)
                gate = dot_w_mxfp4(wg, sg, a_even, a_odd, gate, BLOCK_N, BLOCK_K, MATH, INTERPRETER, WAIT_MMA)
                up = dot_w_mxfp4(wu, su, a_even, a_odd, up, BLOCK_N, BLOCK_K, MATH, INTERPRETER, WAIT_MMA)
            else:
                gate = _dot(
                    a, xs_ptr, tok, row_ok, k0, H, stride_xs, wg, sg, gate, A_FMT, BLOCK_K, MANUAL_DEQUANT, INTERPRETER
                )
                up = _dot(
                    a, xs_ptr, tok, row_ok, k0, H, stride_xs, wu, su, up, A_FMT, BLOCK_K, MANUAL_DEQUANT, INTERPRETER
                )
    if ORDER != "rows":
        gate, up = tl.trans(gate), tl.trans(up)
        col = rn
    elif SWAP_AB:
        gate, up = tl.trans(unshift(gate, SCALE_SHIFT)), tl.trans(unshift(up, SCALE_SHIFT))
        col = split_column(rn)  # the down kernel reads the intermediate in split order too
    else:
        col = rn
    gate = gate + tl.load(b_ptr + e * 2 * Ip + rn)[None, :]
    up = up + tl.load(b_ptr + e * 2 * Ip + Ip + rn)[None, :]
    h = _swiglu(gate, up, alpha, limit)
    tl.store(h_ptr + pos[:, None] * stride_h + col[None, :], h.to(h_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _down_kernel(
    h_ptr,
    hs_ptr,
    w_ptr,
    ws_ptr,
    b_ptr,
    y_ptr,
    order_ptr,
    wts_ptr,
    blk_e_ptr,
    blk_s_ptr,
    blk_end_ptr,
    H,
    Hp,
    Ip,
    stride_h,
    stride_hs,
    stride_we,
    stride_wn,
    stride_wse,
    stride_wsn,
    stride_y,
    A_FMT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MANUAL_DEQUANT: tl.constexpr = False,
    INTERPRETER: tl.constexpr = False,
    SWAP_AB: tl.constexpr = False,
    MATH: tl.constexpr = "asm",
    WAIT_MMA: tl.constexpr = False,
    ORDER: tl.constexpr = "rows",
    DOTS: tl.constexpr = 1,
    PDL: tl.constexpr = 0,
    SCALE_SHIFT: tl.constexpr = 0,
    rows_lo=0,
    rows_hi=1 << 30,
):
    """Grid (row blocks x N tiles, as ``_gate_up_kernel``'s): block ``pid_b`` (expert ``e``'s sorted rows; padding
    blocks return) x the ``pid_n``-th BLOCK_N output columns: each assignment's weighted output row, stored at its
    index (t * k + slot). ``ORDER`` "wgmma" or "mma2": W in that chunk order, decoded once a K tile for ``DOTS``
    dots, the intermediate in natural order."""
    _remainder_overlap(PDL)
    pid_b, pid_n = _tile_of(tl.cdiv(Hp, BLOCK_N))
    e = tl.load(blk_e_ptr + pid_b)
    if e < 0:
        return
    start, end = tl.load(blk_s_ptr + pid_b), tl.load(blk_end_ptr + pid_b)
    if ((end - start) <= rows_lo) | ((end - start) > rows_hi):  # another launch's block (MoeConfig.remainder)
        return
    pos = start + tl.arange(0, BLOCK_M)
    row_ok = pos < end
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # < Hp, but for a wider chunk-order tile's last (down_block_n)
    w_e = w_ptr + e.to(tl.int64) * stride_we
    s_e = ws_ptr + e.to(tl.int64) * stride_wse
    if SWAP_AB:  # W @ h.T into [BLOCK_N, BLOCK_M]; the intermediate as the gate_up kernel wrote it (split order, or
        # natural for the chunk orders)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if ORDER != "rows":
        # rows past Hp (the last tile of a down_block_n that does not divide it) load the last 16 rows again
        blocks = tl.minimum(pid_n * BLOCK_N + 16 * tl.arange(0, BLOCK_N // 16), Hp - 16)
        w_off, s_off = wgmma_chunks(blocks, stride_wn, stride_wsn, _DOWN_ROWS)
        acc = chunk_dots(
            h_ptr,
            order_ptr,
            start,
            end,
            1,
            Ip,
            stride_h,
            w_e,
            s_e,
            w_off,
            s_off,
            _DOWN_ROWS * 64,
            _DOWN_ROWS * 4,
            Ip // 128,
            BLOCK_N // 16,
            BLOCK_M,
            DOTS,
            False,
            MATH,
            ORDER,
            INTERPRETER,
            WAIT_MMA,
            SCALE_SHIFT,
            False,
        )
    else:
        for k0 in range(0, Ip, BLOCK_K):
            if SWAP_AB:
                a_even, a_odd = load_split(h_ptr, pos, row_ok, k0, stride_h, BLOCK_K)
            else:
                a = _load_a(h_ptr, pos, row_ok, k0, Ip, stride_h, A_FMT, BLOCK_K)
            w, s = _load_w(w_e, s_e, rn, k0, Ip, stride_wn, stride_wsn, BLOCK_K, _DOWN_ROWS)
            if SWAP_AB:
                acc = dot_w_mxfp4(
                    w, shift_scales(s, SCALE_SHIFT), a_even, a_odd, acc, BLOCK_N, BLOCK_K, MATH, INTERPRETER, WAIT_MMA
                )
            else:
                acc = _dot(
                    a, hs_ptr, pos, row_ok, k0, Ip, stride_hs, w, s, acc, A_FMT, BLOCK_K, MANUAL_DEQUANT, INTERPRETER
                )
    if SWAP_AB:
        if ORDER == "rows":  # the chunk orders' sums come unshifted from chunk_dots
            acc = unshift(acc, SCALE_SHIFT)
        acc = tl.trans(acc)
    if ORDER != "rows":  # a wider down tile's last may pass Hp (down_block_n)
        acc += tl.load(b_ptr + e * Hp + rn, mask=rn < Hp, other=0.0)[None, :]
    else:
        acc += tl.load(b_ptr + e * Hp + rn)[None, :]
    assignment = tl.load(order_ptr + pos, mask=row_ok, other=0)  # t * k + slot
    acc *= tl.load(wts_ptr + assignment, mask=row_ok, other=0.0)[:, None]
    tl.store(
        y_ptr + assignment[:, None].to(tl.int64) * stride_y + rn[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=row_ok[:, None] & (rn < H)[None, :],
    )


@triton.jit
def _bias_swiglu(gate, up, b_ptr, e, Ip, rn, alpha, limit):
    """Expert ``e``'s gate and up biases added to rows ``rn`` of each, then the gpt-oss SwiGLU (fp32)."""
    gate += tl.load(b_ptr + e * 2 * Ip + rn)
    up += tl.load(b_ptr + e * 2 * Ip + Ip + rn)
    return _swiglu(gate, up, alpha, limit)


@triton.jit
def _gate_up_gemv_kernel(
    x_ptr,
    w_ptr,
    ws_ptr,
    b_ptr,
    h_ptr,
    ids_ptr,
    H,
    Ip,
    TOPK,
    stride_x,
    stride_we,
    stride_wn,
    stride_wse,
    stride_wsn,
    stride_h,
    alpha,
    limit,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DECODE: tl.constexpr,
):
    p = tl.program_id(0)  # assignment t * k + slot
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # < Ip (Ip % BLOCK_N == 0)
    e = tl.load(ids_ptr + p).to(tl.int64)
    x_row = x_ptr + (p // TOPK) * stride_x
    w_e, s_e = w_ptr + e * stride_we, ws_ptr + e * stride_wse
    gate = gemv_rows(x_row, w_e, s_e, _w13_rows(rn, 0), H, stride_wn, stride_wsn, BLOCK_N, BLOCK_K, DECODE, _GU_ROWS)
    up = gemv_rows(x_row, w_e, s_e, _w13_rows(rn, 1), H, stride_wn, stride_wsn, BLOCK_N, BLOCK_K, DECODE, _GU_ROWS)
    h = _bias_swiglu(gate, up, b_ptr, e, Ip, rn, alpha, limit)
    tl.store(h_ptr + p * stride_h + rn, h.to(h_ptr.dtype.element_ty))


@triton.jit
def _gate_up_gemv_f16x2_kernel(
    xp_ptr,
    xe_ptr,
    w_ptr,
    ws_ptr,
    b_ptr,
    hp_ptr,
    he_ptr,
    ids_ptr,
    H,
    Ip,
    TOPK,
    stride_xp,
    stride_xe,
    stride_we,
    stride_wn,
    stride_wse,
    stride_wsn,
    stride_hp,
    stride_he,
    alpha,
    limit,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MATH: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    """The same on prepared activations (``gemv_mxfp4.prepare_x``) with packed fp16 math; its output is
    prepared too (``BLOCK_N`` is whole groups of 32): the intermediate, rounded to bf16 as the other path
    stores it, goes out as fp16 pairs and group factors for the down kernel's f16x2 GEMV. ``PDL``: launched
    while ``prepare_x`` runs, and lets the down kernel launch while it runs (``GemvConfig.pdl``)."""
    if PDL:
        gdc_launch_dependents()
    p = tl.program_id(0)
    e = tl.load(ids_ptr + p).to(tl.int64)
    t = p // TOPK
    xp_row, xe_row = xp_ptr + t * stride_xp, xe_ptr + t * stride_xe
    w_e, s_e = w_ptr + e * stride_we, ws_ptr + e * stride_wse
    # gate rows and up rows in one pass: one stream of weight loads, not two in turn. With 32 rows (the
    # layout's tile) they are one contiguous row tile, and each K step one contiguous block.
    r2 = tl.arange(0, 2 * BLOCK_N)
    rows = _w13_rows(tl.program_id(1) * BLOCK_N + r2 % BLOCK_N, r2 // BLOCK_N)
    y = gemv_rows_f16x2(
        xp_row, xe_row, w_e, s_e, rows, H, stride_wn, stride_wsn, 2 * BLOCK_N, BLOCK_K, MATH, PREFETCH, PDL, _GU_ROWS
    )
    gate, up = tl.split(tl.permute(tl.reshape(y, (2, BLOCK_N)), (1, 0)))
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    h = _bias_swiglu(gate, up, b_ptr, e, Ip, rn, alpha, limit).to(tl.bfloat16).to(tl.float32)
    GB: tl.constexpr = BLOCK_N // 32
    pairs, factors = pack_groups(tl.reshape(h, (GB, 32)), GB)
    g = tl.program_id(1) * GB + tl.arange(0, GB)
    tl.store(hp_ptr + p * stride_hp + g[:, None] * 16 + tl.arange(0, 16)[None, :], pairs)
    tl.store(he_ptr + p * stride_he + g, factors)


@triton.jit
def _down_gemv_kernel(
    h_ptr,
    he_ptr,
    w_ptr,
    ws_ptr,
    b_ptr,
    part_ptr,
    count_ptr,
    out_ptr,
    ids_ptr,
    wts_ptr,
    H,
    Hp,
    Ip,
    stride_h,
    stride_he,
    stride_we,
    stride_wn,
    stride_wse,
    stride_wsn,
    stride_part,
    stride_out,
    TOPK,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DECODE: tl.constexpr,
    PREPARED: tl.constexpr,
    PREFETCH: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    """Down projection of one assignment's row tile, and the combine: the last of a token's k programs
    for this tile (an arrival counter per (token, tile)) sums the k weighted partials in slot order, so
    the result does not depend on which finished last, writes the bf16 output and resets its counter.
    ``PREPARED``: h comes as fp16 pairs + group factors (``h_ptr``, ``he_ptr``) for the f16x2 GEMV, with
    ``DECODE`` its math ("asm" or "ops"); else h is bf16 and ``DECODE`` the fp32 GEMV's decode. ``PDL``
    (prepared only): launched while the gate_up kernel runs."""
    p = tl.program_id(0)
    tile = tl.program_id(1)
    rn = tile * BLOCK_N + tl.arange(0, BLOCK_N)  # < Hp (Hp % BLOCK_N == 0)
    e = tl.load(ids_ptr + p).to(tl.int64)
    w_e, s_e = w_ptr + e * stride_we, ws_ptr + e * stride_wse
    if PREPARED:
        y = gemv_rows_f16x2(
            h_ptr + p * stride_h,
            he_ptr + p * stride_he,
            w_e,
            s_e,
            rn,
            Ip,
            stride_wn,
            stride_wsn,
            BLOCK_N,
            BLOCK_K,
            DECODE,
            PREFETCH,
            PDL,
            _DOWN_ROWS,
        )
    else:
        y = gemv_rows(
            h_ptr + p * stride_h, w_e, s_e, rn, Ip, stride_wn, stride_wsn, BLOCK_N, BLOCK_K, DECODE, _DOWN_ROWS
        )
    y = (y + tl.load(b_ptr + e * Hp + rn)) * tl.load(wts_ptr + p)
    _combine_slots(y, part_ptr, count_ptr, out_ptr, p, tile, rn, H, stride_part, stride_out, TOPK)


@triton.jit
def _combine_slots(y, part_ptr, count_ptr, out_ptr, p, tile, rn, H, stride_part, stride_out, TOPK):
    """The decode GEMVs' combine, in the down kernel: assignment ``p``'s weighted rows ``rn`` (row tile ``tile`` of
    ``tl.num_programs(1)``) stored as its fp32 partial; the last of its token's k programs for the tile (an arrival
    counter per (token, tile)) sums the k partials in slot order, so the result does not depend on which finished
    last, writes the token's rows in ``out``'s dtype and resets the counter."""
    tl.store(part_ptr + p * stride_part + rn, y)
    t = p // TOPK
    counter = count_ptr + t * tl.num_programs(1) + tile
    if last_to_arrive(counter, TOPK):
        total = tl.zeros(y.shape, dtype=tl.float32)
        for j in range(TOPK):
            total += tl.load(part_ptr + (t * TOPK + j) * stride_part + rn, cache_modifier=".cg")
        tl.store(out_ptr + t * stride_out + rn, total.to(out_ptr.dtype.element_ty), mask=rn < H)
        reset_counter(counter)


@triton.jit
def _gate_up_gemv_chunks_kernel(
    x_ptr,
    w_ptr,
    ws_ptr,
    b_ptr,
    h_ptr,
    ids_ptr,
    H,
    Ip,
    TOPK,
    stride_x,
    stride_we,
    stride_wn,
    stride_wse,
    stride_wsn,
    stride_h,
    alpha,
    limit,
    BLOCKS: tl.constexpr,
    ORDER: tl.constexpr,
    MATH: tl.constexpr,
    SCALE_SHIFT: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    """Assignment ``program_id(0)`` (t * k + slot) x the ``program_id(1)``-th 16 BLOCKS intermediate rows: gate and up
    (W in chunk order ``ORDER``, one GEMV over 2 BLOCKS weight blocks), bias, SwiGLU, stored in natural order.
    ``PDL``: let the down kernel launch now (it waits for these stores itself)."""
    if PDL:
        gdc_launch_dependents()
    p = tl.program_id(0)
    n0 = tl.program_id(1) * 16 * BLOCKS
    e = tl.load(ids_ptr + p).to(tl.int64)
    blk = tl.arange(0, 2 * BLOCKS)  # gate blocks, then up blocks
    w_off, s_off = wgmma_chunks(_w13_rows(n0 + 16 * (blk % BLOCKS), blk // BLOCKS), stride_wn, stride_wsn, 64)
    y = gemv_chunks(
        x_ptr + (p // TOPK) * stride_x,
        w_ptr + e * stride_we,
        ws_ptr + e * stride_wse,
        w_off,
        s_off,
        64 * 64,
        64 * 4,
        H,
        2 * BLOCKS,
        ORDER,
        MATH,
        SCALE_SHIFT,
    )
    gate, up = tl.split(tl.permute(tl.reshape(y, (2, 16 * BLOCKS)), (1, 0)))
    rn = n0 + tl.arange(0, 16 * BLOCKS)
    h = _bias_swiglu(gate, up, b_ptr, e, Ip, rn, alpha, limit)
    tl.store(h_ptr + p * stride_h + rn, h.to(h_ptr.dtype.element_ty))


@triton.jit
def _down_gemv_chunks_kernel(
    h_ptr,
    w_ptr,
    ws_ptr,
    b_ptr,
    part_ptr,
    count_ptr,
    out_ptr,
    ids_ptr,
    wts_ptr,
    H,
    Hp,
    Ip,
    stride_h,
    stride_we,
    stride_wn,
    stride_wse,
    stride_wsn,
    stride_part,
    stride_out,
    TOPK,
    BLOCKS: tl.constexpr,
    ORDER: tl.constexpr,
    MATH: tl.constexpr,
    SCALE_SHIFT: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    """Assignment ``program_id(0)`` x the ``program_id(1)``-th 16 BLOCKS rows of H: its weighted output rows (W in
    chunk order ``ORDER``, the intermediate in natural order), and the combine (:func:`_combine_slots`). ``PDL``:
    launched while the gate_up kernel runs."""
    p = tl.program_id(0)
    n0 = tl.program_id(1) * 16 * BLOCKS
    e = tl.load(ids_ptr + p).to(tl.int64)
    w_off, s_off = wgmma_chunks(n0 + 16 * tl.arange(0, BLOCKS), stride_wn, stride_wsn, _DOWN_ROWS)
    y = gemv_chunks(
        h_ptr + p * stride_h,
        w_ptr + e * stride_we,
        ws_ptr + e * stride_wse,
        w_off,
        s_off,
        _DOWN_ROWS * 64,
        _DOWN_ROWS * 4,
        Ip,
        BLOCKS,
        ORDER,
        MATH,
        SCALE_SHIFT,
        PDL,
    )
    rn = n0 + tl.arange(0, 16 * BLOCKS)
    y = (y + tl.load(b_ptr + e * Hp + rn)) * tl.load(wts_ptr + p)
    _combine_slots(y, part_ptr, count_ptr, out_ptr, p, tl.program_id(1), rn, H, stride_part, stride_out, TOPK)


def _moe_gemv_chunks(
    x,
    topk_ids,
    topk_weights,
    w13,
    s13,
    b13,
    w2,
    s2,
    b2,
    cfg: ChunkGemvConfig,
    fold_scale: bool,
    scale_shift: int,
    out: torch.Tensor,
) -> torch.Tensor:
    """Decode on a chunk order (``cfg.order``): per (token, slot) assignment GEMVs, combined into ``out [T, H]``
    (stored in its dtype) by the down kernel; two launches, the second launched while the first runs where the GPU
    can."""
    T, H = x.shape
    k = topk_ids.shape[1]
    E, Ip2, _ = w13.shape
    Ip, Hp = Ip2 // 2, w2.shape[1]
    ids, wts = _flat_routing(topk_ids, topk_weights)
    ptx = runs_ptx(x.device)
    math = ("asm-fold" if fold_scale else "asm") if ptx else "ops"
    pdl = int(cfg.pdl and ptx and launches_dependents(x.device))  # sm_8x: one after the other
    # everything the down kernel needs is allocated before the gate_up launch: nothing between the two launches
    h = torch.empty(T * k, Ip, dtype=torch.bfloat16, device=x.device)
    tiles = Hp // (16 * cfg.down_blocks)
    part, counters = _combine_buffers(x.device, T, k, Hp, tiles)
    _gate_up_gemv_chunks_kernel[(T * k, Ip // (16 * cfg.gate_up_blocks))](
        x,
        w13,
        s13,
        b13,
        h,
        ids,
        H,
        Ip,
        k,
        x.stride(0),
        w13.stride(0),
        w13.stride(1),
        s13.stride(0),
        s13.stride(1),
        h.stride(0),
        SWIGLU_ALPHA,
        SWIGLU_LIMIT,
        BLOCKS=cfg.gate_up_blocks,
        ORDER=cfg.order,
        MATH=math,
        SCALE_SHIFT=scale_shift,
        PDL=pdl,
        num_warps=cfg.gate_up_warps,
    )
    _down_gemv_chunks_kernel[(T * k, tiles)](
        h,
        w2,
        s2,
        b2,
        part,
        counters,
        out,
        ids,
        wts,
        H,
        Hp,
        Ip,
        h.stride(0),
        w2.stride(0),
        w2.stride(1),
        s2.stride(0),
        s2.stride(1),
        part.stride(0),
        out.stride(0),
        k,
        BLOCKS=cfg.down_blocks,
        ORDER=cfg.order,
        MATH=math,
        SCALE_SHIFT=scale_shift,
        PDL=pdl,
        num_warps=cfg.down_warps,
        **({"launch_pdl": True} if pdl else {}),
    )
    return out


_COMBINE = "moe_combine"


def reserve_decode_counters(device: torch.device, hidden_padded: int) -> torch.Tensor:
    """Allocate the decode combine's arrival counters for every T the GEMV path takes (at least one slot per
    token), so that no later call allocates them, e.g. inside a CUDA graph capture (:func:`arrival_counters`), and
    return them."""
    tile = min(MOE_GEMV.down.block_n, *(16 * c.down_blocks for c in CHUNK_GEMVS.values()))  # every order's down tile
    return arrival_counters(
        device, max(GEMV_MAX_ASSIGNMENTS, CHUNK_GEMV_MAX_ASSIGNMENTS) * (hidden_padded // tile), _COMBINE
    )


def _combine_buffers(device: torch.device, T: int, k: int, Hp: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What :func:`_combine_slots` needs for a decode call of ``T`` tokens, ``k`` slots each, down in ``tiles`` row
    tiles of ``Hp``: each assignment's fp32 partial and a zeroed arrival counter per (token, tile)."""
    part = torch.empty(T * k, Hp, dtype=torch.float32, device=device)
    return part, arrival_counters(device, T * tiles, _COMBINE)


def _flat_routing(topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's ids and weights as the per-assignment GEMVs read them, one entry an assignment (t * k + slot):
    int32 or int64 ids as they come (a conversion would be one more launch per call), fp32 weights (converted here:
    no launch between the GEMVs)."""
    ids = (topk_ids if topk_ids.dtype in (torch.int32, torch.int64) else topk_ids.to(torch.int32)).contiguous().view(-1)
    return ids, topk_weights.to(torch.float32).contiguous().view(-1)


def _moe_gemv(
    x, topk_ids, topk_weights, w13, s13, b13, w2, s2, b2, cfg: MoeGemvConfig, out: torch.Tensor
) -> torch.Tensor:
    """Decode: per (token, slot) assignment GEMVs, combined into ``out [T, H]`` (stored in its dtype) by the down
    kernel."""
    T, H = x.shape
    k = topk_ids.shape[1]
    E, Ip2, _ = w13.shape
    Ip, Hp = Ip2 // 2, w2.shape[1]
    gu, d = cfg.gate_up, cfg.down
    ids, wts = _flat_routing(topk_ids, topk_weights)
    if cfg.prepared:
        xp, xe = prepare_x(x, pdl=bool(gu.pdl))
        h = torch.empty(T * k, Ip // 2, dtype=torch.int32, device=x.device)  # fp16 pairs
        he = torch.empty(T * k, Ip // 32, dtype=torch.float32, device=x.device)
        _gate_up_gemv_f16x2_kernel[(T * k, Ip // gu.block_n)](
            xp,
            xe,
            w13,
            s13,
            b13,
            h,
            he,
            ids,
            H,
            Ip,
            k,
            xp.stride(0),
            xe.stride(0),
            w13.stride(0),
            w13.stride(1),
            s13.stride(0),
            s13.stride(1),
            h.stride(0),
            he.stride(0),
            SWIGLU_ALPHA,
            SWIGLU_LIMIT,
            BLOCK_N=gu.block_n,
            BLOCK_K=gu.block_k,
            MATH=gu.math,
            PREFETCH=gu.prefetch,
            PDL=gu.pdl,
            **gu.launch_options(),
        )
    else:
        h = torch.empty(T * k, Ip, dtype=torch.bfloat16, device=x.device)
        he = h
        _gate_up_gemv_kernel[(T * k, Ip // gu.block_n)](
            x,
            w13,
            s13,
            b13,
            h,
            ids,
            H,
            Ip,
            k,
            x.stride(0),
            w13.stride(0),
            w13.stride(1),
            s13.stride(0),
            s13.stride(1),
            h.stride(0),
            SWIGLU_ALPHA,
            SWIGLU_LIMIT,
            BLOCK_N=gu.block_n,
            BLOCK_K=gu.block_k,
            DECODE=gu.decode,
            **gu.launch_options(),
        )
    tiles = Hp // d.block_n
    part, counters = _combine_buffers(x.device, T, k, Hp, tiles)
    _down_gemv_kernel[(T * k, tiles)](
        h,
        he,
        w2,
        s2,
        b2,
        part,
        counters,
        out,
        ids,
        wts,
        H,
        Hp,
        Ip,
        h.stride(0),
        he.stride(0),
        w2.stride(0),
        w2.stride(1),
        s2.stride(0),
        s2.stride(1),
        part.stride(0),
        out.stride(0),
        k,
        BLOCK_N=d.block_n,
        BLOCK_K=d.block_k,
        DECODE=d.math if d.prepared else d.decode,
        PREPARED=d.prepared,
        PREFETCH=d.prefetch,
        PDL=d.pdl,
        **d.launch_options(),
    )
    return out


def moe_mxfp4(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w: dict[str, torch.Tensor],
    activations: str = "bf16",
    config: MoeConfig | MoeGemvConfig | GemvConfig | ChunkGemvConfig | None = None,
    out: torch.Tensor | None = None,
    fold_scale: bool = False,
    order: str = "rows",
    scale_shift: int = 0,
) -> torch.Tensor:
    """One gpt-oss MoE block: ``x [T, H]`` bf16, ``topk_ids/topk_weights [T, k]`` -> ``[T, H]`` bf16.

    ``w``: the strided layout's tensors by suffix (``w13_weight``, ``w13_weight_scale``, ``w13_bias``,
    ``w2_weight``, ``w2_weight_scale``, ``w2_bias``). ``config``: a :class:`MoeConfig` (scheduled tiles),
    a :class:`MoeGemvConfig` (decode GEMV: the rows order, BF16 activations; a single :class:`GemvConfig` serves both
    kernels, :meth:`MoeGemvConfig.from_single`), a :class:`ChunkGemvConfig` (a chunk order's decode GEMVs), or None
    to choose by shape (:func:`pick_moe`). ``fold_scale``: ``w``'s scales fit the
    folded decode, as ``dequant_mxfp4.fold_shift(w13 scales, w2 scales)`` found where the weights were loaded; the
    chosen swapped tiles then fold (same bits, faster) and nothing is checked per call. ``order``: the weights' byte
    order (the strided layout's option): "rows", "wgmma" (BF16 activations, Hopper or the interpreter) or "mma2"
    (BF16 activations, sm_12x / sm_8x or the interpreter: :func:`check_order`). ``scale_shift``: with ``fold_scale``,
    the shift ``dequant_mxfp4.fold_shift(w13 scales, w2 scales)`` found for scales above 128 (the kernels that fold
    read the scales that much lower and multiply their sums back: same bits); 0 otherwise.
    """
    if scale_shift and not fold_scale:
        raise ValueError("scale_shift is the folded decode's (dequant_mxfp4.fold_shift): it needs fold_scale")
    if not 0 <= scale_shift <= MAX_SCALE_SHIFT:
        raise ValueError(f"scale_shift must be 0 to {MAX_SCALE_SHIFT}, got {scale_shift}")
    if activations not in ("bf16", "e4m3", "e2m1"):
        raise ValueError(f"activations must be bf16, e4m3 or e2m1, got {activations!r}")
    check_order(order, activations, x.device)
    T, H = x.shape
    k = topk_ids.shape[1]
    w13, s13, b13 = w["w13_weight"], w["w13_weight_scale"], w["w13_bias"]
    w2, s2, b2 = w["w2_weight"], w["w2_weight_scale"], w["w2_bias"]
    E, Ip2, Hp2 = w13.shape
    Ip, Hp = Ip2 // 2, Hp2 * 2
    if w2.shape != (E, Hp, Ip // 2) or H > Hp:
        raise ValueError(
            f"w13 {tuple(w13.shape)} / w2 {tuple(w2.shape)} / x {tuple(x.shape)} are not one strided MoE layer"
        )
    if out is not None and tuple(out.shape) != (T, H):
        raise ValueError(f"out must be [{T}, {H}] (x's shape), got {list(out.shape)}")
    cfg = config or pick_moe(T, k, E, H, activations, x.device.type == "cuda", fold_scale, order)
    if isinstance(cfg, GemvConfig):
        cfg = MoeGemvConfig.from_single(cfg)
    gemv = isinstance(cfg, MoeGemvConfig)
    chunk_gemv = isinstance(cfg, ChunkGemvConfig)
    if not gemv and cfg.order != order:
        raise ValueError(f"config {cfg.name()} reads the {cfg.order} order, the weights are {order}")
    if gemv and order != "rows":  # the rows order's GEMVs read its rows; the chunk orders have their own
        raise ValueError(
            f"the {order} order runs its scheduled tiles (a MoeConfig with order='{order}') or its GEMVs "
            f"(ChunkGemvConfig('{order}')), not the rows order's GEMVs: got {cfg.name()}"
        )
    if gemv and (activations != "bf16" or H % 32):
        raise ValueError(f"the MoE GEMV needs bf16 activations and H % 32 == 0, got {activations} and H = {H}")
    # row tiles that must divide the padded widths (a wider down tile of a chunk order may end past Hp)
    if gemv:
        tiles = [(cfg.gate_up.block_n, cfg.down.block_n)]
    elif chunk_gemv:
        tiles = [(16 * cfg.gate_up_blocks, 16 * cfg.down_blocks)]
    else:
        tiles = [(t.block_n, DOWN_TILE_ROWS if t.down_block_n else t.block_n) for t in (cfg, cfg.remainder) if t]
    for ip_tile, hp_tile in tiles:
        if Ip % ip_tile or Hp % hp_tile:
            raise ValueError(f"padded widths {Ip}/{Hp} must be multiples of the row tiles {ip_tile}/{hp_tile}")
    if isinstance(cfg, MoeConfig) and cfg.fold_scale and activations == "bf16" and not fold_scale:  # folded by hand
        check_fold_scale(s13, s2)
    # both paths end in a kernel that writes unit-stride rows in the target's dtype: out itself when its rows are so,
    # else a buffer of out's dtype copied into it
    dtype = out.dtype if out is not None else torch.bfloat16
    target = out if out is not None and out.stride(1) == 1 else torch.empty(T, H, dtype=dtype, device=x.device)
    if gemv:
        if not launches_dependents(x.device) and (cfg.gate_up.pdl or cfg.down.pdl):  # sm_8x: one after the other
            cfg = cfg.each(pdl=0)
        _moe_gemv(x.contiguous(), topk_ids, topk_weights, w13, s13, b13, w2, s2, b2, cfg, target)
    elif chunk_gemv:
        _moe_gemv_chunks(
            x.contiguous(), topk_ids, topk_weights, w13, s13, b13, w2, s2, b2, cfg, fold_scale, scale_shift, target
        )
    else:
        y = _moe_scheduled(x, topk_ids, topk_weights, w13, s13, b13, w2, s2, b2, activations, cfg, scale_shift)
        if T:
            _combine_kernel[(T, triton.cdiv(H, COMBINE_BLOCK))](
                y, target, H, y.stride(0), target.stride(0), TOPK=k, BLOCK=COMBINE_BLOCK
            )
    return target if out is None or target is out else out.copy_(target)


COMBINE_BLOCK = 1024


@triton.jit
def _combine_kernel(y_ptr, out_ptr, H, stride_y, stride_out, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    """out[t] = sum of y[t k + j] over the k slots, in slot order, in fp32, stored in out's dtype: the scheduled
    tiles' combine in one pass (the fp32 sum and the cast to bf16 were two torch kernels, ~0.1 ms at T = 4096)."""
    t, cols = tl.program_id(0), tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    rows = y_ptr + (t * TOPK).to(tl.int64) * stride_y + cols
    acc = tl.load(rows, mask=cols < H, other=0.0).to(tl.float32)
    for j in tl.static_range(1, TOPK):
        acc += tl.load(rows + j * stride_y, mask=cols < H, other=0.0).to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * stride_out + cols, acc.to(out_ptr.dtype.element_ty), mask=cols < H)


def _moe_scheduled(
    x, topk_ids, topk_weights, w13, s13, b13, w2, s2, b2, activations: str, cfg: MoeConfig, scale_shift: int = 0
) -> torch.Tensor:
    """Sorted row blocks per expert; returns each assignment's weighted output ``[T*k, H]``, rounded to bf16.
    ``scale_shift`` (``moe_mxfp4``'s): taken by the tiles that decode W in registers (``swap_ab``), folded or not
    (exact either way); the others read the scales as stored."""
    T, H = x.shape
    k = topk_ids.shape[1]
    E, Ip2, Hp2 = w13.shape
    Ip, Hp = Ip2 // 2, Hp2 * 2
    order, blk_e, blk_s, blk_end = moe_schedule(topk_ids, E, cfg.block_m)
    nb = blk_e.numel()
    swap = cfg.swap_ab and activations == "bf16"
    chunked = cfg.order != "rows"
    if swap and (Ip % 128 or Hp % 128):  # whole 128-column K tiles in split order: the loads have no K mask
        raise ValueError(f"swap_ab needs padded widths that are multiples of 128, got {Ip}/{Hp}")
    interpreter = interpreting()
    x = x.contiguous()
    if chunked:  # natural order: the chunk orders' operand is W's K tile in natural order
        a, a_s = x, None
    elif swap:
        a, a_s = split_pairs(x, Hp), None
    elif activations == "bf16":
        a, a_s = x, None
    else:
        a, a_s = quantize_activations(x if H % 32 == 0 else torch.nn.functional.pad(x, (0, 32 - H % 32)), activations)
    h = torch.empty(T * k, Ip, dtype=torch.bfloat16, device=x.device)
    # the tile on the schedule's blocks, and its remainder tile (if any) on those of at most remainder.block_m rows
    r = cfg.remainder
    ptx = runs_ptx(x.device)  # else the portable decode
    # (tile, rows_lo, rows_hi, PDL): on a GPU the remainder tile's launch overlaps the tile's last wave
    overlap = ptx and r is not None and launches_dependents(x.device)
    parts = [(cfg, r.block_m if r is not None else 0, 1 << 30, int(overlap))]
    parts += [(r, 0, r.block_m, 2 * int(overlap))] if r is not None else []
    # Hopper's wgmma reads registers late (under Triton's DISABLE_MMA_V3 Hopper builds mma.sync: no wait)
    wait_here = swap and not interpreter and mma_reads_registers_async(x.device)

    def launch(tile: MoeConfig, rows_lo: int, rows_hi: int, pdl: int) -> dict:  # a tile and its options
        return dict(
            A_FMT=activations,
            BLOCK_M=tile.block_m,
            BLOCK_N=tile.block_n,
            BLOCK_K=tile.block_k,
            MANUAL_DEQUANT=tile.manual_dequant and activations == "bf16",
            INTERPRETER=interpreter,
            SWAP_AB=swap,
            MATH=(tile.math if swap else "asm") if ptx else "ops",
            WAIT_MMA=wait_here and tile.waits,
            ORDER=tile.order,
            DOTS=tile.token_dots,
            PDL=pdl,
            SCALE_SHIFT=scale_shift if swap else 0,
            rows_lo=rows_lo,
            rows_hi=rows_hi,
            num_warps=tile.num_warps,
            num_stages=tile.num_stages,
        ) | ({"launch_pdl": True} if pdl == 2 else {})

    built = []
    for tile, rows_lo, rows_hi, pdl in parts:
        built.append(
            _gate_up_kernel[(nb * (Ip // tile.block_n),)](
                a,
                a_s if a_s is not None else s13,
                w13,
                s13,
                b13,
                h,
                order,
                blk_e,
                blk_s,
                blk_end,
                H,
                Hp,
                Ip,
                k,
                a.stride(0),
                a_s.stride(0) if a_s is not None else 0,
                w13.stride(0),
                w13.stride(1),
                s13.stride(0),
                s13.stride(1),
                h.stride(0),
                SWIGLU_ALPHA,
                SWIGLU_LIMIT,
                **launch(tile, rows_lo, rows_hi, pdl),
            )
        )
    if activations == "bf16":
        ha, ha_s = h, None
    else:
        ha, ha_s = quantize_activations(h, activations)
    # bf16, as triton_kernels' down writes its rows: the combine sums them in fp32; fp32 rows took twice the bytes
    # to write and to read again (~65 us at T = 4096 on an H100)
    y = torch.empty(T * k, H, dtype=torch.bfloat16, device=x.device)
    wts = topk_weights.to(torch.float32).contiguous().view(-1)
    for tile, rows_lo, rows_hi, pdl in parts:
        built.append(
            _down_kernel[(nb * triton.cdiv(Hp, tile.down_n),)](
                ha,
                ha_s if ha_s is not None else s2,
                w2,
                s2,
                b2,
                y,
                order,
                wts,
                blk_e,
                blk_s,
                blk_end,
                H,
                Hp,
                Ip,
                ha.stride(0),
                ha_s.stride(0) if ha_s is not None else 0,
                w2.stride(0),
                w2.stride(1),
                s2.stride(0),
                s2.stride(1),
                y.stride(0),
                **(launch(tile, rows_lo, rows_hi, pdl) | {"BLOCK_N": tile.down_n}),
            )
        )
    if chunked and ptx:  # what a build's decode receives is Triton's choice
        for kernel in built:
            check_chunk_build(kernel)
    return y
