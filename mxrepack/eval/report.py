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


def _bar_svg(title: str, labels: list[str], values: list[float], errors: list[float] | None = None,
             fmt: str = "{:.3f}", width: int = 640, bar_h: int = 18, log: bool = False) -> str:
    """A horizontal bar chart; ``errors`` draws +-error whiskers."""
    import math

    n = len(values)
    left, right, top = 260, 70, 30
    height = top + n * (bar_h + 6) + 20
    vmax = max([v + (errors[i] if errors else 0) for i, v in enumerate(values)] + [1e-12])
    span = width - left - right

    def x(v):
        if log:
            lo = math.log10(max(min(v for v in values if v > 0), 1e-12)) - 0.5 if any(v > 0 for v in values) else -12
            return left + span * max(0.0, (math.log10(max(v, 1e-12)) - lo) / (math.log10(vmax) - lo + 1e-12))
        return left + span * v / vmax

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
             f'<text x="{left}" y="18" font-size="13" font-weight="bold">{html.escape(title)}</text>']
    for i, (label, v) in enumerate(zip(labels, values)):
        y = top + i * (bar_h + 6)
        parts.append(f'<text x="{left - 6}" y="{y + bar_h - 5}" text-anchor="end">{html.escape(label[-40:])}</text>')
        parts.append(f'<rect x="{left}" y="{y}" width="{max(x(v) - left, 1):.1f}" height="{bar_h}" fill="#4c78a8"/>')
        if errors:
            e = errors[i]
            parts.append(f'<line x1="{x(max(v - e, 0)):.1f}" x2="{x(v + e):.1f}" y1="{y + bar_h / 2}" y2="{y + bar_h / 2}" stroke="#222" stroke-width="2"/>')
        parts.append(f'<text x="{x(v + (errors[i] if errors else 0)) + 4:.1f}" y="{y + bar_h - 5}">{fmt.format(v)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _hist_svg(title: str, edges: list[float], counts: list[int], width: int = 640, height: int = 220) -> str:
    left, bottom, top = 50, 40, 30
    n = len(counts)
    bw = (width - left - 20) / max(n, 1)
    cmax = max(counts + [1])
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="10">',
             f'<text x="{left}" y="18" font-size="13" font-weight="bold">{html.escape(title)}</text>']
    for i, c in enumerate(counts):
        h = (height - top - bottom) * c / cmax
        parts.append(f'<rect x="{left + i * bw:.1f}" y="{height - bottom - h:.1f}" width="{bw - 1:.1f}" height="{h:.1f}" fill="#f58518"/>')
        if i % 3 == 0:
            parts.append(f'<text x="{left + i * bw:.1f}" y="{height - bottom + 14}">{edges[i]:.0e}</text>')
    parts.append(f'<text x="{left}" y="{height - 8}">KL per token (log bins); max count {cmax}</text></svg>')
    return "\n".join(parts)


def build_report(model_dir: str | Path | None = None, gpqa: list[str | Path] = (), logits: str | Path | None = None,
                 gate: dict | None = None) -> dict:
    from mxrepack.repack.source import load_json
    from mxrepack.repack.verify import load_manifest

    report: dict = {"model": None, "quantization_error": {}, "gpqa": [], "logits": None, "gate": gate}
    if model_dir:
        manifest = load_manifest(Path(model_dir))
        report["model"] = {"path": str(model_dir), "target": manifest["target"]["name"],
                           "source": manifest["source"].get("repo_id") or manifest["source"].get("path"),
                           "tool": manifest["tool"]}
        report["quantization_error"] = manifest.get("quantization_error", {})
    for path in gpqa:
        r = load_json(Path(path), "`repack eval gpqa` result")
        report["gpqa"].append({"file": str(path), "label": Path(path).stem, "score": r["score"], "stderr": r["stderr"],
                               "n_samples": r["n_samples"], "backend": r.get("backend")})
    if logits:
        r = load_json(Path(logits), "`repack eval logits` result")
        report["logits"] = {k: r[k] for k in ("reference", "candidate", "tokens", "kl", "same_top", "ppl",
                                              "first_token", "per_position", "kl_histogram") if k in r}
    return report


