"""The gpt-oss runner's Triton fast path on a GPU: the bundled tiny model (and an sm121 repack of it)
through ``use_kernels=True`` vs the fp32 torch reference; logits error, top-1 agreement and the
GPQA-style accuracy of both. One call:

    python benchmarks/gpu_runner_check.py [--samples 60] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

from mxrepack.eval.bundled import bundled_model
from mxrepack.eval.gpqa import LocalBackend, run_gpqa
from mxrepack.eval.local import LocalChatModel
from mxrepack.eval.model import load_runner


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=60)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    src = bundled_model()
    records = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__}
    import triton

    records["triton"] = triton.__version__
    try:
        from mxrepack.repack.pipeline import repack

        out = repack(str(src), "sm121", tempfile.mkdtemp() + "/sm121", hash_source=False).out
        paths = {"source": src, "sm121": out}
    except Exception as e:  # compressed-tensors or yaml missing on the GPU machine: the source alone
        records["repack_error"] = f"{type(e).__name__}: {e}"
        paths = {"source": src}
    ids = torch.tensor(LocalChatModel(src).tokenizer.encode((src / "tasks" / "text.txt").read_text()).ids[:256])
    for name, path in paths.items():
        ref = load_runner(path, device=dev).forward(ids)
        t = time.perf_counter()
        fast = load_runner(path, device=dev, use_kernels=True).forward(ids)
        records[f"{name}_rel_err"] = float((fast - ref).norm() / ref.norm())
        records[f"{name}_same_top1"] = float((fast.argmax(-1) == ref.argmax(-1)).float().mean())
        records[f"{name}_forward_s"] = round(time.perf_counter() - t, 3)
        for kernels in (False, True):
            model = (
                LocalChatModel(path if name == "source" else path, device=dev, use_kernels=kernels)
                if (path / "tokenizer.json").is_file()
                else None
            )
            if model is None:
                continue
            r = run_gpqa(LocalBackend(model=model), src / "tasks" / "test.csv", num_examples=a.samples, concurrency=1)
            records[f"{name}_gpqa_{'kernels' if kernels else 'torch'}"] = {
                "score": r["score"],
                "stderr": r["stderr"],
                "seconds": r["seconds"],
            }
        print(json.dumps({k: v for k, v in records.items() if k.startswith(name)}), flush=True)
    print(json.dumps(records, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(records, f, indent=2)


if __name__ == "__main__":
    main()
