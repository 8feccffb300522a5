"""Open a gpt-oss checkpoint from a local directory, the Hugging Face cache or the Hub.

The result, :class:`Checkpoint`, exposes every tensor under its canonical (HF) name as a
:class:`SourceTensor`: a reference to bytes on disk that is read row range by row range, never
loaded whole. Opening checks everything that can be checked without reading data (config, shards,
headers, names, shapes, dtypes), so bad input fails before any output is written.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mxrepack import gptoss
from mxrepack.errors import MxRepackError, load_json
from mxrepack.repack import output
from mxrepack.repack.safetensors_io import TensorInfo, dtype_name, read_header, read_rows, sha256_file

# mxrepack.json: so that an mxrepack output on the Hub is recognised as one (_refuse_mxrepack_output)
HUB_ALLOW = ["*.safetensors", output.INDEX, output.CONFIG, output.MANIFEST, *gptoss.SIDE_FILES]
HUB_IGNORE = ["original/*", "metal/*"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class SourceTensor:
    """A canonical tensor: rows ``[row_start, row_stop)`` of a stored tensor."""

    name: str
    info: TensorInfo
    row_start: int = 0
    row_stop: int | None = None

    @property
    def rows(self) -> int:
        if not self.info.shape:  # a scalar: one "row" of its bytes; validate refuses it where a vector belongs
            return 1
        stop = self.info.shape[0] if self.row_stop is None else self.row_stop
        return stop - self.row_start

    @property
    def shape(self) -> tuple[int, ...]:
        if not self.info.shape:
            return ()
        return (self.rows, *self.info.shape[1:])

    @property
    def dtype(self) -> torch.dtype:
        return self.info.dtype

    @property
    def nbytes(self) -> int:
        return self.rows * self.info.row_bytes

    def read(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        stop = self.rows if stop is None else stop
        return read_rows(self.info, self.row_start + start, self.row_start + stop)


@dataclass(frozen=True)
class ZeroPaddedRows:
    """A source tensor read as if it had ``total_rows`` rows, the extra ones zero (padding a dense
    weight's output rows to a layout's block size while streaming)."""

    source: SourceTensor
    total_rows: int

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def info(self) -> TensorInfo:
        return self.source.info

    @property
    def rows(self) -> int:
        return self.total_rows

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.total_rows, *self.source.shape[1:])

    @property
    def dtype(self) -> torch.dtype:
        return self.source.dtype

    @property
    def nbytes(self) -> int:
        return self.source.nbytes

    def read(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        stop = self.total_rows if stop is None else stop
        real = self.source.read(min(start, self.source.rows), min(stop, self.source.rows))
        if stop <= self.source.rows:
            return real
        out = real.new_zeros((stop - start, *self.source.shape[1:]))
        out[: real.shape[0]] = real
        return out


@dataclass
class Checkpoint:
    root: Path
    layout: str  # "hf" or "original"
    config: dict  # transformers-style config.json content
    tensors: dict[str, SourceTensor]
    files: list[Path]  # the safetensors files, in order
    origin: dict = field(default_factory=dict)  # kind, repo_id, revision, path

    @property
    def dims(self) -> gptoss.Dims:
        return gptoss.Dims.from_config(self.config)

    @property
    def side_files(self) -> list[Path]:
        return [self.root / n for n in gptoss.SIDE_FILES if (self.root / n).is_file()]

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def hash_files_async(self) -> dict[str, Future]:
        """sha256 of every source file, in a background thread (hashlib releases the GIL).

        What the Hub already says costs nothing: a file of the Hub cache is a link to a blob named by
        its LFS sha256, and ``hf download --local-dir`` leaves a metadata file whose etag is that sha256
        (trusted only while the file is not newer than the metadata, as huggingface_hub does).
        ``repack verify --source`` re-hashes everything.
        """
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mxrepack-hash")
        futures: dict[str, Future] = {}
        for path in [*self.files, self.root / "config.json", *self.side_files]:
            rel = str(path.relative_to(self.root))
            known = _hub_sha256(self.root, rel)
            if known:
                f: Future = Future()
                f.set_result(known)
                futures[rel] = f
            elif path.is_file():
                futures[rel] = pool.submit(sha256_file, path)
        pool.shutdown(wait=False)
        return futures


def _hub_sha256(root: Path, rel: str) -> str | None:
    """The sha256 the Hub recorded for ``root/rel``, when the file came from it unchanged; else None."""
    path = root / rel
    blob = os.path.basename(os.path.realpath(path))
    if path.is_symlink() and re.fullmatch(r"[0-9a-f]{64}", blob):
        return blob
    meta = root / ".cache" / "huggingface" / "download" / f"{rel}.metadata"  # hf download --local-dir
    try:
        _commit, etag, stamp = meta.read_text().splitlines()[:3]
        fresh = path.stat().st_mtime - 1 <= float(stamp)
    except (OSError, ValueError):
        return None
    etag = etag.strip().strip('"')
    return etag if fresh and re.fullmatch(r"[0-9a-f]{64}", etag) else None


def resolve(source: str, revision: str | None = None) -> tuple[Path, dict]:
    """A local directory for ``source`` (a path, or a Hub repo id resolved cache-first) and its origin."""
    path = Path(source).expanduser()
    if path.exists():
        if not path.is_dir():
            raise MxRepackError(f"{source}: not a directory; expected a checkpoint directory or a Hub repo id")
        if revision is not None:  # it would be recorded as if it had chosen something
            raise MxRepackError(f"--revision {revision}: {source} is a local folder; a revision picks a Hub repo's")
        return path.resolve(), {"kind": "local", "path": str(path.resolve())}
    if not _REPO_ID.match(source) or source.startswith((".", "/", "~")):
        raise MxRepackError(
            f"{source}: path does not exist (expected a checkpoint directory or a Hub repo id like openai/gpt-oss-120b)"
        )
    return _from_hub(source, revision)


def _from_hub(repo_id: str, revision: str | None) -> tuple[Path, dict]:
    from huggingface_hub import snapshot_download

    kwargs = dict(repo_id=repo_id, revision=revision, allow_patterns=HUB_ALLOW, ignore_patterns=HUB_IGNORE)
    folder = None
    try:
        folder = Path(snapshot_download(local_files_only=True, **kwargs))
        if not _complete(folder):
            folder = None
    except Exception:  # not cached (or only partly): go to the Hub
        folder = None
    if folder is None:
        try:
            folder = Path(snapshot_download(**kwargs))
        except Exception as e:
            reason = type(e).__name__ + (f": {str(e).splitlines()[0]}" if str(e) else "")
            raise MxRepackError(
                f"{repo_id}: no such local folder, not in the Hugging Face cache, and the Hub could not be reached "
                f"({reason}); download it where there is network (hf download {repo_id}) and pass the local "
                f"directory, or point HF_HUB_CACHE at a cache that holds it"
            ) from None
    return folder, {
        "kind": "hub",
        "repo_id": repo_id,
        "revision": folder.name,
        "requested_revision": revision,
        "path": str(folder),
    }


def _complete(folder: Path) -> bool:
    index = folder / "model.safetensors.index.json"
    if not (folder / "config.json").is_file():
        return False
    if index.is_file():
        shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        return all((folder / s).is_file() for s in shards)
    return any(folder.glob("*.safetensors"))


def open_checkpoint(source: str, revision: str | None = None) -> Checkpoint:
    """Resolve ``source`` and check it is a complete, well-formed gpt-oss checkpoint."""
    root, origin = resolve(source, revision)
    _refuse_mxrepack_output(source, root)
    raw_config = load_json(root / "config.json", "model config (config.json)")
    if "model_type" in raw_config:
        if raw_config["model_type"] != "gpt_oss":
            raise MxRepackError(
                f"{root / 'config.json'}: model_type is {raw_config['model_type']!r}, expected 'gpt_oss'"
            )
        layout, config = "hf", raw_config
    elif "num_experts" in raw_config and "experts_per_token" in raw_config:
        layout, config = "original", gptoss.hf_config_from_original(raw_config)
    else:
        raise MxRepackError(
            f"{root / 'config.json'}: not a gpt-oss config (no model_type 'gpt_oss', "
            f"nor the original/ keys num_experts and experts_per_token)"
        )
    dims = config_dims(config, root / "config.json")

    files, where = _shard_files(root)
    headers = {f: read_header(f)[0] for f in files}
    tensors: dict[str, SourceTensor] = {}
    found_in: dict[str, Path] = {}
    unindexed: dict[str, Path] = {}  # in a shard, but the index does not list it at all
    for f in files:
        for name, info in headers[f].items():
            if where is not None and where.get(name) != f.relative_to(root).as_posix():
                if name not in where:
                    unindexed.setdefault(name, f)
                continue  # the index assigns this name elsewhere
            if name in found_in:  # no index: a stale or stray file (a partial download, recorded activations)
                raise MxRepackError(
                    f"{f}: tensor '{name}' is also in {found_in[name].name}, and no model.safetensors.index.json "
                    "says which to read; remove the file that does not belong"
                )
            found_in[name] = f
            if layout == "hf":
                tensors[name] = SourceTensor(name, info)
            else:
                parts = gptoss.original_to_canonical(name, dims)
                fused = max((stop for _, _, stop in parts if stop is not None), default=None)
                if fused is not None and (not info.shape or info.shape[0] != fused):
                    # q, k and v are row ranges of it: other rows would be read past or silently left out
                    raise MxRepackError(
                        f"{f}: tensor '{name}' has shape {list(info.shape)}, expected {fused} rows (q, k and v "
                        f"fused: {dims.heads * dims.head_dim} + 2 x {dims.kv_heads * dims.head_dim} from config.json)"
                    )
                for canonical, start, stop in parts:
                    tensors[canonical] = SourceTensor(canonical, info, start, stop)
    if where is not None:
        for name, shard in where.items():
            if name not in headers[root / shard]:
                raise MxRepackError(f"{root / shard}: index lists tensor '{name}' but the file does not contain it")
    ck = Checkpoint(root, layout, config, tensors, files, origin)
    validate(ck, unindexed)
    _check_quantization_config(raw_config, root / "config.json")
    # after the tensors (a wrong layer count is named there), on the file as written (its own key names)
    check_engine_fields(
        raw_config, dims, root / "config.json", "num_local_experts" if layout == "hf" else "num_experts"
    )
    return ck


def _check_quantization_config(config: dict, path: Path) -> None:
    """The tensors just validated are gpt-oss's MXFP4 experts: a config that says another quantization was edited or
    belongs to other weights (every target writes its own quantization_config, so it would not reach the output, but
    the folder is not the checkpoint its config describes). None, or no quant_method, is the tensors' to say."""
    qc = config.get("quantization_config")
    if qc is not None and not isinstance(qc, dict):
        raise MxRepackError(f"{path}: quantization_config is {qc!r}; expected an object with quant_method 'mxfp4'")
    method = (qc or {}).get("quant_method")
    if method is not None and method != "mxfp4":
        raise MxRepackError(
            f"{path}: quantization_config says quant_method {method!r}, but the tensors are gpt-oss's MXFP4 experts "
            "(blocks and scales); expected 'mxfp4' or no quantization_config"
        )


