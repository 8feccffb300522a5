"""A compact record of Nsight Compute exports (``ncu -i R --page details --csv`` and ``--page source --csv
--print-source sass``) for the kernels whose names contain a pattern: per launch, the headline metrics, the warp stall
reasons summed over the kernel's SASS (share of all samples), shared-memory wavefronts against the ideal (bank
conflicts), and the instructions with the most excess wavefronts and the most stall samples. Runs anywhere (no GPU):
it reads the CSVs ``ncu_moe_prefill.py``'s device run brought back.

Usage: python benchmarks/experiments/ncu_summary.py DETAILS.csv SOURCE.csv PATTERN[,PATTERN] [OUT.json]"""

import collections
import csv
import json
import sys

METRICS = (
    "Duration",
    "SM Frequency",
    "Compute (SM) Throughput",
    "Executed Ipc Active",
    "Issue Slots Busy",
    "No Eligible",
    "Eligible Warps Per Scheduler",
    "Warp Cycles Per Issued Instruction",
    "Executed Instructions",
    "Registers Per Thread",
    "Dynamic Shared Memory Per Block",
    "Grid Size",
    "Waves Per SM",
    "L1/TEX Hit Rate",
    "L2 Hit Rate",
    "DRAM Throughput",
)


def _num(v: str) -> float:
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


def source_kernels(path: str) -> list[dict]:
    """The source page's kernels in launch order: name and one dict per SASS instruction."""
    out, hdr = [], None
    for row in csv.reader(open(path)):
        if not row:
            continue
        if row[0] == "Kernel Name":
            out.append({"name": row[1], "rows": []})
            hdr = None
        elif row[0] == "Address":
            hdr = row
        elif hdr and out:
            out[-1]["rows"].append(dict(zip(hdr, row)))
    return out


def summarize_source(rows: list[dict], top: int = 8) -> dict:
    reasons = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
    samples = sum(_num(r["Warp Stall Sampling (All Samples)"]) for r in rows) or 1.0
    stalls = collections.Counter()
    for r in rows:
        for c in reasons:
            stalls[c] += _num(r[c])
    shared = sum(_num(r["L1 Wavefronts Shared"]) for r in rows)
    ideal = sum(_num(r["L1 Wavefronts Shared Ideal"]) for r in rows)

    def line(r: dict) -> str:
        return " ".join(r["Source"].split())[:70]

    return {
        "sass_instructions": len(rows),
        "stall_share": {c: round(v / samples, 4) for c, v in stalls.most_common() if v},
        "shared_wavefronts": shared,
        "shared_wavefronts_ideal": ideal,
        "most_excess_shared_wavefronts": [
            {
                "sass": line(r),
                "excess": _num(r["L1 Wavefronts Shared Excessive"]),
                "all": _num(r["L1 Wavefronts Shared"]),
            }
            for r in sorted(rows, key=lambda r: -_num(r["L1 Wavefronts Shared Excessive"]))[:top]
            if _num(r["L1 Wavefronts Shared Excessive"])
        ],
        "most_stalled": [
            {
                "sass": line(r),
                "share": round(_num(r["Warp Stall Sampling (All Samples)"]) / samples, 4),
                "reason": max(reasons, key=lambda c: _num(r[c])),
            }
            for r in sorted(rows, key=lambda r: -_num(r["Warp Stall Sampling (All Samples)"]))[:top]
        ],
    }


def main() -> None:
    details, source, patterns = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    launches: dict[str, dict] = {}
    for r in csv.DictReader(open(details)):
        if any(p in r["Kernel Name"] for p in patterns):
            d = launches.setdefault(r["ID"], {"kernel": r["Kernel Name"][:80]})
            if r["Metric Name"] in METRICS:
                d[r["Metric Name"]] = f"{r['Metric Value']} {r['Metric Unit']}".strip()
    matching = [k for k in source_kernels(source) if any(p in k["name"] for p in patterns)]
    for d, k in zip(launches.values(), matching):  # both pages list the launches in the same order
        d |= summarize_source(k["rows"])
    out = list(launches.values())
    for d in out:
        print(
            d["kernel"][:60],
            d.get("Duration"),
            "shared wavefronts",
            d.get("shared_wavefronts"),
            "ideal",
            d.get("shared_wavefronts_ideal"),
            flush=True,
        )
    if len(sys.argv) > 4:
        json.dump(out, open(sys.argv[4], "w"), indent=1)


if __name__ == "__main__":
    main()
