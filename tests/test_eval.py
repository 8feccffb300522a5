"""The reference runner, the GPQA harness (local and over real HTTP), logits comparison, gate, report."""

import json
import random
import re
import shutil
import socket

import pytest
import torch

from mxrepack.errors import MxRepackError
from mxrepack.eval.gpqa import OpenAIChatBackend, compare, run_gpqa
from mxrepack.eval.gpqa_format import INSTRUCTION, build_samples, extract_letter, format_prompt
from mxrepack.eval.model import KVCache, load_runner, load_weights
from mxrepack.recipes import builtin_names, load_recipe


def test_runner_logits_equal_transformers(tiny):
    from transformers import GptOssForCausalLM, Mxfp4Config

    ref = GptOssForCausalLM.from_pretrained(
        str(tiny), quantization_config=Mxfp4Config(dequantize=True), dtype=torch.float32, attn_implementation="eager"
    )
    runner = load_runner(tiny)
    ids = torch.randint(0, 512, (40,))  # longer than the sliding window (8): both attention kinds matter
    with torch.no_grad():
        want = ref(ids[None]).logits[0]
    got = runner.forward(ids)
    # Same fp32 math in a different order (head-batched matmuls, expert loop): rounding-level
    # differences only; 1e-5 of the logit scale (~1.4) leaves three orders of margin.
    assert (got - want).abs().max() < 1e-5 * want.abs().max().clamp(min=1)
    cache = KVCache(runner.d.layers)
    stepwise = torch.cat(
        [runner.forward(ids[:25], cache), runner.forward(ids[25:31], cache), runner.forward(ids[31:], cache)]
    )
    assert (stepwise - got).abs().max() < 1e-5


@pytest.mark.parametrize("target", builtin_names())
def test_runner_reads_every_target_through_its_inverse(tiny, tmp_path, target):
    """Exact logits through every target's expert layout (dense layers kept BF16 here: a quantized dense target
    is compared within a tolerance in the next test)."""
    from mxrepack.repack.pipeline import repack

    dense = "bf16" if load_recipe(target).dense_layout is not None else None
    out = repack(str(tiny), target, tmp_path / target, dense=dense).out
    ids = torch.randint(0, 512, (12,))
    assert torch.equal(load_runner(out).forward(ids), load_runner(tiny).forward(ids))


def test_runner_on_quantized_dense_target_is_close(tiny, tmp_path):
    from mxrepack.repack.pipeline import repack

    out = repack(str(tiny), "sm121", tmp_path / "sm121").out
    w = load_weights(out)
    assert "lm_head.weight" in w.mx and w.mx["lm_head.weight"][0] == "mxfp4"
    ids = torch.randint(0, 512, (12,), generator=torch.Generator().manual_seed(0))
    a, b = load_runner(tiny).forward(ids), load_runner(out).forward(ids)
    # Random weights: each of the 9 MXFP4 matrices on the path adds ~11% relative error and they
    # compound, and near-tied routers flip (over 200 random prompts: median 0.40, max 0.70); a
    # scrambled layout would be uncorrelated (~1.4). The trained model's KL test below is the
    # meaningful accuracy check.
    assert not torch.equal(a, b) and (a - b).norm() / a.norm() < 0.9


