"""The main job: source -> plan -> layouts -> writer -> verify -> atomic rename.

Output goes to a hidden sibling directory first (``.NAME.mxrepack-tmp-PID``); only a complete,
verified result is renamed to the requested path. Interrupts and errors remove the temporary
directory (:mod:`mxrepack.repack.interrupts`); a SIGKILL can leave it behind, and the next run to the same
output removes it. The output path itself never holds a partial result.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

import mxrepack
from mxrepack.errors import MxRepackError
from mxrepack.gptoss import NATIVE_QUANTIZATION_CONFIG
from mxrepack.layouts import make_layout
from mxrepack.layouts.base import passthrough
from mxrepack.quant import check_e8m0
from mxrepack.quant.dense import load_activations
from mxrepack.recipes import Recipe, load_recipe
from mxrepack.repack.destination import OutputLock, check_destination, replace_with, source_places
from mxrepack.repack.finite import FiniteGuard
from mxrepack.repack.interrupts import InterruptGuard
from mxrepack.repack.memory import keep_freed_memory
from mxrepack.repack.output import build_manifest, write_config, write_index, write_manifest
from mxrepack.repack.plan import PlanItem, build_plan, expert_dims, rows_per_chunk
from mxrepack.repack.safetensors_io import PlannedTensor, StreamingShardWriter, plan_shards, sha256_file
from mxrepack.repack.source import Checkpoint, SourceTensor, open_checkpoint
from mxrepack.repack.verify import verify_dir

DEFAULT_SHARD_BYTES = 5_000_000_000
DEFAULT_CHUNK_BYTES = 256 << 20
Progress = Callable[[int, int], None]  # (output tensor bytes written, their total: the index's total_size)


@dataclass
class RepackResult:
    out: Path
    target: str
    tensors: int
    files: int
    source_bytes: int
    output_bytes: int
    seconds: float
    verify: dict
    quantization_error: dict
    expert_layout: str  # the output's expert layout, and its config.json quantization_method kind: what the CLI
    quantization_config: str  # needs to say how to serve it (mxrepack.serve.spec.serve_hint; serve sits above repack)
    warnings: list[str] = dataclasses.field(default_factory=list)  # NaN/Inf written under --allow-nonfinite
    expert_options: dict = dataclasses.field(default_factory=dict)  # the layout's options (strided's byte order)
    dense_format: str = "bf16"  # the dense layers' format (MXFP4 ones have a choice of kernel when served)
    dense_order: str = "rows"  # MXFP4 dense's byte order (a chunk order has one kernel: mxrepack's)

    def summary(self) -> dict:
        return {
            "out": str(self.out),
            "target": self.target,
            "tensors": self.tensors,
            "files": self.files,
            "source_bytes": self.source_bytes,
            "output_bytes": self.output_bytes,
            "seconds": round(self.seconds, 3),
            # the check of the new output before it was moved into place: its folder is the output's now; its
            # checksums were not read back ("checksums": False) but computed from the bytes as written
            "verify": {**self.verify, "directory": str(self.out), "checksums_computed_while_writing": True},
            "quantization_error": self.quantization_error,
            "expert_layout": self.expert_layout,
            "quantization_config": self.quantization_config,
            "warnings": self.warnings,
        }


def default_out(source: str, target: str) -> Path:
    name = Path(source.rstrip("/")).name or "model"
    return Path(f"{name}-{target}")


def _leftovers(out: Path) -> str:
    """What runs that were killed (SIGKILL, a power cut) left beside ``out``: their temporary folders
    (``.NAME.mxrepack-tmp-PID``) are removed, and an output one had set aside to replace (``-old-PID``: killed between
    :func:`replace_with`'s two renames) is put back where ``out`` is missing: it is the user's. The caller holds the
    output's lock, which every run writing these holds to its end: whatever process a PID names now (PIDs are reused,
    so a live one proved nothing), none of them is still being written. Returns a note for the user ("" if none)."""
    prefix = f".{out.name}.mxrepack-"
    found: dict[str, list[Path]] = {"tmp": [], "old": []}
    try:
        for entry in out.parent.iterdir():
            kind, _, pid = entry.name[len(prefix) :].partition("-") if entry.name.startswith(prefix) else ("", "", "")
            if kind in found and pid.isdigit() and entry.is_dir() and not entry.is_symlink():
                found[kind].append(entry)
    except OSError:  # an unlistable folder: nothing of ours is found in it
        return ""
    note = ""
    old = sorted(found["old"], key=lambda p: p.stat().st_mtime_ns)
    if old and not (out.exists() or out.is_symlink()):
        try:
            os.rename(old[-1], out)
        except OSError as e:
            raise MxRepackError(
                f"{old[-1]}: cannot put this set-aside output back at {out} ({e.strerror or e})"
            ) from None
        note = f" (put back from {old.pop().name}, where a run killed while replacing it had set it aside)"
    scratch = out.parent / f"{prefix}tmp-{os.getpid()}"
    for entry in found["tmp"] + old:  # under a temporary name: one stopped part way is no output to put back
        try:
            os.rename(entry, scratch)
            entry = scratch
        except OSError:
            pass
        shutil.rmtree(entry, ignore_errors=True)
    return note


def _quantized_dense_modules(recipe: Recipe, plan: list[PlanItem]) -> list[str]:
    """The dense modules the plan stores in the recipe's dense MX layout (none when dense stays BF16)."""
    dense = recipe.dense_layout
    return sorted({i.group.removesuffix(".weight") for i in plan if dense is not None and i.layout == dense.name})


