"""The output folder's format, owned here: what mxrepack writes beside the weight shards, and how it reads it back.

An mxrepack output directory holds

* ``model-NNNNN-of-MMMMM.safetensors``: the weight shards;
* ``model.safetensors.index.json`` (:data:`INDEX`): ``{"metadata": {"total_size": bytes}, "weight_map": {tensor:
  shard}}``, as transformers and vLLM read it;
* ``config.json`` (:data:`CONFIG`): the source's config with the recipe's ``quantization_config``
  (``pipeline.output_config``; a layout may set keys through ``ExpertLayout.config_overrides``);
* the source's side files (tokenizer, generation config, chat template: ``gptoss.SIDE_FILES``);
* ``mxrepack.json`` (:data:`MANIFEST`): the provenance record, see :func:`build_manifest`. It lists every other
  file's size and sha256, and carries the sha256 of its own content under :data:`DIGEST_KEY`.

Writing (:func:`write_index`, :func:`write_config`, :func:`write_manifest`), reading (:func:`load_manifest`,
:func:`read_manifest` for the typed :class:`Manifest`, :func:`read_weight_map`, :func:`read_config`) and the
manifest's own checks (:func:`check_manifest_digest`, :func:`unlisted_files`) live here; the pipeline, verify,
the eval loader, inspect and the Hub push go through them. No torch at import.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import mxrepack
from mxrepack.errors import MxRepackError, load_json, require_folder

if TYPE_CHECKING:
    from mxrepack.recipes import Recipe
    from mxrepack.repack.plan import PlanItem
    from mxrepack.repack.source import Checkpoint

MANIFEST = "mxrepack.json"
MANIFEST_KIND = "mxrepack-manifest"  # the manifest's "format" value
INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
# The manifest lists every other file's sha256 but cannot hold its own: it carries the sha256 of its content
# without this key instead (sorted keys, no whitespace: json.dumps(..., sort_keys=True, separators=(",", ":"))),
# so that an edited target, recipe or error figure fails verify instead of reaching a model card. Format 2 has
# it; a format 1 manifest (written before) verifies with a warning, and push refuses it.
DIGEST_KEY = "manifest_sha256"
MANIFEST_FORMAT = 2
# Files the Hub puts in a model repo (the card, its attributes) and what `hf download --local-dir` keeps beside
# them: verify accepts them in an output directory (a download of one has them), push never uploads them.
HUB_FILES = ("README.md", ".gitattributes")
HUB_DIRS = (".cache/huggingface/",)


# -- writing ------------------------------------------------------------------------------------------------------


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def write_index(directory: Path, weight_map: dict[str, str], total_size: int) -> None:
    """The shard index: ``total_size`` is the sum of the tensors' bytes (not the files', which have headers)."""
    write_json(Path(directory) / INDEX, {"metadata": {"total_size": total_size}, "weight_map": weight_map})


def write_config(directory: Path, config: dict) -> None:
    write_json(Path(directory) / CONFIG, config)


def tensor_entry(item: PlanItem, file: str) -> dict:
    """One planned tensor's manifest entry (``tensors[name]``)."""
    return {
        "layout": item.layout,
        "dtype": str(item.dtype).removeprefix("torch."),
        "stored_shape": list(item.shape),
        "logical_shape": list(item.logical_shape or item.shape),
        "padding": item.padding,
        "source": sorted({s.name for s in item.inputs.values()}),
        "upstream": item.upstream,
        "file": file,
    }


def quantization_report(plan: list[PlanItem]) -> dict[str, dict]:
    """Per quantized dense weight: its error statistics (mxrepack.quant.dense.ErrorStats)."""
    return {i.group: i.observer.result() for i in plan if i.observer is not None}


def _finite(report: dict) -> dict:
    """JSON has no Infinity: an exact quantization (zero error) reports SQNR as null."""
    return {
        k: {f: (None if isinstance(v, float) and v == float("inf") else v) for f, v in r.items()}
        for k, r in report.items()
    }


def _versions() -> dict:
    import safetensors
    import torch

    return {
        "mxrepack": mxrepack.__version__,
        "torch": torch.__version__,
        "safetensors": safetensors.__version__,
        "python": platform.python_version(),
    }


