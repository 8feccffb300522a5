"""Bad input to `repack eval ...` and `repack push --dry-run` (an audit's findings): each is one line naming the
file or flag and what was expected, before a model loads or a request is sent; no result file is left for a run
that did not happen; no file the user made is replaced."""

import json
import math
import socket

import pytest

from mxrepack.cli import main
from mxrepack.errors import MxRepackError
from mxrepack.eval.bundled import bundled_model
from mxrepack.eval.results import write_json

HEADER = "Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3\n"


@pytest.fixture
def refused(capsys):
    """``refused(argv)``: the CLI exits 1 with one ``error:`` line on stderr; returns the line without ``error: ``."""

    def check(argv) -> str:
        rc = main([str(a) for a in argv])
        err = capsys.readouterr().err
        assert rc == 1 and err.count("\n") == 1 and err.startswith("error: "), err
        return err[len("error: ") : -1]

    return check


@pytest.fixture
def no_model(monkeypatch):
    """Loading a checkpoint fails the test: the refusal must come before it."""
    import mxrepack.eval.gpqa
    import mxrepack.eval.local
    import mxrepack.eval.logits  # imported here, not under the patch: it would keep the stand-in for later tests

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(mxrepack.eval.local, "LocalChatModel", loaded)
    monkeypatch.setattr(mxrepack.eval.logits, "LocalChatModel", loaded)
    monkeypatch.setattr(mxrepack.eval.gpqa, "LocalBackend", loaded)


@pytest.fixture
def csv_file(tmp_path):
    def make(text: str, name: str = "q.csv", encoding: str = "utf-8"):
        path = tmp_path / name
        path.write_text(text, encoding=encoding)
        return path

    return make


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "flags, message",
    [
        # 0 sent no request, and the run failed as "0 of 0 requests failed" with a result file written
        (["--n-repeats", "0"], "--n-repeats 0: expected 1 or more"),
        (["--n-repeats", "-1"], "--n-repeats -1: expected 1 or more"),
        (["--concurrency", "0"], "--concurrency 0: expected 1 or more"),  # ran as 1, recorded as 0
        (["--concurrency", "-3"], "--concurrency -3: expected 1 or more"),
        (["--max-errors", "150%"], "--max-errors '150%': expected a percentage of the requests up to 100%"),
        (["--max-errors", "abc"], "--max-errors 'abc': expected a count (3) or a percentage"),
        (["--max-tokens", "0"], "--max-tokens 0: expected 1 or more"),  # was the default, silently
        (["--max-tokens", "-5"], "--max-tokens -5: expected 1 or more"),  # empty answers, graded wrong: 0.0
        (["--num-examples", "0"], "--num-examples 0: expected 1 to 3 (the rows of the CSV)"),  # was every row
        (["--num-examples", "10"], "--num-examples 10: expected 1 to 3"),  # a ValueError traceback
        (["--num-examples", "-1"], "--num-examples -1: expected 1 to 3"),
        (["--num-examples", "2", "--n-repeats", "2"], "--num-examples needs --n-repeats 1"),  # was after the load
        (["--temperature", "-1"], "--temperature -1.0: expected a finite number, 0 (greedy) or more"),
        (["--temperature", "nan"], "--temperature nan: expected a finite number, 0 (greedy) or more"),
        (["--timeout", "0"], "--timeout 0.0: expected a number of seconds above 0"),
        (["--retries", "-1"], "--retries -1: expected 0 or more"),  # sent nothing: "no answer after 0 attempts"
        # ignored by the local backend: the result passed for one at that effort
        (["--reasoning-effort", "high"], "--reasoning-effort high: for --base-url servers"),
    ],
)
def test_gpqa_flags_out_of_range_are_refused_before_the_model_loads(
    flags, message, refused, no_model, csv_file, tmp_path
):
    data = csv_file(HEADER + "q1,a,b,c,d\nq2,a,b,c,d\nq3,a,b,c,d\n")
    out = tmp_path / "r.json"
    assert refused(["eval", "gpqa", "--local", bundled_model(), "--data", data, *flags, "-o", out]).startswith(message)
    assert not out.exists()


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "q.csv: empty; expected a CSV in the gpqa_diamond.csv format"),  # was "missing column(s) Question, ..."
        # a short row's missing cells were read as None: the prompt offered "(D) None"
        (HEADER + "q,a,b,c\n", "q.csv: line 2 has 4 fields where the header has 5; expected one cell per column"),
        (HEADER + "q,a,b,c,d,e\n", "q.csv: line 2 has 6 fields where the header has 5"),  # an unquoted comma
        (HEADER + 'q1,a,b,c,d\n"q,a,b,c,d\n', "q.csv: line 3 has 1 field where the header has 5"),  # open quote
        (HEADER + "q1,a,b,c,d\nq2,,b,c,d\n", "q.csv: line 3: 'Correct Answer' is empty; expected a question and"),
        # named by the line the row starts on, not the last of its quoted cell's lines
        (HEADER + '"q1\nmore\nlines",a,b,c\nq2,a,b,c,d\n', "q.csv: line 2 has 4 fields where the header has 5"),
        (HEADER, "q.csv: no rows"),
    ],
)
def test_gpqa_csv_rows_that_are_not_a_question_and_four_answers(text, message, refused, no_model, csv_file):
    data = csv_file(text)
    assert refused(["eval", "gpqa", "--local", bundled_model(), "--data", data]).startswith(f"{data.parent}/{message}")


