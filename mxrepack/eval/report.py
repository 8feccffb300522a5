"""The evidence page: JSON plus Markdown and HTML with plots (inline SVG, no plotting library).

Inputs, each optional: an output directory (its manifest's per-tensor quantization error), GPQA
result JSONs (accuracy with 95% error bars), a logits comparison JSON (KL summary and histogram) and
a regression-gate result. ``repack eval report`` writes ``report.json``, ``report.md`` (+ the SVGs
beside it) and ``report.html`` (SVGs inline).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from mxrepack.errors import MxRepackError


def _nice_ticks(vmax: float, n: int = 5) -> list[float]:
    """0 and round steps (1, 2 or 5 x 10^k) up to at least ``vmax``: a linear axis's tick values."""
    import math

    if vmax <= 0:
        return [0.0, 1.0]
    raw = vmax / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(math.ceil(vmax / step - 1e-9)) + 1)]


def _tick_label(v: float) -> str:
    return f"{v:g}" if v == 0 or 1e-3 <= abs(v) < 1e4 else f"{v:.0e}"


def _bar_svg(
    title: str,
    labels: list[str],
    values: list[float],
    errors: list[float] | None = None,
    fmt: str = "{:.3f}",
    width: int = 640,
    bar_h: int = 18,
    log: bool = False,
    xlabel: str = "",
    ylabel: str = "",
) -> str:
    """A horizontal bar chart with axes: categories on the y axis (``ylabel``), values on a ticked x axis
    (``xlabel``, linear from 0 or log10); ``errors`` draws +-error whiskers."""
    import math

    n = len(values)
    left, right, top = 260, 70, 30
    axis_y = top + n * (bar_h + 6)  # the x axis, below the last bar
    height = axis_y + 44
    vmax = max([v + (errors[i] if errors else 0) for i, v in enumerate(values)] + [1e-12])
    span = width - left - right
    if log:
        lo = math.floor(math.log10(max(min([v for v in values if v > 0] or [1e-12]), 1e-12)))
        hi = max(math.ceil(math.log10(vmax)), lo + 1)
        ticks = [10.0**k for k in range(lo, hi + 1)]
    else:
        ticks = _nice_ticks(vmax)
        vmax = ticks[-1]

    def x(v):
        if log:
            return left + span * min(1.0, max(0.0, (math.log10(max(v, 1e-12)) - lo) / (hi - lo)))
        return left + span * v / vmax

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="18" font-size="13" font-weight="bold">{html.escape(title)}</text>',
    ]
    for t in ticks:  # grid and tick labels of the value axis
        parts.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top - 4}" y2="{axis_y + 4}" stroke="#ddd"/>')
        parts.append(f'<text x="{x(t):.1f}" y="{axis_y + 16}" text-anchor="middle">{_tick_label(t)}</text>')
    for i, (label, v) in enumerate(zip(labels, values)):
        y = top + i * (bar_h + 6)
        parts.append(f'<text x="{left - 6}" y="{y + bar_h - 5}" text-anchor="end">{html.escape(label[-40:])}</text>')
        parts.append(f'<rect x="{left}" y="{y}" width="{max(x(v) - left, 1):.1f}" height="{bar_h}" fill="#4c78a8"/>')
        if errors:
            e = errors[i]
            parts.append(
                f'<line x1="{x(max(v - e, 0)):.1f}" x2="{x(v + e):.1f}" y1="{y + bar_h / 2}" y2="{y + bar_h / 2}" '
                'stroke="#222" stroke-width="2"/>'
            )
        parts.append(
            f'<text x="{x(v + (errors[i] if errors else 0)) + 4:.1f}" y="{y + bar_h - 5}">{fmt.format(v)}</text>'
        )
    parts.append(f'<line class="axis" x1="{left}" x2="{left + span}" y1="{axis_y}" y2="{axis_y}" stroke="#333"/>')
    parts.append(f'<line class="axis" x1="{left}" x2="{left}" y1="{top - 4}" y2="{axis_y}" stroke="#333"/>')
    if xlabel:
        parts.append(
            f'<text class="xlabel" x="{left + span / 2:.1f}" y="{axis_y + 34}" text-anchor="middle">'
            f"{html.escape(xlabel)}</text>"
        )
    if ylabel:
        parts.append(
            f'<text class="ylabel" x="{left - 6}" y="{top - 8}" text-anchor="end" font-style="italic">'
            f"{html.escape(ylabel)}</text>"
        )
    parts.append("</svg>")
    return "\n".join(parts)


