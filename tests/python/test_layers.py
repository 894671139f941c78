"""The module layering (scripts/check_layers.py) holds for the tree, and the check really catches a back
include: a fake tree where model includes infer must fail, naming the file and line."""
import subprocess
import sys

from conftest import REPO

CHECK = REPO / "scripts" / "check_layers.py"


def run_check(root):
    return subprocess.run([sys.executable, str(CHECK), "--root", str(root)], capture_output=True, text=True)


def test_the_tree_includes_down_the_layers():
    result = run_check(REPO)
    assert result.returncode == 0, result.stdout


def test_a_back_include_is_caught(tmp_path):
    (tmp_path / "include" / "archspace" / "model").mkdir(parents=True)
    (tmp_path / "src" / "infer").mkdir(parents=True)
    (tmp_path / "include" / "archspace" / "model" / "m.h").write_text(
        '#pragma once\n#include "archspace/util/error.h"\n#include "archspace/infer/generator.h"\n')
    (tmp_path / "src" / "infer" / "g.cpp").write_text('#include "archspace/model/m.h"\n#include "archspace/eval/perplexity.h"\n')
    (tmp_path / "src" / "train").mkdir(parents=True)
    (tmp_path / "src" / "train" / "t.cpp").write_text('#include "archspace/eval/perplexity.h"\n#include "archspace/serve/server.h"\n')
    result = run_check(tmp_path)
    assert result.returncode == 1
    assert "include/archspace/model/m.h:3: model includes infer (a higher layer)" in result.stdout
    assert "src/infer/g.cpp:2: infer includes eval (a higher layer)" in result.stdout
    assert "src/train/t.cpp:2: train includes serve (same layer)" in result.stdout
    assert "m.h:2" not in result.stdout and "g.cpp:1" not in result.stdout and "t.cpp:1" not in result.stdout