def output_config(ck: Checkpoint, recipe: Recipe, plan: list[PlanItem]) -> dict:
    config = dict(ck.config)
    mode = recipe.quantization_config
    if mode == "remove":
        config.pop("quantization_config", None)
    elif mode == "native":
        config["quantization_config"] = dict(NATIVE_QUANTIZATION_CONFIG)
    elif mode == "compressed-tensors":
        from mxrepack.quant import compressed_tensors as ct

        layout = make_layout(recipe.expert_layout, recipe.expert_options)
        config.update(layout.config_overrides(expert_dims(ck)))
        dense = recipe.dense_layout
        dense_modules = _quantized_dense_modules(recipe, plan)
        linear = [
            n.removesuffix(".weight")
            for n in ck.tensors
            if n.endswith(".weight") and (".self_attn." in n or ".mlp.router." in n or n == "lm_head.weight")
        ]
        config["quantization_config"] = ct.quantization_config(
            layout.name == "compressed-tensors", dense.format if dense else None, dense_modules, linear
        )
    else:
        # A quant_method no stock engine knows: an engine that cannot read these layouts fails
        # loudly instead of loading kernel-specific bytes as if they were the native format.
        layouts = sorted({i.layout for i in plan})
        groups: dict[str, dict] = {}
        experts = [i for i in plan if i.group == "layers.0.experts"]  # every layer is laid out the same
        if experts:
            groups["experts"] = {
                "layout": experts[0].layout,
                "padding": experts[0].padding,
                "stored": {
                    i.name.split(".mlp.experts.")[1]: {
                        "dtype": str(i.dtype).removeprefix("torch."),
                        "shape": list(i.shape),
                        "logical_shape": list(i.logical_shape or i.shape),
                    }
                    for i in experts
                },
                "modules": "model.layers.*.mlp.experts",
                "options": recipe.expert_options,
            }
        dense = recipe.dense_layout
        if dense is not None:
            first = [i for i in plan if i.layout == dense.name][:2]  # one tensor's values and scales
            groups["dense"] = {
                **dense.spec(),
                "layers": recipe.dense_layers,
                "modules": _quantized_dense_modules(recipe, plan),
                "stored": {i.name.rsplit(".", 1)[1]: str(i.dtype).removeprefix("torch.") for i in first},
            }
        config["quantization_config"] = {
            "quant_method": "mxrepack",
            "target": recipe.name,
            "layouts": layouts,
            "groups": groups,
            "consumer": recipe.consumer,
            "mxrepack_version": mxrepack.__version__,
        }
    return config


