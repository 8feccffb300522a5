"""Check an output directory: manifest, checksums, index, headers, and a sample against the source.

The source comparison rebuilds the plan from the recipe recorded in the manifest, reads the stored
tensors of a few groups (the first and last layer's experts, the embeddings, lm_head), inverts the
layout and compares with the source: bytes for exact layouts, dequantized values otherwise.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from mxrepack.errors import MxRepackError
from mxrepack.layouts import ExpertDims, dense_weights, make_layout
from mxrepack.progress import Progress
from mxrepack.repack.output import (  # noqa: F401 (re-exported, below)
    DIGEST_KEY,
    HUB_DIRS,
    HUB_FILES,
    INDEX,
    MANIFEST,
    MANIFEST_FORMAT,
    Manifest,
    check_manifest_digest,
    load_manifest,
    manifest_digest,
    manifest_fields_problem,
    read_weight_map,
    seal_manifest,
    unlisted_files,
)
from mxrepack.repack.plan import build_plan, expert_dims
from mxrepack.repack.safetensors_io import read_header, read_rows, sha256_file
from mxrepack.repack.source import Checkpoint, open_checkpoint
from mxrepack.serve.spec import check_experts_written_by

# The output folder's format (file names, manifest reading, digest) moved to mxrepack.repack.output; these names stay
# importable from here for one release.
__all__ = [
    "DIGEST_KEY",
    "HUB_DIRS",
    "HUB_FILES",
    "INDEX",
    "MANIFEST",
    "MANIFEST_FORMAT",
    "check_manifest_digest",
    "compare_with_source",
    "load_manifest",
    "manifest_digest",
    "seal_manifest",
    "unlisted_files",
    "verify_dir",
]


class _Meter:
    """Bytes read in one phase of a verification, reported as ``progress(done, total, phase)``."""

    def __init__(self, progress: Progress | None, phase: str, total: int):
        self.progress, self.phase, self.total, self.done = progress, phase, total, 0
        if progress:
            progress(0, total, phase)

    def __call__(self, nbytes: int) -> None:
        self.done += nbytes
        if self.progress:
            self.progress(self.done, self.total, self.phase)


def _sample_groups(plan) -> list[str]:
    groups = [g for g in dict.fromkeys(i.group for i in plan)]
    experts = [g for g in groups if g.endswith(".experts")]
    dense = [g for g in groups if not g.endswith(".experts")]
    picks = experts[:1] + experts[-1:] + [g for g in dense if g in ("model.embed_tokens.weight", "lm_head.weight")]
    quantized = {}
    for i in plan:  # the first tensor of each dense layout that is not a plain copy
        if not i.group.endswith(".experts") and i.layout != "passthrough":
            quantized.setdefault(i.layout, i.group)
    return list(dict.fromkeys(picks + list(quantized.values())))


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN equal to NaN (a source's NaN bias written under --allow-nonfinite is still itself)."""
    if torch.equal(a, b):  # the usual case, at torch.equal's cost
        return True
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.isclose(a, b, rtol=0, atol=0, equal_nan=True).all())


