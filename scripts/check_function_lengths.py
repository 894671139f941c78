#!/usr/bin/env python3
"""Checks that no function in the given C++ files is longer than --max lines (docs/layout.md, "Functions"): counted
from the first line of its signature to its closing brace, on clang-formatted code, where a namespace-level
definition starts at column 0 and ends with a "}" at column 0 (lambdas and local classes count towards their
function). Prints FILE:LINE: NAME is N lines for each longer one and exits 1 when there is one.

    scripts/check_function_lengths.py --max 100 src/eval tools/eval.cpp
"""
import argparse
import pathlib
import re
import sys

NOT_A_FUNCTION = re.compile(r"^(namespace|class|struct|enum|union|extern|using|typedef|template\s*<[^>]*>\s*(class|struct))\b")


def functions(path):
    """(first line, line count, name) of each namespace-level function definition in the file."""
    lines = pathlib.Path(path).read_text().split("\n")
    found, start, header = [], None, None
    for i, line in enumerate(lines):
        if start is None:
            column0 = line and not line[0].isspace() and not line.startswith(("//", "#", "}"))
            if header is None and column0 and not line.startswith("template"):
                header = i
            elif header is None and column0:
                header = i  # template <...> on its own line starts the signature
            if header is not None:
                signature = " ".join(lines[header:i + 1])
                if NOT_A_FUNCTION.match(lines[header]) or "=" in signature.split("(")[0]:
                    header = None if line.endswith((";", "{", "}")) or not line else header
                    continue
                if line.endswith("{") and "(" in signature:
                    start = header
                elif line.endswith((";", "}")) or not line.strip():
                    header = None
        elif line == "}" or line.startswith("}  //"):
            name = re.sub(r"\s+", " ", " ".join(lines[start:start + 2]))
            name = name[:name.find("(")] if "(" in name else name
            found.append((start + 1, i - start + 1, name.split()[-1] if name.split() else "?"))
            start, header = None, None
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max", type=int, default=100)
    parser.add_argument("paths", nargs="+", help="C++ files, or folders searched for *.cpp")
    args = parser.parse_args()
    files = []
    for p in map(pathlib.Path, args.paths):
        files += sorted(p.rglob("*.cpp")) if p.is_dir() else [p]
    long = [(f, line, n, name) for f in files for line, n, name in functions(f) if n > args.max]
    for f, line, n, name in long:
        print(f"{f}:{line}: {name} is {n} lines (at most {args.max})")
    return 1 if long else 0


if __name__ == "__main__":
    sys.exit(main())
