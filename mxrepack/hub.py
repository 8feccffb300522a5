"""Publish a target checkpoint to the Hugging Face Hub with a generated model card (formats.md 6).

:func:`plan_push` does everything that needs no network: verifies the directory against its manifest
(the manifest's own digest, checksums, no unlisted files), lists the files and sizes, and renders the model
card (``huggingface_hub.ModelCard``, offline: no ``validate()``). :func:`push` then runs
``create_repo(exist_ok=True)``, ``create_branch`` for a non-default revision, and one ``create_commit`` of
exactly the files the manifest lists, the manifest and the card (LFS files the Hub already holds are not sent
again, so re-running the same push continues where it stopped). The card is uploaded from memory: nothing is
written into the output directory. ``--dry-run`` prints the plan and calls nothing on the Hub.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import mxrepack
from mxrepack.errors import MxRepackError, load_json
from mxrepack.repack.output import MANIFEST, check_manifest_digest, load_manifest
from mxrepack.repack.verify import verify_dir

CARD = "README.md"
# Licenses of known sources, for when the source's own card is not at hand.
KNOWN_LICENSES = {"openai/gpt-oss-120b": "apache-2.0", "openai/gpt-oss-20b": "apache-2.0"}
# The card's library_name per config.quantization_config mode: what loads the checkpoint. mxrepack targets load in
# vLLM through the plugin (compressed-tensors too: stock vLLM cannot load gpt-oss's expert biases in that format,
# serve.spec.serving says why); the native and BF16 targets load in stock transformers (and vLLM).
LIBRARY = {"mxrepack": "vllm", "compressed-tensors": "vllm"}

BODY = """
# {{ model_name }}

{{ summary }}