def test_gpqa_csv_with_a_byte_order_mark_or_trailing_commas_is_read(csv_file):
    """A spreadsheet's UTF-8 byte order mark was "missing column(s) Question" for a file that has it."""
    from mxrepack.eval.gpqa_format import read_rows

    rows = read_rows(csv_file("\ufeff" + HEADER + "q,a,b,c,d,\n", encoding="utf-8"))
    assert rows[0]["Question"] == "q" and rows[0]["Incorrect Answer 3"] == "d"


def test_questionable_gpqa_rows_are_scored_with_a_warning(csv_file, tmp_path, capsys):
    """A repeated row and a correct answer that is also an incorrect one were scored silently."""
    from mxrepack.eval.gpqa_format import read_rows

    data = csv_file(HEADER + "Which is a digit?,5,k,V,Z\nq2,a,a,c,d\nWhich is a digit?,5,k,V,Z\nq2,a,b,c,d\n")
    warnings: list[str] = []
    assert len(read_rows(data, warnings)) == 4  # the same question with other options is no repeat
    assert warnings == [
        f"{data}: line 3: the correct answer is also an incorrect one; only its first option is graded correct",
        f"{data}: line 4 repeats line 2; both are scored",
    ]
    out = tmp_path / "r.json"
    assert main(["eval", "gpqa", "--local", str(bundled_model()), "--data", str(data), "-o", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"warning: {w}" for w in warnings]
    r = json.loads(out.read_text())  # how the answers were drawn, for the gate
    assert r["sampling"] == {"temperature": 0.0, "max_tokens": 64, "reasoning_effort": None}  # the runner's limit
    assert r["data"]["rows"] == 4 and len(r["data"]["sha256"]) == 64


@pytest.mark.parametrize(
    "url, message",
    [
        ("", "--base-url '': expected an http:// or https:// URL like http://localhost:8000/v1"),  # a traceback
        ("127.0.0.1:9/v1", "--base-url '127.0.0.1:9/v1': expected an http:// or https:// URL"),  # "unknown url type"
        ("http://[::1", "--base-url 'http://[::1': Invalid IPv6 URL; expected a URL like"),  # a traceback
        ("http://localhost:abc/v1", "--base-url 'http://localhost:abc/v1': Port could not be cast"),
    ],
)
def test_gpqa_base_url_that_is_no_url(url, message, refused, csv_file):
    data = csv_file(HEADER + "q,a,b,c,d\n")
    assert refused(["eval", "gpqa", "--base-url", url, "--model", "m", "--data", data]).startswith(message)


def test_gpqa_with_nothing_listening_says_so_at_once(refused, csv_file, tmp_path, monkeypatch):
    """Each request waited out its retries (31 s with the defaults), then "4 of 4 requests failed (--max-errors 5%
    allows 0)" with a result file of no answers."""
    import time

    for proxy in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    data, out, port = csv_file(HEADER + "q,a,b,c,d\n"), tmp_path / "r.json", _closed_port()
    url = f"http://127.0.0.1:{port}/v1"
    started = time.monotonic()
    message = refused(["eval", "gpqa", "--base-url", url, "--model", "m", "--data", data, "-o", out])
    assert message.startswith(f"--base-url {url}: nothing answers at 127.0.0.1:{port} (")
    assert message.endswith("start the server or check the URL")
    assert time.monotonic() - started < 5 and not out.exists()
    url = "http://no-such-host.invalid:8000/v1"  # a name that does not resolve is said to be one
    message = refused(["eval", "gpqa", "--base-url", url, "--model", "m", "--data", data, "-o", out])
    assert message.startswith(f"--base-url {url}: no such host no-such-host.invalid (")


def _gpqa(path, **fields):
    result = {"eval": "gpqa", "score": 0.7, "stderr": 0.02, "n_samples": 100, "n_repeats": 1} | fields
    path.write_text(json.dumps(result))
    return path


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"score": "0.7"}, "score '0.7'; expected a number from 0 to 1"),  # was a TypeError traceback
        ({"score": math.nan}, "score nan; expected a number from 0 to 1"),  # was "FAILED: candidate nan"
        ({"score": True}, "score True; expected a number from 0 to 1"),
        ({"score": 1.5}, "score 1.5; expected a number from 0 to 1"),
        ({"stderr": -0.1}, "stderr -0.1; expected a number from 0 to 1"),
        ({"stderr": math.inf}, "stderr inf; expected a number from 0 to 1"),  # passed every candidate
        ({"eval": "logits"}, "a `repack eval logits` result; expected `repack eval gpqa` output"),
        ({"score": None, "n_requests": 0, "errors": 0}, "no answered samples; not a score to gate on"),
    ],
)
def test_compare_refuses_a_result_that_is_no_score(fields, message, refused, tmp_path):
    base, cand = _gpqa(tmp_path / "b.json"), _gpqa(tmp_path / "c.json", **fields)
    assert refused(["eval", "compare", base, cand]).startswith(f"{cand}: {message}")


