"""The MMA loops of the kernels in a Triton cache: for each cubin whose name matches, the instructions of every loop
that holds a tensor-core MMA (HGMMA: wgmma, HMMA: mma.sync), counted by opcode, and the order of its wgmma fences,
MMAs and waits -- how a kernel interleaves its decode with its MMA (PERF_LOG stop 36: triton_kernels' Hopper MoE
matmul issues each k16 step's wgmma as its own group, ours fenced the whole K tile at once). Beside each cubin, its
TTGIR's ``warp_group_dot`` count and wait depths.

Usage (on the GPU machine, after a run with TRITON_CACHE_DIR=DIR):
    python benchmarks/experiments/sass_loop.py DIR NAME[,NAME...] [OUT.json]
"""

import collections
import json
import re
import subprocess
import sys
from pathlib import Path


def cuobjdump() -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


def mma_loops(sass: str) -> list[dict]:
    """Each loop (a backward branch and the code from its target) that holds an MMA instruction."""
    ins = [(int(a, 16), op) for a, op in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?)\s*;", sass)]
    where = {a: i for i, (a, _) in enumerate(ins)}
    loops = []
    for i, (a, op) in enumerate(ins):
        m = re.search(r"\bBRA\s+(0x[0-9a-f]+)", op)
        if not m or int(m.group(1), 16) >= a or int(m.group(1), 16) not in where:
            continue
        body = [o for _, o in ins[where[int(m.group(1), 16)] : i + 1]]
        if not any(re.search(r"\bH[G]?MMA\b|HGMMA", o) for o in body):
            continue
        opcode = [re.sub(r"^@!?U?P\w+\s+", "", o).split()[0] for o in body]
        plain = [re.sub(r"^@!?U?P\w+\s+", "", o) for o in body]
        flow = [  # a wait's depth kept (WARPGROUP.DEPBAR.LE gsb0, 0x7: at most 7 groups left in flight)
            re.sub(r"\s+", " ", o) if o.startswith("WARPGROUP.DEPBAR") else o.split()[0]
            for o in plain
            if o.startswith(("HGMMA", "WARPGROUP", "HMMA", "BAR.SYNC"))
        ]
        runs = []  # the flow with repeats folded: ["WARPGROUP.ARRIVE", "HGMMA.64x128x16.F32.BF16 x16", ...]
        for o in flow:
            if runs and runs[-1][0] == o:
                runs[-1][1] += 1
            else:
                runs.append([o, 1])
        loops.append(
            {
                "instructions": len(body),
                "opcodes": dict(collections.Counter(o.split(".")[0] for o in opcode).most_common()),
                "flow": [f"{o} x{n}" if n > 1 else o for o, n in runs],
            }
        )
    return loops


def main() -> None:
    root, names = Path(sys.argv[1]), sys.argv[2].split(",")
    out = []
    for cubin in sorted(root.rglob("*.cubin")):
        if not any(n in cubin.stem for n in names):
            continue
        sass = subprocess.run([cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True).stdout
        res = subprocess.run([cuobjdump(), "-res-usage", str(cubin)], capture_output=True, text=True).stdout
        ttgir = next(cubin.parent.glob("*.ttgir"), None)
        text = ttgir.read_text() if ttgir else ""
        rec = {
            "kernel": cubin.stem,
            "cache_key": cubin.parent.name[:12],
            "resources": (re.search(r"REG:\d+ STACK:\d+ SHARED:\d+", res) or [""])[0],
            "warp_group_dots": text.count("ttng.warp_group_dot "),
            "dot_waits": re.findall(r"warp_group_dot_wait .*?pendings = (\d+)", text),
            "loops": mma_loops(sass),
        }
        out.append(rec)
        for loop in rec["loops"]:
            print(
                rec["kernel"],
                rec["cache_key"],
                rec["resources"],
                "dots",
                rec["warp_group_dots"],
                "waits",
                rec["dot_waits"],
                "loop",
                loop["instructions"],
                " ".join(loop["flow"]),
                flush=True,
            )
    if len(sys.argv) > 3:
        Path(sys.argv[3]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