def _shard_name(i: int, n: int) -> str:
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def _write_weights(
    tmp: Path, plan: list[PlanItem], shard_bytes: int, chunk_bytes: int, progress: Progress | None
) -> tuple[dict[str, str], dict[str, dict]]:
    by_name = {i.name: i for i in plan}
    shards = plan_shards([PlannedTensor(i.name, i.dtype, i.shape) for i in plan], shard_bytes)
    # The bar counts output tensor bytes as each chunk is written (its total is the index's total_size). It
    # counted the source bytes each output reads, which add up to neither size: a dense weight quantized into
    # values and scales counted twice (a 4.5 GB total for a 3.27 GB source and a 2.38 GB output), and the
    # increments counted zero-padded rows that the total did not.
    total = sum(i.nbytes for i in plan)
    done = 0
    weight_map: dict[str, str] = {}
    files: dict[str, dict] = {}
    closed: list[StreamingShardWriter] = []  # hashing and fsyncing in the background while the next shard is written
    order = [by_name[t.name] for tensors in shards for t in tensors]
    with ThreadPoolExecutor(1, thread_name_prefix="mxrepack-read") as pool:
        reads = _reads_ahead(pool, _chunks(order, chunk_bytes))
        try:
            for s, tensors in enumerate(shards):
                fname = _shard_name(s, len(shards))
                writer = StreamingShardWriter(
                    tmp / fname, tensors, metadata={"format": "pt", "producer": f"mxrepack {mxrepack.__version__}"}
                )
                try:
                    for t in tensors:
                        done = _write_tensor(writer, by_name[t.name], reads, chunk_bytes, done, total, progress)
                        weight_map[t.name] = fname
                    writer.close()
                    closed.append(writer)
                except BaseException:
                    writer.abort()
                    raise
            for writer in closed:  # the shards' hashes ran in parallel, each behind its writer
                files[writer.path.name] = {"sha256": writer.sha256(), "size": writer.size}
        except BaseException:
            reads.close()
            for writer in closed:
                writer.abort()
            raise
    for writer in closed:
        writer.wait_synced()
    return weight_map, files


def _row_ranges(item: PlanItem, chunk_bytes: int):
    """``item``'s chunks as (first row, end row): what each read, pack and write handles at once."""
    step = rows_per_chunk(item, chunk_bytes)
    for r0 in range(0, item.shape[0], step):
        yield r0, min(r0 + step, item.shape[0])


def _chunks(order: list[PlanItem], chunk_bytes: int):
    """(item, first row, end row) of every chunk the pipeline reads into memory, in the order it writes them
    (the tensors stored unchanged are copied by the kernel instead, and read nothing here)."""
    for item in order:
        if _stored_unchanged(item) is None:
            yield from ((item, r0, r1) for r0, r1 in _row_ranges(item, chunk_bytes))


def _read_chunk(item: PlanItem, r0: int, r1: int) -> dict[str, torch.Tensor]:
    return {k: src.read() if item.whole else src.read(r0, r1) for k, src in item.inputs.items()}


def _reads_ahead(pool: ThreadPoolExecutor, chunks):
    """The chunks' inputs, each read by ``pool`` while the chunk before it is packed and written: from a cold
    page cache the disk then reads while the CPU works, instead of in turn. One chunk ahead, so the memory
    bound grows by one chunk's inputs."""
    chunks = iter(chunks)
    nxt = next(chunks, None)
    pending = pool.submit(_read_chunk, *nxt) if nxt is not None else None
    while pending is not None:
        current = nxt
        inputs = pending.result()
        nxt = next(chunks, None)
        pending = pool.submit(_read_chunk, *nxt) if nxt is not None else None
        yield current, inputs


