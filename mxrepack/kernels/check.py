"""``repack kernels check``: prove every shipped kernel configuration builds for each GPU arch, on CPU.

Each (kernel, config, mode) is compiled ahead of time with ``triton.compile(ASTSource(...),
target=GPUTarget("cuda", cap, 32))`` -- Triton's own front end, LLVM and the ptxas it ships, so no GPU
is needed -- and the result is inspected:

* ``shared_bytes``: the compiled kernel's shared memory (``metadata.shared``); on sm_12x it must be
  <= 101376 bytes (99 KiB, the opt-in per-block limit of consumer Blackwell). Each kernel is compiled with
  the alignment a gpt-oss launch gives it (:func:`specialized`): without it Triton cannot use 16-byte
  asynchronous copies, so it does not pipeline the K loop and reports a fraction of the real figure;
* ``tma``: any ``cp.async.bulk.tensor``, ``.tile::scatter4`` or ``.tile::gather4`` in the PTX (ptxas
  rejects TMA scatter on sm_121a; our kernels use none on any arch);
* swapped-operand tiles (``swap_ab``: W decoded into registers as the MMA's first operand) must not write a
  register an in-flight ``wgmma`` still reads, nor one a wgmma reads without a ``wgmma.fence`` after the write
  (``dequant_mxfp4.wgmma_register_hazards`` walks the PTX: the next decode overwriting one is triton-lang/triton#9433;
  ``dequant_mxfp4.mma_done`` makes Triton wait for each wgmma, and the wgmma order's tiles kept in flight pass because
  their operand is copied per k16 step, ``dequant_mxfp4.fresh_operand``);
* ``mma``: the MMA instructions found (``mma.sync...``, ``wgmma...``, ``tcgen05.mma...``); the W4A4 path
  must reach the native FP4 tensor cores on sm_12x: ``mma.sync...kind::mxf4nvf4.block_scale``. The
  decode GEMVs (``gemv_*``) and the prefill's dequantizer (``dequant_mxfp4``) run on CUDA cores by
  design and must have none.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import json
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from mxrepack.kernels import dequant_mxfp4 as dq
from mxrepack.kernels import gemv_mxfp4 as gemv
from mxrepack.kernels import linear_mxfp4 as lin
from mxrepack.kernels import moe_mxfp4 as moe

SM12X_SHARED_LIMIT = 101376
# Compiled as they are launched on gpt-oss: at launch Triton specializes every pointer that is 16-byte aligned
# (torch allocations are) and every integer argument that is a multiple of 16, and that decides vector widths
# and whether loads become asynchronous copies (so shared memory). These integer arguments are multiples of
# 16 at gpt-oss's shapes (H 2880, padded 2944, K 2880/4096, N 201088/4096/2880/512, their packed strides);
# the others (scale-row strides such as 90 or 92, top-k 4, M) are not, or vary per call.
DIVISIBLE_BY_16 = frozenset(
    {
        "rows_lo",  # 0, a remainder tile's rows (16, 32) or 1 << 30 (MoeConfig.remainder)
        "rows_hi",
        "H",
        "Hp",
        "Ip",
        "K",
        "N",
        "Np",  # whole 16-row tiles; without it Triton 3.6 / 3.9 lay the wgmma dense tile's decode out otherwise
        "stride_h",
        "stride_hp",
        "stride_on",
        "stride_out",
        "stride_part",
        "stride_pm",
        "stride_we",
        "stride_wse",
        "stride_wn",
        "stride_x",
        "stride_xm",
        "stride_xp",
        "stride_y",
        "stride_ym",
    }
)
ARCHS = {90: "sm_90a", 100: "sm_100a", 120: "sm_120a", 121: "sm_121a"}
_TMA = re.compile(r"cp\.async\.bulk\.tensor|\.tile::scatter4|\.tile::gather4")
_MMA = re.compile(r"\b(mma\.sync\.aligned[\w.:]*|wgmma\.mma_async[\w.:]*|tcgen05\.mma[\w.:]*)")
_A_TYPE = {"bf16": "*bf16", "e4m3": "*fp8e4nv", "e2m1": "*u8"}


def _linear_source(mode: str, cfg: lin.LinearConfig) -> ASTSource:
    a_fmt = lin.MODES[mode]
    sig = {
        "x_ptr": _A_TYPE[a_fmt],
        "xs_ptr": "*u8",
        "w_ptr": "*u8",
        "ws_ptr": "*u8",
        "b_ptr": "*bf16",
        "y_ptr": "*bf16",
        "part_ptr": "*fp32",
        "count_ptr": "*i32",
        "M": "i32",
        "N": "i32",
        "K": "i32",
        "stride_xm": "i32",
        "stride_xsm": "i32",
        "stride_wn": "i32",
        "stride_wsn": "i32",
        "stride_ym": "i32",
        "A_FMT": "constexpr",
        "HAS_BIAS": "constexpr",
        "SPLIT_K": "constexpr",
        "BLOCK_M": "constexpr",
        "BLOCK_N": "constexpr",
        "BLOCK_K": "constexpr",
        "MANUAL_DEQUANT": "constexpr",
        "INTERPRETER": "constexpr",
        "SWAP_AB": "constexpr",
        "MATH": "constexpr",
        "WAIT_MMA": "constexpr",
    }
    const = {
        "A_FMT": a_fmt,
        "HAS_BIAS": True,
        "SPLIT_K": cfg.split_k,
        "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
        "BLOCK_K": cfg.block_k,
        "MANUAL_DEQUANT": cfg.manual_dequant and a_fmt == "bf16",
        "INTERPRETER": False,
        "SWAP_AB": cfg.swap_ab and a_fmt == "bf16",
        "MATH": cfg.math,
        "WAIT_MMA": False,  # per arch: for_arch
    }
    return ASTSource(lin._linear_mxfp4_kernel, sig, const)


def _linear_chunks_source(cfg: lin.LinearConfig, order: str) -> ASTSource:
    """The dense W4A16 tile on weights in a chunk ``order`` (``linear_mxfp4.linear_chunks``), waiting for each wgmma
    as it does on Hopper (the mma2 order's ``mma.sync`` is synchronous)."""
    sig = {
        "x_ptr": "*bf16",
        "w_ptr": "*u8",
        "ws_ptr": "*u8",
        "b_ptr": "*bf16",
        "y_ptr": "*bf16",
        "part_ptr": "*fp32",
        "count_ptr": "*i32",
        "M": "i32",
        "N": "i32",
        "K": "i32",
        "Np": "i32",
        "stride_xm": "i32",
        "stride_wn": "i32",
        "stride_wsn": "i32",
        "stride_ym": "i32",
    }
    const = {
        "HAS_BIAS": True,
        "SPLIT_K": cfg.split_k,
        "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
        "DOTS": cfg.block_m // (16 if cfg.block_m <= 32 else 32) if order == "mma2" else 1,
        "MATH": cfg.math,
        "ORDER": order,
        "INTERPRETER": False,
        "WAIT_MMA": order == "wgmma",
    }
    return ASTSource(lin._linear_chunks_kernel, sig | dict.fromkeys(const, "constexpr"), const)


def _moe_sources(act: str, cfg: moe.MoeConfig, pdl: int = 0) -> dict[str, ASTSource]:
    """The scheduled tiles' two kernels; ``pdl`` as the launch sets it (1: a tile whose remainder tile's launch
    overlaps it, 2: that remainder tile)."""
    common = {
        "A_FMT": act,
        "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
        "BLOCK_K": cfg.block_k,
        "MANUAL_DEQUANT": cfg.manual_dequant and act == "bf16",
        "INTERPRETER": False,
        "SWAP_AB": cfg.swap_ab and act == "bf16",
        "MATH": cfg.math,
        "WAIT_MMA": cfg.order == "wgmma" and cfg.waits,  # the rows order: per arch (for_arch); mma2: never
        "ORDER": cfg.order,
        "DOTS": cfg.token_dots,
        "PDL": pdl,
        "SCALE_SHIFT": 0,  # a shift (scales above 128) adds a max, a subtraction and a multiply: no memory
    }
    gate_up = {
        "x_ptr": _A_TYPE[act],
        "xs_ptr": "*u8",
        "w_ptr": "*u8",
        "ws_ptr": "*u8",
        "b_ptr": "*fp32",
        "h_ptr": "*bf16",
        "order_ptr": "*i32",
        "blk_e_ptr": "*i32",
        "blk_s_ptr": "*i32",
        "blk_end_ptr": "*i32",
        "H": "i32",
        "Hp": "i32",
        "Ip": "i32",
        "TOPK": "i32",
        "stride_x": "i32",
        "stride_xs": "i32",
        "stride_we": "i32",
        "stride_wn": "i32",
        "stride_wse": "i32",
        "stride_wsn": "i32",
        "stride_h": "i32",
        "alpha": "fp32",
        "limit": "fp32",
        **{k: "constexpr" for k in common},
        "rows_lo": "i32",
        "rows_hi": "i32",
    }
    down = {
        "h_ptr": _A_TYPE[act],
        "hs_ptr": "*u8",
        "w_ptr": "*u8",
        "ws_ptr": "*u8",
        "b_ptr": "*fp32",
        "y_ptr": "*bf16",
        "order_ptr": "*i32",
        "wts_ptr": "*fp32",
        "blk_e_ptr": "*i32",
        "blk_s_ptr": "*i32",
        "blk_end_ptr": "*i32",
        "H": "i32",
        "Hp": "i32",
        "Ip": "i32",
        "stride_h": "i32",
        "stride_hs": "i32",
        "stride_we": "i32",
        "stride_wn": "i32",
        "stride_wse": "i32",
        "stride_wsn": "i32",
        "stride_y": "i32",
        **{k: "constexpr" for k in common},
        "rows_lo": "i32",
        "rows_hi": "i32",
    }
    return {
        "moe_gate_up_swiglu": ASTSource(moe._gate_up_kernel, gate_up, dict(common)),
        "moe_down_combine": ASTSource(moe._down_kernel, down, common | {"BLOCK_N": cfg.down_n}),
    }


def _gemv_sources(cfg: gemv.GemvConfig) -> dict[str, ASTSource]:
    if cfg.prepared:
        const = {
            "BLOCK_N": cfg.block_n,
            "BLOCK_K": cfg.block_k,
            "MATH": cfg.math,
            "PREFETCH": cfg.prefetch,
            "PDL": cfg.pdl,
            "ROWS": cfg.rows,
        }
        dense = {
            "xp_ptr": "*i32",
            "xe_ptr": "*fp32",
            "w_ptr": "*u8",
            "ws_ptr": "*u8",
            "b_ptr": "*bf16",
            "y_ptr": "*bf16",
            "N": "i32",
            "K": "i32",
            "stride_pm": "i32",
            "stride_em": "i32",
            "stride_wn": "i32",
            "stride_wsn": "i32",
            "stride_ym": "i32",
            "HAS_BIAS": "constexpr",
            **{k: "constexpr" for k in const},
            "M": "i32",
        }
        prep = {
            "x_ptr": "*bf16",
            "xp_ptr": "*i32",
            "xe_ptr": "*fp32",
            "K": "i32",
            "stride_xm": "i32",
            "stride_pm": "i32",
            "stride_em": "i32",
            "GB": "constexpr",
            "PDL": "constexpr",
        }
        # a multi-row configuration is what the dispatch runs at that many rows (NARROW_ROWS), never at one
        launched = {"gemv_mxfp4_f16x2_rows": cfg} if cfg.rows else {"gemv_mxfp4_f16x2": cfg}
        return {
            kernel: ASTSource(gemv._gemv_f16x2_kernel, dense, {"HAS_BIAS": True, **const, "ROWS": c.rows})
            for kernel, c in launched.items()
        } | {"gemv_prepare_x": ASTSource(gemv._prepare_x_kernel, prep, {"GB": gemv.PREPARE_GROUPS, "PDL": cfg.pdl})}
    const = {"BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "DECODE": cfg.decode}
    dense = {
        "x_ptr": "*bf16",
        "w_ptr": "*u8",
        "ws_ptr": "*u8",
        "b_ptr": "*bf16",
        "y_ptr": "*bf16",
        "N": "i32",
        "K": "i32",
        "stride_xm": "i32",
        "stride_wn": "i32",
        "stride_wsn": "i32",
        "stride_ym": "i32",
        "HAS_BIAS": "constexpr",
        **{k: "constexpr" for k in const},
    }
    return {"gemv_mxfp4": ASTSource(gemv._gemv_mxfp4_kernel, dense, {"HAS_BIAS": True, **const})}


# an expert layer's strides (experts, rows) of its weights and of their scales, as the MoE GEMVs take them
_W_STRIDES = {"stride_we": "i32", "stride_wn": "i32", "stride_wse": "i32", "stride_wsn": "i32"}


_IDS_DIMS = {"ids_ptr": "*i32", "H": "i32", "Ip": "i32", "TOPK": "i32"}
_SWIGLU = {"alpha": "fp32", "limit": "fp32"}
# the decode gate_up GEMVs on BF16 activations (the rows order's fp32 GEMV, the chunk orders'), constexprs apart
_GATE_UP_BF16 = {
    "x_ptr": "*bf16",
    "w_ptr": "*u8",
    "ws_ptr": "*u8",
    "b_ptr": "*fp32",
    "h_ptr": "*bf16",
    **_IDS_DIMS,
    "stride_x": "i32",
    **_W_STRIDES,
    "stride_h": "i32",
    **_SWIGLU,
}


def _down_combine_args(h: str, group_factors: bool) -> dict[str, str]:
    """The decode down GEMVs' arguments, constexprs apart (both orders; they combine the k slots): the intermediate
    ``h`` of type ``h``, with its group factors (``he_ptr``, ``stride_he``: the rows order's kernel) or not."""
    he = {"he_ptr": "*fp32"} if group_factors else {}
    stride_he = {"stride_he": "i32"} if group_factors else {}
    return {
        "h_ptr": h,
        **he,
        "w_ptr": "*u8",
        "ws_ptr": "*u8",
        "b_ptr": "*fp32",
        "part_ptr": "*fp32",
        "count_ptr": "*i32",
        "out_ptr": "*bf16",
        "ids_ptr": "*i32",
        "wts_ptr": "*fp32",
        "H": "i32",
        "Hp": "i32",
        "Ip": "i32",
        "stride_h": "i32",
        **stride_he,
        **_W_STRIDES,
        "stride_part": "i32",
        "stride_out": "i32",
        "TOPK": "i32",
    }


def _moe_gemv_sources(cfg: moe.MoeGemvConfig) -> dict[str, ASTSource]:
    gu, d = cfg.gate_up, cfg.down
    if cfg.prepared:
        const = {"BLOCK_N": gu.block_n, "BLOCK_K": gu.block_k, "MATH": gu.math, "PREFETCH": gu.prefetch, "PDL": gu.pdl}
        sig = {
            "xp_ptr": "*i32",
            "xe_ptr": "*fp32",
            "w_ptr": "*u8",
            "ws_ptr": "*u8",
            "b_ptr": "*fp32",
            "hp_ptr": "*i32",
            "he_ptr": "*fp32",
            **_IDS_DIMS,
            "stride_xp": "i32",
            "stride_xe": "i32",
            **_W_STRIDES,
            "stride_hp": "i32",
            "stride_he": "i32",
            **_SWIGLU,
            **{k: "constexpr" for k in const},
        }
        gate_up = {"gemv_moe_gate_up_f16x2": ASTSource(moe._gate_up_gemv_f16x2_kernel, sig, const)}
    else:
        const = {"BLOCK_N": gu.block_n, "BLOCK_K": gu.block_k, "DECODE": gu.decode}
        sig = {**_GATE_UP_BF16, **{k: "constexpr" for k in const}}
        gate_up = {"gemv_moe_gate_up": ASTSource(moe._gate_up_gemv_kernel, sig, const)}
    const = {
        "BLOCK_N": d.block_n,
        "BLOCK_K": d.block_k,
        "DECODE": d.math if d.prepared else d.decode,
        "PREPARED": d.prepared,
        "PREFETCH": d.prefetch,
        "PDL": d.pdl,
    }
    down = {**_down_combine_args("*i32" if d.prepared else "*bf16", True), **{k: "constexpr" for k in const}}
    return {**gate_up, "gemv_moe_down": ASTSource(moe._down_gemv_kernel, down, const)}


def _dequant_source(cfg: dq.DequantConfig) -> ASTSource:
    sig = {
        "w_ptr": "*u8",
        "ws_ptr": "*u8",
        "out_ptr": "*bf16",
        "N": "i32",
        "K": "i32",
        "stride_wn": "i32",
        "stride_wsn": "i32",
        "stride_on": "i32",
        "BLOCK_N": "constexpr",
        "BLOCK_K": "constexpr",
    }
    return ASTSource(dq._dequant_mxfp4_kernel, sig, {"BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k})


def _moe_schedule_sources(experts: int = 128, block_m: int = 64, max_chunks: int = 2) -> dict[str, ASTSource]:
    """The scheduled MoE path's CUDA-core kernels as gpt-oss-120b launches them: the schedule's two (128 experts;
    int32 router ids, as vLLM's; the placing kernel's counts tile for ``max_chunks`` chunks) and the combine of the
    top-4 slots."""
    e_p2 = triton.next_power_of_2(experts)
    piece = moe._schedule_piece(e_p2)
    shape = {"PIECE": piece, "E_P2": e_p2}
    count = {"ids_ptr": "*i32", "hist_ptr": "*i32", "n": "i32", "chunk": "i32", **{k: "constexpr" for k in shape}}
    place_shape = {"BLOCK_M": block_m, **shape, "MAX_CHUNKS": max_chunks, "BLOCKS_PER_PROGRAM": moe.SCHEDULE_BLOCKS}
    place = {
        "ids_ptr": "*i32",
        "hist_ptr": "*i32",
        "order_ptr": "*i32",
        "blk_e_ptr": "*i32",
        "blk_s_ptr": "*i32",
        "blk_end_ptr": "*i32",
        "n": "i32",
        "experts": "i32",
        "blocks_total": "i32",
        "chunk": "i32",
        "chunks": "i32",
        **{k: "constexpr" for k in place_shape},
    }
    return {
        "moe_schedule_count": ASTSource(moe._schedule_count_kernel, count, shape),
        "moe_schedule_place": ASTSource(moe._schedule_place_kernel, place, place_shape),
        "moe_schedule_combine": ASTSource(
            moe._combine_kernel,
            {"y_ptr": "*bf16", "out_ptr": "*bf16", "H": "i32", "stride_y": "i32", "stride_out": "i32"}
            | {"TOPK": "constexpr", "BLOCK": "constexpr"},
            {"TOPK": 4, "BLOCK": moe.COMBINE_BLOCK},
        ),
    }


def _chunk_gemv_sources(cfg: moe.ChunkGemvConfig, math: str) -> dict[str, ASTSource]:
    """A chunk order's decode GEMVs (``moe_mxfp4.ChunkGemvConfig``), PTX decode ``math`` ("asm" or "asm-fold")."""
    const = {"BLOCKS": "constexpr", "ORDER": "constexpr", "MATH": "constexpr", "SCALE_SHIFT": "constexpr"}
    gate_up = {**_GATE_UP_BF16, **const, "PDL": "constexpr"}
    down = {**_down_combine_args("*bf16", False), **const, "PDL": "constexpr"}
    each = {"ORDER": cfg.order, "MATH": math, "SCALE_SHIFT": 0, "PDL": int(cfg.pdl)}
    return {
        f"gemv_moe_gate_up_{cfg.order}": ASTSource(
            moe._gate_up_gemv_chunks_kernel, gate_up, {"BLOCKS": cfg.gate_up_blocks, **each}
        ),
        f"gemv_moe_down_{cfg.order}": ASTSource(
            moe._down_gemv_chunks_kernel, down, {"BLOCKS": cfg.down_blocks, **each}
        ),
    }


def _no_mma(kernel: str) -> bool:
    """Kernels that run on CUDA cores by design: the decode GEMVs, the MoE schedule and combine, the prefill's
    dequantizers and the swapped tiles' activation reorder."""
    return kernel.startswith(("gemv_", "moe_schedule", "dequant_", "split_pairs"))


def _with_folded(configs: dict, bf16: bool) -> dict:
    """``configs`` and, for BF16 activations, each swapped one with the scale folded: what the dispatch runs for
    weights whose scales fit (``pick_config`` / ``pick_moe_config`` with ``fold_scale``)."""
    folded = {f"{n}+fold": f for n, c in configs.items() if (f := dq.with_fold(c, bf16, True)) is not c}
    return configs | folded


# Streaming multiprocessors of the GPUs the chunk orders run on: GB10 (48), H100 / H200 (132), RTX 5090 (170), RTX PRO
# 6000 Blackwell (188); the K split of a q/k/v/o tile follows the count (linear_mxfp4._two_per_sm)
CHUNK_SM_COUNTS = (48, 132, 170, 188)
GPT_OSS_DENSE = {"qkv": (5120, 2880), "o": (2880, 4096), "lm_head": (201088, 2880)}  # (N, K), 20b and 120b alike


def chunk_tiles(order: str) -> dict:
    """Every tile ``pick_chunk_config`` launches on weights in chunk order ``order`` for gpt-oss's dense layers on
    :data:`CHUNK_SM_COUNTS`, at each row-count class (1-16, 17-32, 33-64), folded and not: {name in CHUNK_CONFIGS:
    config}."""
    names = {dataclasses.replace(cfg, split_k=1): name for name, cfg in lin.CHUNK_CONFIGS.items()}
    tiles = {}
    for (n, k), sms, rows, fold in itertools.product(GPT_OSS_DENSE.values(), CHUNK_SM_COUNTS, (1, 17, 33), (0, 1)):
        tile = lin.pick_chunk_config(rows, n, k, sms, bool(fold), order=order)
        name = names[dataclasses.replace(tile, split_k=1, fold_scale=False)] + ("+fold" if tile.fold_scale else "")
        tiles[f"{name}/s{tile.split_k}"] = tile
    return dict(sorted(tiles.items()))


def shipped_kernels():
    """(kernel, config name, mode, ASTSource, num_warps, num_stages) for every shipped configuration."""
    for mode in lin.MODES:
        for name, cfg in _with_folded(lin.CONFIGS, lin.MODES[mode] == "bf16").items():
            yield "linear_mxfp4", f"{name}:{cfg.name()}", mode, _linear_source(mode, cfg), cfg.num_warps, cfg.num_stages
    # the chunk orders' dense tiles (the dense layout's order): every tile and K split the dispatch picks at gpt-oss's
    # widths on the GPUs they run on (:func:`chunk_tiles`), built where the order runs (run_check); and their prefill's
    # dequantizer
    for order in ("wgmma", "mma2"):
        for name, tile in chunk_tiles(order).items():
            src = _linear_chunks_source(tile, order)
            yield "linear_chunks", f"{order} {name}:{tile.name()}", "w4a16", src, tile.num_warps, tile.num_stages
    for order in ("wgmma", "mma2"):
        sig = {
            "w_ptr": "*u8",
            "s_ptr": "*u8",
            "out_ptr": "*i32",
            "N": "i32",
            "K": "i32",
            "stride_wn": "i32",
            "stride_wsn": "i32",
            "stride_on": "i32",
            "ORDER": "constexpr",
            "MATH": "constexpr",
        }
        src = ASTSource(dq._dequant_chunks_kernel, sig, {"ORDER": order, "MATH": "asm"})
        yield "dequant_chunks", f"{order} prefill", "w4a16", src, 4, 1
    # A MoE tile's kernels do not depend on its remainder tile: each tile (a table entry's, or its remainder, which
    # may differ from every entry: a wider down tile) is built once, under the first table entry that runs it. The
    # wgmma order's tiles: sm_90a only; the mma2 order's: sm_12x (run_check).
    built = set()
    for act, mode, configs, label in (
        ("bf16", "w4a16", moe.MOE_CONFIGS, ""),
        ("e4m3", "w4a8", moe.MOE_CONFIGS_SCALED, ""),
        ("e2m1", "w4a4", moe.MOE_CONFIGS_SCALED, ""),
        ("bf16", "w4a16", moe.MOE_CONFIGS_WGMMA, "wgmma "),
        ("bf16", "w4a16", moe.MOE_CONFIGS_MMA2, "mma2 "),
    ):
        for name, cfg in _with_folded(configs, act == "bf16").items():
            # on a GPU a tile with a remainder tile lets the remainder's launch overlap it (PDL 1, then 2)
            roles = (("", dataclasses.replace(cfg, remainder=None), int(cfg.remainder is not None)),)
            roles += ((" remainder", cfg.remainder, 2),)
            for role, tile, pdl in roles:
                for kernel, src in _moe_sources(act, tile, pdl).items() if tile is not None else ():
                    # gate_up does not read down_block_n: one build per tile without it
                    key = (act, kernel, pdl, dataclasses.replace(tile, down_block_n=0) if "gate_up" in kernel else tile)
                    if key in built:
                        continue
                    built.add(key)
                    yield kernel, f"{label}{name}{role}:{tile.name()}", mode, src, tile.num_warps, tile.num_stages
    narrow_rows = tuple((f"narrow {m} rows", cfg) for m, cfg in gemv.NARROW_ROWS.items())
    prepare_built = set()  # the activation-preparing kernel differs by PDL only: built once per PDL
    for name, cfg in (("wide", gemv.WIDE), ("narrow", gemv.NARROW), *narrow_rows):
        for kernel, src in _gemv_sources(cfg).items():
            warps, stages = cfg.num_warps, cfg.num_stages
            if kernel == "gemv_prepare_x":  # launched on its own warps and stages, not the GEMV's
                if cfg.pdl in prepare_built:
                    continue
                prepare_built.add(cfg.pdl)
                warps, stages = gemv.PREPARE_WARPS, gemv.PREPARE_STAGES
            yield kernel, f"{name}:{cfg.name()}", "w4a16", src, warps, stages
    for kernel, src in _moe_gemv_sources(moe.MOE_GEMV).items():
        one = moe.MOE_GEMV.gate_up if "gate_up" in kernel else moe.MOE_GEMV.down
        yield kernel, f"decode:{one.name()}", "w4a16", src, one.num_warps, one.num_stages
    # the chunk orders' decode GEMVs (moe_mxfp4.CHUNK_GEMVS, the dispatch's at T x k <= 8), with and without PDL (the
    # build a GPU without it runs); each order built where it runs (run_check)
    for gemv_cfg, math in itertools.product(moe.CHUNK_GEMVS.values(), ("asm", "asm-fold")):
        for cfg in (gemv_cfg, dataclasses.replace(gemv_cfg, pdl=not gemv_cfg.pdl)):
            for kernel, src in _chunk_gemv_sources(cfg, math).items():
                warps = cfg.gate_up_warps if "gate_up" in kernel else cfg.down_warps
                yield kernel, f"{cfg.order} decode:{cfg.name()} {math}", "w4a16", src, warps, 1
    yield "dequant_mxfp4", f"prefill:{dq.DEQUANT.name()}", "w4a16", _dequant_source(dq.DEQUANT), dq.DEQUANT.num_warps, 1
    # the swapped tiles' activations in split order (dequant_mxfp4.split_pairs), launched as split_pairs launches it
    split = {
        "x_ptr": "*bf16",
        "out_ptr": "*bf16",
        "K": "i32",
        "width": "i32",
        "stride_xm": "i32",
        "stride_xk": "i32",
        "TILES": "constexpr",
    }
    src = ASTSource(dq._split_pairs_kernel, split, {"TILES": dq.SPLIT_TILES})
    yield "split_pairs", f"swapped tiles' activations, {dq.SPLIT_TILES} tiles", "w4a16", src, dq.SPLIT_WARPS, 1
    # CUDA cores, any activations: checked once, the placing kernel at each chunk count a call may take
    chunk_counts = [1 << i for i in range(1, moe.SCHEDULE_CHUNKS.bit_length())]
    for kernel, src in _moe_schedule_sources().items():
        for max_chunks in chunk_counts if kernel == "moe_schedule_place" else [0]:
            if max_chunks:
                src = _moe_schedule_sources(max_chunks=max_chunks)[kernel]
            warps = moe.schedule_place_warps(max_chunks) if max_chunks else 4
            what = f"120b experts{f', {max_chunks} chunks' if max_chunks else ''}"
            yield kernel, what, "any", src, warps, 1
            if "ids_ptr" in src.signature:  # torch.topk's int64 ids too
                sig = src.signature | {"ids_ptr": "*i64"}
                yield kernel, f"{what}, i64 ids", "any", ASTSource(src.fn, sig, src.constants), warps, 1


def specialized(src: ASTSource) -> ASTSource:
    """``src`` with the alignment facts Triton would find at a gpt-oss launch (:data:`DIVISIBLE_BY_16`)."""
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, (name, ty) in enumerate(src.signature.items())
        if ty.startswith("*") or name in DIVISIBLE_BY_16
    }
    return ASTSource(src.fn, src.signature, dict(src.constants), attrs)


def for_arch(src: ASTSource, cap: int) -> ASTSource:
    """``src`` as launched on compute capability ``cap``: a swapped-operand kernel waits for its MMAs on Hopper only,
    and not under Triton's ``DISABLE_MMA_V3`` (``WAIT_MMA``, as ``dequant_mxfp4.mma_reads_registers_async`` decides at
    launch)."""
    if "WAIT_MMA" not in src.signature or _constant(src, "ORDER") in ("wgmma", "mma2"):  # as its config says
        return src
    wait = bool(_constant(src, "SWAP_AB")) and dq.builds_wgmma(cap // 10)
    names = list(src.fn.arg_names)
    const = {k: v for k, v in src.constants.items() if k not in ("WAIT_MMA", (names.index("WAIT_MMA"),))}
    return ASTSource(src.fn, src.signature, const | {"WAIT_MMA": wait}, src.attrs)


def _constant(src: ASTSource, name: str):
    """A constexpr argument's value (Triton keys them by name or, in newer releases, by ``(argument index,)``)."""
    if name in src.constants:
        return src.constants[name]
    names = list(src.fn.arg_names)  # the kernel's own argument order (a signature dict may list them otherwise)
    return src.constants.get((names.index(name),)) if name in names else None


def check_one(kernel: str, config: str, mode: str, src: ASTSource, num_warps: int, num_stages: int, cap: int) -> dict:
    arch = ARCHS[cap]
    rec = {
        "kernel": kernel,
        "config": config,
        "mode": mode,
        "arch": arch,
        "num_warps": num_warps,
        "num_stages": num_stages,
        "shared_bytes": None,
        "mma": [],
        "tma": False,
        "copies_modelled": None,
        "copy_wavefronts_over_ideal": None,
        "ok": False,
        "error": None,
    }
    try:
        compiled = triton.compile(
            specialized(for_arch(src, cap)),
            target=GPUTarget("cuda", cap, 32),
            options={"num_warps": num_warps, "num_stages": num_stages},
        )
    except Exception as e:  # a compile failure is a finding, reported per record
        rec["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
        return rec
    ptx = compiled.asm["ptx"]
    rec["shared_bytes"] = int(compiled.metadata.shared)
    rec["mma"] = sorted(set(_MMA.findall(ptx)))
    rec["tma"] = bool(_TMA.search(ptx))
    problems = []
    if rec["tma"]:
        problems.append("TMA instructions in PTX")
    if cap >= 120:
        if rec["shared_bytes"] > SM12X_SHARED_LIMIT:
            problems.append(f"shared memory {rec['shared_bytes']} > {SM12X_SHARED_LIMIT}")
        if mode == "w4a4" and not any("kind::mxf4nvf4.block_scale" in m for m in rec["mma"]):
            problems.append("W4A4 does not use mma.sync kind::mxf4nvf4.block_scale")
    hazards = dq.wgmma_register_hazards(ptx) if _constant(src, "SWAP_AB") else []
    if hazards:
        # W decoded into registers is wgmma's operand; a wgmma left in flight while the next decode rewrites those
        # registers reads garbage (triton-lang/triton#9433: non-finite output on an H100, PERF_LOG.md stop 19).
        # dequant_mxfp4.mma_done makes Triton wait for each one; a wgmma order tile kept in flight (wait_mma=False)
        # passes because its operand is copied per k16 step (dequant_mxfp4.fresh_operand)
        problems.append(f"a register an in-flight wgmma reads is written ({hazards[0]}; see dequant_mxfp4.mma_done)")
    # a chunk order's GEMVs and prefill dequantizer take whole int32 words, whatever the layout
    tile = not _no_mma(kernel)
    if tile and _constant(src, "ORDER") in ("wgmma", "mma2") and not dq.wgmma_words_packed(compiled.asm["ttgir"]):
        # the tiles' decode takes a word's 4 bytes as 4 consecutive registers: true of the layouts Triton derives from
        # wgmma's A operand (kWidth 2) and mma.sync's fed by the mma2 order (kWidth 8), which it chooses, so each
        # build is checked
        problems.append(
            f"the {_constant(src, 'ORDER')} order's decode does not receive whole words (Triton chose another layout)"
        )
    try:
        copies = shared_copy_wavefronts(compiled.asm["ttgir"])
    except (ValueError, KeyError, AttributeError, IndexError) as e:  # a layout this model cannot read
        copies = []
        problems.append(f"the shared-copy model could not read this build's TTGIR ({type(e).__name__}: {e})"[:200])
    rec["copies_modelled"] = len(copies)
    rec["copy_wavefronts_over_ideal"] = max((c["wavefronts"] / c["ideal"] for c in copies), default=None)
    if tile and _constant(src, "ORDER") in ("wgmma", "mma2"):
        # the chunk orders' weight and scale copies ran 4x and 16x their ideal wavefronts until stop 37 (10% of the
        # prefill tiles' time): chunk_tile loads them as rows so that Triton lays each warp's copies along one. A
        # build where the model finds no byte copy (a TTGIR it does not parse) fails rather than passing unread
        worst = max(copies, key=lambda c: c["wavefronts"] / c["ideal"], default=None)
        if sum(c["dtype"] == "i8" for c in copies) < 2:
            problems.append(
                f"the {_constant(src, 'ORDER')} order's weight and scale copies were not found in the TTGIR"
            )
        elif worst["wavefronts"] > worst["ideal"]:
            problems.append(
                f"the {_constant(src, 'ORDER')} order's copies into shared memory bank-conflict ({worst['shape']} "
                f"{worst['dtype']}: {worst['wavefronts']} wavefronts where {worst['ideal']} would do"
                + ("; see dequant_mxfp4.chunk_tile)" if worst["dtype"] == "i8" else ")")
            )
    if _no_mma(kernel):
        if rec["mma"]:
            problems.append("MMA instructions in a CUDA-core kernel")
    elif not rec["mma"]:
        problems.append("no MMA instruction found")
    rec["ok"] = not problems
    rec["error"] = "; ".join(problems) or None
    return rec


_WGMMA_FLOW = re.compile(
    r"^\s*(?:@!?%p\d+\s+)?(wgmma\.(?:commit_group|wait_group\.sync\.aligned\s+\d+|fence|mma_async)|\$L__\w+:|bra\b)",
    re.M,
)


def wgmma_left_in_flight(ptx: str) -> int:
    """How many ``wgmma`` groups the PTX commits without a ``wait_group 0`` before the next wgmma instruction, label
    or branch: each lets other code run while the MMA still reads its register operands. Labels and branches end
    the search because a loop's back edge jumps to code that comes before the commit in the text. Descriptive (the
    probes print it); whether that other code writes those registers is ``dequant_mxfp4.wgmma_register_hazards``."""
    ops = [re.sub(r"\s+", " ", op) for op in _WGMMA_FLOW.findall(ptx)]
    return sum(
        op == "wgmma.commit_group" and (i + 1 == len(ops) or ops[i + 1] != "wgmma.wait_group.sync.aligned 0")
        for i, op in enumerate(ops)
    )


_LAYOUT = re.compile(r"^(#[\w.]+) = #ttg\.(blocked|swizzled_shared)<\{(.*)\}>", re.M)
_COPY = re.compile(
    r"ttg\.async_copy_global_to_local .*?(?:\{contiguity = (\d+) : i32\} )?: "
    r"tensor<([0-9x]+)x!tt\.ptr<(\w+)>, (#[\w.]+)> -> <[0-9x]+x\w+, (#[\w.]+)"
)


def _elem_bytes(dtype: str) -> int:
    """Bytes of a TTGIR element type from its width (i8, bf16, f8E4M3FN, f32, ...)."""
    return max(1, int(re.search(r"\d+", dtype).group()) // 8)


def _fields(text: str) -> dict:
    return {k: json.loads(v) for k, v in re.findall(r"(\w+) = (\[[^\]]*\]|\d+)", text)}


def _blocked_coords(shape: list, b: dict, lane: int) -> list:
    """The first element warp 0's ``lane`` holds in a blocked layout (lanes fill ``order``'s dims fastest first;
    a tile larger than the shape wraps, as Triton broadcasts)."""
    coords = [0] * len(shape)
    for d in b["order"]:
        coords[d] = (lane % b["threadsPerWarp"][d]) * b["sizePerThread"][d] % shape[d]
        lane //= b["threadsPerWarp"][d]
    return coords


def _swizzled_offset(shape: list, sh: dict, coords: list) -> int:
    """An element's offset (in elements) in a ``swizzled_shared`` buffer: ``order``'s first dim contiguous, its
    second the swizzled rows (column vectors of ``vec`` XOR the row's phase), the rest stacked."""
    order = sh["order"]
    col, row = coords[order[0]], coords[order[1]] if len(order) > 1 else 0
    phase = (row // sh["perPhase"]) % sh["maxPhase"]
    offset, stride = ((col // sh["vec"]) ^ phase) * sh["vec"] + col % sh["vec"], shape[order[0]]
    for d in order[1:]:
        offset, stride = offset + coords[d] * stride, stride * shape[d]
    return offset


def shared_copy_wavefronts(ttgir: str) -> list[dict]:
    """For each pipelined copy into an unswizzled or swizzled shared buffer (``ttg.async_copy_global_to_local``) in a
    build's TTGIR: the shared-memory wavefronts one warp's first copy instruction takes (the most distinct 4-byte
    words any of the 32 banks serves, at least one per 128 bytes), against the ideal (one per 128 bytes). The model
    of Nsight Compute's count: on the H100 it gave the chunk orders' weight copies before stop 37 exactly (16 against
    4) and flags their scale copies (16 here, 32 measured, against 2). It reads shared-memory addresses only, per
    warp, not per the half- or quarter-warp phases of 8- and 16-byte accesses, so it can only undercount: the scale
    copies as stop 37 left them, whose 4 lanes a quad copy the same 8 source bytes, it finds ideal where ncu counted
    7.5 wavefronts for 2. wgmma's own operand buffers (``nvmma_shared``) are Triton's and are not read."""
    layouts = {name: (kind, _fields(body)) for name, kind, body in _LAYOUT.findall(ttgir)}
    out = []
    for contiguity, shape_s, dtype, src, dst in _COPY.findall(ttgir):
        if layouts.get(src, ("",))[0] != "blocked" or layouts.get(dst, ("",))[0] != "swizzled_shared":
            continue
        shape, b, sh, size = [int(n) for n in shape_s.split("x")], layouts[src][1], layouts[dst][1], _elem_bytes(dtype)
        fast = b["order"][0]
        # elements a copy moves: a thread's run, at most 16 bytes, and at most the pipeliner's contiguity where it
        # wrote one (a masked copy); without it the lowering vectorizes the thread's run
        run = b["sizePerThread"][fast]
        vec = min(run, int(contiguity) if contiguity else run, max(1, 16 // size))
        words = set()
        for lane in range(32):
            coords = _blocked_coords(shape, b, lane)
            start = _swizzled_offset(shape, sh, coords) * size
            words.update(range(start // 4, (start + vec * size + 3) // 4))
        busiest_bank = max(collections.Counter(w % 32 for w in words).values())
        ideal = -(-len(words) * 4 // 128)
        out.append({"shape": shape, "dtype": dtype, "wavefronts": max(busiest_bank, ideal), "ideal": ideal})
    return out


@functools.cache
def _shipped() -> list:
    return list(shipped_kernels())


def _check_index(i: int, cap: int) -> dict:
    return check_one(*_shipped()[i], cap)


def run_check(caps: list[int] | None = None, kernels: list[str] | None = None, jobs: int | None = None) -> list[dict]:
    """One record per (kernel, config, mode, arch); compiles in ``jobs`` processes (default: all cores)."""
    import os
    from concurrent.futures import ProcessPoolExecutor

    caps = caps or sorted(ARCHS)
    unknown = [c for c in caps if c not in ARCHS]
    if unknown:
        raise ValueError(f"unknown compute capability {unknown[0]}; known: {', '.join(map(str, ARCHS))}")
    work = [
        (i, cap)
        for i, k in enumerate(_shipped())
        if not kernels or k[0] in kernels
        for cap in caps
        # the wgmma order is Hopper's fragment; the mma2 order mma.sync's (sm_12x here; sm_90a and sm_100a build others)
        if {"wgmma": cap // 10 == 9, "mma2": cap >= 120}.get(_constant(k[3], "ORDER"), True)
    ]
    jobs = jobs or os.cpu_count() or 1
    if jobs == 1:
        return [_check_index(i, cap) for i, cap in work]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_check_index, *zip(*work)))


def format_table(records: list[dict]) -> str:
    lines = [f"{'kernel':<20} {'config':<26} {'mode':<6} {'arch':<8} {'shared':>7} {'ok':<3} mma / problem", "-" * 110]
    for r in records:
        mma = ", ".join(m.replace("mma.sync.aligned.", "mma.sync.") for m in r["mma"]) or "-"
        shared = "-" if r["shared_bytes"] is None else str(r["shared_bytes"])
        note = mma if r["ok"] else f"FAIL: {r['error']}"
        lines.append(
            f"{r['kernel']:<20} {r['config']:<26} {r['mode']:<6} {r['arch']:<8} {shared:>7} "
            f"{'yes' if r['ok'] else 'NO':<3} {note}"
        )
    return "\n".join(lines)


__all__ = ["ARCHS", "SM12X_SHARED_LIMIT", "format_table", "run_check", "shipped_kernels"]
