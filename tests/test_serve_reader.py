"""The plugin's weight reader (mxrepack.serve.reader): every tensor's bytes as safetensors' own reader gives them,
through read-ahead, ring wrap-around, tensors larger than the ring and a consumer that keeps what it was handed."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from mxrepack.errors import MxRepackError
from mxrepack.serve.reader import ALIGN, read_tensors


@pytest.fixture
def shards(tmp_path):
    g = torch.Generator().manual_seed(0)
    dtypes = (torch.bfloat16, torch.uint8, torch.float32, torch.int32, torch.float8_e8m0fnu)
    files = []
    for s in range(2):
        tensors = {}
        for i in range(12):
            rows, cols = (int(torch.randint(1, n, (1,), generator=g)) for n in (40, 900))
            dt = dtypes[i % len(dtypes)]
            raw = torch.randint(0, 255, (rows * cols * dt.itemsize,), generator=g, dtype=torch.uint8)
            tensors[f"model.layers.{s}.t{i}"] = raw.view(dt).reshape(rows, cols)
        tensors[f"model.layers.{s}.scalar"] = torch.tensor(3.5)
        tensors[f"model.layers.{s}.empty"] = torch.empty(0, 7, dtype=torch.bfloat16)
        path = tmp_path / f"model-0000{s + 1}-of-00002.safetensors"
        save_file(tensors, path)
        files.append(path)
    return files


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def expected(files):
    out = {}
    for f in files:
        with safe_open(f, "pt") as h:
            out |= {k: h.get_tensor(k) for k in h.keys()}
    return out


@pytest.mark.parametrize("ring_bytes", [1 << 20, 3 * ALIGN, ALIGN])  # all ahead; wrapping; most larger than the ring
def test_read_tensors_gives_safetensors_bytes(shards, ring_bytes):
    want = expected(shards)
    got = {}
    for name, t in read_tensors(shards, threads=3, ring_bytes=ring_bytes, chunk_bytes=1000):
        assert t.dtype == want[name].dtype and t.shape == want[name].shape, name
        got[name] = t.clone()  # the consumer copies, as vLLM's weight loaders do
    assert got.keys() == want.keys()
    for name, t in want.items():
        assert torch.equal(as_bytes(got[name]), as_bytes(t)), name


def test_a_consumer_may_keep_what_it_was_handed(shards):
    """Kept tensors keep their bytes: the ring skips them and reads the rest into fresh memory."""
    want = expected(shards)
    kept = dict(read_tensors(shards, threads=2, ring_bytes=4 * ALIGN, chunk_bytes=512))
    assert kept.keys() == want.keys()
    for name, t in want.items():
        assert torch.equal(as_bytes(kept[name]), as_bytes(t)), name


def test_a_truncated_shard_names_the_file(shards):
    data = shards[1].read_bytes()
    shards[1].write_bytes(data[: len(data) - 100])
    with pytest.raises(MxRepackError, match=r"model-00002-of-00002\.safetensors.*truncated"):
        list(read_tensors(shards))