def test_triton_fast_path_matches_reference(tiny, tmp_path):
    from mxrepack.repack.pipeline import repack

    out = repack(str(tiny), "sm121", tmp_path / "sm121").out
    ref, fast = load_runner(out), load_runner(out, use_kernels=True)  # Triton interpreter in CI
    ids = torch.tensor([172, 47, 117, 192, 323, 251])
    inputs: dict = {}
    want = ref.forward(ids, hidden=inputs)

    def rel(a, b):
        return ((a - b).norm() / b.norm()).item()

    # The kernels op by op on identical inputs. End to end, a bf16 rounding upstream can flip the
    # router between two near-tied experts (seen: logits -0.0335 vs -0.0337) and give one token a
    # different expert set; on the same input both paths route alike and only kernel error remains.
    linears = [w for w in inputs if w in fast.mx]
    assert "lm_head.weight" in linears and len(linears) > 4
    for w in linears:
        for x in inputs[w]:
            assert rel(fast.linear(x, w[: -len(".weight")]), ref.linear(x, w[: -len(".weight")])) < 2e-2, w
    for layer in range(ref.d.layers):
        h = inputs[f"model.layers.{layer}.mlp.router.weight"][0]
        assert rel(fast.moe(layer, h), ref.moe(layer, h)) < 2e-2, layer
    # bf16 activations into the kernels vs the fp32 reference: ~1e-2 relative (these tokens' router
    # margins are wide; the op-by-op checks above do not depend on that)
    assert rel(fast.forward(ids), want) < 3e-2


def test_gpqa_sampling_prompt_and_grading_follow_gpt_oss_evals():
    rows = [
        {
            "Question": f"Q{i}?",
            "Correct Answer": f"right{i}",
            "Incorrect Answer 1": f"w{i}a",
            "Incorrect Answer 2": f"w{i}b",
            "Incorrect Answer 3": f"w{i}c",
        }
        for i in range(3)
    ]
    samples = build_samples(rows, n_repeats=2)
    # Documented: one Random(0); rows repeated in order; each sample draws sample(range(4), 4) in turn.
    rng = random.Random(0)
    for s, row in zip(samples, rows * 2):
        perm = rng.sample(range(4), 4)
        base = [row["Correct Answer"], row["Incorrect Answer 1"], row["Incorrect Answer 2"], row["Incorrect Answer 3"]]
        choices = [base[p] for p in perm]
        assert s.answer == "ABCD"[choices.index(row["Correct Answer"])]
        assert s.prompt == (
            f"{row['Question']}\n\n(A) {choices[0]}\n(B) {choices[1]}\n(C) {choices[2]}\n(D) {choices[3]}\n\n"
            "Express your final answer as the corresponding option 'A', 'B', 'C', or 'D'."
        )
    assert format_prompt("Q", list("wxyz")).endswith(INSTRUCTION)
    canned = {
        "Answer: C": "C",
        "**Answer:** B": "B",
        "answer: d": "D",
        "The final Answer: (A)": "A",
        "I pick Option C.": "C",
        "It is \\boxed{B}.": "B",
        "So (D) it is.": "D",
        "clearly **A**": "A",
        "\\textbf{C} wins": "C",
        "**D) forty-two**": "D",
        "B. because": "B",
        # earlier rungs win over later ones, whatever the order in the text:
        "(A) looks tempting but Answer: B": "B",
        "(A) or \\boxed{C}": "C",
        # nothing matches: the first character (after a leading **), even if it is no letter
        "I am not sure": "I",
        "**maybe": "m",
        "": "",
    }
    for text, letter in canned.items():
        assert extract_letter(text) == letter, text


@pytest.fixture(scope="module")
def served_tiny(tmp_path_factory):
    """The bundled trained model behind a real HTTP server on localhost."""
    from mxrepack.eval.bundled import bundled_model
    from mxrepack.eval.local import LocalChatModel

    return LocalChatModel(bundled_model())


def _small_csv(tmp_path, n=12):
    from mxrepack.eval.bundled import bundled_model
    from mxrepack.eval.gpqa_format import read_rows
    from mxrepack.eval.tinytask import write_csv

    path = tmp_path / "small.csv"
    write_csv(read_rows(bundled_model() / "tasks" / "test.csv")[:n], path)
    return path


