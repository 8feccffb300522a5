"""The plugin's weight reader (mxrepack.serve.reader): every tensor's bytes as safetensors' own reader gives them,
read in chunks by several threads (the host path here; the GPU path in benchmarks/weights_read.py)."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from mxrepack.errors import MxRepackError
from mxrepack.serve.reader import read_tensors


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


@pytest.mark.parametrize("chunk_bytes", [1 << 20, 1000, 7])  # whole tensors; several chunks; many
def test_read_tensors_gives_safetensors_bytes(shards, chunk_bytes):
    want = expected(shards)
    got = list(read_tensors(shards, threads=3, chunk_bytes=chunk_bytes))
    names = [n for n, _ in got]
    assert sorted(names) == sorted(want) and len(set(names)) == len(names)
    first = [i for i, n in enumerate(names) if n.startswith("model.layers.0.")]
    assert max(first) < min(i for i, n in enumerate(names) if n.startswith("model.layers.1."))  # file by file
    for name, t in got:
        assert t.dtype == want[name].dtype and t.shape == want[name].shape, name
        assert torch.equal(as_bytes(t), as_bytes(want[name])), name


def test_a_shard_truncated_while_loading_names_file_and_tensor(shards):
    """Cut short after its header was read (the header check names a shard that is short from the start)."""
    tensors = read_tensors(shards, threads=2)
    next(tensors)
    data = shards[1].read_bytes()
    shards[1].write_bytes(data[: len(data) // 2])
    with pytest.raises(
        MxRepackError, match=r"model-00002-of-00002\.safetensors: truncated while reading tensor 'model\.layers\.1\."
    ):
        list(tensors)


def test_shards_come_in_vllms_order(tmp_path):
    """Natural order of the names, as vLLM's reader sorts them: shard 2 before shard 10."""
    for i in (10, 2, 1):
        save_file({f"t{i}": torch.zeros(1)}, tmp_path / f"model-{i}.safetensors")
    names = [n for n, _ in read_tensors(sorted(tmp_path.iterdir()))]
    assert names == ["t1", "t2", "t10"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the staging path needs a CUDA device")
@pytest.mark.parametrize("chunk_bytes, slots", [(1000, 1), (4099, 2), (1 << 20, 16)])
def test_read_tensors_to_gpu_gives_safetensors_bytes(shards, chunk_bytes, slots):
    """The GPU path with slots reused within a tensor (random bytes: a chunk copied from a stale slot would differ)."""
    want = expected(shards)
    for name, t in read_tensors(shards, "cuda", threads=3, chunk_bytes=chunk_bytes, slots=slots):
        assert t.is_cuda and torch.equal(as_bytes(t).cpu(), as_bytes(want[name])), name


def test_load_format_wraps_vllms_default_loader(shards, monkeypatch):
    """``--load-format mxrepack`` (mxrepack.serve.vllm.loader) against stand-ins for vLLM's loader module: vLLM's own
    file discovery, asked as for ``safetensors`` (the only name it knows) and left as it was; 0.26's three-value and
    0.33's four-value answer; the source prefix; the reader's tensors; vLLM's own reader where the load needs more.
    Imports no vLLM."""
    import sys
    import types
    from dataclasses import dataclass, field

    registered = {}
    asked = []

    class DefaultModelLoader:  # the part of vLLM's class the load format uses
        DEFAULT_NUM_THREADS = 8
        counter_before_loading_weights = 0.0
        v033 = False
        safetensors = True

        def __init__(self, load_config):
            self.load_config = load_config

        def _prepare_weights(self, path, subfolder, revision, fall_back_to_pt, allow_patterns_overrides):
            asked.append(self.load_config.load_format)
            found = (path, [str(f) for f in shards], self.safetensors)
            return found + (("model.safetensors.index.json",) if self.v033 else ())

        def _get_weights_iterator(self, source):
            return "vLLM's reader"

    @dataclass
    class LoadConfig:
        load_format: str = "mxrepack"
        model_loader_extra_config: dict = field(default_factory=lambda: {"num_threads": 2})
        safetensors_load_strategy: str | None = None

    @dataclass
    class Source:
        model_or_path: str = "/m"
        revision: str | None = None
        prefix: str = "pre."
        fall_back_to_pt: bool = True
        allow_patterns_overrides: list | None = None
        subfolder: str | None = None
        is_unused_weight: object = None

    def register_model_loader(name):
        return lambda cls: registered.setdefault(name, cls)

    loader_mod = types.ModuleType("vllm.model_executor.model_loader")
    loader_mod.register_model_loader = register_model_loader
    default_mod = types.ModuleType("vllm.model_executor.model_loader.default_loader")
    default_mod.DefaultModelLoader = DefaultModelLoader
    for name, mod in {
        "vllm": types.ModuleType("vllm"),
        "vllm.model_executor": types.ModuleType("vllm.model_executor"),
        "vllm.model_executor.model_loader": loader_mod,
        "vllm.model_executor.model_loader.default_loader": default_mod,
    }.items():
        monkeypatch.setitem(sys.modules, name, mod)
    from mxrepack.serve.vllm import loader

    loader.register()
    want = expected(shards)
    for v033 in (False, True):
        DefaultModelLoader.v033 = v033
        ml = registered[loader.LOAD_FORMAT](LoadConfig())
        got = dict(ml._get_weights_iterator(Source()))
        assert ml.load_config.load_format == "mxrepack" and asked[-1] == "safetensors"
        assert got.keys() == {"pre." + k for k in want}
        assert all(torch.equal(as_bytes(got["pre." + k]), as_bytes(t)) for k, t in want.items())
        assert ml.counter_before_loading_weights > 0
    # where the load needs more than reading every tensor of safetensors files, vLLM's reader does it
    assert ml._get_weights_iterator(Source(is_unused_weight=lambda n: n.endswith(".scalar"))) == "vLLM's reader"
    assert (
        registered[loader.LOAD_FORMAT](LoadConfig(safetensors_load_strategy="torchao"))._get_weights_iterator(Source())
        == "vLLM's reader"
    )
    DefaultModelLoader.safetensors = False  # .bin / .pt weights
    assert registered[loader.LOAD_FORMAT](LoadConfig())._get_weights_iterator(Source()) == "vLLM's reader"