def _write_tensor(
    writer: StreamingShardWriter,
    item: PlanItem,
    reads,
    chunk_bytes: int,
    done: int,
    total: int,
    progress: Progress | None,
) -> int:
    """Stream one planned tensor into ``writer`` chunk by chunk (its inputs from ``reads``, :func:`_reads_ahead`);
    returns the output bytes written so far."""
    stored = _stored_unchanged(item)
    if stored is not None:  # the kernel copies it, chunk by chunk for the progress bar
        row_bytes = stored.info.row_bytes
        for r0, r1 in _row_ranges(item, chunk_bytes):
            writer.copy_from(
                item.name,
                stored.info.file,
                stored.info.start + (stored.row_start + r0) * row_bytes,
                (r1 - r0) * row_bytes,
            )
            if item.finite is not None:  # after the copy, which left these rows in the page cache; on a thread
                item.finite.check_range(stored.info, stored.row_start + r0, r1 - r0)
            done += (r1 - r0) * item.row_bytes
            if progress:
                progress(done, total)
        return done
    for r0, r1 in _row_ranges(item, chunk_bytes):
        (read_item, read_r0, read_r1), inputs = next(reads)
        if read_item is not item or (read_r0, read_r1) != (r0, r1):  # the two walks over the plan must agree
            raise RuntimeError(f"{item.name}: rows {r0}:{r1} expected, read {read_item.name} {read_r0}:{read_r1}")
        for k, src in item.inputs.items():
            if src.name.endswith("_scales"):
                check_e8m0(inputs[k], f"{src.info.file}: tensor '{src.name}'")
            elif item.finite is not None:
                item.finite.check(src.info, inputs[k])
        chunk = item.pack(**inputs)
        if item.observer is not None:
            item.observer.observe(inputs, chunk)
        if chunk.dtype != item.dtype or tuple(chunk.shape) != (r1 - r0, *item.shape[1:]):
            raise RuntimeError(
                f"{item.name}: layout {item.layout} produced {chunk.dtype} "
                f"{tuple(chunk.shape)}, planned {item.dtype} {(r1 - r0, *item.shape[1:])}"
            )
        writer.write(item.name, chunk)
        del inputs, chunk  # before the next chunk is taken: at most two chunks' inputs are alive
        done += (r1 - r0) * item.row_bytes
        if progress:
            progress(done, total)
    return done


def _stored_unchanged(item: PlanItem) -> SourceTensor | None:
    """The source tensor ``item`` stores byte for byte, if it is one (no layout, no observer, and not
    E8M0 scales, whose bytes are checked on the way)."""
    if item.pack is not passthrough or item.observer is not None or len(item.inputs) != 1:
        return None
    (src,) = item.inputs.values()
    if type(src) is not SourceTensor or src.name.endswith("_scales"):
        return None
    return src if (src.dtype, tuple(src.shape)) == (item.dtype, tuple(item.shape)) else None


def _convert(
    ck: Checkpoint,
    recipe: Recipe,
    plan: list[PlanItem],
    out: Path,
    shard_bytes: int,
    chunk_bytes: int,
    hash_source: bool,
    progress: Progress | None,
    finished: list[Path],
) -> tuple[dict, dict, dict]:
    """Write, verify and rename into place (the caller holds the output's lock and has checked the path);
    returns (manifest, files, verify report). ``out`` is appended to ``finished`` the moment it is in place."""
    hash_futures = ck.hash_files_async() if hash_source else {}
    tmp = out.parent / f".{out.name}.mxrepack-tmp-{os.getpid()}"
    with InterruptGuard() as guard:
        try:  # the folder is made inside: an interrupt right after it is made still removes it
            try:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
            except OSError as e:
                raise MxRepackError(f"{out.parent}: cannot write the output here ({e.strerror or e})") from None
            weight_map, files = _write_weights(tmp, plan, shard_bytes, chunk_bytes, progress)
            total_size = sum(i.nbytes for i in plan)
            write_index(tmp, weight_map, total_size)
            write_config(tmp, output_config(ck, recipe, plan))
            for side in ck.side_files:
                shutil.copyfile(side, tmp / side.name)
            source_hashes = {name: f.result() for name, f in hash_futures.items()}
            manifest = build_manifest(ck, recipe, plan, weight_map, source_hashes)
            for path in sorted(tmp.iterdir()):
                if path.name not in files:
                    files[path.name] = {"sha256": sha256_file(path), "size": path.stat().st_size}
            manifest["files"] = dict(sorted(files.items()))
            manifest = write_manifest(tmp, manifest)  # sealed with its own sha256: an edit fails verify

            # Checksums were computed from the bytes as written; the source comparison proves the layout.
            report = verify_dir(tmp, checksums=False, source=ck, quick=True)
            if not report["ok"]:
                raise MxRepackError(f"{out}: verification of the new output failed: {report['problems'][0]}")
            with guard.deferred():  # an interrupt now is raised once `finished` says whether the output is in place
                replace_with(out, tmp)
                finished.append(out)
        except OSError as e:
            where = e.filename or tmp
            raise MxRepackError(f"{where}: write failed ({e.strerror or e}); is the disk full?") from None
        finally:
            try:  # an interrupt's unwinding drops further signals (the guard's "drop"); any other ending defers them
                if guard.mode != "drop":
                    guard.mode = "defer"
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return manifest, files, report


