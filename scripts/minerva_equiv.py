"""Minerva MATH answer equivalence for `archspace eval downstream` (src/eval/generation_metrics.cpp).

The engine extracts and normalises the answers natively; whether a normalised answer equals the gold needs
sympy's LaTeX parser, so this decides each pair here as OLMES does: OLMES pins lm_eval==0.4.3 (olmes 99cf8bb7,
pyproject.toml:27), whose is_equiv (lm_eval/tasks/minerva_math/utils.py:144-183 there) parses both strings even
when they are identical; lm-eval 0.4.13 returns True for identical non-empty strings first (its utils.py:169), so
a tuple or an interval equal to the gold, which sympy cannot parse, is False in OLMES and True in 0.4.13. The
engine sends every pair, identical ones included.

    python scripts/minerva_equiv.py IN.json OUT.json

IN.json: {"pairs": [[answer, gold], ...]}; OUT.json: {"equivalent": [true/false, ...]}, one per pair, written
whole (beside OUT, then renamed). Exit status 1 with a message on stderr for a bad input file.
"""

import json
import logging
import os
import sys


def olmes_is_equiv(x1, x2):
    """lm-eval 0.4.3's is_equiv (utils.py:144-183), the one OLMES runs, restated: no identical-string shortcut."""
    import sympy
    from lm_eval.tasks.minerva_math.utils import timeout  # the same SIGALRM guard in 0.4.3 and 0.4.13
    from sympy.parsing.latex import parse_latex
    from sympy.parsing.latex.errors import LaTeXParsingError

    try:
        with timeout(seconds=5):
            try:
                parsed_x1, parsed_x2 = parse_latex(x1), parse_latex(x2)
            except (LaTeXParsingError, sympy.SympifyError, TypeError):
                return False
            try:
                diff = parsed_x1 - parsed_x2
            except TypeError:
                return False
            try:
                return bool(sympy.simplify(diff) == 0)
            except ValueError:
                return False  # 0.4.3 falls through to None here, which counts as not equal
    except TimeoutError:
        return False
    except ImportError:
        raise
    except Exception:  # noqa: BLE001 (0.4.3 scores any other failure as not equal)
        return False


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
    out = [olmes_is_equiv(a, b) for a, b in pairs]
    tmp = dst + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"equivalent": out}, f)
    os.replace(tmp, dst)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