def test_gpqa_over_http_equals_local_and_survives_faults(served_tiny, tmp_path):
    from mxrepack.eval.gpqa import LocalBackend
    from mxrepack.eval.server import ChatServer

    data = _small_csv(tmp_path)
    local = run_gpqa(LocalBackend(model=served_tiny), data, concurrency=1)
    with ChatServer(served_tiny, "tiny") as server:
        remote = run_gpqa(OpenAIChatBackend(server.base_url, "tiny", temperature=0.0, timeout=30), data, concurrency=4)
    assert [s["response"] for s in remote["samples"]] == [s["response"] for s in local["samples"]]
    assert remote["score"] == local["score"] and remote["n_samples"] == 12 and remote["requests_per_s"] > 0
    for s in remote["samples"]:
        assert set(s) >= {"prompt", "response", "extracted", "answer", "correct"}
    for fault in ({"error_every": 2}, {"drop_every": 3}):
        with ChatServer(served_tiny, "tiny", fault=fault) as server:
            backend = OpenAIChatBackend(server.base_url, "tiny", temperature=0.0, timeout=30, retries=3, backoff=0.01)
            r = run_gpqa(backend, data, concurrency=3)
        assert [s["response"] for s in r["samples"]] == [s["response"] for s in local["samples"]], fault
        assert backend.attempts > 12  # the failures were retried


def test_gpqa_http_timeouts_and_dead_servers_are_one_line_errors(served_tiny, tmp_path):
    from mxrepack.eval.server import ChatServer

    with ChatServer(served_tiny, "tiny", fault={"delay": 1.0}) as server:
        backend = OpenAIChatBackend(server.base_url, "tiny", timeout=0.2, retries=1, backoff=0.01)
        with pytest.raises(MxRepackError, match=r"no answer after 2 attempts \(last: .*timed out"):
            backend.complete([{"role": "user", "content": "hi"}])
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = OpenAIChatBackend(f"http://127.0.0.1:{port}/v1", "tiny", retries=1, backoff=0.01, timeout=2)
    with pytest.raises(MxRepackError, match="no answer after 2 attempts"):
        backend.complete([{"role": "user", "content": "hi"}])


def test_gpqa_failed_requests_are_errors_not_wrong_answers(served_tiny, tmp_path, capsys):
    """A server that refuses every request (HTTP 400, as vLLM did rendering the tiny model's chats with Harmony
    token ids outside its vocabulary) scored 0.0 and exited 0: failed requests were graded as wrong answers."""
    from mxrepack.cli import main
    from mxrepack.eval.gpqa import LocalBackend
    from mxrepack.eval.server import ChatServer

    data = _small_csv(tmp_path)
    refused = tmp_path / "refused.json"
    with ChatServer(served_tiny, "tiny", fault={"bad_request_every": 1}) as server:
        rc = main(
            ["eval", "gpqa", "--base-url", server.base_url, "--model", "tiny", "--data", str(data), "-o", str(refused)]
        )
    cap = capsys.readouterr()
    assert rc == 1 and "score" not in cap.out
    assert cap.err.count("\n") == 1 and cap.err.startswith("error: eval gpqa:")
    assert "HTTP 400: Token id 200005 is out of vocabulary (injected)" in cap.err  # the server's message, one line
    r = json.loads(refused.read_text())
    assert r["too_many_errors"] and r["errors"] >= 1 and r["n_samples"] == 0 and r["score"] is None
    assert r["errors"] + r["not_asked"] == r["n_requests"] == 12  # it stopped sending once the run was lost
    assert main(["eval", "compare", str(refused), str(refused)]) == 1  # the gate refuses it, and so does the report
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {refused}: ") and "not a score to gate on" in err
    assert main(["eval", "report", "--out", str(tmp_path / "rep"), "--gpqa", str(refused)]) == 1
    assert "not a score to gate on" in capsys.readouterr().err

    # Errors within --max-errors: the score is over the answered requests, and the errors are counted apart.
    local = {s["index"]: s for s in run_gpqa(LocalBackend(model=served_tiny), data, concurrency=1)["samples"]}
    some = tmp_path / "some.json"
    args = ["eval", "gpqa", "--data", str(data), "--temperature", "0", "-o", str(some)]
    with ChatServer(served_tiny, "tiny", fault={"bad_request_every": 6}) as server:  # 2 of the 12 requests
        assert main([*args, "--base-url", server.base_url, "--model", "tiny", "--max-errors", "2"]) == 0
    cap = capsys.readouterr()
    assert "over 10 answered samples; 2 failed requests not scored" in cap.out
    assert cap.err.startswith("warning: 2 of 12 requests failed") and "out of vocabulary" in cap.err
    r = json.loads(some.read_text())
    assert (r["errors"], r["n_samples"], r["n_requests"], r["max_errors"], r["too_many_errors"]) == (
        2,
        10,
        12,
        2,
        False,
    )
    answered = [s for s in r["samples"] if s["error"] is None]
    assert len(answered) == 10 and all(s["response"] == local[s["index"]]["response"] for s in answered)
    assert r["score"] == sum(s["correct"] for s in answered) / 10 and "answered" in r["scored_over"]
    assert all(s["correct"] is None and "HTTP 400" in s["error"] for s in r["samples"] if s["error"] is not None)
    assert main(["eval", "compare", str(some), str(some)]) == 0
    with ChatServer(
        served_tiny, "tiny", fault={"bad_request_every": 6}
    ) as server:  # the default, 5% of 12, allows none
        assert main([*args, "--base-url", server.base_url, "--model", "tiny"]) == 1
    from mxrepack.eval.gpqa import allowed_errors

    assert (allowed_errors("5%", 12), allowed_errors("5%", 200), allowed_errors("3", 200)) == (0, 10, 3)
    with pytest.raises(MxRepackError, match="--max-errors 'five'"):
        allowed_errors("five", 12)