def config_dims(config: dict, path: Path) -> gptoss.Dims:
    """``config``'s sizes (:meth:`gptoss.Dims.from_config`), a missing key or a size that is not a positive integer
    one line naming ``path``."""
    try:
        return gptoss.Dims.from_config(config)
    except KeyError as e:
        raise MxRepackError(f"{path}: missing key {e.args[0]!r}") from None
    except ValueError as e:
        raise MxRepackError(f"{path}: {e}") from None


ATTENTION_TYPES = ("sliding_attention", "full_attention")


def check_engine_fields(config: dict, dims: gptoss.Dims, path: Path, experts_key: str = "num_local_experts") -> None:
    """The config fields an engine reads beside the tensor sizes: the experts a token takes, the layers' attention
    types and the sliding window. Checked here because a conversion copies them into its output, where vLLM or
    transformers would refuse them only at load, after the conversion's minutes to hours. Absent (or null
    ``layer_types``) fields are left to the engine's gpt-oss defaults (top-4; sliding and full layers alternating; a
    window of 128). ``experts_key``: the file's name for the expert count (``num_experts`` in an original/ config)."""
    for key in ("num_experts_per_tok", "experts_per_token"):  # HF's name, and the original/ config's
        k = config.get(key)
        if key in config and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= dims.experts):
            raise MxRepackError(f"{path}: {key} is {k!r}, expected an integer from 1 to {experts_key} ({dims.experts})")
    types = config.get("layer_types")
    expected = f"expected a list of num_hidden_layers ({dims.layers}) entries, each " + " or ".join(
        map(repr, ATTENTION_TYPES)
    )
    if types is not None and (not isinstance(types, list) or len(types) != dims.layers):
        shown = f"a list of {len(types)}" if isinstance(types, list) else repr(types)
        raise MxRepackError(f"{path}: layer_types is {shown}, {expected}")
    bad = next((i for i, t in enumerate(types or ()) if t not in ATTENTION_TYPES), None)
    if bad is not None:
        raise MxRepackError(f"{path}: layer_types[{bad}] is {types[bad]!r}, {expected}")
    sliding = types is None or "sliding_attention" in types
    window = config.get("sliding_window")
    if (
        sliding
        and "sliding_window" in config
        and (isinstance(window, bool) or not isinstance(window, int) or window <= 0)
    ):
        raise MxRepackError(
            f"{path}: sliding_window is {window!r}, expected a positive integer (sliding layers use it)"
        )


