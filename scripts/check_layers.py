#!/usr/bin/env python3
"""Checks that the library's modules include each other in one direction only (docs/layout.md, "Module layering"):

    util -> text, kernels -> config -> dist -> io -> model -> tokenizer -> chat, data -> infer -> eval -> train, export,
         serve -> tools

A file under include/archspace/<module>/ or src/<module>/ may include its own module and modules of
lower layers; modules on the same layer (chat and data; train, export and serve) do not include
each other. Prints every back include as FILE:LINE and exits 1 when there is one.
"""
import argparse
import pathlib
import re
import sys

LAYERS = [["util"], ["text", "kernels"], ["config"], ["dist"], ["io"], ["model"], ["tokenizer"], ["chat", "data"],
          ["infer"], ["eval"], ["train", "export", "serve"], ["tools"]]
RANK = {module: rank for rank, modules in enumerate(LAYERS) for module in modules}
INCLUDE = re.compile(r'^\s*#\s*include\s+"archspace/([a-z_]+)/')


def module_of(path, root):
    parts = path.relative_to(root).parts
    if parts[0] == "include" and len(parts) > 3 and parts[1] == "archspace":
        return parts[2]
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    if parts[0] == "tools":
        return "tools"
    return None


def back_includes(root):
    problems = []
    files = [p for d in ("include", "src", "tools") for p in sorted((root / d).rglob("*")) if p.suffix in (".h", ".cpp", ".cu")]
    for path in files:
        module = module_of(path, root)
        if module is None:
            continue
        if module not in RANK:
            problems.append(f"{path.relative_to(root)}: module '{module}' has no layer (add it to LAYERS in {__file__})")
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            m = INCLUDE.match(line)
            if not m or m.group(1) == module:
                continue
            target = m.group(1)
            if target not in RANK:
                problems.append(f"{path.relative_to(root)}:{number}: includes unknown module '{target}'")
            elif RANK[target] >= RANK[module]:
                problems.append(f"{path.relative_to(root)}:{number}: {module} includes {target} "
                                f"({'same layer' if RANK[target] == RANK[module] else 'a higher layer'})")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    problems = back_includes(args.root)
    for p in problems:
        print(p)
    print(f"layer check: {len(problems)} back include(s)" if problems else "layer check: every include goes down the layers")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
