"""The ``repack`` command.

``repack SOURCE --target T [--out DIR]`` is the main job; the other commands are subcommands
(``repack inspect PATH``, ``repack targets``, ``repack verify DIR``, ``repack make-fixture OUT``).
A first argument that is not a subcommand name is taken as the SOURCE of the main job, so the
literal ``repack openai/gpt-oss-120b --target sm121`` works; ``repack convert ...`` is the explicit
spelling (for a local directory that happens to be named like a subcommand).

Heavy imports (torch, transformers, triton) happen inside the commands, not at start-up.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Optional

import typer

from mxrepack.errors import MxRepackError, read_text, require_folder

_CONTEXT = {"help_option_names": ["-h", "--help"]}
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings=_CONTEXT,
    help="Repack gpt-oss MXFP4 checkpoints into the exact weight layouts each GPU's kernels want.",
)
SUBCOMMANDS = {"convert", "inspect", "targets", "verify", "make-fixture", "kernels", "eval", "push"}
kernels_app = typer.Typer(
    no_args_is_help=True, context_settings=_CONTEXT, help="mxrepack's Triton kernels: build proofs."
)
app.add_typer(kernels_app, name="kernels")
eval_app = typer.Typer(
    no_args_is_help=True,
    context_settings=_CONTEXT,
    help="Evidence: logit fidelity, GPQA-style accuracy, regression gate, report.",
)
app.add_typer(eval_app, name="eval")
INTERRUPTED = "error: interrupted; nothing was written to the output path"


def _parse_size(text: str) -> int:
    units = {
        "": 1,
        "B": 1,
        "K": 10**3,
        "KB": 10**3,
        "M": 10**6,
        "MB": 10**6,
        "G": 10**9,
        "GB": 10**9,
        "KIB": 2**10,
        "MIB": 2**20,
        "GIB": 2**30,
    }
    t = text.strip().upper()
    num = t.rstrip("KMGIB")
    try:
        size = int(float(num) * units[t[len(num) :]])
    except (KeyError, ValueError, OverflowError):  # OverflowError: inf
        size = 0
    if size <= 0:  # 0 or less made one file per tensor
        raise MxRepackError(f"--shard-size {text!r}: expected a positive size like 5GB, 500MB or 2GiB")
    return size


def _emit(data: dict, as_json: bool, human: str) -> None:
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        typer.echo(human)


def _print_version(value: bool) -> None:
    if value:
        import mxrepack

        typer.echo(f"mxrepack {mxrepack.__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit"
    ),
) -> None:
    """Repack gpt-oss MXFP4 checkpoints into the exact weight layouts each GPU's kernels want."""