def compare_with_source(
    directory: Path,
    manifest: dict,
    ck: Checkpoint,
    chunk_bytes: int = 128 << 20,
    first_chunk_only: bool = False,
    progress: Progress | None = None,
) -> tuple[int, list[str]]:
    """Re-derive a sample of tensors from the source, a few experts (or rows) at a time so that memory
    stays bounded at any model size; returns (groups checked, problems). ``first_chunk_only`` checks
    only the first experts/rows of each sampled group (the quick check at the end of a conversion).
    ``progress(done, total, phase)`` counts the stored bytes compared (full comparisons only: the quick
    check reads too little to show)."""
    recipe = Manifest(manifest).recipe
    plan = build_plan(ck, recipe)
    index = read_weight_map(directory)
    headers: dict[str, dict] = {}
    problems: list[str] = []
    layout = make_layout(recipe.expert_layout, recipe.expert_options)
    groups = _sample_groups(plan)
    # Every sampled tensor is read once, whole, a chunk at a time.
    meter = _Meter(
        None if first_chunk_only else progress,
        "source comparison (output bytes)",
        sum(i.nbytes for i in plan if i.group in groups),
    )

    def stored(name: str, r0: int, r1: int) -> torch.Tensor:
        fname = index[name]
        if fname not in headers:
            headers[fname] = read_header(directory / fname)[0]
        rows = read_rows(headers[fname][name], r0, r1)
        meter(rows.nbytes)
        return rows

    for group in groups:
        items = [i for i in plan if i.group == group]
        rows = items[0].shape[0]
        step = max(1, chunk_bytes // max(sum(i.row_bytes * max(i.work_factor, 4) for i in items), 1))
        if not group.endswith(".experts"):
            # Dense tensors: stored bytes == the layout applied to the source rows again (a copy, or a
            # deterministic quantization), chunk by chunk in whole row blocks.
            align = max(i.row_align for i in items)
            step = max(align, step // align * align)
            for item in items:
                for r0 in range(0, step if first_chunk_only else rows, step):
                    r1 = min(r0 + step, rows)
                    want = item.pack(**{k: src.read(r0, r1) for k, src in item.inputs.items()})
                    if not torch.equal(stored(item.name, r0, r1).view(torch.uint8), want.view(torch.uint8)):
                        problems.append(
                            f"{item.name}: stored bytes differ from the source (rows {r0}:{r1}) "
                            f"under layout {item.layout}"
                        )
                        break
            continue
        prefix = items[0].name[: items[0].name.index(".mlp.experts.") + len(".mlp.experts.")]
        dims: ExpertDims = expert_dims(ck)
        per_expert = layout.per_expert
        if per_expert:  # one tensor per (expert, part): stack a few experts' tensors per part
            rows = dims.experts
            step = max(1, chunk_bytes // max(sum(i.nbytes * 4 for i in items) // rows, 1))
        sources = {src.name[len(prefix) :]: src for i in items for src in i.inputs.values()}
        for r0 in range(0, step if first_chunk_only else rows, step):
            r1 = min(r0 + step, rows)
            if per_expert:
                stored_parts = {}
                for i in items:
                    if r0 <= i.expert < r1:
                        stored_parts.setdefault(i.part, []).append(stored(i.name, 0, i.shape[0]))
                stored_parts = {k: torch.stack(v) for k, v in stored_parts.items()}
                # Each input is one expert's slice; the experts tensor itself starts at row 0.
                source_parts = {k: read_rows(src.info, r0, r1) for k, src in sources.items()}
            else:
                stored_parts = {i.part: stored(i.name, r0, r1) for i in items}
                source_parts = {k: src.read(r0, r1) for k, src in sources.items()}
            got = layout.unpack(stored_parts, dims)
            if layout.exact_bytes:
                bad = [k for k in got if not torch.equal(got[k].view(torch.uint8), source_parts[k].view(torch.uint8))]
            else:
                want, have = dense_weights(source_parts), dense_weights(got)
                bad = [k for k in want if not _same_values(have[k], want[k])]
            if bad:
                problems.append(
                    f"{prefix}{bad[0]}: layout {layout.name} does not invert to the source (experts {r0}:{r1})"
                )
                break
    return len(groups), problems


def _unreadable_layout(directory: Path, manifest: Manifest) -> str | None:
    """Why this mxrepack cannot read the output's expert bytes (written by another version in a format it no longer
    reads: ``serve.spec.check_experts_written_by``), or None."""
    recipe = manifest.recipe
    try:
        check_experts_written_by(recipe.expert_layout, recipe.expert_options, manifest.written_by)
    except MxRepackError as e:
        return f"{directory}: {e}"
    return None


def verify_dir(
    directory: str | Path,
    checksums: bool = True,
    source: Checkpoint | None | bool = None,
    quick: bool = False,
    progress: Progress | None = None,
) -> dict:
    """Verify an output directory. ``source``: a Checkpoint, None (open the recorded source if it is
    reachable) or False (skip the source comparison). ``quick`` compares only the first chunk of each
    sampled group with the source. ``progress(done, total, phase)`` counts the bytes each phase reads
    (output checksums, source comparison, source checksums). Returns a report; ``ok`` is False on any problem."""
    directory = Path(directory)
    manifest = load_manifest(directory)
    problem, warning = check_manifest_digest(directory, manifest)
    warnings = [warning] if warning else []
    if not problem:  # an unsealed (format 1) manifest cut short: one line, not the first missing key's traceback
        problem = manifest_fields_problem(directory, manifest)
    if not problem:  # strided bytes this mxrepack reads otherwise: one line, not a source mismatch per tensor
        problem = _unreadable_layout(directory, Manifest(manifest))
    if problem:  # nothing else it says can be trusted
        return {
            "ok": False,
            "directory": str(directory),
            "files": len(manifest.get("files") or {}) if isinstance(manifest.get("files"), dict) else 0,
            "tensors": len(manifest.get("tensors") or {}) if isinstance(manifest.get("tensors"), dict) else 0,
            "checksums": checksums,
            "source_checked": False,
            "groups_compared": 0,
            "problems": [problem],
            "warnings": warnings,
        }
    problems: list[str] = []
    hashed = _Meter(
        progress if checksums else None,
        "sha256 of output files",
        sum(meta["size"] for meta in manifest["files"].values()),
    )
    for fname, meta in manifest["files"].items():
        path = directory / fname
        if not path.is_file():
            problems.append(f"{path}: listed in the manifest but missing")
            continue
        if path.stat().st_size != meta["size"]:
            problems.append(f"{path}: size {path.stat().st_size}, manifest says {meta['size']}")
        elif checksums and sha256_file(path, on_block=hashed) != meta["sha256"]:
            problems.append(f"{path}: sha256 differs from the manifest")
    for path in unlisted_files(directory, manifest):
        problems.append(f"{path}: not listed in the manifest (mxrepack did not write it); move it out of the output")
    index_path = directory / INDEX
    try:
        weight_map = read_weight_map(directory, missing_ok=True)
        if not weight_map:
            problems.append(f"{index_path}: missing or empty")
    except MxRepackError as e:  # not JSON, no weight_map (its size or sha256 differs too, said above)
        weight_map = {}
        problems.append(str(e))
    for name, entry in manifest["tensors"].items():
        if weight_map.get(name) != entry["file"]:
            problems.append(f"{index_path}: tensor '{name}' should map to {entry['file']}")
    if not problems:
        for fname in sorted(set(weight_map.values())):
            try:
                with safe_open(str(directory / fname), framework="pt") as f:
                    keys = set(f.keys())
                    for name in keys:
                        sl = f.get_slice(name)
                        entry = manifest["tensors"].get(name)
                        if entry is None:
                            problems.append(f"{fname}: tensor '{name}' is not in the manifest")
                        elif list(sl.get_shape()) != entry["stored_shape"]:
                            problems.append(
                                f"{fname}: tensor '{name}' has shape {sl.get_shape()}, "
                                f"manifest says {entry['stored_shape']}"
                            )
            except Exception as e:  # safetensors' own parser has the last word on the files we wrote
                problems.append(f"{fname}: safetensors cannot open it ({e})")
    checked_source = False
    groups = 0
    if source is not False and not problems:
        ck = source
        if ck is None:
            path = manifest["source"].get("path")
            if path and Path(path).is_dir():
                try:
                    ck = open_checkpoint(path)
                except MxRepackError as e:
                    problems.append(f"source {path}: {e}")
        if isinstance(ck, Checkpoint):
            groups, more = compare_with_source(directory, manifest, ck, first_chunk_only=quick, progress=progress)
            problems += more
            checked_source = True
            if checksums and not quick:  # the source's recorded hashes may have come from the Hub unchecked
                recorded = {ck.root / name: meta for name, meta in manifest["source"].get("files", {}).items()}
                present = {path: meta for path, meta in recorded.items() if path.is_file()}
                source_hashed = _Meter(progress, "sha256 of source files", sum(p.stat().st_size for p in present))
                for path, meta in present.items():
                    if sha256_file(path, on_block=source_hashed) != meta["sha256"]:
                        problems.append(f"source {path}: sha256 differs from the one recorded at conversion")
    return {
        "ok": not problems,
        "directory": str(directory),
        "files": len(manifest["files"]),
        "tensors": len(manifest["tensors"]),
        "checksums": checksums,
        "source_checked": checked_source,
        "groups_compared": groups,
        "problems": problems,
        "warnings": warnings,
    }
