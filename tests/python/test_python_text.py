"""The engine lowers and capitalizes text as Python does (text/python_str.h), over every code point whose case
Python changes: PopQA's exact_match (OLMES popqa.py:160-180: an alias a, a.lower() or a.capitalize() occurs in the
generation) rescored by the engine equals the rule computed by this Python, on rows built so that only the engine's
lower() (or only its capitalize()) can match. Also the final-sigma rule on the boundaries of the case-ignorable and
cased ranges, and on words. The reference is Python's own str methods (what lm-eval and OLMES run)."""
import json

from conftest import run_cli
from test_sft_metrics import ref_popqa

SURROGATES = range(0xD800, 0xE000)


def code_points():
    return (c for c in range(0x110000) if c not in SURROGATES)


def boundaries(predicate):
    """The first and last code point of each run where `predicate` holds, and the code points just outside."""
    out, previous = set(), False
    for c in range(0x110000):
        inside = c not in SURROGATES and predicate(chr(c))
        if inside != previous:
            out.update({c - 1, c} if c > 0 else {c})
        previous = inside
    return sorted(c for c in out if c not in SURROGATES)


def cased(x):
    return x.islower() or x.isupper() or x.istitle()


def rows_and_references():
    aliases_and_generations = []
    for c in code_points():
        x = chr(c)
        if x.lower() != x:  # only lower() can match: the generation starts lowercase, the alias and its capital don't
            alias = "Q" + x + "\u03a3"
            aliases_and_generations.append((alias, "<" + alias.lower() + ">"))
        if x.capitalize() != x:  # only capitalize() can match: its title form, then the lowered rest
            alias = x + "\u03a3x"
            aliases_and_generations.append((alias, "<" + alias.capitalize() + ">"))
    # The final-sigma rule on both sides of a capital sigma, for the ends of every cased and case-ignorable run.
    ignorable = lambda x: ("1" + x + "\u03a3").lower()[-1] == "\u03c3" and ("A" + x + "\u03a3").lower()[-1] == "\u03c2"
    for c in sorted(set(boundaries(cased)) | set(boundaries(ignorable))):
        x = chr(c)
        for alias in ("A" + x + "\u03a3", "1" + x + "\u03a3", "Q\u03a3" + x, "Q\u03a3" + x + "b", x + "\u03a3"):
            aliases_and_generations.append((alias, "<" + alias.lower() + ">"))
    for word in ("ΟΔΟΣ", "ΟΔΟΣ ΣΑ", "Σ", "ΣΣ", "AΣ.", "AΣ'B", "AΣ\u0301", "AΣ\u0301B", "ὈΔΥΣΣΕΎΣ", "ΣΑΣ!", "IΣ-"):
        aliases_and_generations.append((word, "<" + word.lower() + ">"))
        aliases_and_generations.append(("x" + word, "<" + ("x" + word).capitalize() + ">"))
    return aliases_and_generations


def test_lower_and_capitalize_equal_pythons_over_every_code_point(tmp_path):
    cases = rows_and_references()
    src, out, rows_out = tmp_path / "rows.jsonl", tmp_path / "out.json", tmp_path / "rescored.jsonl"
    with open(src, "w", encoding="utf-8") as f:
        for i, (alias, generation) in enumerate(cases):
            f.write(json.dumps({"task": "popqa", "format": "gen", "shots": 0, "doc_id": i, "native_id": i,
                                "prompt_tokens": [], "generation": generation, "gold": [alias]}) + "\n")
    run_cli("eval", "downstream", "--rescore", src, "--out", out, "--requests-out", rows_out)
    # split("\n"), not splitlines(): the rows hold U+2028 and U+0085 unescaped, as JSON allows
    rescored = [json.loads(line) for line in rows_out.read_text(encoding="utf-8").split("\n") if line]
    assert len(rescored) == len(cases) > 3000
    wrong = [(alias, generation) for (alias, generation), row in zip(cases, rescored)
             if row["metrics"]["exact_match"] != ref_popqa(generation, [alias])["exact_match"]]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ from Python, e.g. {wrong[:5]}"
    # The rows were built to match through the engine's forms: every one of them scores 1 in Python too.
    assert all(ref_popqa(g, [a])["exact_match"] == 1.0 for a, g in cases)
