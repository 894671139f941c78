"""The prompts of the seed's table's Minerva and DROP tasks against OLMES' own rules, on every document, without a
model: build/task_prompts_dump (tests/tools/task_prompts_dump.cpp) runs `eval downstream`'s planning and loading and
prints each request's prompt.

- minerva_math_<subject>::tulu under --chat: OLMES' default few-shot source "Minerva:MATH" (not the installed files'
  "Minerva:MATH:fixed"), kept in src/eval/tasks/olmes_fewshot/minerva_math.json. That copy is tied to an
  artifact made by OLMES itself: its "Minerva:MATH:fixed" renders, character for character, the shots of every
  installed request.
- drop::llama3 from a local copy of EleutherAI/drop written by `datasets` itself (save_to_disk, its cache after
  load_dataset, the hub's Parquet shards): shots drawn by Python's own random.Random(1234).sample, documents and
  golds as OLMES processes the rows `datasets` reads back.

OLMES is not installable here: its rules are restated below with their file and lines in OLMES as vendored in
github.com/prudhvirajn/gsm8k-rollut-lab (olmes/, commit 1a64c6d1; the same code in stellalisy/EvoLM d97cac6e), the
few-shot sources from oe_eval/tasks/fewshot_sources.py (github.com/goodfire-ai/olmes acbb7467)."""
import gzip
import json
import os
import pathlib
import random
import subprocess

import pytest

from conftest import REPO
from test_chat_eval import concat_with_space, olmes_chat_context
from test_generation_tasks import request_file

DUMP = pathlib.Path(os.environ.get("ARCHSPACE_TASK_PROMPTS_DUMP", REPO / "build" / "task_prompts_dump"))
SHOTS = json.loads((REPO / "src" / "eval" / "tasks" / "olmes_fewshot" / "minerva_math.json").read_text())
SUBJECTS = ["algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory", "prealgebra",
            "precalculus"]


