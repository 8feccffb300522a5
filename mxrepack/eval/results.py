"""The eval commands' result files: where one may be written, and what one read back must hold."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mxrepack.errors import MxRepackError, file_in_the_way


def inside_checkpoint(path: Path, own_safetensors: bool = True) -> str | None:
    """Why ``path`` (a result file, or a report folder) lies in a checkpoint, or None: a folder from its own up that
    holds an mxrepack manifest (`repack verify` and `push` refuse an output holding files its manifest does not list)
    or a model's config.json (one naming a ``model_type`` or ``architectures``: the file travels with the model), or
    with ``own_safetensors``, its own folder holding .safetensors files (a .safetensors result is read as the model's
    tensors). Another tool's config.json, in a project folder or in ``~``, is no checkpoint."""
    path = Path(path).resolve()
    for folder in path.parents:
        if (folder / "mxrepack.json").is_file():
            return f"inside the mxrepack output {folder}"
        if _model_config(folder / "config.json"):
            return f"inside the checkpoint {folder} (its config.json)"
        if own_safetensors and folder == path.parent and next(folder.glob("*.safetensors"), None) is not None:
            return f"beside the safetensors files of {folder}"
    return None


def json_keys(path: Path) -> set[str]:
    """The keys of the JSON object in ``path``; none where there is no such file or it holds no object (a file
    looked at to tell what a folder is, never one the user asked to read)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    return set(data) if isinstance(data, dict) else set()


def _model_config(path: Path) -> bool:
    return bool(json_keys(path) & {"model_type", "architectures"})


def check_result_path(path: Path | None) -> None:
    """Refuse, before the work, a result file path that cannot take the result: a folder, a path under a file (the
    result was computed, minutes for an eval, and then lost with a traceback at the rename), or a place in a
    checkpoint (:func:`inside_checkpoint`)."""
    if path is None:
        return
    if path.is_dir():
        raise MxRepackError(f"{path}: is a folder; expected a file path for the result (e.g. {path / 'result.json'})")
    blocking = file_in_the_way(path)
    if blocking is not None:
        raise MxRepackError(f"{path}: {blocking} is a file, not a folder; expected a file path for the result")
    where = inside_checkpoint(path)
    if where:
        raise MxRepackError(f"{path}: {where}; write the result elsewhere")


def write_atomic(path: Path, write) -> None:
    """``write(tmp)`` to a hidden sibling, then rename over ``path``: never a half-written result file."""
    check_result_path(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:  # named as the path the user gave, not the hidden file beside it
        raise MxRepackError(f"{path}: cannot write the result ({e.strerror or e})") from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # its folder could not be made: there is nothing to remove
            pass


def write_json(path: Path | None, data: dict) -> None:
    if path is not None:
        write_atomic(path, lambda tmp: tmp.write_text(json.dumps(data, indent=2) + "\n"))


# What `eval report` and `push --eval` read of an `eval logits` result, and each value's kind.
LOGITS_FIELDS = {
    "tokens": int,
    "kl.mean": float,
    "kl.median": float,
    "kl.p99": float,
    "kl.max": float,
    "same_top": float,
    "ppl.reference": float,
    "ppl.candidate": float,
    "ppl.ratio": float,
    "first_token.ok": bool,
    "first_token.prompts": int,
    "text": str,
}


def require_logits(r: dict, name: str, fields: tuple[str, ...] = tuple(LOGITS_FIELDS)) -> None:
    """Refuse a result that is not `repack eval logits` output with ``fields`` (dotted paths): a gpqa result given
    as one made a report without its logits section, a missing or mistyped field a traceback."""
    if r.get("eval", "logits") != "logits":
        raise MxRepackError(f"{name}: a `repack eval {r['eval']}` result; expected `repack eval logits` output")
    for field in fields:
        v = r
        for key in field.split("."):
            v = v.get(key) if isinstance(v, dict) else None
        kind = LOGITS_FIELDS[field]
        if kind is float:  # NaN too: a candidate's NaN logits are what the report must show
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        else:
            ok = isinstance(v, kind) and (kind is bool or not isinstance(v, bool))
        if v is None:
            raise MxRepackError(f"{name}: no {field}; expected `repack eval logits` output")
        if not ok:
            what = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[kind]
            raise MxRepackError(f"{name}: {field} is {v!r}; expected {what}, as `repack eval logits` writes")
