"""Write the fixture and every case's checkpoint of vllm_plugin_check.py ahead of its run (CPU work, no vLLM): lets
the first device calls of the vllm-kit dance, which only carry kit parts, do it.

    python benchmarks/vllm_plugin_prebuild.py --work /root/vpc --layers 2 --experts 32 [--ct-site DIR]
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_plugin_check as check  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--work", default="/root/vpc")
ap.add_argument("--layers", type=int, default=2)
ap.add_argument("--experts", type=int, default=32)
ap.add_argument("--ct-site")
ap.add_argument("--convert", action="store_true")
args = ap.parse_args()
from mxrepack.repack.fixture import make_fixture  # noqa: E402

work = Path(args.work)
work.mkdir(parents=True, exist_ok=True)
src = work / "src"
if not src.exists():
    t = time.perf_counter()
    make_fixture(src, preset="20b", layers=args.layers, num_local_experts=args.experts)
    print(f"fixture: {time.perf_counter() - t:.1f} s", flush=True)
names = [what for what, *_ in check.CASES.values()] + (["sm80", "sm90", "sm100", "sm121"] if args.convert else [])
for name in dict.fromkeys(names):
    try:
        check._model(name, work, src, args.ct_site)
    except Exception as e:  # noqa: BLE001 - the check run reports it again
        print(f"{name}: {e}", flush=True)