- **Base model:** {% if base_model %}[{{ base_model }}](https://huggingface.co/{{ base_model }}){% else %}a local checkpoint{% endif %}
- **Target:** `{{ target }}` — {{ description }}
- **Consumer:** {{ consumer }}{% if engine %} (engine: {{ engine }}){% endif %}
- **Made with:** mxrepack {{ tool_version }} (torch {{ torch_version }}), {{ created }}

## What is in it

| component | layout | stored as | padding |
|---|---|---|---|
{% for row in layouts -%}
| {{ row.component }} | `{{ row.layout }}` | {{ row.stored }} | {{ row.padding }} |
{% endfor %}
{{ layout_notes }}

## How to load it

{{ load_howto }}

## Provenance: the manifest

`mxrepack.json` records the source (repo, revision, sha256 of every source file), the recipe, and for
every tensor its layout, logical and stored shape, padding and the upstream function its bytes match,
plus the sha256 of every file here. Check a download with:

```
pip install mxrepack
repack verify {{ local_name }}
```

## Accuracy

{% if evals -%}
| evaluation | metric | value | stderr | samples |
|---|---|---|---|---|
{% for e in evals -%}
| {{ e.name }} | {{ e.metric }} | {{ "%.4f"|format(e.value) }} | {{ e.stderr }} | {{ e.n }} |
{% endfor %}
{%- else -%}
No evaluation results were attached to this upload (`repack push --eval RESULT.json`).
{%- endif %}
{% if quant_rows %}
Data-free quantization error of the dense layers (relative Frobenius norm, SQNR):

| tensors | format | mean rel. error | worst rel. error | mean SQNR dB |
|---|---|---|---|---|
{% for q in quant_rows -%}
| {{ q.kind }} ({{ q.n }}) | {{ q.format }} | {{ "%.4f"|format(q.mean) }} | {{ "%.4f"|format(q.worst) }} | {{ q.sqnr }} |
{% endfor %}
{%- endif %}
"""  # noqa: E501 (Markdown: a template line is one table row or list item)


@dataclass
class PushPlan:
    """What :func:`push` will upload (made by :func:`plan_push`, with no network); ``describe()`` is ``--dry-run``."""

    directory: Path
    repo_id: str
    private: bool
    revision: str | None
    commit_message: str
    files: list[tuple[str, int]]  # (path in repo, bytes): the manifest's files, the manifest, the card
    card: str  # README.md content
    manifest: dict = field(repr=False, default_factory=dict)

    def describe(self) -> str:
        total = sum(s for _, s in self.files)
        lines = [
            f"repo: {self.repo_id} ({'private' if self.private else 'public'}), revision: {self.revision or 'main'}",
            f"commit message: {self.commit_message}",
            f"files ({len(self.files)}, {total / 1e9:.3f} GB):",
        ]
        lines += [f"  {size:>14,d}  {name}" for name, size in self.files]
        return "\n".join(lines) + "\n--- " + CARD + " ---\n" + self.card


def _license(manifest: dict) -> str | None:
    src = manifest["source"]
    path = src.get("path")
    if path and (Path(path) / CARD).is_file():
        from huggingface_hub import ModelCard

        lic = ModelCard.load(Path(path) / CARD).data.to_dict().get("license")
        if lic:
            return lic
    return KNOWN_LICENSES.get(src.get("repo_id") or "")


def _evaluated(r: dict) -> tuple[str | None, str | None]:
    """The checkpoint folder a result evaluated and the weights it read (:func:`weights_identity`; older results do
    not record them), where it names them: the candidate of `eval logits`, the checkpoint of `eval gpqa --local` (a
    server's model is named by neither)."""
    if r.get("eval") == "logits":
        return r.get("candidate"), r.get("candidate_weights")
    backend = r.get("backend")
    if isinstance(backend, str) and backend.startswith("local "):
        return backend[len("local ") :], r.get("weights")
    return None, None


def check_evals_match(paths: list[Path], directory: Path) -> None:
    """Refuse a result that evaluated other weights than ``directory``'s (its figures would go on this model's card):
    the weights it recorded, or else those of the folder it names where that still exists, must be the output's
    (:func:`weights_identity`, the manifest's digest). A server's result, or an older one whose folder is gone,
    cannot be told apart and is taken."""
    from mxrepack.serve.spec import weights_identity

    mine = weights_identity(directory)
    for p in paths:
        evaluated, weights = _evaluated(load_json(Path(p), "`repack eval gpqa` or `repack eval logits` result"))
        if weights is None and evaluated and Path(evaluated).is_dir():
            weights = weights_identity(evaluated)
        if weights is not None and weights != mine:
            raise MxRepackError(f"{p}: evaluates {evaluated}, whose weights are not {directory}'s; pass its own result")


def _eval_entries(paths: list[Path]) -> list[dict]:
    out = []
    for p in paths:
        r = load_json(Path(p), "`repack eval gpqa` or `repack eval logits` result")
        if r.get("eval") == "gpqa":
            from mxrepack.eval.gpqa import require_score

            require_score(r, str(p))  # a run whose requests failed is no score to publish
            data = r.get("data")
            # the card names the questions, the repeats and the samples: one without them was a KeyError traceback
            found = {
                "data.path": isinstance(data, dict) and isinstance(data.get("path"), str),
                **{k: isinstance(r.get(k), int) and not isinstance(r.get(k), bool) for k in ("n_repeats", "n_samples")},
            }
            missing = next((k for k, ok in found.items() if not ok), None)
            if missing:
                raise MxRepackError(
                    f"{p}: no {missing} (or not of its kind); expected the file `repack eval gpqa -o` wrote"
                )
            out.append(
                {
                    "name": f"GPQA-style ({Path(r['data']['path']).name}, {r['n_repeats']} repeats)",
                    "metric": "accuracy",
                    "value": r["score"],
                    "stderr": f"{r['stderr']:.4f}",
                    "n": r["n_samples"],
                    "dataset": Path(r["data"]["path"]).stem,
                }
            )
        elif r.get("eval") == "logits":
            from mxrepack.eval.results import require_logits

            require_logits(r, str(p), ("kl.mean", "same_top", "tokens", "text"))  # what the card shows
            out.append(
                {
                    "name": "KL divergence to the source (mean)",
                    "metric": "kl_mean",
                    "value": r["kl"]["mean"],
                    "stderr": "-",
                    "n": r["tokens"],
                    "dataset": Path(r["text"]).stem,
                }
            )
            out.append(
                {
                    "name": "top-1 agreement with the source",
                    "metric": "same_top",
                    "value": r["same_top"],
                    "stderr": "-",
                    "n": r["tokens"],
                    "dataset": Path(r["text"]).stem,
                }
            )
        else:
            raise MxRepackError(f"{p}: not a `repack eval gpqa` or `repack eval logits` result")
    return out


def _layout_rows(manifest: dict) -> list[dict]:
    rows: dict[str, dict] = {}
    for name, t in manifest["tensors"].items():
        comp = (
            "experts"
            if ".mlp.experts." in name
            else "lm_head"
            if name.startswith("lm_head")
            else "attention"
            if ".self_attn." in name
            else "router"
            if ".router." in name
            else "embeddings"
            if "embed" in name
            else "norms"
        )
        key = f"{comp}/{t['layout']}"
        if key not in rows:
            pad = ", ".join(f"{k} {v[0]}→{v[1]}" for k, v in (t.get("padding") or {}).items()) or "none"
            rows[key] = {"component": comp, "layout": t["layout"], "stored": t["dtype"], "padding": pad}
    return list(rows.values())


def _quant_rows(manifest: dict) -> list[dict]:
    groups: dict[tuple, list] = {}
    for name, r in (manifest.get("quantization_error") or {}).items():
        kind = name.split(".")[-2] if ".self_attn." in name else name.split(".")[0]
        groups.setdefault((kind, r.get("format", "")), []).append(r)
    return [
        {
            "kind": k,
            "format": f,
            "n": len(v),
            "mean": sum(r["rel_fro"] for r in v) / len(v),
            "worst": max(r["rel_fro"] for r in v),
            "sqnr": "%.2f"
            % (
                sum(r["sqnr_db"] for r in v if r["sqnr_db"] is not None)
                / max(1, sum(r["sqnr_db"] is not None for r in v))
            ),
        }
        for (k, f), v in sorted(groups.items())
    ]


def render_card(manifest: dict, repo_id: str, eval_paths: list[Path] = (), refusal: str | None = None) -> str:
    """The model card (YAML metadata + README body), rendered offline. ``refusal``: why no engine serves the output
    (:func:`mxrepack.serve.spec.serve_refusal`), said instead of how to serve it."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    from mxrepack.layouts import get_layout
    from mxrepack.serve.spec import (
        FAST_LOAD_FLAG,
        FAST_LOAD_WHY,
        RUN_HERE,
        UNSERVED_HOW,
        VLLM_SUPPORTED_TEXT,
        dense_serving,
        serving,
    )

    target = manifest["target"]
    base = manifest["source"].get("repo_id")
    evals = _eval_entries(list(eval_paths))
    name = repo_id.split("/")[-1]
    # The bf16 target dequantizes: neither MXFP4 nor quantized.
    quantized = (target["recipe"]["experts"]["layout"], target["recipe"]["dense"]["format"]) != ("bf16", "bf16")
    tags = [
        "gpt_oss",
        *(["mxfp4"] if quantized else []),
        target["name"],
        "mxrepack",
        *(["quantized"] if quantized else []),
    ]
    if target.get("engine"):
        tags.append(target["engine"])
    data = ModelCardData(
        base_model=base,
        license=_license(manifest),
        library_name=LIBRARY.get(target["recipe"]["config"]["quantization_config"], "transformers"),
        tags=tags,
        model_name=name,
        pipeline_tag="text-generation",
        base_model_relation="quantized" if base and quantized else None,
        quantized_by=f"mxrepack {manifest['tool']['mxrepack']}",
        eval_results=[
            EvalResult(
                task_type="text-generation",
                dataset_type=e["dataset"],
                dataset_name=e["dataset"],
                metric_type=e["metric"],
                metric_value=e["value"],
                metric_name=e["name"],
            )
            for e in evals
        ]
        or None,
    )
    experts = target["recipe"]["experts"]["layout"]
    dense = target["recipe"]["dense"]
    mode = target["recipe"]["config"]["quantization_config"]
    layout = get_layout(experts).name
    how, kernel = serving(layout, mode, target["recipe"]["experts"].get("options"))
    if refusal:
        load = f"No serving engine loads this checkpoint: {refusal}. Instead, {UNSERVED_HOW}."
    elif mode == "mxrepack":
        load = (
            "Serve it with vLLM and mxrepack's vLLM plugin, which loads the stored experts straight into the MoE "
            'kernel\'s parameters (no repack of them at start-up):\n\n```\npip install "mxrepack[vllm]"\nvllm serve '
            + repo_id
            + "\n```\n\nNo `--quantization` flag: `config.json` declares `quant_method: mxrepack`, which a stock "
            f"vLLM refuses instead of misreading. MoE kernel: {kernel}. One GPU (tensor parallelism 1). The plugin "
            f"supports vLLM {VLLM_SUPPORTED_TEXT}. `{FAST_LOAD_FLAG}`: {FAST_LOAD_WHY}."
        )
        dense_kernels = dense_serving(dense.get("format", "bf16"), mode, dense.get("order", "rows"))
        if dense_kernels:
            load += f" {dense_kernels[0].upper()}{dense_kernels[1:]}."
    elif mode == "compressed-tensors":
        dense_kernels = dense_serving(dense.get("format", "bf16"), mode)
        formats = "`mxfp4-pack-quantized`" + (" and `mxfp8-quantized`" if dense.get("format") == "mxfp8" else "")
        load = (
            "Serve it with vLLM and mxrepack's vLLM plugin (stock vLLM 0.26-0.33 cannot: its compressed-tensors "
            'MXFP4 MoE method has no expert biases):\n\n```\npip install "mxrepack[vllm]"\nvllm serve '
            + repo_id
            + f"\n```\n\nKernels: {kernel}"
            + (f"; {dense_kernels}" if dense_kernels else "")
            + f". One GPU (tensor parallelism 1). The tensors are compressed-tensors' {formats} formats, which the "
            "library reads and decompresses (the versions mxrepack's "
            'tests compare with):\n\n```\npip install "compressed-tensors>=0.19,<0.22"\n```\n\n'
            "mxrepack's torch reference runner "
            "(for evaluation, not serving) also runs it: `pip install mxrepack`, then `repack eval serve DIR` on "
            "the downloaded folder."
        )
    elif mode == "native":
        load = (
            "The official gpt-oss MXFP4 format: engines that read openai/gpt-oss load it as is. vLLM, "
            f"{how} -- MoE kernel: {kernel}:\n\n```\npip install vllm\nvllm serve {repo_id}\n```\n\n"
            'or transformers\' MXFP4 integration:\n\n```\npip install "transformers>=4.56"\n```\n\n'
            f'`AutoModelForCausalLM.from_pretrained("{repo_id}")`.'
        )
    else:
        load = (
            'Stock transformers, with no quantizer (experts are BF16):\n\n```\npip install "transformers>=4.56"\n'
            f'```\n\n`AutoModelForCausalLM.from_pretrained("{repo_id}")`. '
            f"vLLM serves it too, {how} -- MoE kernel: {kernel}:"
            f"\n\n```\npip install vllm\nvllm serve {repo_id}\n```"
        )
    if RUN_HERE.get(target["name"]) and not refusal:
        load += f"\n\nRun on a GPU by mxrepack: {RUN_HERE[target['name']]}."
    notes = (
        f"Experts: `{experts}` layout. Dense layers: {dense['format']}"
        + (
            f" ({', '.join(dense.get('layers') or [])}; scale rule {dense.get('scale_rule', 'ocp')})"
            if dense["format"] != "bf16"
            else ""
        )
        + ". Padding is zero bytes and zero scales: numerically inert (proved in mxrepack's tests)."
    )
    if manifest.get("nonfinite"):
        notes += (
            "\n\n**Warning:** the source held NaN/Inf values, written here unchanged (`--allow-nonfinite`): "
            + ", ".join(f"`{n}` ({e['count']})" for n, e in manifest["nonfinite"].items())
            + "."
        )
    card = ModelCard.from_template(
        data,
        template_str="---\n{{ card_data }}\n---\n" + BODY,
        model_name=name,
        summary=f"{base or 'A gpt-oss checkpoint'} repacked by mxrepack for **{target['name']}**: "
        f"{target['recipe']['description']}.",
        base_model=base,
        target=target["name"],
        description=target["recipe"]["description"],
        consumer=target.get("consumer"),
        engine=target.get("engine"),
        tool_version=manifest["tool"]["mxrepack"],
        torch_version=manifest["tool"].get("torch"),
        created=manifest.get("created"),
        layouts=_layout_rows(manifest),
        layout_notes=notes,
        load_howto=load,
        local_name=name,
        evals=evals,
        quant_rows=_quant_rows(manifest),
    )
    return str(card)


def check_repo_id(repo_id: str, flag: str = "--repo-id") -> None:
    """A repo id the Hub takes (ORG/NAME by its rules), or one line naming ``flag``: a dry run passed 'me/' or
    'me/x y', which the Hub then refused after the whole output was verified (or converted)."""
    if "/" not in repo_id or repo_id.count("/") != 1:
        raise MxRepackError(f"{flag} {repo_id!r}: expected ORG/NAME")
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        reason = str(e).rsplit(": '", 1)[0].rstrip(".")
        raise MxRepackError(f"{flag} {repo_id!r}: expected ORG/NAME as the Hub takes it ({reason})") from None


def plan_push(
    directory: str | Path,
    repo_id: str,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    eval_paths: list[Path] = (),
) -> PushPlan:
    """Everything about a push that needs no network, or a one-line refusal.

    ``directory`` must be an mxrepack output whose manifest verifies: its own digest (a format 1 manifest, which has
    none, is refused), every listed file's size and sha256, no unlisted files, the index and shard headers (the
    source is not compared). The plan lists exactly the manifest's files, the manifest and the generated model card
    (``README.md``, rendered offline from the manifest and the ``eval_paths`` results: ``repack eval gpqa``/``logits``
    JSON). ``repo_id`` is ``ORG/NAME``; ``revision`` a branch (created by :func:`push` if missing)."""
    directory = Path(directory)
    check_repo_id(repo_id)
    manifest = load_manifest(directory)  # refuses a directory without a manifest
    problem, old = check_manifest_digest(directory, manifest)  # the card is rendered from this very content
    if problem or old:
        raise MxRepackError(f"{directory}: refusing to push, the manifest does not verify: {problem or old}")
    report = verify_dir(directory, checksums=True, source=False)
    if not report["ok"]:
        raise MxRepackError(f"{directory}: refusing to push, the manifest does not verify: {report['problems'][0]}")
    # Only what the manifest lists, and the manifest: a README.md or .gitattributes there (a download from the
    # Hub has them) is not uploaded; the card below replaces the one.
    files = [(name, (directory / name).stat().st_size) for name in [*manifest["files"], MANIFEST]]
    check_evals_match(list(eval_paths), directory)
    from mxrepack.serve.spec import serve_refusal

    card = render_card(manifest, repo_id, eval_paths, serve_refusal(load_json(directory / "config.json", "config")))
    files.append((CARD, len(card.encode())))
    message = commit_message or f"mxrepack {mxrepack.__version__}: {manifest['target']['name']} checkpoint"
    return PushPlan(directory, repo_id, private, revision, message, sorted(files), card, manifest)


def hub_token() -> str:
    """The Hugging Face token a push uses (HF_TOKEN, else the saved login); one line when there is none."""
    token = os.environ.get("HF_TOKEN")
    if not token:
        from huggingface_hub import get_token

        token = get_token()
    if not token:
        raise MxRepackError("no Hugging Face token: set HF_TOKEN or run `hf auth login` (or use --dry-run)")
    return token


def push(plan: PushPlan, api=None) -> str:
    """Upload a planned push; returns the repo URL. ``api`` is an ``HfApi`` (injected in tests)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        raise MxRepackError("offline mode (HF_HUB_OFFLINE=1): unset it to push, or use --dry-run")
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi(token=hub_token())
    from huggingface_hub import CommitOperationAdd

    try:
        url = api.create_repo(plan.repo_id, private=plan.private, repo_type="model", exist_ok=True)
        if plan.revision and plan.revision != "main":
            api.create_branch(plan.repo_id, branch=plan.revision, repo_type="model", exist_ok=True)
        operations = [
            CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(plan.directory / name))
            for name, _ in plan.files
            if name != CARD
        ]
        operations.append(CommitOperationAdd(path_in_repo=CARD, path_or_fileobj=plan.card.encode()))
        api.create_commit(
            plan.repo_id, operations, commit_message=plan.commit_message, repo_type="model", revision=plan.revision
        )
    except MxRepackError:
        raise
    except Exception as e:  # network, auth, quota: one line that says what happened
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MxRepackError(f"push to {plan.repo_id} failed: {msg} (re-run the same command to resume)") from None
    return str(url)


__all__ = ["MANIFEST", "PushPlan", "plan_push", "push", "render_card"]