@app.command("convert")
def convert(
    source: str = typer.Argument(
        ..., help="Checkpoint: local directory, Hub repo id (openai/gpt-oss-120b), or HF cache"
    ),
    target: Optional[str] = typer.Option(None, "--target", "-t", help="Target name (see `repack targets`)"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output directory (default: ./NAME-TARGET)"),
    recipe: Optional[Path] = typer.Option(None, "--recipe", help="A recipe YAML file instead of a built-in target"),
    revision: Optional[str] = typer.Option(None, "--revision", help="Hub revision (branch, tag or commit)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing output directory"),
    shard_size: str = typer.Option("5GB", "--shard-size", help="Maximum bytes per output shard"),
    no_source_hash: bool = typer.Option(False, "--no-source-hash", help="Skip the sha256 of local source files"),
    dense: Optional[str] = typer.Option(
        None, "--dense", help="Dense layers: mxfp4, mxfp8 or bf16 (default: the recipe's)"
    ),
    dense_layers: Optional[str] = typer.Option(
        None,
        "--dense-layers",
        help="Which dense layers, e.g. qkv,o,lm_head "
        "(keys: q,k,v,o,qkv,attn,lm_head,embed,router; module names; re:REGEX)",
    ),
    scale_rule: Optional[str] = typer.Option(None, "--scale-rule", help="ocp or compressed-tensors"),
    scale_search: Optional[bool] = typer.Option(
        None, "--scale-search/--no-scale-search", help="Try each group's scale one step up, keep the lower error"
    ),
    activations: Optional[Path] = typer.Option(
        None, "--activations", help="safetensors of recorded layer inputs for the error report"
    ),
    push_to_hub: Optional[str] = typer.Option(
        None, "--push-to-hub", help="Then upload the result to this Hub repo (ORG/NAME)"
    ),
    private: bool = typer.Option(False, "--private", help="With --push-to-hub: create the repo private"),
    allow_nonfinite: bool = typer.Option(
        False,
        "--allow-nonfinite",
        help="Write NaN/Inf found in tensors stored unquantized (router, norms, biases, BF16 dense) "
        "with a warning instead of refusing",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON"),
) -> None:
    """Convert SOURCE for a target GPU (the main job)."""
    from mxrepack.repack import readahead

    # Idle OpenMP workers sleep at once instead of spinning (libgomp reads this when torch loads it). The
    # pipeline's torch ops are short and run between hashing, reading and writing threads: on 2 cores the
    # spinning took ~3 core-seconds of 28 from them (docs/PERF_LOG.md, stop 15). A user's own setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    readahead.start(source, revision)  # the disk reads the first tensors while torch is imported
    from mxrepack.repack.pipeline import repack

    if target is None and recipe is None:
        raise MxRepackError("no target: pass --target NAME (see `repack targets`) or --recipe FILE")
    if target is not None and recipe is not None:
        raise MxRepackError(f"--target {target} and --recipe {recipe}: pass one (the recipe file names its own target)")
    if push_to_hub is not None:  # before the conversion, not after it (a 65 GB one takes minutes)
        from mxrepack.hub import check_repo_id, hub_token

        check_repo_id(push_to_hub, "--push-to-hub")
        hub_token()
    shard_bytes = _parse_size(shard_size)
    from mxrepack.progress import ProgressBar

    written: list[Path] = []  # the output path, the moment the verified output is in place
    uploading = False
    try:
        with ProgressBar("writing: output bytes", enabled=not as_json) as progress:
            result = repack(
                source,
                target,
                out,
                recipe_file=str(recipe) if recipe else None,
                revision=revision,
                overwrite=overwrite,
                shard_bytes=shard_bytes,
                hash_source=not no_source_hash,
                progress=progress,
                dense=dense,
                dense_layers=dense_layers,
                scale_rule=scale_rule,
                scale_search=scale_search,
                activations=activations,
                allow_nonfinite=allow_nonfinite,
                finished=written,
            )
        _report(result, as_json)
        if push_to_hub:
            from mxrepack.hub import plan_push, push

            uploading = True
            url = push(plan_push(result.out, push_to_hub, private))
            uploading = False
            typer.echo(f"pushed {result.out} to {url}", err=as_json)
    except KeyboardInterrupt:
        if not written:
            raise
        done = f"{written[0]} is complete and verified"
        if not uploading:
            raise OutputKept(f"interrupted after the output was written; {done}") from None
        again = (
            f"repack push {shlex.quote(str(written[0]))} --repo-id {shlex.quote(push_to_hub)}" + " --private" * private
        )
        raise OutputKept(f"interrupted during the upload to {push_to_hub}; {done} (`{again}` uploads it)") from None


class OutputKept(Exception):
    """An interrupt once the output was in place (verified before its rename): it stays, and the message says so
    where the plain interrupt's says that nothing was written. Exit status 130, as for any interrupt."""


def _report(result, as_json: bool) -> None:
    """The finished conversion's summary, its quantization error table and how to serve it."""
    from mxrepack.errors import load_json
    from mxrepack.serve.spec import serve_hint, serve_refusal

    s = result.summary()
    s["serve"] = serve_hint(
        result.out,
        result.expert_layout,
        result.quantization_config,
        result.expert_options,
        result.dense_format,
        result.dense_order,
        refusal=serve_refusal(load_json(Path(result.out) / "config.json", "config")),
    )
    for warning in s["warnings"]:
        typer.echo(f"warning: {warning}", err=True)
    if s["quantization_error"] and not as_json:
        from mxrepack.quant.dense import format_error_table

        typer.echo(format_error_table(s["quantization_error"]))
    human = (
        f"wrote {s['out']}: target {s['target']}, {s['tensors']} tensors in {s['files']} files, "
        f"{s['output_bytes'] / 1e9:.3f} GB from {s['source_bytes'] / 1e9:.3f} GB in {s['seconds']:.1f} s; "
        f"verified ({s['verify']['groups_compared']} groups re-derived from the source)\n" + "\n".join(s["serve"])
    )
    _emit(s, as_json, human)


@app.command("push")
def push_cmd(
    directory: Path = typer.Argument(..., help="An mxrepack output directory (its manifest must verify)"),
    repo_id: str = typer.Option(..., "--repo-id", help="ORG/NAME on the Hugging Face Hub"),
    private: bool = typer.Option(False, "--private", help="Create the repo private"),
    revision: Optional[str] = typer.Option(None, "--revision", help="Branch to push to (created if missing)"),
    commit_message: Optional[str] = typer.Option(None, "--commit-message", help="Commit message"),
    eval_results: Optional[list[Path]] = typer.Option(
        None, "--eval", help="`repack eval gpqa/logits` JSON for the card (repeatable)"
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the repo, files and card; no network"),
) -> None:
    """Upload a verified output directory with a generated model card (token: HF_TOKEN or `hf auth login`)."""
    from mxrepack.hub import plan_push, push

    plan = plan_push(directory, repo_id, private, revision, commit_message, eval_results or [])
    if dry_run:
        typer.echo(plan.describe())
        typer.echo("dry run: nothing was sent")
        return
    url = push(plan)
    typer.echo(f"pushed {directory} to {url} ({len(plan.files)} files)")


@app.command("inspect")
def inspect_cmd(
    path: str = typer.Argument(..., help="Checkpoint directory or Hub repo id"),
    as_json: bool = typer.Option(False, "--json", help="Print as JSON"),
) -> None:
    """What is in a checkpoint: format, config summary, bytes per component."""
    from mxrepack.repack.inspect import format_report, inspect_checkpoint

    report = inspect_checkpoint(path)
    _emit(report, as_json, format_report(report))


@app.command("targets")
def targets_cmd(as_json: bool = typer.Option(False, "--json", help="Print as JSON")) -> None:
    """List the built-in targets and what each produces."""
    from mxrepack.layouts import get_layout
    from mxrepack.recipes import list_recipes
    from mxrepack.serve.spec import RUN_HERE, serving

    rows = []
    for r in list_recipes():
        loads, kernel = serving(get_layout(r.expert_layout).name, r.quantization_config, r.expert_options)
        rows.append(
            {
                "target": r.name,
                "experts": r.expert_layout,
                "dense": r.dense_format,
                "description": r.description,
                "consumer": r.consumer,
                "vllm": loads,
                "moe_kernel": kernel,
                "run_here": RUN_HERE.get(r.name, ""),
            }
        )
    width = max(len(r["target"]) for r in rows)
    pad = " " * width
    human = "\n".join(
        f"{r['target']:<{width}}  {r['description']}\n{pad}  consumer: {r['consumer']}\n"
        f"{pad}  vLLM: {r['vllm']}\n{pad}  MoE kernel: {r['moe_kernel']}"
        + (f"\n{pad}  run here: {r['run_here']}" if r["run_here"] else "")
        for r in rows
    )
    _emit({"targets": rows}, as_json, human)


@app.command("verify")
def verify_cmd(
    directory: Path = typer.Argument(..., help="An mxrepack output directory"),
    no_source: bool = typer.Option(False, "--no-source", help="Skip the comparison with the source"),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON"),
) -> None:
    """Check checksums, index and headers, and re-derive a sample of tensors from the source if reachable."""
    from mxrepack.progress import ProgressBar
    from mxrepack.repack.verify import verify_dir

    with ProgressBar("verify", enabled=not as_json) as progress:
        report = verify_dir(directory, checksums=True, source=False if no_source else None, progress=progress)
    for warning in report.get("warnings", []):
        typer.echo(f"warning: {warning}", err=True)
    if report["ok"]:
        src = (
            f"{report['groups_compared']} groups match the source"
            if report["source_checked"]
            else "source not checked (unreachable or --no-source)"
        )
        _emit(
            report,
            as_json,
            f"ok: {directory}: {report['files']} files, {report['tensors']} tensors; checksums match; {src}",
        )
    else:
        if as_json:
            typer.echo(json.dumps(report, indent=2))
        raise MxRepackError(
            f"verify failed: {report['problems'][0]}"
            + (f" (and {len(report['problems']) - 1} more)" if len(report["problems"]) > 1 else "")
        )


@app.command("make-fixture")
def make_fixture_cmd(
    out: Path = typer.Argument(..., help="Directory to create"),
    preset: str = typer.Option("tiny", "--preset", help="tiny, 20b or 120b"),
    layers: Optional[int] = typer.Option(None, "--layers", help="Cut the depth to N layers"),
    seed: int = typer.Option(0, "--seed"),
    layout: str = typer.Option("hf", "--layout", help="hf (transformers names) or original (gpt-oss original/)"),
    overwrite: bool = typer.Option(False, "--overwrite"),
) -> None:
    """Write a synthetic gpt-oss checkpoint with the official names, dtypes and shapes."""
    from mxrepack.repack.fixture import make_fixture

    path = make_fixture(out, preset, layers, seed, layout, overwrite=overwrite)
    typer.echo(f"wrote {path} ({preset}, {layout} layout)")


@kernels_app.command("check")
def kernels_check_cmd(
    arch: Optional[list[int]] = typer.Option(
        None, "--arch", help="Compute capability to build for (repeatable): 90, 100, 120, 121; default all"
    ),
    kernel: Optional[list[str]] = typer.Option(None, "--kernel", help="Only this kernel (repeatable)"),
    jobs: Optional[int] = typer.Option(None, "--jobs", help="Parallel compiles (default: CPU count)"),
    as_json: bool = typer.Option(False, "--json", help="One JSON record per (kernel, config, arch)"),
) -> None:
    """AOT-compile every shipped kernel configuration (no GPU needed) and check sm_12x limits:
    shared memory <= 101376 bytes, no TMA in the PTX, native FP4 MMA on the W4A4 path."""
    import os

    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    from mxrepack.kernels.check import format_table, run_check

    try:
        records = run_check(arch or None, kernel or None, jobs)
    except ValueError as e:
        raise MxRepackError(str(e)) from None
    if as_json:
        typer.echo(json.dumps(records, indent=1))
    else:
        typer.echo(format_table(records))
    bad = [r for r in records if not r["ok"]]
    if bad:
        raise MxRepackError(
            f"kernels check: {len(bad)} of {len(records)} builds failed, first: "
            f"{bad[0]['kernel']} {bad[0]['config']} {bad[0]['mode']} {bad[0]['arch']}: {bad[0]['error']}"
        )
    if not as_json:
        typer.echo(f"ok: {len(records)} builds")


@eval_app.command("logits")
def eval_logits_cmd(
    reference: Path = typer.Argument(..., help="Reference checkpoint (source or mxrepack output)"),
    candidate: Path = typer.Argument(..., help="Candidate checkpoint"),
    text: Optional[Path] = typer.Option(
        None, "--text", help="Token set (text file) (default: REFERENCE/tasks/text.txt)"
    ),
    ctx: int = typer.Option(256, "--ctx", help="Tokens per window"),
    max_tokens: int = typer.Option(4096, "--max-tokens", help="Tokens of the text to use"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the result JSON here"),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON"),
) -> None:
    """KL divergence, top-1 agreement, perplexity delta and a first-token check, candidate vs reference."""
    from mxrepack.eval.logits import compare_logits
    from mxrepack.eval.results import check_result_path, write_json
    from mxrepack.progress import ProgressBar

    check_result_path(output)
    with ProgressBar("eval logits", enabled=not as_json, unit="count") as progress:
        r = compare_logits(reference, candidate, text, ctx, max_tokens, progress=progress)
    write_json(output, r)
    kl, ft = r["kl"], r["first_token"]
    human = (
        f"{r['tokens']} tokens: KL mean {kl['mean']:.3g} median {kl['median']:.3g} p99 {kl['p99']:.3g} "
        f"max {kl['max']:.3g}; "
        f"same top-1 {r['same_top']:.4f}; PPL {r['ppl']['reference']:.4f} -> {r['ppl']['candidate']:.4f} "
        f"(ratio {r['ppl']['ratio']:.4f}); first token {'ok' if ft['ok'] else 'MISMATCH'} ({ft['prompts']} prompts)"
    )
    _emit(r, as_json, human)


@eval_app.command("gpqa")
def eval_gpqa_cmd(
    base_url: Optional[str] = typer.Option(
        None, "--base-url", help="OpenAI-compatible server, e.g. http://localhost:8000/v1"
    ),
    model: Optional[str] = typer.Option(None, "--model", help="Model name on the server"),
    local: Optional[Path] = typer.Option(None, "--local", help="Run this checkpoint in process instead of a server"),
    data: Optional[Path] = typer.Option(
        None, "--data", help="CSV in the gpqa_diamond.csv format (default: the bundled tiny task, with a warning)"
    ),
    n_repeats: int = typer.Option(1, "--n-repeats", help="Repeat each question (gpt_oss.evals uses 8)"),
    num_examples: Optional[int] = typer.Option(None, "--num-examples", help="A random subset (needs --n-repeats 1)"),
    concurrency: int = typer.Option(8, "--concurrency", help="Requests in flight"),
    temperature: Optional[float] = typer.Option(
        None, "--temperature", help="Sampling temperature (default: 1.0 for servers, 0 (greedy) local)"
    ),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Completion token limit"),
    reasoning_effort: Optional[str] = typer.Option(None, "--reasoning-effort", help="low, medium or high (servers)"),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds per request"),
    retries: int = typer.Option(5, "--retries", help="Retries per request (exponential backoff)"),
    api_key: Optional[str] = typer.Option(
        None, "--api-key", envvar="OPENAI_API_KEY", help="Bearer token for the server"
    ),
    max_errors: str = typer.Option(
        "5%",
        "--max-errors",
        help="Failed requests (HTTP 400, or no answer after the retries) "
        "allowed, as a count (3) or a percentage of the requests (5%); more stop the run and "
        "exit 1. Failed requests are errors, not wrong answers: the score is over the answered ones",
    ),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the result JSON here"),
    as_json: bool = typer.Option(False, "--json", help="Print the result (without samples) as JSON"),
) -> None:
    """GPQA-style multiple choice with gpt_oss.evals' sampling, prompt and grading."""
    from mxrepack.eval.gpqa import LocalBackend, OpenAIChatBackend, allowed_errors, check_options, run_gpqa
    from mxrepack.eval.gpqa_format import build_samples, read_rows
    from mxrepack.eval.results import check_result_path, write_json
    from mxrepack.progress import ProgressBar

    allowed_errors(max_errors, 1)  # a malformed value fails before a model is loaded
    check_options(concurrency, temperature, max_tokens, timeout, retries)
    check_result_path(output)

    if (local is None) == (base_url is None):
        raise MxRepackError("pass exactly one of --base-url URL (with --model) or --local PATH")
    if local is not None:
        if reasoning_effort:  # it was dropped, and the result looked like one at that effort
            raise MxRepackError(
                f"--reasoning-effort {reasoning_effort}: for --base-url servers; --local renders the checkpoint's "
                "chat template without it"
            )
        require_folder(local)  # before the data is chosen by what it holds
        backend = None  # loaded once the data and the flags are known to be good
        default_data = local / "tasks" / "test.csv"
    else:
        if not model:
            raise MxRepackError("--base-url needs --model NAME (the served model's name; see GET /v1/models)")
        backend = OpenAIChatBackend(
            base_url,
            model,
            api_key,
            1.0 if temperature is None else temperature,
            max_tokens,
            reasoning_effort,
            timeout,
            retries,
        )
        default_data = None
    if data is None:
        from mxrepack.eval.bundled import bundled_model

        if default_data is not None and default_data.is_file():
            data = default_data
        else:  # a model other than one that ships its own tasks: scored on questions made for the tiny one
            data = bundled_model() / "tasks" / "test.csv"
            typer.echo(
                f"warning: no --data: scoring the bundled tiny task ({data}), written for the bundled tiny model, "
                "not GPQA; pass --data gpqa_diamond.csv to score GPQA",
                err=True,
            )
    questionable: list[str] = []
    build_samples(read_rows(data, questionable), n_repeats, num_examples)  # before a model loads or a request
    for warning in questionable:
        typer.echo(f"warning: {warning}", err=True)
    if backend is None:
        backend = LocalBackend(local, temperature or 0.0, max_tokens)
    else:
        backend.check_reachable()
    with ProgressBar("eval gpqa: requests", enabled=not as_json, unit="count") as progress:
        r = run_gpqa(backend, data, n_repeats, num_examples, concurrency, progress, max_errors)
    write_json(output, r)
    summary = {k: v for k, v in r.items() if k != "samples"}
    wrote = f"; wrote {output}" if output else ""
    if r["too_many_errors"]:  # no score line: a score over a few answers must not pass for the run's
        if as_json:
            typer.echo(json.dumps(summary, indent=2))
        stopped = f", {r['not_asked']} not sent" if r["not_asked"] else ""
        raise MxRepackError(
            f"eval gpqa: {r['errors']} of {r['n_requests']} requests failed (--max-errors {max_errors} "
            f"allows {r['max_errors']}{stopped}){wrote}; first: {r['first_error']}"
        )
    failed = f"; {r['errors']} failed requests not scored" if r["errors"] else ""
    _emit(
        summary,
        as_json,
        f"score {r['score']:.4f} +- {r['stderr']:.4f} (stderr) over {r['n_samples']} answered "
        f"samples{failed}; {r['requests_per_s']} requests/s{wrote}",
    )
    if r["errors"]:
        typer.echo(
            f"warning: {r['errors']} of {r['n_requests']} requests failed and are not scored; first: "
            f"{r['first_error']}",
            err=True,
        )


@eval_app.command("compare")
def eval_compare_cmd(
    baseline: Path = typer.Argument(..., help="Baseline `repack eval gpqa` JSON"),
    candidate: Path = typer.Argument(..., help="Candidate JSON"),
    z: float = typer.Option(1.96, "--z", help="Standard errors of the difference that a drop may reach"),
    tolerance: float = typer.Option(0.0, "--tolerance", help="Absolute drop allowed on top (vLLM CI: 0.05)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The regression gate: exit 1 when the candidate is worse than chance explains."""
    from mxrepack.errors import load_json
    from mxrepack.eval.gpqa import compare, require_score

    results = [load_json(path, "`repack eval gpqa` result") for path in (baseline, candidate)]
    for path, r in zip((baseline, candidate), results):
        require_score(r, str(path))  # named by file: a run with too many failed requests is no score to gate on
    g = compare(*results, z, tolerance, names=(str(baseline), str(candidate)))
    _emit(
        g,
        as_json,
        f"{'PASSED' if g['passed'] else 'FAILED'}: candidate {g['candidate']:.4f} vs baseline "
        f"{g['baseline']:.4f} (delta {g['delta']:+.4f}, allowed drop {g['allowed_drop']:.4f})",
    )
    if not g["passed"]:
        raise typer.Exit(1)


@eval_app.command("report")
def eval_report_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Directory for report.json/.md/.html"),
    model_dir: Optional[Path] = typer.Option(None, "--model", help="An mxrepack output (for its quantization error)"),
    gpqa: Optional[list[Path]] = typer.Option(None, "--gpqa", help="GPQA result JSON (repeatable; first = baseline)"),
    logits: Optional[Path] = typer.Option(None, "--logits", help="A `repack eval logits` JSON"),
) -> None:
    """A readable page of the evidence: tables plus plots."""
    from mxrepack.errors import load_json
    from mxrepack.eval.gpqa import comparable, compare, require_score
    from mxrepack.eval.report import build_report, check_report_folder, write_report

    if not (model_dir or gpqa or logits):  # it wrote a page with a heading and nothing under it
        raise MxRepackError("nothing to report: pass --model DIR, --gpqa RESULT or --logits RESULT")
    check_report_folder(out)  # before the inputs are read and the gate is run
    for path in gpqa or []:
        require_score(load_json(path, "`repack eval gpqa` result"), str(path))
    gate = None
    if gpqa and len(gpqa) >= 2:  # first against last
        first, last = (load_json(p, "`repack eval gpqa` result") for p in (gpqa[0], gpqa[-1]))
        try:  # runs no gate compares (other questions, or drawn another way) still go on the page side by side
            comparable(first, last, (str(gpqa[0]), str(gpqa[-1])))
        except MxRepackError as e:
            typer.echo(f"warning: no gate in the report: {e}", err=True)
        else:
            gate = compare(first, last, names=(str(gpqa[0]), str(gpqa[-1])))
    paths = write_report(build_report(model_dir, gpqa or [], logits, gate), out)
    typer.echo(f"wrote {paths['markdown']} and {paths['html']}")


@eval_app.command("serve")
def eval_serve_cmd(
    path: Path = typer.Argument(..., help="Checkpoint to serve (source or mxrepack output)"),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port"),
    name: str = typer.Option("local", "--name", help="Model name reported by /v1/models"),
) -> None:
    """Serve a checkpoint through the torch runner as an OpenAI-compatible chat endpoint."""
    from mxrepack.eval.local import LocalChatModel
    from mxrepack.eval.server import ChatServer

    if not 0 <= port <= 65535:
        raise MxRepackError(f"--port {port}: expected 0-65535")
    try:  # the port first: a taken one is said at once, not after the model has loaded
        server = ChatServer(None, name, host, port)
    except OSError as e:  # in use, not permitted, no such address
        raise MxRepackError(f"{host}:{port}: cannot listen ({e.strerror or e})") from None
    try:
        server.model = LocalChatModel(path)
    except BaseException:
        server.httpd.server_close()
        raise
    typer.echo(f"serving {path} at {server.base_url} (Ctrl-C to stop)")
    try:
        server.httpd.serve_forever()
    finally:
        server.httpd.server_close()


@eval_app.command("record-activations")
def eval_record_cmd(
    path: Path = typer.Argument(..., help="Checkpoint (source) to run"),
    out: Path = typer.Argument(..., help="safetensors file to write (weight name -> tokens x K)"),
    text: Optional[Path] = typer.Option(None, "--text", help="Text to run (default: PATH/tasks/text.txt)"),
    max_tokens: int = typer.Option(512, "--max-tokens"),
) -> None:
    """Record every Linear's input on a text, for `repack ... --activations` error reports."""
    from mxrepack.eval.local import LocalChatModel
    from mxrepack.eval.results import check_result_path, write_atomic

    if max_tokens < 1:  # 0 was an IndexError traceback; -1 silently dropped the text's last token
        raise MxRepackError(f"--max-tokens {max_tokens}: expected 1 or more")
    require_folder(path)  # named as the checkpoint it is, not as a missing text in it
    check_result_path(out)  # beside the checkpoint it reads, its tensors were read as the model's
    if text is not None and text.is_dir():
        raise MxRepackError(f"{text}: is a folder; expected a text file (--text)")
    text = text or path / "tasks" / "text.txt"
    if not text.is_file():  # before the model loads
        raise MxRepackError(f"{text}: no such text file; pass --text FILE")
    raw = read_text(text, "a text to run (--text)")
    if not raw:  # before the model loads
        raise MxRepackError(f"{text}: empty; expected a text to run (--text)")
    m = LocalChatModel(path)
    ids = m.tokenizer.encode(raw, add_special_tokens=False).ids[:max_tokens]
    if not ids:  # a text the tokenizer makes no token of: an IndexError traceback in the runner
        raise MxRepackError(f"{text}: no tokens; expected a text to run (--text)")
    import torch
    from safetensors.torch import save_file

    hidden: dict = {}
    m.runner.forward(torch.tensor(ids), hidden=hidden)
    tensors = {k: torch.cat(v).to(torch.bfloat16).contiguous() for k, v in hidden.items()}
    write_atomic(out, lambda tmp: save_file(tensors, str(tmp)))
    typer.echo(f"wrote {out}: {len(hidden)} layers x {len(ids)} tokens")


def main(argv: list[str] | None = None) -> int:
    as_program = argv is None  # the `repack` command itself, not a caller in this process (tests)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS:
        typo = _misspelled_subcommand(argv[0])
        if typo:
            typer.echo(
                f"error: unknown command {argv[0]!r}; did you mean {typo!r}? (a checkpoint to convert is a "
                "directory or a Hub id ORG/NAME)",
                err=True,
            )
            return 2
        argv.insert(0, "convert")
    # A file-size limit (RLIMIT_FSIZE) should surface as a write error, not kill the process.
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        rc = app(args=argv, prog_name="repack", standalone_mode=False)
        if rc == 130:  # typer turns KeyboardInterrupt (Ctrl-C, or SIGTERM / SIGHUP during a conversion) into 130
            typer.echo(INTERRUPTED, err=True)
            _exit_on_next_interrupt(as_program)
        if isinstance(rc, int):
            return rc
    except MxRepackError as e:
        typer.echo(f"error: {e}", err=True)
        return 1
    except OutputKept as e:
        typer.echo(f"error: {e}", err=True)
        _exit_on_next_interrupt(as_program)
        return 130
    except KeyboardInterrupt:
        typer.echo(INTERRUPTED, err=True)
        _exit_on_next_interrupt(as_program)
        return 130
    except Exception as e:  # usage errors
        usage, leave, abort = _click_exceptions()
        if isinstance(e, usage):
            e.show()
            return e.exit_code
        if isinstance(e, leave):
            return e.exit_code
        if isinstance(e, abort):
            typer.echo("error: aborted", err=True)
            return 130
        raise
    return 0


def _exit_on_next_interrupt(as_program: bool) -> None:
    """After an interrupt has been reported (and the conversion undone), another Ctrl-C exits at once with 130:
    pressed again while the interpreter shuts down (torch's finalizers), it printed a KeyboardInterrupt traceback
    under the one-line error."""
    if as_program and signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not one ignored (a `&` job)
        signal.signal(signal.SIGINT, lambda *_: os._exit(130))


def _misspelled_subcommand(word: str) -> str | None:
    """The subcommand ``word`` is a near miss of, when it cannot be a source (no such path, no ``/``)."""
    import difflib

    if "/" in word or Path(word).exists():
        return None
    close = difflib.get_close_matches(word, sorted(SUBCOMMANDS), n=1, cutoff=0.75)
    return close[0] if close else None


def _click_exceptions() -> tuple[tuple[type, ...], tuple[type, ...], tuple[type, ...]]:
    """(usage error, exit, abort) exception classes of every click the installed typer may raise from.

    typer >= 0.22 bundles its own copy of click (``typer._click``; Exit and Abort in ``typer.exceptions``),
    whose classes are not the ``click`` package's: a handler for one of them only lets the other's usage
    errors through as tracebacks. Older typers raise ``click``'s."""
    import importlib

    modules = []
    for name in ("click.exceptions", "typer._click.exceptions", "typer.exceptions", "typer"):
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            pass

    def classes(attr: str) -> tuple[type, ...]:
        return tuple({c for m in modules if isinstance(c := getattr(m, attr, None), type)})

    return classes("ClickException"), classes("Exit"), classes("Abort")


if __name__ == "__main__":
    sys.exit(main())
