#!/usr/bin/env python3
"""The five-minute tour of README.md: the ```sh blocks that follow a `<!-- tour: NAME -->` marker line.

One source for three readers: the README shows the tour, `make demo` prints it as its "Next:" list
(scripts/demo.sh runs this script), and tests/python/test_readme_tour.py runs every block as written on a
demo-like checkpoint. So the tour cannot name a command that does not work, nor the demo another tour.
Standard library only: make demo may run it with the system python.
"""
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- tour: ([a-z0-9_-]+) -->\s*$")


class TourError(Exception):
    pass


def tour_blocks(readme=REPO / "README.md"):
    """[(name, code)] in README order; a marker not followed by a closed ```sh block is an error."""
    readme = pathlib.Path(readme)
    lines = readme.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = MARKER.match(lines[i])
        if m:
            if i + 1 >= len(lines) or lines[i + 1].strip() != "```sh":
                raise TourError(f"{readme}:{i + 2}: the tour marker '{m.group(1)}' must be followed by a ```sh line")
            end = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == "```"), None)
            if end is None:
                raise TourError(f"{readme}:{i + 2}: the ```sh block of tour step '{m.group(1)}' is not closed")
            blocks.append((m.group(1), "\n".join(lines[i + 2:end])))
            i = end
        i += 1
    names = [n for n, _ in blocks]
    if not blocks:
        raise TourError(f"{readme}: no '<!-- tour: NAME -->' blocks")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise TourError(f"{readme}: tour steps named twice: {', '.join(dup)}")
    return blocks


def render(blocks):
    """The tour as make demo prints it: every block as written, a blank line between blocks."""
    return "\n\n".join(code for _, code in blocks) + "\n"


def main(argv):
    readme = argv[1] if len(argv) > 1 else REPO / "README.md"
    try:
        sys.stdout.write(render(tour_blocks(readme)))
    except (TourError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
