"""``repack inspect``: what a checkpoint directory holds, without reading any tensor data."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from mxrepack import gptoss
from mxrepack.errors import MxRepackError, load_json
from mxrepack.repack.output import MANIFEST, load_manifest
from mxrepack.repack.safetensors_io import dtype_name, read_header
from mxrepack.repack.source import config_dims, resolve

CONFIG_KEYS = (
    "num_hidden_layers",
    "num_local_experts",
    "num_experts_per_tok",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "sliding_window",
)


def inspect_checkpoint(source: str) -> dict:
    root, origin = resolve(source)
    present = sorted(root.glob("*.safetensors"))
    listed = _listed_shards(root)
    # with an index, the files it lists are the model (what a loader reads); others beside them are named apart
    files = present if listed is None else sorted(root / n for n in listed if (root / n).is_file())
    unlisted = [] if listed is None else sorted(f.name for f in present if f.name not in listed)
    if not files and not unlisted:
        raise MxRepackError(f"{root}: no *.safetensors files")
    config_path = root / "config.json"
    # a folder without a config is described all the same; a config that is there but unreadable is one line naming
    # it (load_json)
    config = load_json(config_path, "model config (config.json)") if config_path.exists() else {}
    original = "model_type" not in config and "num_experts" in config
    if original:
        config = gptoss.hf_config_from_original(config)
    d = config_dims(config, config_path) if "num_local_experts" in config else None
    manifest_path = root / MANIFEST
    manifest = load_manifest(root) if manifest_path.exists() else None  # its reading and format: the owner's checks
    target = manifest.get("target") if manifest else None
    if manifest is not None and not (isinstance(target, dict) and isinstance(target.get("recipe"), dict)):
        raise MxRepackError(f"{manifest_path}: incomplete manifest: no target and recipe; re-run repack")
    qc = config.get("quantization_config")
    qc = qc if isinstance(qc, dict) else {}

    components: dict[str, dict] = defaultdict(lambda: {"tensors": 0, "bytes": 0, "dtypes": set()})
    total = 0
    for f in files:
        for name, info in read_header(f)[0].items():
            canonical = name
            if original and d is not None:
                mapped = gptoss.original_to_canonical(name, d)
                canonical = mapped[0][0] if mapped else name
            c = components[gptoss.component(canonical)]
            c["tensors"] += 1
            c["bytes"] += info.nbytes
            c["dtypes"].add(dtype_name(info.dtype))
            total += info.nbytes
    if manifest:
        experts = (target["recipe"].get("experts") or {}).get("layout", "?")
        fmt = f"mxrepack target '{target.get('name', '?')}' (experts: {experts})"
    elif qc.get("quant_method") == "mxfp4":
        fmt = "native gpt-oss MXFP4 (" + ("original/ layout" if original else "Hugging Face layout") + ")"
    elif config.get("quantization_config"):
        fmt = f"quantized ({qc.get('quant_method', 'unknown')})"
    else:
        fmt = "unquantized (no quantization_config)"
    return {
        "path": str(root),
        "origin": origin,
        "format": fmt,
        "config": {k: config.get(k) for k in CONFIG_KEYS if k in config},
        "files": len(files),
        "total_bytes": total,
        "components": {k: {**v, "dtypes": sorted(v["dtypes"])} for k, v in sorted(components.items())},
        "manifest": {
            "target": target.get("name"),
            "tool": manifest["tool"] if isinstance(manifest.get("tool"), dict) else {},
            "created": manifest.get("created"),
        }
        if manifest
        else None,
        # the files the index lists that are not there: what inspect describes is then part of the model (an
        # unfinished download), which `repack` itself refuses
        "missing_shards": sorted(n for n in listed or () if not (root / n).is_file()),
        # files beside the model that its index does not list (a stale shard, recorded activations): not counted
        "unlisted_shards": unlisted,
    }


def _listed_shards(root: Path) -> set[str] | None:
    """The file names the folder's index maps tensors to; None without an index, or with one that cannot be read
    (inspect describes the files then, and `repack` names the index's fault)."""
    index = root / "model.safetensors.index.json"
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(weight_map, dict) or not weight_map:
        return None
    return {Path(name).as_posix() for name in weight_map.values() if isinstance(name, str) and name}  # ./a -> a


def format_report(r: dict) -> str:
    lines = [
        f"{r['path']}",
        f"  format: {r['format']}",
        f"  files: {r['files']} safetensors, {r['total_bytes'] / 1e9:.3f} GB",
    ]
    if r["config"]:
        lines.append("  config: " + ", ".join(f"{k}={v}" for k, v in r["config"].items()))
    lines.append("  components:")
    for name, c in r["components"].items():
        lines.append(f"    {name:<11} {c['tensors']:>5} tensors {c['bytes'] / 1e6:>12.2f} MB  {'/'.join(c['dtypes'])}")
    if r["manifest"]:
        lines.append(f"  made by mxrepack {r['manifest']['tool'].get('mxrepack', '?')} on {r['manifest']['created']}")
    if r["missing_shards"]:
        lines.append(
            f"  incomplete: the index lists {_some(r['missing_shards'], ' not here')}; the figures above are of the "
            "files present"
        )
    if r["unlisted_shards"]:
        lines.append(
            f"  not in the index: {_some(r['unlisted_shards'])}; a loader does not read them, and the figures above "
            "leave them out"
        )
    return "\n".join(lines)


def _some(names: list[str], after: str = "") -> str:
    """``N file(s)<after> (first and K more)``."""
    more = f" and {len(names) - 1} more" if len(names) > 1 else ""
    return f"{len(names)} file(s){after} ({names[0]}{more})"