def _plots(report: dict) -> dict[str, str]:
    plots = {}
    q = report["quantization_error"]
    if q:
        names = list(q)
        plots["quant_error"] = _bar_svg("Dense quantization error (relative Frobenius)", names,
                                        [q[n]["rel_fro"] for n in names], fmt="{:.4f}")
    if report["gpqa"]:
        g = report["gpqa"]
        plots["accuracy"] = _bar_svg("GPQA-style accuracy (bars: 95% interval)", [r["label"] for r in g],
                                     [r["score"] for r in g], [1.96 * r["stderr"] for r in g])
    if report["logits"] and "kl_histogram" in report["logits"]:
        h = report["logits"]["kl_histogram"]
        plots["kl_hist"] = _hist_svg("KL(reference || candidate) per token", h["edges"], h["counts"])
    return plots


def _markdown(report: dict, svg_names: dict[str, str]) -> str:
    lines = ["# mxrepack evaluation report", ""]
    m = report["model"]
    if m:
        lines += [f"Checkpoint `{m['path']}`: target **{m['target']}**, source `{m['source']}`, "
                  f"mxrepack {m['tool'].get('mxrepack')}.", ""]
    if report["gpqa"]:
        lines += ["## Accuracy (GPQA-style)", "", "| run | score | stderr | samples | backend |", "|---|---|---|---|---|"]
        lines += [f"| {r['label']} | {r['score']:.4f} | {r['stderr']:.4f} | {r['n_samples']} | {r['backend']} |" for r in report["gpqa"]]
        lines += ["", f"![accuracy]({svg_names['accuracy']})", ""]
    if report["gate"]:
        g = report["gate"]
        lines += ["## Regression gate", "", f"**{'PASSED' if g['passed'] else 'FAILED'}**: candidate {g['candidate']:.4f} vs "
                  f"baseline {g['baseline']:.4f} (delta {g['delta']:+.4f}; allowed drop {g['allowed_drop']:.4f} = "
                  f"{g['tolerance']} + {g['z']} x {g['stderr_diff']:.4f}). Rule: {g['rule']}.", ""]
    lg = report["logits"]
    if lg:
        kl = lg["kl"]
        lines += ["## Logit fidelity", "", f"{lg['tokens']} tokens. KL mean {kl['mean']:.3g}, median {kl['median']:.3g}, "
                  f"p99 {kl['p99']:.3g}, max {kl['max']:.3g}; same top-1 {lg['same_top']:.4f}; "
                  f"PPL {lg['ppl']['reference']:.4f} -> {lg['ppl']['candidate']:.4f} (ratio {lg['ppl']['ratio']:.4f}). "
                  f"First token: {'ok' if lg['first_token']['ok'] else 'MISMATCH'} "
                  f"(same top-1 {lg['first_token']['same_top']}, {lg['first_token']['prompts']} prompts).", ""]
        if "kl_hist" in svg_names:
            lines += [f"![KL histogram]({svg_names['kl_hist']})", ""]
    q = report["quantization_error"]
    if q:
        lines += ["## Dense quantization error", "", "| tensor | format | rel. Frobenius | SQNR dB | max abs | output rel. (random) | output rel. (recorded) |",
                  "|---|---|---|---|---|---|---|"]
        for n, r in q.items():
            rec = "-" if r.get("out_rel_recorded") is None else f"{r['out_rel_recorded']:.4f}"
            sq = "exact" if r.get("sqnr_db") is None else f"{r['sqnr_db']:.2f}"
            lines.append(f"| `{n}` | {r.get('format', '')} | {r['rel_fro']:.4f} | {sq} | {r['max_abs']:.3g} | {r['out_rel_random']:.4f} | {rec} |")
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
            out.append("<table><tr>" + "".join(f"<th>{_inline(c.strip())}</th>" for c in head) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{_inline(c.strip())}</td>" for c in r) + "</tr>" for r in body)
                       + "</table>")
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


def write_report(report: dict, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = _plots(report)
    names = {k: f"report_{k}.svg" for k in plots}
    for k, svg in plots.items():
        (out / names[k]).write_text(svg)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    md = _markdown(report, names)
    (out / "report.md").write_text(md)
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>mxrepack report</title><style>"
            "body{font-family:sans-serif;max-width:960px;margin:2em auto;line-height:1.4}"
            "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}"
            "th{background:#f3f3f3}code{background:#f6f6f6}</style></head><body>\n"
            + _markdown_to_html(md, {names[k]: svg for k, svg in plots.items()}) + "\n</body></html>\n")
    (out / "report.html").write_text(page)
    return {"json": out / "report.json", "markdown": out / "report.md", "html": out / "report.html"}