def build_manifest(
    ck: Checkpoint, recipe: Recipe, plan: list[PlanItem], weight_map: dict[str, str], source_hashes: dict[str, str]
) -> dict:
    """The manifest of a conversion, before its ``files`` are listed and it is sealed (:func:`write_manifest`):
    the tool versions, the source (origin, layout, dims, sha256 and size of each file hashed), the target (name,
    recipe as recorded, consumer, engine), every tensor (:func:`tensor_entry`), the dense quantization error and
    the NaN/Inf written under ``--allow-nonfinite``."""
    return {
        "format": MANIFEST_KIND,
        "format_version": MANIFEST_FORMAT,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "tool": _versions(),
        "source": {
            **ck.origin,
            "layout": ck.layout,
            "dims": dataclasses.asdict(ck.dims),
            "files": {
                name: {"sha256": h, "size": (ck.root / name).stat().st_size} for name, h in source_hashes.items()
            },
        },
        "target": {
            "name": recipe.name,
            "recipe_source": recipe.source,
            "recipe": recipe.data,
            "consumer": recipe.consumer,
            "engine": recipe.engine,
        },
        "tensors": {i.name: tensor_entry(i, weight_map[i.name]) for i in plan},
        "quantization_error": _finite(quantization_report(plan)),
        # NaN/Inf written unchanged under --allow-nonfinite (a conversion without it refuses them)
        "nonfinite": next((i.finite.result() for i in plan if i.finite is not None), {}),
        "files": {},
    }


def manifest_digest(manifest: dict) -> str:
    """The sha256 of a manifest's content without its own digest (see DIGEST_KEY)."""
    body = {k: v for k, v in manifest.items() if k != DIGEST_KEY}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def seal_manifest(manifest: dict) -> dict:
    """``manifest`` with its format version and digest set: the last step before it is written. The digest is of
    the content as JSON reads it back (tuples become lists, keys strings), which is what verify sees."""
    sealed = json.loads(json.dumps({**manifest, "format_version": MANIFEST_FORMAT}))
    sealed.pop(DIGEST_KEY, None)
    return {**sealed, DIGEST_KEY: manifest_digest(sealed)}


def write_manifest(directory: Path, manifest: dict) -> dict:
    """Seal ``manifest`` (its own sha256: an edit fails verify) and write it; returns the sealed content."""
    sealed = seal_manifest(manifest)
    write_json(Path(directory) / MANIFEST, sealed)
    return sealed


# -- reading ------------------------------------------------------------------------------------------------------


def is_output(directory: str | Path) -> bool:
    """Whether ``directory`` has an mxrepack manifest file (not whether it verifies)."""
    return (Path(directory) / MANIFEST).is_file()


def load_manifest(directory: str | Path) -> dict:
    """The manifest of the output in ``directory``, as the dict JSON reads (see :class:`Manifest` for a typed view).

    Raises :class:`MxRepackError` in one line when there is no manifest, it is not JSON, or it is not an mxrepack
    manifest. Does not check its digest or the files it lists: :func:`check_manifest_digest` and
    ``verify.verify_dir`` do."""
    path = Path(directory) / MANIFEST
    require_folder(directory)
    if not path.is_file():
        raise MxRepackError(f"{path}: no manifest; not an mxrepack output (or not finished)")
    try:
        manifest = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MxRepackError(f"{path}: manifest is not valid JSON ({e})") from None
    if not isinstance(manifest, dict):
        raise MxRepackError(f"{path}: not an mxrepack manifest (a JSON {type(manifest).__name__}, not an object)")
    if manifest.get("format") != MANIFEST_KIND:
        raise MxRepackError(f"{path}: not an mxrepack manifest (format={manifest.get('format')!r})")
    return manifest


def read_manifest(directory: str | Path) -> Manifest:
    """:func:`load_manifest` as a :class:`Manifest`, its fields checked (:func:`manifest_fields_problem`)."""
    manifest = load_manifest(directory)
    problem = manifest_fields_problem(directory, manifest)
    if problem:
        raise MxRepackError(problem)
    return Manifest(manifest)