def test_eval_progress_bars_count_to_their_totals(served_tiny, tmp_path, bars):
    from mxrepack.cli import main
    from mxrepack.eval.bundled import bundled_model
    from mxrepack.eval.server import ChatServer

    src, data = bundled_model(), _small_csv(tmp_path, n=4)
    assert main(["eval", "logits", str(src), str(src), "--max-tokens", "300", "--ctx", "128"]) == 0
    assert main(["eval", "gpqa", "--local", str(src), "--data", str(data)]) == 0
    with ChatServer(served_tiny, "tiny") as server:
        assert main(["eval", "gpqa", "--base-url", server.base_url, "--model", "tiny", "--data", str(data)]) == 0
    logits, local, remote = bars
    assert logits.totals() == {"positions": 299, "first-token prompts": 16}
    assert local.totals() == remote.totals() == {None: 4}
    assert all(b.enabled for b in bars)
    assert main(["eval", "gpqa", "--local", str(src), "--data", str(data), "--json"]) == 0
    assert not bars[-1].enabled  # --json: no bar


def test_bundled_model_answers_well_above_chance():
    from mxrepack.eval.bundled import bundled_model
    from mxrepack.eval.gpqa import LocalBackend

    path = bundled_model()
    r = run_gpqa(LocalBackend(path), path / "tasks" / "test.csv", num_examples=60, concurrency=1)
    assert r["score"] > 0.25 + 4 * r["stderr"]  # chance is 0.25


def test_regression_gate_rule_and_cli(tmp_path):
    from mxrepack.cli import main

    base = {"score": 0.70, "stderr": 0.02}
    assert compare(base, {"score": 0.66, "stderr": 0.02})["passed"]  # 0.04 < 1.96 * 0.028
    assert not compare(base, {"score": 0.60, "stderr": 0.02})["passed"]
    assert compare(base, {"score": 0.60, "stderr": 0.02}, tolerance=0.05)["passed"]
    assert compare(base, {"score": 0.90, "stderr": 0.0})["passed"]
    (tmp_path / "b.json").write_text(json.dumps(base))
    (tmp_path / "c.json").write_text(json.dumps({"score": 0.5, "stderr": 0.01}))
    assert main(["eval", "compare", str(tmp_path / "b.json"), str(tmp_path / "b.json")]) == 0
    assert main(["eval", "compare", str(tmp_path / "b.json"), str(tmp_path / "c.json")]) == 1


