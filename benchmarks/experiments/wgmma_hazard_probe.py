"""Whether a swapped-operand MoE tile left with a wgmma in flight writes a register that wgmma still reads, in the PTX
this machine's Triton builds (``dequant_mxfp4.wgmma_register_hazards``: undefined in PTX), beside the blunter rule
the kernels check used until stop 36 (``check.wgmma_left_in_flight``: any wgmma group committed without
``wait_group 0``). The
rows order's 16-row tile on 2-3 stages without the wait has the shape that gave non-finite outputs on the H100 with
Triton 3.6 (PERF_LOG stop 19); the wgmma order's tiles without the wait are the ``overlap`` variants. Compiles only
(sm_90a). A first form read the SASS instead and flagged writes the hardware runs safely (ptxas orders them by
scoreboards that ``cuobjdump`` does not print; the overlap variants gave identical bits over 20 runs): the PTX is the
contract Triton must keep.

Usage: python benchmarks/experiments/wgmma_hazard_probe.py [--without-copy] [OUT.json]
"""

import json
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from mxrepack.kernels import check, dequant_mxfp4
from mxrepack.kernels.moe_mxfp4 import MoeConfig


def with_wait(src: ASTSource, wait: bool) -> ASTSource:
    names = list(src.fn.arg_names)
    const = {k: v for k, v in src.constants.items() if k not in ("WAIT_MMA", (names.index("WAIT_MMA"),))}
    return ASTSource(src.fn, src.signature, const | {"WAIT_MMA": wait}, src.attrs)


@triton.jit
def _identity(w):
    return w


# --without-copy: dequant_mxfp4.fresh_operand made the identity before anything is compiled (Triton keeps a process's
# first build of a called function, so the switch cannot come between builds)
WITHOUT_COPY = "--without-copy" in sys.argv
if WITHOUT_COPY:
    sys.argv.remove("--without-copy")
    dequant_mxfp4.fresh_operand = _identity


def main() -> None:
    cases = []
    for stages in (1, 2, 3):  # the rows order's swapped tile, as stop 19 ran it (3 stages raced there)
        cfg = MoeConfig(16, 64, 128, 4, stages, swap_ab=True, fold_scale=True)
        cases += [(f"rows {cfg.name()} wait={w}", cfg, w) for w in (False, True)]
    for bm, bn, warps in ((16, 64, 4), (32, 64, 4), (64, 64, 4), (128, 128, 8)):
        for wait in (True, False):
            cfg = MoeConfig(bm, bn, 128, warps, 3, swap_ab=True, fold_scale=True, order="wgmma", wait_mma=wait)
            cases.append((f"wgmma {cfg.name()}", cfg, None))
    if WITHOUT_COPY:  # the positive control: the in-flight tiles only, as Triton 3.6 builds them without the copy
        cases = [(f"{n} without the copy", c, w) for n, c, w in cases if n.endswith("overlap")]
    out = {"triton": triton.__version__, "without_copy": WITHOUT_COPY, "cases": []}
    for name, cfg, wait in cases:
        for kernel, src in check._moe_sources("bf16", cfg).items():
            src = check.for_arch(src, 90)
            if wait is not None:
                src = with_wait(src, wait)
            c = triton.compile(
                check.specialized(src),
                target=GPUTarget("cuda", 90, 32),
                options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages},
            )
            hazards = dequant_mxfp4.wgmma_register_hazards(c.asm["ptx"])
            rec = {
                "case": name,
                "kernel": kernel,
                "ptx_groups_in_flight": check.wgmma_left_in_flight(c.asm["ptx"]),
                "ptx_hazards": len(hazards),
                "first_hazards": hazards[:3],
            }
            out["cases"].append(rec)
            print(
                f"{name:50s} {kernel:20s} PTX groups in flight {rec['ptx_groups_in_flight']}  hazards "
                f"{rec['ptx_hazards']}  {hazards[:1]}",
                flush=True,
            )
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