@pytest.mark.parametrize(
    "fields, message",
    [
        # the same questions answered another way: a greedy baseline against a sampled candidate, or one at low
        # reasoning effort against one at high
        (
            {"sampling": {"temperature": 0.0, "max_tokens": None, "reasoning_effort": None}},
            "ran with --temperature 0.0, where {b} ran with --temperature 1.0; expected the same --temperature "
            "(--local's default is 0 (greedy), --base-url's 1.0): run both the same way",
        ),
        (
            {"sampling": {"temperature": 1.0, "max_tokens": None, "reasoning_effort": "high"}},
            "ran with --reasoning-effort high, where {b} ran with no --reasoning-effort; expected the same "
            "--reasoning-effort (--local has none, --base-url's default is the server's): run both the same way",
        ),
    ],
)
def test_compare_refuses_runs_drawn_another_way(fields, message, refused, tmp_path, capsys):
    sampling = {"temperature": 1.0, "max_tokens": None, "reasoning_effort": None}
    base = _gpqa(tmp_path / "b.json", sampling=sampling)
    cand = _gpqa(tmp_path / "c.json", **({"sampling": sampling} | fields))
    assert refused(["eval", "compare", base, cand]) == f"{cand}: " + message.format(b=base)
    old = _gpqa(tmp_path / "old.json")  # written before results recorded how they were drawn: not checked
    assert main(["eval", "compare", str(base), str(old)]) == 0
    more = _gpqa(tmp_path / "more.json", sampling=sampling, n_repeats=8)  # more repeats: a smaller stderr, no more
    assert main(["eval", "compare", str(base), str(more)]) == 0
    capsys.readouterr()


def test_a_report_of_runs_no_gate_compares_has_no_gate(refused, tmp_path, capsys):
    """A greedy run beside a sampled one refused the whole page; it is written, without the gate, and says why."""
    sampling = {"temperature": 1.0, "max_tokens": None, "reasoning_effort": None}
    base = _gpqa(tmp_path / "b.json", sampling=sampling)
    cand = _gpqa(tmp_path / "c.json", sampling=sampling | {"temperature": 0.0})
    assert main(["eval", "report", "--out", str(tmp_path / "rep"), "--gpqa", str(base), "--gpqa", str(cand)]) == 0
    assert "warning: no gate in the report: " in capsys.readouterr().err
    assert json.loads((tmp_path / "rep" / "report.json").read_text())["gate"] is None


@pytest.mark.parametrize(
    "flags",
    [["--tolerance", "nan"], ["--tolerance", "inf"], ["--z", "nan"]],  # NaN failed every candidate, inf passed all
)
def test_compare_refuses_a_margin_that_is_no_number(flags, refused, tmp_path):
    base = _gpqa(tmp_path / "b.json")
    assert refused(["eval", "compare", base, base, *flags]).endswith(": expected finite numbers")


