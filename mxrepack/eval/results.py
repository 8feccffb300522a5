"""The eval commands' result files: where one may be written, and what one read back must hold."""

from __future__ import annotations

from pathlib import Path

from mxrepack.errors import MxRepackError


def check_result_location(path: Path | None) -> None:
    """Refuse a result file (``-o``, recorded activations) inside an mxrepack output, where `repack verify` and
    `push` then refuse the output for a file its manifest does not list, or beside a checkpoint's config.json,
    where it travels with the model (and a .safetensors one is read as its weights)."""
    if path is None:
        return
    for folder in Path(path).absolute().parents:
        if (folder / "mxrepack.json").is_file():
            raise MxRepackError(
                f"{path}: inside the mxrepack output {folder} (`repack verify` and `push` refuse files its manifest "
                "does not list); write the result elsewhere"
            )
    folder = Path(path).absolute().parent
    if (folder / "config.json").is_file():
        raise MxRepackError(f"{path}: beside {folder / 'config.json'} (a checkpoint); write the result elsewhere")


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
