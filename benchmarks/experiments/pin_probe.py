"""How long page-locking host memory takes, by method (for mxrepack.serve.reader's ring). Not a test."""

import json
import mmap
import sys
import time

import torch

cudart = torch.cuda.cudart()
torch.cuda.init()
GIB = 2**30
out = {}
for gib in (1, 2):
    n = gib * GIB
    for name in ("mmap+register", "mmap+hugepage+populate+register", "torch pin_memory", "mmap populate only"):
        t = time.perf_counter()
        if name == "torch pin_memory":
            x = torch.empty(n, dtype=torch.uint8, pin_memory=True)
            del x
        else:
            flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (mmap.MAP_POPULATE if "populate" in name else 0)
            if "hugepage" in name:
                flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
            m = mmap.mmap(-1, n, flags=flags)
            if "hugepage" in name:
                m.madvise(mmap.MADV_HUGEPAGE)
                m.madvise(getattr(mmap, "MADV_POPULATE_WRITE", 23))
            if "register" in name:
                ptr = torch.frombuffer(m, dtype=torch.uint8, count=1).data_ptr()
                err = cudart.cudaHostRegister(ptr, n, 0)
                assert err == cudart.cudaError.success, err
                cudart.cudaHostUnregister(ptr)
            m.close()
        out[f"{name} {gib} GiB"] = time.perf_counter() - t
        print(f"{name:40s} {gib} GiB {out[f'{name} {gib} GiB']:.3f} s", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1) if len(sys.argv) > 1 else None