def repack(
    source: str,
    target: str | None = None,
    out: str | Path | None = None,
    *,
    recipe_file: str | None = None,
    revision: str | None = None,
    overwrite: bool = False,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    hash_source: bool = True,
    progress: Progress | None = None,
    checkpoint: Checkpoint | None = None,
    dense: str | None = None,
    dense_layers: str | None = None,
    scale_rule: str | None = None,
    scale_search: bool | None = None,
    activations: str | Path | None = None,
    allow_nonfinite: bool = False,
    finished: list[Path] | None = None,
) -> RepackResult:
    """Convert ``source`` for ``target`` (or ``recipe_file``) into ``out``; see the module docstring.

    ``dense``/``dense_layers``/``scale_rule``/``scale_search`` override the recipe's dense section;
    ``activations`` is a safetensors file of recorded layer inputs for the error report. NaN/Inf in a float
    tensor stored without quantizing (router, norms, biases, BF16 dense) is an error unless ``allow_nonfinite``:
    then each such tensor is a warning in the result and an entry in the manifest's ``nonfinite``. ``finished``: a
    list of the caller's that the output path is appended to the moment the verified output is in place (with
    interrupts held), so that a caller interrupted at any point after it can say the output is complete."""
    started = time.perf_counter()
    keep_freed_memory()
    if shard_bytes <= 0:
        raise MxRepackError(f"shard size {shard_bytes}: expected a positive number of bytes")
    recipe = load_recipe(target, recipe_file).with_overrides(dense, dense_layers, scale_rule, scale_search)
    out = Path(out) if out is not None else default_out(source, recipe.name)
    out = out.expanduser().absolute()
    if not out.parent.is_dir():
        what = "is not a directory" if out.parent.exists() else "does not exist"
        raise MxRepackError(f"{out.parent}: output's parent {what}")
    finished = [] if finished is None else finished
    with OutputLock(out):
        put_back = _leftovers(out)
        if (out.exists() or out.is_symlink()) and not overwrite:  # before a Hub source is fetched
            raise MxRepackError(f"{out}: output already exists{put_back}; pass --overwrite to replace it")
        ck = checkpoint or open_checkpoint(source, revision)
        check_destination(out, source_places(ck.root, [*ck.files, *ck.side_files]), overwrite)
        guard = FiniteGuard(allow_nonfinite)
        acts = load_activations(activations, {name: tuple(t.shape) for name, t in ck.tensors.items()})
        plan = build_plan(ck, recipe, acts, guard)
        manifest, files, report = _convert(
            ck, recipe, plan, out, shard_bytes, chunk_bytes, hash_source, progress, finished
        )
    layout = make_layout(recipe.expert_layout, recipe.expert_options).name
    return RepackResult(
        out,
        recipe.name,
        len(plan),
        len(files),
        ck.total_bytes,
        sum(f["size"] for f in files.values()),
        time.perf_counter() - started,
        report,
        manifest["quantization_error"],
        layout,
        recipe.quantization_config,
        guard.warnings(),
        dict(recipe.expert_options),
        recipe.dense_format,
        recipe.dense_order,
    )
