"""No response ends a run (issue 47): degenerate responses for every generation task family, rescored by the
engine (`eval downstream --rescore`, no model), equal the independent references of test_generation_metrics.py
and test_sft_metrics.py (lm-eval's and OLMES' rules restated); IFEval's raising checks score False as OLMES'
per-instruction try/except does (olmes 99cf8bb7, oe_eval/dependencies/ifeval/utils.py lines 33-52, 86-111) and
are named in "scoring_errors".
"""

import json

import pytest

from conftest import run_cli
from test_generation_metrics import ref_drop, ref_gsm8k, ref_minerva, ref_squad
from test_sft_metrics import DEGENERATE_RESPONSES, ifeval_doc, olmes_instruction_check, ref_bbh, ref_popqa

IFEVAL_DOC = ifeval_doc(1, "Answer in JSON, no commas.", ("detectable_format:json_format", {}),
                        ("punctuation:no_comma", {}))  # fmt: skip

# (task, gold, reference): one of each gold shape and extraction the suite scores natively.
FAMILIES = [
    ("gsm8k", "42", ref_gsm8k),
    ("minerva_math_algebra", "\\frac{1}{2}", ref_minerva),
    ("drop", [["12"], ["twelve"]], ref_drop),
    ("squad", ["Paris"], ref_squad),
    ("bbh_date_understanding", "(B)", lambda g, gold: ref_bbh("date_understanding", g, gold)),
    ("bbh_dyck_languages", "] )", lambda g, gold: ref_bbh("dyck_languages", g, gold)),
    ("bbh_word_sorting", "apple banana", lambda g, gold: ref_bbh("word_sorting", g, gold)),
    ("popqa", ["Paris", "City of Light"], ref_popqa),
]


def ref_ifeval_olmes(generation, doc):
    n = len(doc["instruction_id_list"])
    out = {}
    for level in ("strict", "loose"):
        inst = [olmes_instruction_check(doc, i, generation, level == "loose") for i in range(n)]
        out[f"prompt_level_{level}_acc"] = 1.0 if all(inst) else 0.0
        out[f"inst_level_{level}_acc"] = sum(inst) / n
    return out


def test_degenerate_responses_are_scored_for_every_task_family(tmp_path):
    rows, refs = [], []
    # The 1 MB response is 64 KB here: the Python references (gsm8k's) take minutes on 1 MB; the IFEval scorer
    # has the 1 MB one (test_sft_metrics.py test_ifeval_scorer_scores_a_raising_check_false_as_olmes_does).
    responses = {**DEGENERATE_RESPONSES, "one_char_1mb": "a" * (1 << 16)}
    for name, response in responses.items():
        for task, gold, ref in FAMILIES:
            rows.append((task, response, gold))
            refs.append(ref(response, gold))
        rows.append(("ifeval", response, IFEVAL_DOC))
        refs.append(ref_ifeval_olmes(response, IFEVAL_DOC))
    src, out, rows_out = tmp_path / "rows.jsonl", tmp_path / "out.json", tmp_path / "rescored.jsonl"
    with open(src, "w", encoding="utf-8") as f:
        for i, (task, generation, gold) in enumerate(rows):
            f.write(json.dumps({"task": task, "format": "gen", "shots": 0, "doc_id": i, "native_id": i,
                                "prompt_tokens": [], "generation": generation, "gold": gold}) + "\n")  # fmt: skip
    run_cli("eval", "downstream", "--rescore", src, "--out", out, "--requests-out", rows_out)
    rescored = [json.loads(line) for line in rows_out.read_text().splitlines()]
    assert len(rescored) == len(rows)
    for (task, generation, _), want, got in zip(rows, refs, rescored):
        assert set(got["metrics"]) == set(want), task
        for metric, value in want.items():
            assert got["metrics"][metric] == pytest.approx(value, abs=1e-12), (task, generation[:40], metric)

    # The JSON check raises RecursionError on the two nesting responses (strict and loose): named, counted.
    result = json.loads(out.read_text())
    errors = result["scoring_errors"]
    named = {(e["task"], e["doc_id"]) for e in errors["instances"]}
    assert errors["count"] == len(errors["instances"]) == len(named)
    nesting = [i for i, (task, g, _) in enumerate(rows) if task == "ifeval" and g in (
        DEGENERATE_RESPONSES["brackets"], DEGENERATE_RESPONSES["json_nesting"])]  # fmt: skip
    assert {("ifeval", i) for i in nesting} <= named
    for i in nesting:
        assert any("json_format: RecursionError" in e for e in rescored[i]["scoring_errors"])
    assert all("scoring_errors" not in r for i, r in enumerate(rescored) if ("ifeval", i) not in named)