def dump(*args):
    assert DUMP.exists(), f"{DUMP} is missing: build the task_prompts_dump target (or set ARCHSPACE_TASK_PROMPTS_DUMP)"
    result = subprocess.run([str(DUMP), *map(str, args)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return lines[:-1], lines[-1]["prompts_differ"]


def installed(task):
    with gzip.open(next(request_file(task).glob("requests.jsonl.gz")), "rt") as f:
        return [json.loads(line) for line in f]


# ---- Minerva ---------------------------------------------------------------------------------------------------


def minerva_query(problem):
    # oe_eval/tasks/oe_eval_tasks/minerva_math.py:153-183, _process_doc with cot_style "minerva"
    return "Problem:\n" + problem + "\n\nSolution:"


def minerva_shots(source):
    # fewshot_examples with a fewshot_source (base_task.py:578-589): the source's first k, through _process_doc;
    # doc_to_target (minerva_math.py:189-193, use_cot): " " + solution
    return [(minerva_query(s["problem"]), " " + s["solution"]) for s in SHOTS[source][:4]]


def test_the_kept_few_shot_sources_are_olmes_own():
    """The kept "Minerva:MATH:fixed" renders the shots of every installed request of the 7 subjects (files OLMES
    wrote with that source: config.json fewshot_source "Minerva:MATH:fixed"), so the copy is OLMES' to the
    character; "Minerva:MATH" differs from it in the 4th example only (its line breaks). lm-eval's
    list_fewshot_samples, the source's origin, is not it exactly: example 1 lacks the "}" after "$." and its align*
    rows end in two backslashes where OLMES' have one."""
    prefix = "".join(text + target + "\n\n" for text, target in minerva_shots("Minerva:MATH:fixed"))
    for subject in SUBJECTS:
        lines = installed(f"minerva_math_{subject}")
        config = json.loads(next(request_file(f"minerva_math_{subject}").glob("config.json")).read_text())
        assert config["task_config"]["fewshot_source"] == "Minerva:MATH:fixed"
        for line in lines:
            expected = prefix + minerva_query(line["doc"]["problem"])
            assert line["request"]["context"] == expected, (subject, line["doc_id"])
    tulu, fixed = SHOTS["Minerva:MATH"], SHOTS["Minerva:MATH:fixed"]
    assert tulu[:3] == fixed[:3] and tulu[3] != fixed[3]
    assert "\n\n\\begin{align*}" in tulu[3]["problem"] and "\\end{align*}has" in tulu[3]["problem"]
    assert "\\end{align*}\nhas" in fixed[3]["problem"]

    from lm_eval.tasks.minerva_math.utils import list_fewshot_samples

    lm_eval = [{"problem": s["problem"], "solution": s["solution"]} for s in list_fewshot_samples()]
    assert lm_eval != tulu
    assert lm_eval[0]["problem"] + "}" == tulu[0]["problem"]
    assert lm_eval[1] == tulu[1]
    assert lm_eval[2]["solution"].replace("\\\\\n", "\\\n") == tulu[2]["solution"]


def test_minerva_under_chat_is_tulu_on_every_document():
    """Every document of the 7 subjects under --chat: the conversation minerva_math_<subject>::tulu builds
    (configs/tasks.py:4594-4611: use_chat_format, fewshot_as_multiturn, stop_sequences [], max_gen_toks 1024;
    fewshot_source left at minerva_math.py:73's "Minerva:MATH") with base_task.py:459-576's fewshot_context."""
    rows, differ = dump("--chat", "minerva_math")
    assert "minerva_math_algebra" not in differ
    shots = minerva_shots("Minerva:MATH")
    n = 0
    for subject in SUBJECTS:
        task = f"minerva_math_{subject}"
        lines = {line["doc_id"]: line for line in installed(task)}
        mine = [r for r in rows if r["task"] == task]
        assert len(mine) == len(lines) and len(mine) > 0
        for row in mine:
            expected = olmes_chat_context(minerva_query(lines[row["doc_id"]]["doc"]["problem"]), shots, "", "", True)
            assert row["messages"] == expected["messages"], (task, row["doc_id"])
            assert row["assistant_prefix"] == "" and row["stop_sequences"] == [] and row["max_gen_toks"] == 1024
            n += 1
    assert n == len(rows) == 5000  # MATH's test split
    assert rows[0]["messages"][7]["content"] == concat_with_space("", " " + SHOTS["Minerva:MATH"][3]["solution"])


def test_minerva_without_chat_keeps_the_installed_prompts():
    rows, differ = dump("--limit", 3, "minerva_math_geometry")
    lines = installed("minerva_math_geometry")[:3]
    assert [r["context"] for r in rows] == [line["request"]["context"] for line in lines] and not differ
    assert rows[0]["stop_sequences"] == ["Problem:", "\n\n"]


# ---- DROP ------------------------------------------------------------------------------------------------------
# EleutherAI/drop's features (its loading script, the dataset OLMES' DROP task loads: drop.py:41-58 dataset_path).


def drop_features():
    import datasets

    date = {"day": datasets.Value("string"), "month": datasets.Value("string"), "year": datasets.Value("string")}
    answer = {"number": datasets.Value("string"), "date": date, "spans": datasets.Sequence(datasets.Value("string")),
              "worker_id": datasets.Value("string"), "hit_id": datasets.Value("string")}
    return datasets.Features({"section_id": datasets.Value("string"), "query_id": datasets.Value("string"),
                              "passage": datasets.Value("string"), "question": datasets.Value("string"),
                              "answer": answer, "validated_answers": datasets.Sequence(answer)})


def drop_answer(number="", spans=(), date=("", "", "")):
    return {"number": number, "date": dict(zip(("day", "month", "year"), date)), "spans": list(spans),
            "worker_id": "w", "hit_id": "h"}


def drop_rows(n, seed):
    """n DROP-shaped rows: numbers, spans and dates, validated answers repeating the answer or not."""
    rng = random.Random(seed)
    kinds = [lambda i: drop_answer(number=str(i)), lambda i: drop_answer(spans=[f"span {i}", f"other {i}"]),
             lambda i: drop_answer(date=(str(1 + i % 28), "May", "1990")), lambda i: drop_answer(date=("", "", "2001")),
             lambda i: drop_answer(spans=[f"Team {i}"])]
    rows = []
    for i in range(n):
        answer = kinds[rng.randrange(len(kinds))](i)
        validated = [answer, kinds[rng.randrange(len(kinds))](i + 1)][: rng.randrange(3)]
        rows.append({"section_id": f"s{i // 3}", "query_id": f"q-{seed}-{i}",
                     "passage": f"Passage {i // 3}: the Lions scored {i} points.\nIn 1990 they won.",
                     "question": f"How many points in game {i}?", "answer": answer,
                     "validated_answers": {k: [v[k] for v in validated] for k in answer}})
    return rows


def drop_dataset(train, validation):
    import datasets

    return datasets.DatasetDict({
        "train": datasets.Dataset.from_list(train, features=drop_features()),
        "validation": datasets.Dataset.from_list(validation, features=drop_features())})


def parse_answer(answer):  # drop.py:141-151
    if answer["number"] != "":
        return (str(answer["number"]),)
    if answer["spans"] != []:
        return tuple(answer["spans"])
    return (" ".join([answer["date"]["day"], answer["date"]["month"], answer["date"]["year"]]).strip(),)


def get_answers(doc):  # drop.py:113-139
    validated = doc["validated_answers"]
    candidates = [doc["answer"]] + [{"number": validated["number"][i], "date": validated["date"][i],
                                     "spans": validated["spans"][i]} for i in range(len(validated["number"]))]
    answers, seen = [], set()
    for candidate in candidates:
        a = parse_answer(candidate)
        if a not in seen:
            seen.add(a)
            answers.append(a)
    return answers


def process_doc(doc):  # drop.py:96-111 with make_cloze_prompt (tasks/utils.py:90-92)
    query = f"Passage: {doc['passage']}\nQuestion: {doc['question']}\nAnswer:"
    return {"query_id": doc["query_id"], "query": query, "answers": get_answers(doc)}


def llama3_expected(train_docs, eval_docs, chat):
    """drop::llama3 (configs/tasks.py:491-499) per document: build_all_requests' random.Random(1234) per document
    (base_task.py:421-457), fewshot_examples' rnd.sample(training docs, 3) (base_task.py:583-587), fewshot_context
    (base_task.py:459-576) with doc_to_text = query, doc_to_target = " " + ", ".join(answers[0]) (drop.py:153-157),
    no description; under --chat one user turn (no fewshot_as_multiturn) and chat_overrides' stops (drop.py:54-58)."""
    processed = [process_doc(d) for d in train_docs]
    out = []
    for doc in eval_docs:
        shots = random.Random(1234).sample(processed, 3)
        pairs = [(s["query"], " " + ", ".join(s["answers"][0])) for s in shots]
        text = process_doc(doc)["query"] if "validated_answers" in doc else doc["query"]
        context = olmes_chat_context(text, pairs) if chat else "\n\n".join(t + a for t, a in pairs) + "\n\n" + text
        out.append(context)
    return out


@pytest.fixture(scope="module")
def drop_copies(tmp_path_factory):
    """One EleutherAI/drop-shaped dataset (400 training rows, 9 validation) in the layouts users have it in."""
    import datasets

    root = tmp_path_factory.mktemp("drop")
    train, validation = drop_rows(400, 1), drop_rows(9, 2)
    dd = drop_dataset(train, validation)
    dd.save_to_disk(str(root / "saved"))
    hub = root / "hub" / "datasets--EleutherAI--drop" / "snapshots" / "abc" / "data"
    hub.mkdir(parents=True)
    dd["train"].select(range(250)).to_parquet(str(hub / "train-00000-of-00002.parquet"))
    dd["train"].select(range(250, 400)).to_parquet(str(hub / "train-00001-of-00002.parquet"))
    dd["validation"].to_parquet(str(hub / "validation-00000-of-00001.parquet"))
    cache = root / "cache"
    loaded = datasets.load_dataset("parquet", data_dir=str(hub), cache_dir=str(cache))
    assert loaded["train"]["query_id"] == [r["query_id"] for r in train]
    # What `datasets` reads back is the reference's input (its own reader, not ours).
    back = datasets.load_from_disk(str(root / "saved"))
    return {"saved": root / "saved", "hub": root / "hub", "cache": cache,
            "train": back["train"].to_list(), "validation": back["validation"].to_list()}


@pytest.mark.parametrize("layout", ["saved", "hub", "cache"])
@pytest.mark.parametrize("chat", [False, True])
def test_drop_llama3_from_a_local_copy(drop_copies, layout, chat):
    rows, differ = dump(*(["--chat"] if chat else []), "--drop-dataset", drop_copies[layout], "drop")
    train, validation = drop_copies["train"], drop_copies["validation"]
    expected = llama3_expected(train, validation, chat)
    assert len(rows) == len(validation) and not differ
    for i, (row, doc, context) in enumerate(zip(rows, validation, expected)):
        assert row["doc_id"] == i and row["native_id"] == doc["query_id"]
        assert row["gold"] == [list(a) for a in get_answers(doc)]
        if chat:
            assert row["messages"] == context["messages"] and row["assistant_prefix"] == ""
            assert row["stop_sequences"] == ["Passage:", "Question:", "<|eot_id|>"]
        else:
            assert row["context"] == context and row["stop_sequences"] == ["Passage:", "Question:", "\n\n"]
        assert row["max_gen_toks"] == 50
    limited, _ = dump("--limit", 4, "--drop-dataset", drop_copies[layout], "drop")
    assert [r["context"] for r in limited] == [r["context"] for r in dump("--drop-dataset", drop_copies[layout],
                                                                           "drop")[0][:4]]


def test_drop_llama3_shots_with_the_installed_documents(drop_copies):
    """One training file (no validation split beside it): the shots from it, the documents the installed file's."""
    arrow = next((drop_copies["saved"] / "train").glob("*.arrow"))
    rows, differ = dump("--limit", 5, "--drop-dataset", arrow, "drop")
    docs = installed("drop")[:5]
    expected = llama3_expected(drop_copies["train"], [d["doc"] for d in docs], False)
    assert [r["context"] for r in rows] == expected and not differ
    assert [r["native_id"] for r in rows] == [d["native_id"] for d in docs]


def test_drop_installed_under_chat_says_how_it_differs():
    rows, differ = dump("--chat", "--limit", 2, "drop")
    assert len(rows) == 2 and "drop::llama3" in differ["drop"] and "--drop-dataset" in differ["drop"]


@pytest.mark.parametrize("kind,fragment", [
    ("absent", "no such file or directory"),
    ("empty", "no .arrow or .parquet file of the 'train' split"),
    ("corrupt", "not a readable arrow file"),
    ("two copies", "files of the 'train' split in 2 directories"),
])
def test_drop_dataset_errors_name_the_path(tmp_path, kind, fragment):
    path = tmp_path / kind
    if kind == "empty":
        path.mkdir()
    elif kind == "corrupt":
        path = tmp_path / "drop-train.arrow"
        path.write_bytes(b"not arrow")
    elif kind == "two copies":
        for revision in ("a", "b"):
            (path / revision).mkdir(parents=True)
            (path / revision / "drop-train.arrow").write_bytes(b"")
    result = subprocess.run([str(DUMP), "--drop-dataset", str(path), "drop"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0 and fragment in result.stderr and str(path) in result.stderr, result.stderr


def test_drop_dataset_of_another_shape_names_the_columns(tmp_path):
    import datasets

    datasets.Dataset.from_list([{"passage": "p", "question": "q", "answers_spans": {"spans": ["a"]}}] * 4) \
        .to_parquet(str(tmp_path / "train-00000-of-00001.parquet"))
    result = subprocess.run([str(DUMP), "--drop-dataset", str(tmp_path), "drop"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0 and "no column 'answer'" in result.stderr, result.stderr


def test_eval_downstream_with_a_drop_copy_end_to_end(drop_copies, tmp_path):
    """`eval downstream --drop-dataset` itself: the generations' prompts are the dump's (drop::llama3's), the --out
    file says nothing differs; under --chat without the copy, the table's line and --out's prompts_differ say how."""
    import test_downstream as ds
    from conftest import run_cli

    hf = ds.export(tmp_path, "base")
    r, out, rows = ds.engine(hf, tmp_path, "--drop-dataset", drop_copies["saved"], tasks="drop", limit=2, fmt="rc",
                             name="drop-copy")
    assert out["prompts_differ"] == {} and len(rows) == 2
    dumped, _ = dump("--limit", 2, "--drop-dataset", drop_copies["saved"], "drop")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(hf))
    for row, d in zip(rows, dumped):
        assert row["native_id"] == d["native_id"] and row["gold"] == d["gold"]
        assert row["prompt_tokens"] == tokenizer(d["context"], add_special_tokens=False)["input_ids"]
    assert "training documents in" in r.stderr and "random.Random(1234).sample" in r.stderr
    r, out, _ = ds.engine(hf, tmp_path, "--chat", tasks="drop", limit=1, fmt="rc", name="drop-installed")
    assert "--drop-dataset" in out["prompts_differ"]["drop"]
    assert r.stdout.count("drop: not drop::llama3's prompts") == 1
    bad = run_cli("eval", "downstream", "--model", hf, "--tasks", "gsm8k", "--limit", 1, "--drop-dataset",
                  drop_copies["saved"], check=False)
    assert bad.returncode != 0 and "does not evaluate drop" in bad.stderr
