#!/usr/bin/env python3
"""Rows of one split of a local Hugging Face dataset copy, for `archspace eval downstream` (drop::llama3's shots
from DROP's training split: src/eval/drop_train_shots.cpp). Reads the files as `datasets` and the hub leave them,
with pyarrow: Arrow IPC files (the datasets cache's `NAME-SPLIT.arrow`, `save_to_disk`'s `SPLIT/data-*.arrow`,
stream or file format) and Parquet files (the hub's `SPLIT-*.parquet`, `refs/convert/parquet`'s `SPLIT/*.parquet`).

    hf_dataset_rows.py REQUEST.json OUT.json

REQUEST: {"path": file or directory, "split": "train", "columns": [...], "indices": null, "all" or [i, ...],
"optional": false}.
OUT: {"files": [the files read, in order], "rows": N, "columns": [...], "selected": [{column: value} for each
index, in the order asked, or every row for "all"]} ("selected" only when indices are given). With "optional", a
path without files of the split answers {"files": [], "rows": 0, "missing": why} instead of failing (a file path
is taken as the split's only when the split is not optional). A directory is searched for .arrow/.parquet
files of the split: the split's name as a directory of the path below it or as a word of the file name
(`drop-train.arrow`, `train-00000-of-00001.parquet`); all of them must lie in one directory (the shards of one
copy, read in name order), else the answer names the candidates and asks for one. Anything that is not such a
copy: exit status 2, the reason as OUT's {"error": ...}.
"""
import json
import pathlib
import re
import sys


OUT = None  # the answer's path, where a failure's reason goes too


def fail(message):
    if OUT is not None:  # the caller reports it
        OUT.write_text(json.dumps({"error": message}))
    else:
        print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


class Missing(Exception):
    pass


def split_files(path, split, optional):
    if path.is_file():
        if optional:
            raise Missing(f"{path} is one file, taken as another split's")
        return [path]
    if not path.is_dir():
        fail(f"{path}: no such file or directory")
    word = re.compile(r"(^|[-_.])" + re.escape(split) + r"($|[-_.])")
    found = []
    for f in sorted(path.rglob("*")):
        if not f.is_file() or f.suffix not in (".arrow", ".parquet") or ".incomplete" in f.parts:
            continue
        below = f.relative_to(path).parts[:-1]
        if split in below or word.search(f.stem):
            found.append(f)
    if not found:
        if optional:
            raise Missing(f"{path}: no .arrow or .parquet file of the {split!r} split below it")
        fail(f"{path}: no .arrow or .parquet file of the {split!r} split below it")
    dirs = sorted({f.parent for f in found})
    if len(dirs) > 1:
        fail(f"{path}: files of the {split!r} split in {len(dirs)} directories ({', '.join(map(str, dirs))}): "
             "name one file or directory")
    kinds = {f.suffix for f in found}
    if len(kinds) > 1:
        fail(f"{dirs[0]}: both .arrow and .parquet files of the {split!r} split: name one file")
    return found


def read_table(f):
    import pyarrow as pa
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    try:
        if f.suffix == ".parquet":
            return pq.read_table(f)
        with pa.memory_map(str(f)) as source:
            try:
                return ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                source.seek(0)
                return ipc.open_file(source).read_all()
    except (pa.ArrowException, OSError) as e:
        fail(f"{f}: not a readable {f.suffix[1:]} file ({e})")


def main():
    global OUT
    if len(sys.argv) != 3:
        fail("usage: hf_dataset_rows.py REQUEST.json OUT.json")
    OUT = pathlib.Path(sys.argv[2])
    request = json.loads(pathlib.Path(sys.argv[1]).read_text())
    try:
        files = split_files(pathlib.Path(request["path"]).expanduser(), request["split"], request.get("optional"))
    except Missing as e:
        pathlib.Path(sys.argv[2]).write_text(json.dumps({"files": [], "rows": 0, "missing": str(e)}))
        return
    import pyarrow as pa

    tables = [read_table(f) for f in files]
    columns = request["columns"]
    for f, t in zip(files, tables):
        missing = [c for c in columns if c not in t.column_names]
        if missing:
            fail(f"{f}: no column {', '.join(map(repr, missing))} (it has {', '.join(t.column_names)})")
    try:
        table = pa.concat_tables([t.select(columns) for t in tables])
    except pa.ArrowException as e:
        fail(f"{', '.join(map(str, files))}: the shards do not make one table ({e})")
    out = {"files": [str(f.resolve()) for f in files], "rows": table.num_rows, "columns": columns}
    if request.get("indices") == "all":
        out["selected"] = table.to_pylist()
    elif request.get("indices") is not None:
        indices = request["indices"]
        bad = [i for i in indices if not isinstance(i, int) or not 0 <= i < table.num_rows]
        if bad:
            fail(f"row {bad[0]} asked of {table.num_rows} rows")
        out["selected"] = table.take(pa.array(indices, type=pa.int64())).to_pylist()
    pathlib.Path(sys.argv[2]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
