"""[eval] downstream during training runs generation tasks through the library's downstream pipeline
(eval/downstream_pipeline.h), the one `eval downstream` runs: a short run with gsm8k (3 documents) beside a
multiple-choice task logs gsm8k's primary metric at every evaluation, equal to `eval downstream` on the checkpoint
of that step; the tasks scored by lm-eval's Python (Minerva's is_equiv, IFEval's checks) are scored in the loop
by the same scorers, and refused at setup, before any step, where those cannot run."""
import json

import test_downstream as ds
from conftest import run_cli


def test_in_loop_generation_task_is_logged_as_eval_downstream_scores_it(tmp_path):
    (tmp_path / "doc.txt").write_text("Question: What is two plus two?\nAnswer: four. " * 200)
    run_cli("tokenize", "--out", tmp_path / "shards", tmp_path / "doc.txt")
    ds.train_with_downstream(tmp_path, "run", downstream=("gsm8k", "arc_easy"))
    lines = ds.downstream_lines(tmp_path / "run")
    assert [l["step"] for l in lines] == [2, 4]
    for l in lines:
        assert set(l["downstream"]) == {"gsm8k", "arc_easy"}
        gsm8k = l["downstream"]["gsm8k"]
        assert gsm8k["metric"] == "exact_match" and gsm8k["n"] == 3 and gsm8k["format"] == "gen", gsm8k

    ckpt = tmp_path / "run" / "checkpoints" / "step-00000002"
    out = tmp_path / "step2.json"
    run_cli("eval", "downstream", "--model", ckpt, "--tasks", "gsm8k", "--limit", 3, "--out", out)
    (row,) = [r for r in json.loads(out.read_text())["results"] if r["primary"]]
    logged = lines[0]["downstream"]["gsm8k"]
    assert (row["task"], row["metric"], row["value"], row["n"], row["shots"]) == \
        ("gsm8k", logged["metric"], logged["value"], logged["n"], logged["shots"])


def test_in_loop_tasks_scored_by_python_are_logged_as_eval_downstream_scores_them(tmp_path, monkeypatch):
    from test_chat_eval import write_olmes_files

    # OLMES' request files of the two tasks (IFEval's are not among the offline data), for training and eval alike.
    write_olmes_files(tmp_path / "tasks", ["minerva_math_algebra", "ifeval"], chat=False)
    monkeypatch.setenv("ARCHSPACE_EVAL_TASKS", str(tmp_path / "tasks"))
    (tmp_path / "doc.txt").write_text("Question: What is two plus two?\nAnswer: four. " * 200)
    run_cli("tokenize", "--out", tmp_path / "shards", tmp_path / "doc.txt")
    ds.train_with_downstream(tmp_path, "run", downstream=("minerva_math_algebra", "ifeval"))
    lines = ds.downstream_lines(tmp_path / "run")
    assert [l["step"] for l in lines] == [2, 4]
    assert {l["downstream"]["ifeval"]["metric"] for l in lines} == {"prompt_level_loose_acc"}

    ckpt = tmp_path / "run" / "checkpoints" / "step-00000004"
    out = tmp_path / "step4.json"
    run_cli("eval", "downstream", "--model", ckpt, "--tasks", "minerva_math_algebra,ifeval", "--limit", 3,
            "--out", out)
    rows = {r["task"]: r for r in json.loads(out.read_text())["results"] if r["primary"]}
    logged = lines[1]["downstream"]
    assert set(logged) == set(rows) == {"minerva_math_algebra", "minerva_math", "ifeval"}  # with the group's row
    for task, row in rows.items():
        assert (row["metric"], row["value"], row["n"], row["shots"]) == \
            (logged[task]["metric"], logged[task]["value"], logged[task]["n"], logged[task]["shots"]), task


def test_in_loop_tasks_scored_by_python_are_refused_where_python_cannot_score(tmp_path, monkeypatch):
    from test_train import write_toml

    (tmp_path / "doc.txt").write_text("Some text to train on. " * 100)
    run_cli("tokenize", "--out", tmp_path / "shards", tmp_path / "doc.txt")
    s = {"model": {"preset": "micro"}, "data": {"train": str(tmp_path / "shards")},
         "train": {"run_dir": str(tmp_path / "r"), "sequence_length": 16, "max_steps": 1},
         "eval": {"downstream": ["arc_easy", "minerva_math_algebra"], "downstream_limit": 2}}
    monkeypatch.setenv("ARCHSPACE_PYTHON", str(tmp_path / "no-python"))
    r = run_cli("train", "--config", write_toml(tmp_path / "r.toml", s), check=False)
    assert r.returncode == 1, r.stderr
    for part in ("eval.downstream", "minerva_math_algebra", "no-python", "ARCHSPACE_PYTHON"):
        assert part in r.stderr, (part, r.stderr)
    assert not (tmp_path / "r" / "checkpoints").exists()  # refused at setup: no step ran