def test_report_out_that_cannot_take_the_report(refused, tmp_path):
    gpqa = _gpqa(tmp_path / "g.json")
    afile = tmp_path / "afile"
    afile.write_text("mine")
    # were FileExistsError / NotADirectoryError tracebacks
    assert refused(["eval", "report", "--out", afile, "--gpqa", gpqa]) == (
        f"{afile}: is a file; expected a folder for the report (--out)"
    )
    assert refused(["eval", "report", "--out", afile / "sub", "--gpqa", gpqa]).startswith(
        f"{afile / 'sub'}: {afile} is a file, not a folder"
    )
    assert afile.read_text() == "mine"
    theirs = tmp_path / "notes"  # a report.md of the user's own was overwritten
    theirs.mkdir()
    (theirs / "report.md").write_text("my notes")
    assert refused(["eval", "report", "--out", theirs, "--gpqa", gpqa]) == (
        f"{theirs}: holds report.md, which no `repack eval report` wrote; write the report to another folder"
    )
    assert [p.name for p in theirs.iterdir()] == ["report.md"] and (theirs / "report.md").read_text() == "my notes"
    # wrote a page with a heading and nothing under it
    assert refused(["eval", "report", "--out", tmp_path / "r"]) == (
        "nothing to report: pass --model DIR, --gpqa RESULT or --logits RESULT"
    )
    assert not (tmp_path / "r").exists()


def test_report_into_a_folder_of_other_files(tmp_path, capsys):
    """A folder holding other files takes the report beside them; one holding recorded activations is no
    checkpoint (every report under it was refused as "inside a checkpoint")."""
    gpqa = _gpqa(tmp_path / "g.json")
    (tmp_path / "acts.safetensors").write_bytes(b"\x00" * 8)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("kept")
    assert main(["eval", "report", "--out", str(mine), "--gpqa", str(gpqa)]) == 0
    assert (mine / "notes.txt").read_text() == "kept" and (mine / "report.html").is_file()
    assert main(["eval", "report", "--out", str(mine), "--gpqa", str(gpqa)]) == 0  # its own report, replaced
    capsys.readouterr()


def test_report_refuses_another_commands_result(refused, tmp_path):
    gpqa = _gpqa(tmp_path / "g.json")
    logits = tmp_path / "l.json"
    logits.write_text(json.dumps({"eval": "logits", "tokens": 10, "kl": {"mean": 0.1}}))
    out = tmp_path / "rep"
    # a gpqa result as --logits made a report without its logits section, silently
    assert refused(["eval", "report", "--out", out, "--logits", gpqa]) == (
        f"{gpqa}: a `repack eval gpqa` result; expected `repack eval logits` output"
    )
    assert refused(["eval", "report", "--out", out, "--gpqa", logits]) == (
        f"{logits}: a `repack eval logits` result; expected `repack eval gpqa` output"
    )
    assert refused(["eval", "report", "--out", out, "--logits", logits]) == (  # was a KeyError traceback
        f"{logits}: no kl.median; expected `repack eval logits` output"
    )
    no_samples = tmp_path / "n.json"
    no_samples.write_text(json.dumps({"score": 0.5, "stderr": 0.1}))  # was a KeyError traceback
    assert main(["eval", "report", "--out", str(out), "--gpqa", str(no_samples)]) == 0
    assert "| n | 0.5000 | 0.1000 | None |" in (out / "report.md").read_text()