def _refuse_mxrepack_output(source: str, root: Path) -> None:
    """One line when ``root`` is an mxrepack output whose tensors are not the native gpt-oss format (it would
    otherwise fail on the first tensor a target renamed, e.g. "lm_head.weight is missing"). An output of a
    recipe that keeps the native format (experts mxfp4, dense bf16, config native: target mxfp4) is a native
    checkpoint and is read as one."""
    target, native, original = None, False, None
    try:
        manifest = json.loads((root / output.MANIFEST).read_text())
        if manifest.get("format") == output.MANIFEST_KIND:
            target = str(manifest["target"]["name"])
            recipe = manifest["target"]["recipe"]
            native = (
                recipe["experts"]["layout"],
                recipe["dense"]["format"],
                recipe["config"]["quantization_config"],
            ) == ("mxfp4", "bf16", "native")
            original = manifest.get("source", {}).get("repo_id") or manifest.get("source", {}).get("path")
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        pass
    if target is None:
        try:
            qc = json.loads((root / "config.json").read_text()).get("quantization_config") or {}
            if qc.get("quant_method") == "mxrepack":
                target = str(qc.get("target", "?"))
        except (OSError, ValueError, AttributeError):
            pass
    if target is not None and not native:
        # its config says mxrepack but the manifest is gone: a damaged output (eval and verify know an output by it)
        damaged = "" if (root / output.MANIFEST).is_file() else f" whose {output.MANIFEST} is missing"
        raise MxRepackError(
            f"{source} is an mxrepack output (target {target}){damaged}; repack from the original checkpoint"
            + (f" ({original})" if original else "")
        )


