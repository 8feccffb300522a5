"""Sources: the Hugging Face cache (offline), Hub errors, and the original/ layout."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mxrepack.errors import MxRepackError
from mxrepack.repack.source import open_checkpoint, resolve


def _fake_hub_cache(cache: Path, repo_id: str, src: Path, commit: str = "a" * 40) -> Path:
    """Lay out ``src`` the way huggingface_hub stores a download: blobs named by sha256, snapshot symlinks."""
    from mxrepack.repack.safetensors_io import sha256_file

    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for f in src.iterdir():
        digest = sha256_file(f)
        shutil.copyfile(f, repo / "blobs" / digest)
        os.symlink(os.path.relpath(repo / "blobs" / digest, snap), snap / f.name)
    return snap


def test_repo_id_resolves_from_cache_offline(tiny, tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    snap = _fake_hub_cache(cache, "openai/gpt-oss-tiny", tiny)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    root, origin = resolve("openai/gpt-oss-tiny")
    assert root == snap and origin == {
        "kind": "hub",
        "repo_id": "openai/gpt-oss-tiny",
        "revision": "a" * 40,
        "requested_revision": None,
        "path": str(snap),
    }
    ck = open_checkpoint("openai/gpt-oss-tiny")
    hashes = {k: f.result() for k, f in ck.hash_files_async().items()}
    assert hashes["model-00000-of-00000.safetensors"] == os.path.basename(
        os.path.realpath(snap / "model-00000-of-00000.safetensors")
    )


def test_cli_main_job_from_cache_with_default_out(tiny, tmp_path):
    cache = tmp_path / "hub"
    _fake_hub_cache(cache, "openai/gpt-oss-tiny", tiny)
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mxrepack.cli", "openai/gpt-oss-tiny", "--target", "mxfp4", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["out"] == str(tmp_path / "gpt-oss-tiny-mxfp4") and summary["verify"]["ok"]
    manifest = json.loads((tmp_path / "gpt-oss-tiny-mxfp4" / "mxrepack.json").read_text())
    assert manifest["source"]["repo_id"] == "openai/gpt-oss-tiny" and manifest["source"]["revision"] == "a" * 40


def test_unreachable_hub_is_one_line_error(tmp_path, monkeypatch):
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    with pytest.raises(
        MxRepackError,
        match=r"openai/gpt-oss-120b: no such local folder, not in the Hugging Face cache, and the Hub could "
        r"not be reached .*pass the local directory",
    ) as e:
        resolve("openai/gpt-oss-120b")
    assert "\n" not in str(e.value)
    # huggingface_hub 1.x/2.x ship the `hf` command; `huggingface-cli` is gone
    assert "(hf download openai/gpt-oss-120b)" in str(e.value) and "huggingface-cli" not in str(e.value)


def test_original_layout_maps_to_canonical_names(tiny, tiny_original):
    a, b = open_checkpoint(str(tiny)), open_checkpoint(str(tiny_original))
    assert b.layout == "original" and a.tensors.keys() == b.tensors.keys()
    for name in (
        "model.layers.1.self_attn.k_proj.weight",
        "model.layers.0.mlp.experts.gate_up_proj_scales",
        "lm_head.weight",
    ):
        assert a.tensors[name].read().equal(b.tensors[name].read()), name
    assert b.config["num_local_experts"] == 4 and b.config["rope_scaling"]["beta_fast"] == 32.0


def test_missing_tensor_and_extra_tensor(tiny, copy_of):
    d = copy_of(tiny)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.7.self_attn.sinks"] = "model-00000-of-00000.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(
        MxRepackError, match="index lists tensor 'model.layers.7.self_attn.sinks' but the file does not contain it"
    ):
        open_checkpoint(str(d))
    cfg = json.loads((d / "config.json").read_text())
    del index["weight_map"]["model.layers.7.self_attn.sinks"]
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    cfg["num_hidden_layers"] = 3
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(MxRepackError, match="tensor 'model.layers.2.input_layernorm.weight' is missing"):
        open_checkpoint(str(d))


def test_local_dir_download_metadata_gives_source_hashes_and_verify_rechecks(tiny, copy_of, tmp_path):
    """`hf download --local-dir` leaves .cache/huggingface/download/<file>.metadata (commit, etag =
    LFS sha256, timestamp): trusted while the file is not newer; `repack verify` re-hashes the source."""
    import hashlib
    import time

    from mxrepack.repack.pipeline import repack
    from mxrepack.repack.verify import verify_dir

    src = copy_of(tiny)
    shard = next(src.glob("*.safetensors"))
    real = hashlib.sha256(shard.read_bytes()).hexdigest()
    meta = src / ".cache" / "huggingface" / "download" / f"{shard.name}.metadata"
    meta.parent.mkdir(parents=True)
    meta.write_text(f"{'c' * 40}\n{'f' * 64}\n{time.time() + 5}\n")  # an etag that is not the content's hash
    ck = open_checkpoint(str(src))
    assert ck.hash_files_async()[shard.name].result() == "f" * 64  # taken from the metadata, not computed
    out = tmp_path / "out"
    repack(str(src), "mxfp4", out)
    report = verify_dir(out)
    assert not report["ok"] and any("sha256 differs from the one recorded" in p for p in report["problems"])
    os.utime(shard, (time.time() + 60, time.time() + 60))  # modified after the download: recomputed
    assert open_checkpoint(str(src)).hash_files_async()[shard.name].result() == real


def test_early_read_ahead_finds_the_first_tensors_without_torch(tiny, tiny_original, tmp_path, monkeypatch):
    """The start-up read-ahead (mxrepack.repack.readahead) runs before torch is imported: it finds the
    embeddings' and lm_head's bytes in a directory, in the HF cache by repo id, and in the original/ layout."""
    from mxrepack.repack import readahead
    from mxrepack.repack.source import open_checkpoint

    ck = open_checkpoint(str(tiny))
    expected = sorted(
        (Path(t.info.file).resolve(), t.info.start, t.nbytes)
        for t in (ck.tensors["model.embed_tokens.weight"], ck.tensors["lm_head.weight"])
    )
    assert sorted((p.resolve(), o, n) for p, o, n in readahead.first_ranges(tiny)) == expected
    readahead.read_ahead(readahead.first_ranges(tiny))
    orig = readahead.first_ranges(tiny_original)
    assert len(orig) == 2 and all(n > 0 for _, _, n in orig)
    cache = tmp_path / "hub"
    _fake_hub_cache(cache, "openai/gpt-oss-tiny", tiny)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    assert readahead.local_source_dir("openai/gpt-oss-tiny").is_dir()
    assert readahead.local_source_dir("openai/not-downloaded") is None
    assert readahead.local_source_dir(str(tmp_path / "missing")) is None
    # nothing of torch is imported by it (it must run while torch's import runs)
    code = "import sys, mxrepack.repack.readahead; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
