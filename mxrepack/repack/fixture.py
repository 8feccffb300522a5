"""Synthetic gpt-oss checkpoints with the official names, dtypes, shapes and config fields.

Presets: ``tiny`` (widths that are multiples of 32 but not of 128, as 2880 is; 4 experts, top-2,
2 layers, sliding/full alternation, sinks), ``20b`` and ``120b`` (the real shapes; ``layers`` cuts
depth). Weights are random but shaped like the real thing: E2M1 codes uniform, E8M0 scales mostly
2^-8..2^-4 with a tail to 2^2, BF16 dense weights ~N(0, 0.02), norms near 1. Data is generated and
written in chunks, so a full-depth 120b fixture (65 GB) streams like a conversion does.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch

from mxrepack import gptoss
from mxrepack.errors import MxRepackError, file_in_the_way
from mxrepack.repack.safetensors_io import PlannedTensor, StreamingShardWriter, plan_shards

_GPT_OSS_20B = dict(
    hidden_size=2880,
    intermediate_size=2880,
    num_hidden_layers=24,
    num_local_experts=32,
    num_experts_per_tok=4,
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=64,
    vocab_size=201088,
    sliding_window=128,
    initial_context_length=4096,
    max_position_embeddings=131072,
)

PRESETS: dict[str, dict] = {
    "tiny": dict(
        hidden_size=288,
        intermediate_size=160,
        num_hidden_layers=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=512,
        sliding_window=8,
        initial_context_length=64,
        max_position_embeddings=2048,
    ),
    "20b": _GPT_OSS_20B,
    "120b": _GPT_OSS_20B | dict(num_hidden_layers=36, num_local_experts=128),  # the same shapes, deeper and wider
}

CHAT_TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}\n"
)


def fixture_config(preset: str = "tiny", layers: int | None = None, **overrides) -> dict:
    if preset not in PRESETS:
        raise MxRepackError(f"unknown fixture preset {preset!r}; valid: {', '.join(PRESETS)}")
    p = {**PRESETS[preset], **overrides}
    n = layers if layers is not None else p["num_hidden_layers"]
    if n < 1:
        raise MxRepackError(f"--layers must be at least 1, got {n}")
    return gptoss.hf_config(
        hidden=p["hidden_size"],
        intermediate=p["intermediate_size"],
        layers=n,
        experts=p["num_local_experts"],
        experts_per_token=p["num_experts_per_tok"],
        heads=p["num_attention_heads"],
        kv_heads=p["num_key_value_heads"],
        head_dim=p["head_dim"],
        sliding_window=p["sliding_window"],
        max_positions=p["max_position_embeddings"],
        context=p["initial_context_length"],
        vocab=p["vocab_size"],
        bos_token_id=p["vocab_size"] - 3,
        eos_token_id=p["vocab_size"] - 2,
        pad_token_id=p["vocab_size"] - 1,
        torch_dtype="bfloat16",
    )


def _original_config(c: dict) -> dict:
    return {
        "num_hidden_layers": c["num_hidden_layers"],
        "num_experts": c["num_local_experts"],
        "experts_per_token": c["num_experts_per_tok"],
        "vocab_size": c["vocab_size"],
        "hidden_size": c["hidden_size"],
        "intermediate_size": c["intermediate_size"],
        "swiglu_limit": c["swiglu_limit"],
        "head_dim": c["head_dim"],
        "num_attention_heads": c["num_attention_heads"],
        "num_key_value_heads": c["num_key_value_heads"],
        "sliding_window": c["sliding_window"],
        "initial_context_length": c["initial_context_length"],
        "rope_theta": c["rope_theta"],
        "rope_scaling_factor": 32.0,
        "rope_ntk_alpha": 1.0,
        "rope_ntk_beta": 32.0,
    }


def _generate(name: str, kind: str, shape: tuple[int, ...], rows: slice, seed: int) -> torch.Tensor:
    """Rows of one synthetic tensor; deterministic per (name, seed, row), whatever the chunking."""
    n = rows.stop - rows.start
    g = torch.Generator().manual_seed((seed * 1_000_003 + sum(map(ord, name)) * 7919 + rows.start) % (2**63))
    sub = (n, *shape[1:])
    if kind == "blocks":
        return torch.randint(0, 256, sub, generator=g, dtype=torch.uint8)
    if kind == "scales":
        # Mostly 2^-8..2^-4 (bytes 119..123) with a thin tail up to 2^2 (129): real-looking, and
        # tame enough that a forward pass through random experts stays finite.
        tail = torch.randn(sub, generator=g).abs().mul(2.0).floor().clamp(max=10).to(torch.uint8)
        return (119 + tail).clamp(max=129)
    if kind == "weight":
        return (torch.randn(sub, generator=g) * 0.02).to(torch.bfloat16)
    if name.endswith("layernorm.weight") or name == "model.norm.weight" or name.endswith("norm.scale"):
        return (1.0 + 0.05 * torch.randn(sub, generator=g)).to(torch.bfloat16)
    if name.endswith("sinks"):
        return torch.randn(sub, generator=g).to(torch.bfloat16)
    return (torch.randn(sub, generator=g) * 0.02).to(torch.bfloat16)


def _original_tensors(c: dict) -> dict[str, tuple[tuple[int, ...], str, list[str]]]:
    """original/ name -> (shape, kind, canonical tensors whose rows it holds, in order)."""
    out: dict[str, tuple[tuple[int, ...], str, list[str]]] = {}
    for canonical, (shape, kind) in gptoss.expected_tensors(gptoss.Dims.from_config(c)).items():
        orig = gptoss.canonical_to_original(canonical)
        if orig in out:  # q, k, v stack into the fused qkv
            prev_shape, _, members = out[orig]
            out[orig] = ((prev_shape[0] + shape[0], *shape[1:]), kind, members + [canonical])
        else:
            out[orig] = (shape, kind, [canonical])
    return out


FIXTURE_MARK = "mxrepack-fixture.json"  # what make-fixture wrote there: the only folders --overwrite replaces


def _not_a_fixture(out: Path) -> str | None:
    """Why ``out`` is not a fixture folder, as make-fixture left it, that ``--overwrite`` may replace whole, or None:
    a file it did not write, or one of its files edited since (another size than the mark records, or newer than the
    mark, which make-fixture writes last). An edit is the user's to keep; a copy that did not keep file times is
    refused too (no hash is recorded to tell it from an edit), and its owner removes it."""
    if out.is_symlink() or not out.is_dir():
        return "this is not a folder"
    try:
        mark = json.loads((out / FIXTURE_MARK).read_text())
        listed = set(mark["files"]) | {FIXTURE_MARK}
        sizes = mark.get("sizes") or {}  # fixtures written before mxrepack recorded sizes have none
        written = (out / FIXTURE_MARK).stat().st_mtime_ns
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"it holds no readable {FIXTURE_MARK}"
    for entry in sorted(out.iterdir()):
        if entry.name not in listed:
            return f"it holds {entry.name!r}, which make-fixture did not write"
        if entry.name == FIXTURE_MARK or not entry.is_file():
            continue
        st = entry.stat()
        if sizes.get(entry.name) not in (None, st.st_size) or st.st_mtime_ns > written:
            return f"{entry.name!r} was changed after make-fixture wrote it"
    return None


def make_fixture(
    out: str | Path,
    preset: str = "tiny",
    layers: int | None = None,
    seed: int = 0,
    layout: str = "hf",
    shard_bytes: int = 4_800_000_000,
    overwrite: bool = False,
    chunk_bytes: int = 64 << 20,
    **overrides,
) -> Path:
    """Write a synthetic gpt-oss checkpoint to ``out`` (HF layout, or ``layout="original"``)."""
    if layout not in ("hf", "original"):
        raise MxRepackError(f"unknown fixture layout {layout!r}; valid: hf, original")
    out = Path(out)
    config = fixture_config(preset, layers, **overrides)
    if not (out.exists() or out.is_symlink()):
        blocking = file_in_the_way(out)
        if blocking is not None:
            raise MxRepackError(f"{blocking}: is a file; expected a folder to hold the fixture {out.name}")
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise MxRepackError(f"{out.parent}: cannot create the folder ({e.strerror or e})") from None
    # One writer per path, as for a conversion (the same lock file): a second make-fixture would remove the first's
    # temporary folder under it and write its files into the other's.
    from mxrepack.repack.destination import OutputLock

    with OutputLock(out.absolute()):
        return _make_fixture_locked(out, config, preset, layers, seed, layout, shard_bytes, overwrite, chunk_bytes)


def _make_fixture_locked(
    out: Path,
    config: dict,
    preset: str,
    layers: int | None,
    seed: int,
    layout: str,
    shard_bytes: int,
    overwrite: bool,
    chunk_bytes: int,
) -> Path:
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise MxRepackError(f"{out}: already exists; pass --overwrite to replace it")
        problem = _not_a_fixture(out)
        if problem:
            raise MxRepackError(
                f"{out}: --overwrite only replaces a fixture made by `repack make-fixture`, and "
                f"{problem}; remove it yourself or choose another path"
            )
    d = gptoss.Dims.from_config(config)
    expected = gptoss.expected_tensors(d)
    if layout == "hf":
        members = {name: (shape, kind, [name]) for name, (shape, kind) in expected.items()}
    else:
        members = _original_tensors(config)
    planned = [
        PlannedTensor(name, torch.uint8 if kind in ("blocks", "scales") else torch.bfloat16, shape)
        for name, (shape, kind, _) in members.items()
    ]
    tmp = out.parent / f".{out.name}.fixture-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        shards = plan_shards(planned, shard_bytes)
        weight_map = {}
        for s, tensors in enumerate(shards):
            fname = f"model-{s:05d}-of-{len(shards) - 1:05d}.safetensors"  # the official 0-based naming
            writer = StreamingShardWriter(tmp / fname, tensors, metadata={"format": "pt"})
            for t in tensors:
                shape, kind, canon = members[t.name]
                for member in canon:  # a fused original tensor is its canonical parts stacked by rows
                    mshape = expected[member][0]
                    row_bytes = max(1, t.nbytes // shape[0])
                    step = max(1, chunk_bytes // row_bytes)
                    for r0 in range(0, mshape[0], step):
                        rows = slice(r0, min(r0 + step, mshape[0]))
                        writer.write(t.name, _generate(member, kind, mshape, rows, seed))
                weight_map[t.name] = fname
            writer.close()
        total = sum(t.nbytes for t in planned)
        (tmp / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
        )
        if layout == "hf":
            (tmp / "config.json").write_text(json.dumps(config, indent=2))
        else:
            (tmp / "config.json").write_text(json.dumps(_original_config(config), indent=2))
            dtypes = {
                n: ("FP4" if k == "blocks" else "UE8" if k == "scales" else "BF16") for n, (_, k, _) in members.items()
            }
            (tmp / "dtypes.json").write_text(json.dumps(dtypes, indent=2))
        (tmp / "generation_config.json").write_text(
            json.dumps(
                {
                    "bos_token_id": config["bos_token_id"],
                    "eos_token_id": [config["eos_token_id"]],
                    "pad_token_id": config["pad_token_id"],
                    "do_sample": True,
                },
                indent=2,
            )
        )
        (tmp / "chat_template.jinja").write_text(CHAT_TEMPLATE)
        files = sorted(p.name for p in tmp.iterdir())
        sizes = {name: (tmp / name).stat().st_size for name in files}  # what --overwrite checks for edits
        mark = {"preset": preset, "layers": layers, "seed": seed, "layout": layout, "files": files, "sizes": sizes}
        (tmp / FIXTURE_MARK).write_text(json.dumps(mark, indent=2))
        if out.exists():  # a fixture, checked above: aside first, so the path always holds a whole one
            old = out.parent / f".{out.name}.fixture-old"
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def fixture_bytes(preset: str = "tiny", layers: int | None = None) -> int:
    d = gptoss.Dims.from_config(fixture_config(preset, layers))
    return sum(math.prod(s) * (1 if k in ("blocks", "scales") else 2) for s, k in gptoss.expected_tensors(d).values())