def manifest_fields_problem(directory: str | Path, manifest: dict) -> str | None:
    """Why ``manifest`` lacks what reading the output needs (target and recipe, source, tensors, files), or None.
    A sealed manifest that passes :func:`check_manifest_digest` has them all; one without a digest (format 1) or
    one a user cut may not, and would otherwise fail on the first missing key."""
    path = Path(directory) / MANIFEST
    target, source = manifest.get("target"), manifest.get("source")
    if not isinstance(target, dict) or not all(k in target for k in ("name", "recipe", "recipe_source")):
        return f"{path}: incomplete manifest: no target name, recipe and recipe_source; re-run repack"
    if not isinstance(source, dict):
        return f"{path}: incomplete manifest: no source; re-run repack"
    for key, fields in (("tensors", ("file", "stored_shape", "layout")), ("files", ("sha256", "size"))):
        entries = manifest.get(key)
        if not isinstance(entries, dict):
            return f"{path}: incomplete manifest: no {key}; re-run repack"
        bad = next((n for n, e in entries.items() if not isinstance(e, dict) or any(f not in e for f in fields)), None)
        if bad is not None:
            return f"{path}: incomplete manifest: {key} entry {bad!r} lacks {' or '.join(fields)}; re-run repack"
    return None


def read_weight_map(directory: str | Path, missing_ok: bool = False) -> dict[str, str]:
    """The index's tensor -> shard map (``{}`` for a missing index where ``missing_ok``); one line for an index that
    is not JSON or has no ``weight_map`` of file names."""
    path = Path(directory) / INDEX
    if missing_ok and not path.is_file():
        return {}
    weight_map = load_json(path, "shard index").get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise MxRepackError(f"{path}: no weight_map of tensor -> file name")
    return weight_map


def read_config(directory: str | Path) -> dict:
    """The output's ``config.json`` as written (with a padded ``intermediate_size`` where a layout pads it; the
    logical sizes are :attr:`Manifest.source_dims`)."""
    return load_json(Path(directory) / CONFIG, "model config")


@dataclass(frozen=True)
class Manifest:
    """A typed view of a manifest's content; ``data`` is the dict as JSON reads it (what the digest covers)."""

    data: dict

    @property
    def format_version(self) -> int:
        return self.data.get("format_version", 1)

    @property
    def written_by(self) -> str | None:
        """The mxrepack version that wrote the output (None where the manifest does not say)."""
        return (self.data.get("tool") or {}).get("mxrepack")

    @property
    def target_name(self) -> str:
        return self.data["target"]["name"]

    @property
    def recipe(self) -> Recipe:
        """The recipe the output was made with, as recorded (overrides applied)."""
        from mxrepack.recipes import Recipe

        target = self.data["target"]
        return Recipe(target["name"], target["recipe"], target["recipe_source"])

    @property
    def source(self) -> dict:
        return self.data["source"]

    @property
    def source_dims(self) -> dict | None:
        """The source's ``gptoss.Dims`` as a dict (the logical sizes), or None in a manifest without them."""
        return self.data["source"].get("dims")

    @property
    def tensors(self) -> dict[str, dict]:
        """Tensor name -> entry (:func:`tensor_entry`)."""
        return self.data["tensors"]

    @property
    def files(self) -> dict[str, dict]:
        """File name -> ``{"sha256", "size"}`` of every file but the manifest."""
        return self.data.get("files") or {}

    @property
    def quantization_error(self) -> dict:
        return self.data.get("quantization_error") or {}

    @property
    def nonfinite(self) -> dict:
        return self.data.get("nonfinite") or {}


def check_manifest_digest(directory: Path, manifest: dict) -> tuple[str | None, str | None]:
    """(problem, warning) about the manifest's own content: edited since written, or too old to tell."""
    path = Path(directory) / MANIFEST
    recorded = manifest.get(DIGEST_KEY)
    if recorded is None:
        if manifest.get("format_version", 1) < MANIFEST_FORMAT:
            return None, (
                f"{path}: format {manifest.get('format_version', 1)} has no {DIGEST_KEY}, so its own content "
                "(target, recipe, error figures) is not checked; re-run repack to write one that has"
            )
        return f"{path}: its {DIGEST_KEY} was removed; re-run repack rather than edit the manifest", None
    if recorded != manifest_digest(manifest):
        return (
            f"{path}: edited since mxrepack wrote it (its content no longer matches its {DIGEST_KEY}); re-run "
            "repack rather than edit the manifest"
        ), None
    return None, None


def unlisted_files(directory: Path, manifest: dict) -> list[Path]:
    """Files in ``directory`` that its manifest does not list (besides the manifest and the Hub's own files)."""
    directory = Path(directory)
    listed = set(manifest.get("files") or {}) | {MANIFEST, *HUB_FILES}
    extra = []
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if (path.is_dir() and not path.is_symlink()) or rel in listed or rel.startswith(HUB_DIRS):
            continue
        extra.append(path)
    return extra