def _shard_files(root: Path) -> tuple[list[Path], dict[str, str] | None]:
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = load_json(index, "safetensors index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise MxRepackError(f"{index}: no weight_map")
        for name, shard in weight_map.items():
            # a file name inside the folder: a number or null is no file, and ../x would read (and count as the
            # source) a file of another folder
            if not isinstance(shard, str) or not shard or Path(shard).is_absolute() or ".." in Path(shard).parts:
                raise MxRepackError(
                    f"{index}: tensor '{name}' maps to {shard!r}; expected the name of a .safetensors file in {root}"
                )
        weight_map = {name: Path(shard).as_posix() for name, shard in weight_map.items()}  # ./a -> a
        shards = sorted(set(weight_map.values()))
        for s in shards:
            if not (root / s).is_file():
                what = "is not a file" if (root / s).exists() else "is missing"
                raise MxRepackError(f"{root / s}: shard listed in {index.name} {what}")
        return [root / s for s in shards], weight_map
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise MxRepackError(f"{root}: no *.safetensors files and no model.safetensors.index.json")
    return files, None


def validate(ck: Checkpoint, unindexed: dict[str, Path] | None = None) -> None:
    """Every expected tensor present with the right shape and dtype; MX scales match their blocks. ``unindexed``:
    tensors found in a shard that the folder's index does not list (named as such when one is missing)."""
    expected = gptoss.expected_tensors(ck.dims)
    for name, (shape, kind) in expected.items():
        t = ck.tensors.get(name)
        if t is None and unindexed and name in unindexed:
            raise MxRepackError(
                f"{ck.root / 'model.safetensors.index.json'}: does not list tensor '{name}', which is in "
                f"{unindexed[name].name}; the index is incomplete"
            )
        unpacked = ck.tensors.get(name.removesuffix("_blocks")) if kind == "blocks" else None
        if t is None and unpacked is not None:  # a dequantized copy (the experts as one BF16 tensor each)
            raise MxRepackError(
                f"{unpacked.info.file}: tensor '{unpacked.name}' holds the experts as {dtype_name(unpacked.dtype)} "
                f"where gpt-oss stores them as MXFP4 ('{name}' and its _scales); mxrepack converts the MXFP4 release "
                "(openai/gpt-oss-20b, openai/gpt-oss-120b)"
            )
        if t is None:
            raise MxRepackError(f"{ck.root}: tensor '{name}' is missing (expected {kind} of shape {list(shape)})")
        where = f"{t.info.file}: tensor '{name}'"
        if kind == "scales":
            blocks = ck.tensors.get(name.replace("_scales", "_blocks"))
            if blocks is not None and tuple(t.shape) != tuple(blocks.shape[:-1]):
                raise MxRepackError(
                    f"{where}: scales shape {list(t.shape)} != blocks shape[:-1] {list(blocks.shape[:-1])}"
                )
        if tuple(t.shape) != tuple(shape):
            raise MxRepackError(f"{where}: shape {list(t.shape)}, expected {list(shape)} from config.json")
        allowed = gptoss.KIND_DTYPES[kind]
        if t.dtype not in allowed:
            raise MxRepackError(
                f"{where}: dtype {dtype_name(t.dtype)}, expected {' or '.join(dtype_name(a) for a in allowed)}"
            )
    extra = sorted(set(ck.tensors) - set(expected))
    if extra:
        raise MxRepackError(
            f"{ck.root}: unexpected tensor '{extra[0]}' (and {len(extra) - 1} more) for a gpt-oss "
            f"checkpoint with {ck.dims.layers} layers"
            if len(extra) > 1
            else f"{ck.root}: unexpected tensor '{extra[0]}' for a gpt-oss checkpoint with {ck.dims.layers} layers"
        )
