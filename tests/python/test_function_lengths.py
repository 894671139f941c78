"""No function in src/eval/ or tools/eval.cpp is over 100 lines (scripts/check_function_lengths.py, docs/layout.md),
and the check really counts: a function of 101 lines is named with its file, line and length, one of 100 is not,
and a long lambda or class body counts towards the function or does not count at all as it should."""
import subprocess
import sys

from conftest import REPO

CHECK = REPO / "scripts" / "check_function_lengths.py"


def run_check(*paths, limit=100):
    return subprocess.run([sys.executable, str(CHECK), "--max", str(limit), *map(str, paths)], capture_output=True,
                          text=True)


def test_eval_functions_are_at_most_100_lines():
    result = run_check(REPO / "src" / "eval", REPO / "tools" / "eval.cpp")
    assert result.returncode == 0, result.stdout


def function(name, n, signature_lines=1):
    """A function of exactly n lines, its signature on one line or two."""
    signature = [f"int {name}(int x) {{"] if signature_lines == 1 else [f"int {name}(", "    int x) {"]
    return "\n".join(signature + ["  x += 1;"] * (n - len(signature) - 2) + ["  return x;", "}"]) + "\n"


def test_a_long_function_is_named(tmp_path):
    src = tmp_path / "a.cpp"
    table = "const std::vector<int> table = {\n" + "    1,\n" * 200 + "};\n"  # not a function
    src.write_text("#include <x>\n\nnamespace a {\nnamespace {\n\n" + function("f_100", 100, signature_lines=2) +
                   "\n}  // namespace\n\n" + function("f_101", 101) + "\nstruct S {\n  int a = 0;\n};\n\n" + table +
                   "\n}  // namespace a\n")
    result = run_check(tmp_path)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{src}:") and "f_101 is 101 lines (at most 100)" in lines[0], lines


def test_lambdas_count_towards_their_function(tmp_path):
    src = tmp_path / "b.cpp"
    src.write_text("void g() {\n  auto l = [] {\n" + "    int y = 0;\n" * 60 + "  };\n  l();\n}\n")
    result = run_check(src, limit=60)
    assert result.returncode == 1 and "g is 65 lines" in result.stdout, result.stdout
