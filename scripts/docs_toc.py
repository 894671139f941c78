#!/usr/bin/env python3
"""The table of contents of each docs/*.md: the lines between `<!-- toc -->` and `<!-- /toc -->`, one link per
## and ### heading below them, in order, with GitHub's anchors.

  python3 scripts/docs_toc.py          rewrites every file's table of contents
  python3 scripts/docs_toc.py --check  lists the files whose table is missing or stale (status 1)
tests/python/test_readme_tour.py runs the check.
"""
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
START, END = "<!-- toc -->", "<!-- /toc -->"


def slug(heading):
    """GitHub's anchor of a heading: a link's text only, no backticks, lower case, punctuation but '-' and '_'
    dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return re.sub(r"[^\w\- ]", "", text.replace("`", "").strip().lower()).replace(" ", "-")


def headings(markdown):
    """[(line index, level, text, anchor)] of the headings outside code fences; a repeated anchor is numbered
    -1, -2, ... as GitHub numbers them."""
    out, seen, fence = [], {}, False
    for i, line in enumerate(markdown.splitlines()):
        if line.lstrip().startswith("```"):
            fence = not fence
        m = None if fence else re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.append((i, len(m.group(1)), m.group(2), s if n == 0 else f"{s}-{n}"))
    return out


def anchors(markdown):
    return {anchor for _, _, _, anchor in headings(markdown)}


def with_toc(markdown, path="file"):
    """The file with its table of contents rebuilt from the headings that follow it."""
    if START not in markdown or END not in markdown:
        raise ValueError(f"{path}: no '{START}' ... '{END}' lines")
    head, rest = markdown.split(START, 1)
    _, body = rest.split(END, 1)
    end_line = markdown[:markdown.index(END)].count("\n")  # the headings below this line are listed
    entries = [f"{'  ' * (level - 2)}- [{text}](#{anchor})" for i, level, text, anchor in headings(markdown)
               if i > end_line and level in (2, 3)]
    return head + START + "\n" + "\n".join(entries) + "\n" + END + body


def main(argv):
    stale = []
    for path in sorted((REPO / "docs").glob("*.md")):
        text = path.read_text(encoding="utf-8")
        try:
            new = with_toc(text, path.relative_to(REPO))
        except ValueError as e:
            stale.append(str(e))
            continue
        if new != text:
            if "--check" in argv:
                stale.append(f"{path.relative_to(REPO)}: table of contents out of date (run scripts/docs_toc.py)")
            else:
                path.write_text(new, encoding="utf-8")
    for line in stale:
        print(f"error: {line}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