def test_a_report_that_fails_leaves_no_files(tmp_path, monkeypatch):
    """Plots and report.json were written before the Markdown and HTML were rendered, one file after another."""
    import os

    import mxrepack.eval.report as report_module
    from mxrepack.eval.report import build_report, write_report

    report = build_report(gpqa=[_gpqa(tmp_path / "g.json")])

    def broken(*args):
        raise RuntimeError("rendering failed")

    with monkeypatch.context() as m:
        m.setattr(report_module, "_markdown_to_html", broken)
        with pytest.raises(RuntimeError):
            write_report(report, tmp_path / "rep")
    assert not (tmp_path / "rep").exists()
    replace, calls = os.replace, []

    def disk_full(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        replace(src, dst)

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(MxRepackError, match=r"rep: cannot write the report \(No space left on device\)"):
        write_report(report, tmp_path / "rep")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json"]


def test_logits_text_that_is_blank_or_a_folder(refused, no_model, tmp_path):
    src = bundled_model()
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n\n")  # scored 2 newlines and said "first token ok" over no prompt
    assert refused(["eval", "logits", src, src, "--text", blank]) == (
        f"{blank}: empty or only whitespace; expected a text to score (--text)"
    )
    assert refused(["eval", "logits", src, src, "--text", tmp_path]) == (
        f"{tmp_path}: is a folder; expected a text file (--text)"
    )


@pytest.mark.parametrize("max_tokens", ["0", "-1"])  # 0: an IndexError traceback; -1 dropped the last token
def test_record_activations_max_tokens_out_of_range(max_tokens, refused, no_model, tmp_path):
    out = tmp_path / "a.safetensors"
    args = ["eval", "record-activations", bundled_model(), out, "--max-tokens", max_tokens]
    assert refused(args) == f"--max-tokens {max_tokens}: expected 1 or more" and not out.exists()


def test_record_activations_text_that_is_empty_or_a_folder(refused, no_model, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")  # was an IndexError traceback, after the model loaded
    out = tmp_path / "a.safetensors"
    assert refused(["eval", "record-activations", bundled_model(), out, "--text", empty]) == (
        f"{empty}: empty; expected a text to run (--text)"
    )
    assert refused(["eval", "record-activations", bundled_model(), out, "--text", tmp_path]) == (
        f"{tmp_path}: is a folder; expected a text file (--text)"
    )


def test_results_are_not_written_into_a_checkpoint(refused, no_model, tiny, tmp_path):
    """Recorded activations written into the checkpoint they came from were read as its weights (conversion and
    eval then refused it: "tensor 'lm_head.weight' is also in acts.safetensors"); a result inside an output made
    `repack verify` and `push` refuse the output."""
    import shutil

    from mxrepack.repack.pipeline import repack

    model = tmp_path / "model"
    shutil.copytree(bundled_model(), model)
    before = sorted(p.name for p in model.iterdir())
    acts = model / "acts.safetensors"
    assert refused(["eval", "record-activations", model, acts]) == (
        f"{acts}: inside the checkpoint {model.resolve()} (its config.json); write the result elsewhere"
    )
    project = tmp_path / "project"  # another tool's config.json: no checkpoint
    project.mkdir()
    (project / "config.json").write_text('{"lint": true}')
    write_json(project / "r.json", {})
    assert sorted(p.name for p in model.iterdir()) == before
    out = repack(str(tiny), "mxfp4", tmp_path / "out").out
    for result in (out / "gpqa.json", out / "evals" / "gpqa.json"):
        message = refused(["eval", "gpqa", "--local", model, "-o", result])
        assert message == f"{result}: inside the mxrepack output {out.resolve()}; write the result elsewhere"
        message = refused(["eval", "logits", model, model, "-o", result])
        assert message.startswith(f"{result}: inside the mxrepack output {out.resolve()}")
    assert not (out / "evals").exists()
    (out.parent / "elsewhere").mkdir()
    write_json(out / ".." / "elsewhere" / "r.json", {})  # '..' resolved: not inside the output


@pytest.fixture(scope="module")
def output(tiny, tmp_path_factory):
    from mxrepack.repack.pipeline import repack

    return repack(str(tiny), "mxfp4", tmp_path_factory.mktemp("out") / "out").out


@pytest.mark.parametrize(
    "repo_id, reason",
    [
        ("me/", "Repo id must use alphanumeric chars"),
        ("me/x y", "Repo id must use alphanumeric chars"),
        ("me/x--y", "Cannot have -- or .. in repo_id"),
        ("me/x.git", "Repo_id cannot end by '.git'"),
    ],
)
def test_push_dry_run_refuses_a_repo_id_the_hub_refuses(repo_id, reason, refused, output):
    """The dry run passed it; the push then failed at the Hub, after verifying the whole output."""
    message = refused(["push", output, "--repo-id", repo_id, "--dry-run"])
    assert message.startswith(f"--repo-id {repo_id!r}: expected ORG/NAME as the Hub takes it ({reason}")


def test_push_to_hub_refuses_a_repo_id_the_hub_refuses_before_converting(tiny, tmp_path, refused):
    """The conversion ran first (minutes for a whole model), then the upload failed on the repo id."""
    out = tmp_path / "out"
    message = refused([tiny, "--target", "mxfp4", "--out", out, "--push-to-hub", "me/x y"])
    assert message.startswith("--push-to-hub 'me/x y': expected ORG/NAME as the Hub takes it") and not out.exists()


@pytest.mark.parametrize(
    "result, message",
    [  # each was a KeyError or TypeError traceback
        (
            {"eval": "gpqa", "score": 0.5, "stderr": 0.1},
            "no data.path (or not of its kind); expected the file `repack eval gpqa -o` wrote",
        ),
        ({"eval": "logits"}, "no kl.mean; expected `repack eval logits` output"),
        (
            {"eval": "logits", "kl": {"mean": "x"}, "same_top": 1.0, "tokens": 3, "text": "t"},
            "kl.mean is 'x'; expected a number, as `repack eval logits` writes",
        ),
    ],
)
def test_push_dry_run_refuses_an_eval_result_it_cannot_put_on_the_card(result, message, refused, output, tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    assert refused(["push", output, "--repo-id", "me/x", "--dry-run", "--eval", path]) == f"{path}: {message}"