def _hist_svg(
    title: str,
    edges: list[float],
    counts: list[int],
    width: int = 640,
    height: int = 240,
    xlabel: str = "KL per token (log bins)",
    ylabel: str = "tokens",
) -> str:
    """A histogram with axes: bin edges on the x axis, counts on a ticked y axis."""
    left, right, bottom, top = 64, 20, 48, 30
    n = len(counts)
    bw = (width - left - right) / max(n, 1)
    ticks = _nice_ticks(max(counts + [1]))
    cmax = ticks[-1]
    plot_h = height - top - bottom
    base = height - bottom  # the x axis
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="10">',
        f'<text x="{left}" y="18" font-size="13" font-weight="bold">{html.escape(title)}</text>',
    ]
    for t in ticks:  # grid and tick labels of the count axis
        y = base - plot_h * t / cmax
        parts.append(f'<line x1="{left - 4}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 3:.1f}" text-anchor="end">{_tick_label(t)}</text>')
    for i, c in enumerate(counts):
        h = plot_h * c / cmax
        parts.append(
            f'<rect x="{left + i * bw:.1f}" y="{base - h:.1f}" width="{max(bw - 1, 0.5):.1f}" height="{h:.1f}" '
            'fill="#f58518"/>'
        )
    step = max(1, n // 8)  # edge labels: at most ~9, the last edge included
    for i in list(range(0, n + 1, step)) + ([n] if n % step else []):
        if i < len(edges):
            parts.append(
                f'<line x1="{left + i * bw:.1f}" x2="{left + i * bw:.1f}" y1="{base}" y2="{base + 4}" stroke="#333"/>'
            )
            parts.append(f'<text x="{left + i * bw:.1f}" y="{base + 15}" text-anchor="middle">{edges[i]:.0e}</text>')
    parts.append(f'<line class="axis" x1="{left}" x2="{width - right}" y1="{base}" y2="{base}" stroke="#333"/>')
    parts.append(f'<line class="axis" x1="{left}" x2="{left}" y1="{top - 4}" y2="{base}" stroke="#333"/>')
    parts.append(
        f'<text class="xlabel" x="{left + (width - left - right) / 2:.1f}" y="{height - 10}" text-anchor="middle">'
        f"{html.escape(xlabel)}</text>"
    )
    parts.append(
        f'<text class="ylabel" transform="translate(14 {top + plot_h / 2:.1f}) rotate(-90)" text-anchor="middle">'
        f"{html.escape(ylabel)}</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts)


def build_report(
    model_dir: str | Path | None = None,
    gpqa: list[str | Path] = (),
    logits: str | Path | None = None,
    gate: dict | None = None,
) -> dict:
    from mxrepack.errors import MxRepackError, load_json
    from mxrepack.repack.output import check_manifest_digest, load_manifest, manifest_fields_problem

    report: dict = {"model": None, "quantization_error": {}, "gpqa": [], "logits": None, "gate": gate}
    if model_dir:
        manifest = load_manifest(Path(model_dir))
        problem, _ = check_manifest_digest(Path(model_dir), manifest)  # its error figures go into the report
        problem = problem or manifest_fields_problem(Path(model_dir), manifest)
        if problem:
            raise MxRepackError(problem)
        report["model"] = {
            "path": str(model_dir),
            "target": manifest["target"]["name"],
            "source": manifest["source"].get("repo_id") or manifest["source"].get("path"),
            "tool": manifest.get("tool") or {},
        }
        report["quantization_error"] = manifest.get("quantization_error", {})
    from mxrepack.eval.gpqa import require_score
    from mxrepack.eval.results import require_logits

    for path in gpqa:
        r = load_json(Path(path), "`repack eval gpqa` result")
        require_score(r, str(path))
        report["gpqa"].append(
            {
                "file": str(path),
                "label": Path(path).stem,
                "score": r["score"],
                "stderr": r["stderr"],
                "n_samples": r.get("n_samples"),
                "backend": r.get("backend"),
            }
        )
    if logits:
        r = load_json(Path(logits), "`repack eval logits` result")
        require_logits(r, str(logits))
        report["logits"] = {
            k: r[k]
            for k in (
                "reference",
                "candidate",
                "tokens",
                "kl",
                "same_top",
                "ppl",
                "first_token",
                "per_position",
                "kl_histogram",
            )
            if k in r
        }
    return report


def _plots(report: dict) -> dict[str, str]:
    plots = {}
    q = report["quantization_error"]
    if q:
        names = list(q)
        plots["quant_error"] = _bar_svg(
            "Dense quantization error (relative Frobenius)",
            names,
            [q[n]["rel_fro"] for n in names],
            fmt="{:.4f}",
            xlabel="relative Frobenius error |W - Q(W)| / |W|",
            ylabel="tensor",
        )
    if report["gpqa"]:
        g = report["gpqa"]
        plots["accuracy"] = _bar_svg(
            "GPQA-style accuracy (bars: 95% interval)",
            [r["label"] for r in g],
            [r["score"] for r in g],
            [1.96 * r["stderr"] for r in g],
            xlabel="accuracy (fraction of samples correct)",
            ylabel="run",
        )
    if report["logits"] and "kl_histogram" in report["logits"]:
        h = report["logits"]["kl_histogram"]
        plots["kl_hist"] = _hist_svg("KL(reference || candidate) per token", h["edges"], h["counts"])
    return plots


def _markdown(report: dict, svg_names: dict[str, str]) -> str:
    lines = ["# mxrepack evaluation report", ""]
    m = report["model"]
    if m:
        lines += [
            f"Checkpoint `{m['path']}`: target **{m['target']}**, source `{m['source']}`, "
            f"mxrepack {m['tool'].get('mxrepack')}.",
            "",
        ]
    if report["gpqa"]:
        lines += [
            "## Accuracy (GPQA-style)",
            "",
            "| run | score | stderr | samples | backend |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['label']} | {r['score']:.4f} | {r['stderr']:.4f} | {r['n_samples']} | {r['backend']} |"
            for r in report["gpqa"]
        ]
        lines += ["", f"![accuracy]({svg_names['accuracy']})", ""]
    if report["gate"]:
        g = report["gate"]
        lines += [
            "## Regression gate",
            "",
            f"**{'PASSED' if g['passed'] else 'FAILED'}**: candidate {g['candidate']:.4f} vs "
            f"baseline {g['baseline']:.4f} (delta {g['delta']:+.4f}; allowed drop {g['allowed_drop']:.4f} = "
            f"{g['tolerance']} + {g['z']} x {g['stderr_diff']:.4f}). Rule: {g['rule']}.",
            "",
        ]
    lg = report["logits"]
    if lg:
        kl = lg["kl"]
        lines += [
            "## Logit fidelity",
            "",
            f"{lg['tokens']} tokens. KL mean {kl['mean']:.3g}, median {kl['median']:.3g}, "
            f"p99 {kl['p99']:.3g}, max {kl['max']:.3g}; same top-1 {lg['same_top']:.4f}; "
            f"PPL {lg['ppl']['reference']:.4f} -> {lg['ppl']['candidate']:.4f} (ratio {lg['ppl']['ratio']:.4f}). "
            f"First token: {'ok' if lg['first_token']['ok'] else 'MISMATCH'} "
            f"(same top-1 {lg['first_token']['same_top']}, {lg['first_token']['prompts']} prompts).",
            "",
        ]
        if "kl_hist" in svg_names:
            lines += [f"![KL histogram]({svg_names['kl_hist']})", ""]
    q = report["quantization_error"]
    if q:
        lines += [
            "## Dense quantization error",
            "",
            "| tensor | format | rel. Frobenius | SQNR dB | max abs | output rel. (random) | output rel. (recorded) |",
            "|---|---|---|---|---|---|---|",
        ]
        for n, r in q.items():
            rec = "-" if r.get("out_rel_recorded") is None else f"{r['out_rel_recorded']:.4f}"
            sq = "exact" if r.get("sqnr_db") is None else f"{r['sqnr_db']:.2f}"
            lines.append(
                f"| `{n}` | {r.get('format', '')} | {r['rel_fro']:.4f} | {sq} | {r['max_abs']:.3g} | "
                f"{r['out_rel_random']:.4f} | {rec} |"
            )
        lines += ["", f"![quantization error]({svg_names['quant_error']})", ""]
    return "\n".join(lines) + "\n"


def _inline(text: str) -> str:
    import re

    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def _markdown_to_html(md: str, images: dict[str, str]) -> str:
    """The small Markdown subset report.md uses: headings, tables, image lines (inlined SVG), paragraphs."""
    import re

    out, table = [], []

    def flush():
        if table:
            rows = [r.strip().strip("|").split("|") for r in table if not re.fullmatch(r"\|[-| ]+\|", r.strip())]
            head, body = rows[0], rows[1:]
            out.append(
                "<table><tr>"
                + "".join(f"<th>{_inline(c.strip())}</th>" for c in head)
                + "</tr>"
                + "".join("<tr>" + "".join(f"<td>{_inline(c.strip())}</td>" for c in r) + "</tr>" for r in body)
                + "</table>"
            )
            table.clear()

    for line in md.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        image = re.fullmatch(r"!\[.*\]\((.+)\)", line.strip())
        if image and image.group(1) in images:
            out.append(images[image.group(1)])
        elif line.startswith("## "):
            out.append(f"<h2>{_inline(line[3:])}</h2>")
        elif line.startswith("# "):
            out.append(f"<h1>{_inline(line[2:])}</h1>")
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
    flush()
    return "\n".join(out)


REPORT_FILES = ("report.json", "report.md", "report.html")


def check_report_folder(out_dir: str | Path) -> None:
    """Refuse, before any work, a report folder that cannot take the report: a file, a path under a file, a
    checkpoint folder or one inside it (files added to a model or an mxrepack output would travel with it: `repack
    verify` and `push` refuse an output holding files its manifest does not list), or a folder holding a
    report.json/.md/.html or report_*.svg that no `repack eval report` wrote (it was overwritten)."""
    from mxrepack.errors import file_in_the_way
    from mxrepack.eval.results import inside_checkpoint

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise MxRepackError(f"{out}: is a file; expected a folder for the report (--out)")
    blocking = file_in_the_way(out)
    if blocking is not None:
        raise MxRepackError(f"{out}: {blocking} is a file, not a folder; expected a folder for the report (--out)")
    where = inside_checkpoint(out / "report.json")  # the folder itself, or one above it (out/report in an output)
    if where:
        raise MxRepackError(f"{out}: {where}; write the report elsewhere")
    if not out.is_dir() or _is_report(out / "report.json"):
        return
    theirs = [out / n for n in REPORT_FILES if (out / n).exists()] + sorted(out.glob("report_*.svg"))
    if theirs:
        raise MxRepackError(
            f"{out}: holds {theirs[0].name}, which no `repack eval report` wrote; write the report to another folder"
        )


def _is_report(path: Path) -> bool:
    from mxrepack.eval.results import json_keys

    return {"model", "quantization_error", "gpqa", "logits", "gate"} <= json_keys(path)


def write_report(report: dict, out_dir: str | Path) -> dict[str, Path]:
    """Write the report's JSON, Markdown, HTML and plots into ``out_dir`` (a previous report's files there are
    replaced; :func:`check_report_folder` says what is refused). Everything is rendered before the first file is
    written, and each file is renamed into place: a failure leaves no half-written report."""
    import os
    import shutil

    out = Path(out_dir)
    check_report_folder(out)
    plots = _plots(report)
    names = {k: f"report_{k}.svg" for k in plots}
    md = _markdown(report, names)
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>mxrepack report</title><style>"
        "body{font-family:sans-serif;max-width:960px;margin:2em auto;line-height:1.4}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}"
        "th{background:#f3f3f3}code{background:#f6f6f6}</style></head><body>\n"
        + _markdown_to_html(md, {names[k]: svg for k, svg in plots.items()})
        + "\n</body></html>\n"
    )
    # report.json first: it marks the folder as a report's, whose files a later report may replace
    files = {"report.json": json.dumps(report, indent=2) + "\n", "report.md": md, "report.html": page}
    files |= {names[k]: svg for k, svg in plots.items()}
    fresh = not out.exists()  # a new folder is made beside it and renamed into place whole
    folder = out.parent / f".{out.name}.tmp-{os.getpid()}" if fresh else out
    made = False  # only a folder this call made is removed after a failure
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir(exist_ok=not fresh)
        made = fresh
        for name, text in files.items():
            tmp = folder / f".{name}.tmp-{os.getpid()}"
            try:
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, folder / name)
            finally:
                tmp.unlink(missing_ok=True)
        if fresh:
            os.rename(folder, out)
    except OSError as e:
        raise MxRepackError(f"{out}: cannot write the report ({e.strerror or e})") from None
    finally:
        if made and folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
    return {"json": out / "report.json", "markdown": out / "report.md", "html": out / "report.html"}
