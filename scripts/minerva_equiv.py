"""Minerva MATH answer equivalence for `archspace eval downstream` (src/eval/generation_metrics.cpp).

The engine extracts and normalises the answers natively; whether a normalised answer equals the gold needs
sympy's LaTeX parser, so this calls lm-evaluation-harness's own is_equiv
(lm_eval/tasks/minerva_math/utils.py) on each pair.

    python scripts/minerva_equiv.py IN.json OUT.json

IN.json: {"pairs": [[answer, gold], ...]}; OUT.json: {"equivalent": [true/false, ...]}, one per pair, written
whole (beside OUT, then renamed). Exit status 1 with a message on stderr for a bad input file.
"""

import json
import logging
import os
import sys


def main(argv):
    if len(argv) != 3:
        print("usage: minerva_equiv.py IN.json OUT.json", file=sys.stderr)
        return 2
    src, dst = argv[1], argv[2]
    try:
        with open(src, encoding="utf-8") as f:
            pairs = json.load(f)["pairs"]
        if not all(isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in pairs):
            raise ValueError("every pair must be [answer, gold], two strings")
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"{src}: {e}", file=sys.stderr)
        return 1
    logging.disable(logging.WARNING)  # is_equiv logs every unparsable answer at debug/warning level
    from lm_eval.tasks.minerva_math.utils import is_equiv

    out = [bool(is_equiv(a, b)) for a, b in pairs]
    tmp = dst + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"equivalent": out}, f)
    os.replace(tmp, dst)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