def test_the_gate_refuses_a_negative_margin():
    from mxrepack.errors import MxRepackError
    from mxrepack.eval.gpqa import compare

    base = {"score": 0.80, "stderr": 0.01, "n_samples": 100, "errors": 0, "too_many_errors": False}
    with pytest.raises(MxRepackError, match="--tolerance -1 / --z 1.96: expected 0 or more"):
        compare(base, base | {"score": 0.9}, tolerance=-1)  # it would fail a candidate that scored higher


def test_the_gate_compares_runs_over_the_same_questions(tmp_path, capsys):
    """A baseline scored on GPQA and a candidate scored on another file (the bundled tiny task, which `eval gpqa`
    falls back to without --data) made a gate verdict out of two different tests."""
    from mxrepack.cli import main
    from mxrepack.errors import MxRepackError
    from mxrepack.eval.gpqa import compare

    data = {"path": "gpqa_diamond.csv", "sha256": "a" * 64, "rows": 198, "num_examples": None}
    base = {"score": 0.70, "stderr": 0.02, "data": data}
    cand = base | {"score": 0.69, "data": data | {"path": "tiny/tasks/test.csv", "sha256": "b" * 64}}
    with pytest.raises(MxRepackError, match="candidate JSON: scored tiny/tasks/test.csv .*expected the same question"):
        compare(base, cand)
    with pytest.raises(MxRepackError, match="expected the same --num-examples subset"):
        compare(base, base | {"data": data | {"num_examples": 50}})
    assert compare(base, base | {"score": 0.69})["passed"]
    older = {"score": 0.69, "stderr": 0.02}  # written before results recorded their data: not checked
    assert compare(base, older)["passed"] and compare(older, base)["passed"]
    assert compare(base, older | {"data": {"sha256": "a" * 64}})["passed"]  # no num_examples recorded there
    (tmp_path / "b.json").write_text(json.dumps(base))
    (tmp_path / "c.json").write_text(json.dumps(cand))
    assert main(["eval", "compare", str(tmp_path / "b.json"), str(tmp_path / "c.json")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {tmp_path / 'c.json'}: scored tiny/tasks/test.csv")
    assert f"where {tmp_path / 'b.json'} scored gpqa_diamond.csv" in err
    report = ["eval", "report", "--out", str(tmp_path / "rep"), "--gpqa", str(tmp_path / "b.json")]
    # the report shows them side by side, with no gate, and says why
    assert main([*report, "--gpqa", str(tmp_path / "c.json")]) == 0
    assert capsys.readouterr().err == err.replace("error: ", "warning: no gate in the report: ")
    assert json.loads((tmp_path / "rep" / "report.json").read_text())["gate"] is None


def test_eval_gpqa_without_data_says_it_scores_the_tiny_task(served_tiny, tmp_path, capsys):
    """Without --data a server's model was scored on the bundled tiny task, silently."""
    from mxrepack.cli import main
    from mxrepack.eval.bundled import bundled_model
    from mxrepack.eval.server import ChatServer

    out = tmp_path / "r.json"
    with ChatServer(served_tiny, "tiny") as server:
        args = ["eval", "gpqa", "--base-url", server.base_url, "--model", "tiny", "--num-examples", "2"]
        assert main([*args, "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: no --data: scoring the bundled tiny task") and "--data gpqa_diamond.csv" in err
    assert json.loads(out.read_text())["data"]["path"] == str(bundled_model() / "tasks" / "test.csv")
    assert main(["eval", "gpqa", "--local", str(bundled_model()), "--num-examples", "2"]) == 0  # its own tasks
    assert "warning" not in capsys.readouterr().err
    no_tasks = tmp_path / "no-tasks"  # a checkpoint without tasks/test.csv: the tiny task, said so
    shutil.copytree(bundled_model(), no_tasks, ignore=shutil.ignore_patterns("tasks"))
    assert main(["eval", "gpqa", "--local", str(no_tasks), "--num-examples", "2"]) == 0
    assert capsys.readouterr().err.startswith("warning: no --data: scoring the bundled tiny task")


def test_eval_text_is_checked_before_a_model_loads(tmp_path, capsys):
    """`eval logits` / `record-activations` on a checkpoint without a text loaded the models first, then failed."""
    from mxrepack.cli import main

    assert main(["eval", "logits", str(tmp_path / "nowhere"), str(tmp_path)]) == 1
    assert capsys.readouterr().err == f"error: {tmp_path / 'nowhere'}: path does not exist\n"
    not_a_model = tmp_path / "ckpt"
    not_a_model.mkdir()
    assert main(["eval", "logits", str(not_a_model), str(not_a_model)]) == 1
    assert capsys.readouterr().err == f"error: {not_a_model / 'tasks' / 'text.txt'}: no token set; pass --text FILE\n"
    assert main(["eval", "record-activations", str(not_a_model), str(tmp_path / "a.safetensors")]) == 1
    err = capsys.readouterr().err
    assert err == f"error: {not_a_model / 'tasks' / 'text.txt'}: no such text file; pass --text FILE\n"


def test_logits_compare_report_and_cli(tmp_path):
    from mxrepack.cli import main
    from mxrepack.eval.bundled import bundled_model
    from mxrepack.eval.logits import compare_logits
    from mxrepack.repack.pipeline import repack

    src = bundled_model()
    same = compare_logits(src, src, max_tokens=300)
    assert same["kl"]["max"] < 1e-9 and same["same_top"] == 1.0 and same["first_token"]["ok"]
    out = repack(str(src), "sm121", tmp_path / "sm121").out
    logits_json = tmp_path / "logits.json"
    assert main(["eval", "logits", str(src), str(out), "--max-tokens", "300", "-o", str(logits_json)]) == 0
    r = json.loads(logits_json.read_text())
    assert 0 < r["kl"]["mean"] < 0.5 and r["same_top"] > 0.8 and r["tokens"] == 299
    assert r["ppl"]["ratio"] > 0 and r["per_position"] and sum(r["kl_histogram"]["counts"]) == 299
    g1, g2 = tmp_path / "g1.json", tmp_path / "g2.json"
    g1.write_text(json.dumps({"eval": "gpqa", "score": 0.8, "stderr": 0.03, "n_samples": 100, "backend": "a"}))
    g2.write_text(json.dumps({"eval": "gpqa", "score": 0.78, "stderr": 0.03, "n_samples": 100, "backend": "b"}))
    assert (
        main(
            [
                "eval",
                "report",
                "--out",
                str(tmp_path / "rep"),
                "--model",
                str(out),
                "--gpqa",
                str(g1),
                "--gpqa",
                str(g2),
                "--logits",
                str(logits_json),
            ]
        )
        == 0
    )
    md = (tmp_path / "rep" / "report.md").read_text()
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "PASSED" in md and "KL mean" in md and "lm_head.weight" in md
    assert html.count("<svg") == 3 and json.loads((tmp_path / "rep" / "report.json").read_text())["gate"]["passed"]


def test_report_charts_have_axes_and_an_edited_manifest_is_refused(tiny, tmp_path):

    from mxrepack.errors import MxRepackError
    from mxrepack.eval.report import _plots, build_report
    from mxrepack.repack.pipeline import repack

    report = {
        "quantization_error": {
            "model.layers.0.self_attn.q_proj.weight": {"rel_fro": 0.093},
            "lm_head.weight": {"rel_fro": 0.11},
        },
        "gpqa": [{"label": "base", "score": 0.8, "stderr": 0.03}, {"label": "cand", "score": 0.78, "stderr": 0.03}],
        "logits": {
            "kl_histogram": {
                "edges": [10.0 ** (-8 + i / 4) for i in range(37)],
                "counts": [0] * 12 + [5, 40, 90, 30, 4] + [0] * 19,
            }
        },
    }
    plots = _plots(report)
    assert set(plots) == {"quant_error", "accuracy", "kl_hist"}
    for name, svg in plots.items():
        assert svg.count('class="axis"') == 2, name  # an x and a y axis line
        assert re.search(r'class="xlabel"[^>]*>[^<]+</text>', svg) and re.search(
            r'class="ylabel"[^>]*>[^<]+</text>', svg
        )
    assert ">accuracy (fraction of samples correct)<" in plots["accuracy"]
    assert all(f">{t}</text>" in plots["accuracy"] for t in ("0", "0.2", "0.4", "0.6", "0.8", "1"))  # value ticks
    assert ">KL per token (log bins)<" in plots["kl_hist"] and ">tokens<" in plots["kl_hist"]
    assert (
        all(f">{t}</text>" in plots["kl_hist"] for t in ("0", "20", "40", "60", "80")) and ">1e-08<" in plots["kl_hist"]
    )
    assert ">relative Frobenius error |W - Q(W)| / |W|<" in plots["quant_error"]

    out = repack(str(tiny), "sm121", tmp_path / "o").out
    assert build_report(out)["quantization_error"]
    manifest = json.loads((out / "mxrepack.json").read_text())
    next(iter(manifest["quantization_error"].values()))["rel_fro"] = 1e-6  # a better-looking figure
    (out / "mxrepack.json").write_text(json.dumps(manifest))
    with pytest.raises(MxRepackError, match="mxrepack.json: edited since mxrepack wrote it"):
        build_report(out)

    # the report goes to a folder of its own: into a checkpoint its files would travel with the model
    from mxrepack.eval.report import write_report

    report = build_report()
    for checkpoint, what in ((out, "the mxrepack output"), (tiny, "the checkpoint")):
        before = sorted(p.name for p in checkpoint.iterdir())
        for where in (checkpoint, checkpoint / "report"):  # nor a folder in one
            with pytest.raises(MxRepackError, match=re.escape(f"{where}: inside {what} {checkpoint.resolve()}")):
                write_report(report, where)
        assert sorted(p.name for p in checkpoint.iterdir()) == before
    assert write_report(report, tmp_path / "rep")["html"].is_file()
    assert write_report(report, tmp_path / "rep")["html"].is_file()  # a report's own folder: written again


def test_gpqa_cli_local_and_backend_choice(tmp_path):
    from mxrepack.cli import main
    from mxrepack.eval.bundled import bundled_model

    data = _small_csv(tmp_path, n=4)
    out = tmp_path / "r.json"
    assert (
        main(["eval", "gpqa", "--local", str(bundled_model()), "--data", str(data), "--n-repeats", "2", "-o", str(out)])
        == 0
    )
    r = json.loads(out.read_text())
    assert r["n_samples"] == 8 and r["n_repeats"] == 2 and {"score", "stderr", "samples"} <= set(r)
    assert main(["eval", "gpqa", "--data", str(data)]) == 1  # neither backend
    assert main(["eval", "gpqa", "--base-url", "http://127.0.0.1:9/v1", "--data", str(data)]) == 1  # no --model


def test_recorded_activations_from_the_runner_feed_the_error_report(tmp_path):
    from mxrepack.cli import main
    from mxrepack.eval.bundled import bundled_model
    from mxrepack.repack.pipeline import repack

    acts = tmp_path / "acts.safetensors"
    assert main(["eval", "record-activations", str(bundled_model()), str(acts), "--max-tokens", "64"]) == 0
    r = repack(str(bundled_model()), "sm121", tmp_path / "o", activations=acts)
    for name, entry in r.quantization_error.items():
        assert entry["out_rel_recorded"] is not None and 0 < entry["out_rel_recorded"] < 0.5, name
