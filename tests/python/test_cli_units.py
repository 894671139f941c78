"""Units on the command line (docs/commands.md, "Units"), over every flag of every command as `--help` lists them:
a memory size requires its unit (a bare number is refused with the accepted forms, never read as bytes); seconds,
bytes and tokens are named in the flag and said in its help; a sequence's length says "tokens" in its help. A flag
whose name or help speaks of such a quantity and that no table below classifies fails the test, so a new one is
classified when it lands. Usage lines name the program and the command."""
import re

import pytest

from conftest import run_cli, without_startup_note

# Words that mark a flag as possibly taking a memory size, a duration or a token count.
QUANTITY_WORDS = re.compile(r"\b(memory|bytes|seconds|timeout|interval|deadline|duration|tokens|length|stride|window|"
                            r"MiB|GiB|context)\b", re.IGNORECASE)

# Memory sizes: parsed with their unit (train/plan.h parse_memory_size). command -> flag -> (a valid value, the
# other arguments the command needs to reach the flag's check).
MEMORY_SIZE_FLAGS = {
    ("plan",): {"--gpu-memory": ["--preset", "micro", "--sequence-length", "64"]},
}

# Seconds, bytes or tokens: the unit is the end of a name of the flag and a word of its help.
NAMED_UNIT_FLAGS = {
    ("tokenize",): {"--shard-tokens": "tokens"},
    ("plan",): {"--loss-chunk-tokens": "tokens"},
    ("generate",): {"--max-new-tokens": "tokens"},
    ("eval", "ppl"): {"--max-tokens": "tokens"},
    ("eval", "downstream"): {"--batch-tokens": "tokens"},
    ("serve",): {"--log-stats-interval-s": "seconds", "--request-timeout-s": "seconds", "--max-body-bytes": "bytes",
                 "--max-header-bytes": "bytes", "--max-stop-bytes": "bytes", "--max-prompt-tokens": "tokens"},
}
UNIT_SUFFIXES = {"seconds": "-s", "bytes": "-bytes", "tokens": "-tokens"}

# A sequence's length (and a window's start spacing) is in tokens, as everywhere in the field; its help says so.
SEQUENCE_LENGTH_FLAGS = {
    ("plan",): ["--sequence-length"],
    ("analyze",): ["--sequence-length"],
    ("eval", "ppl"): ["--context", "--stride"],
    ("eval", "downstream"): ["--max-length"],
}

# Flags whose help mentions such a word but that take no memory size, duration or token count, with why.
NOT_QUANTITIES = {
    "--tokens": "token ids, not a count",
    "--prompt-tokens": "token ids, not a count",
    "--tokenizer": "a tokenizer",
    "--quantization": "a weight format (its help mentions bytes read)",
    "--repeat": "a count of forward passes (its help mentions the seconds printed)",
    "--no-access-log": "a switch (its help lists what the log line holds)",
    "--disable-log-requests": "a switch (its help lists what the log line holds)",
    "--disable-log-stats": "a switch",
    "--document-masking": "a switch",
    "--decode-steps": "a mode (its help mentions the KV cache's length)",
    "--spike-window": "a count of steps (its help says steps)",
    "--prompts-file": "a file",
    "--world": "a count of ranks",
    "--batch-size": "a count of sequences",
    "--sequences": "a count of sequences",
    "--max-batch": "a count of sequences",
    "--no-prefix-sharing": "a switch",
    "--chat": "a switch",
    "--context-parallel": "a count of ranks",
    "--format": "a file format",
    "--data": "a path",
    "--rescore": "a path",
    "--requests-out": "a path",
    "--profile": "a path",
    "--messages": "a path or JSON",
    "--token-dtype": "an element type",
    "--help": "help",
    "--x": "a choice of axis (step or tokens)",
    "--smooth": "a moving average's weight (its help mentions the tokens to reach a loss)",
    "--levels": "loss levels (its help mentions tokens-to-reach)",
    "--depth-stride": "Depth-Attention's stride over layers",
    "--depth-recent-window": "Depth-Attention's count of recent layers",
}


def help_text(command):
    return run_cli(*command, "--help").stdout


def subcommands(text):
    if "Subcommands:" not in text:
        return []
    return [line.split()[0] for line in text.split("Subcommands:")[1].splitlines() if line.startswith("  ") and line.split()]


def options(text):
    """(names, help) of each option in CLI11's --help: "  --a,--b TYPE  help", the help maybe on the next line."""
    found, section = [], None
    for line in text.splitlines():
        if line and not line.startswith(" "):
            section = line
            continue
        if not (section or "").startswith("Options"):
            continue
        if line.startswith("  -"):
            # The names, then the type and the help (CLI11 separates a long type from the help by one space only).
            head, _, rest = line.strip().partition(" ")
            names = [re.sub(r"\{.*\}$", "", n) for n in head.split(",")]
            found.append((names, rest.strip()))
        elif found and line.startswith(" " * 30):
            found[-1] = (found[-1][0], (found[-1][1] + " " + line.strip()).strip())
    return found


def every_command(command=()):
    text = help_text(command)
    yield command, text
    for sub in subcommands(text):
        yield from every_command(command + (sub,))


@pytest.fixture(scope="module")
def commands():
    return list(every_command())


def test_usage_lines_name_the_program_and_the_command(commands):
    for command, text in commands:
        usage = next(line for line in text.splitlines() if line.startswith("Usage:"))
        assert usage.startswith("Usage: " + " ".join(("archspace",) + command) + " "), (command, usage)


def test_every_flag_that_takes_a_quantity_is_classified_and_says_its_unit(commands):
    seen = set()
    for command, text in commands:
        for names, help_ in options(text):
            key = (command, names[0])
            if names[0] in MEMORY_SIZE_FLAGS.get(command, {}):
                assert "unit" in help_ and "GiB" in help_, key
                seen.add(key)
            elif names[0] in NAMED_UNIT_FLAGS.get(command, {}):
                unit = NAMED_UNIT_FLAGS[command][names[0]]
                assert names[0].endswith(UNIT_SUFFIXES[unit]), key
                assert re.search(rf"\b{unit}\b", help_), (key, help_)
                seen.add(key)
            elif names[0] in SEQUENCE_LENGTH_FLAGS.get(command, []):
                assert re.search(r"\btokens?\b", help_), (key, help_)
                seen.add(key)
            elif QUANTITY_WORDS.search(" ".join(names) + " " + help_):
                assert any(n in NOT_QUANTITIES for n in names), (
                    f"archspace {' '.join(command)} {names[0]}: its name or help speaks of a quantity ({help_!r}); "
                    "classify it in tests/python/test_cli_units.py and give it its unit (docs/commands.md, Units)")
    # Every flag the tables name still exists (a renamed flag does not silently leave its row behind).
    named = {(c, f) for table in (MEMORY_SIZE_FLAGS, NAMED_UNIT_FLAGS) for c, flags in table.items() for f in flags}
    named |= {(c, f) for c, flags in SEQUENCE_LENGTH_FLAGS.items() for f in flags}
    assert named <= seen, named - seen


@pytest.mark.parametrize("command,flag,args", [(c, f, a) for c, flags in MEMORY_SIZE_FLAGS.items()
                                               for f, a in flags.items()])
@pytest.mark.parametrize("bare", ["80", "80.5", "0x50"])
def test_a_bare_memory_size_is_refused_with_the_accepted_forms(command, flag, args, bare):
    r = run_cli(*command, *args, flag, bare, check=False)
    assert r.returncode == 1, r.stdout
    assert without_startup_note(r.stderr).startswith("error"), r.stderr
    assert flag in r.stderr and f"'{bare}'" in r.stderr, r.stderr
    for form in ("80GiB", "80GB", "81920MiB"):
        assert form in r.stderr, r.stderr


@pytest.mark.parametrize("command,flag,args", [(c, f, a) for c, flags in MEMORY_SIZE_FLAGS.items()
                                               for f, a in flags.items()])
def test_a_memory_size_with_its_unit_is_read_in_that_unit(command, flag, args):
    import json
    for text, expected in [("80GiB", 80 << 30), ("80 GB", 80 << 30), ("81920MiB", 80 << 30), ("1024B", 1024),
                           ("0.5T", 1 << 39)]:
        out = json.loads(run_cli(*command, *args, flag, text, "--json").stdout)
        assert out["fit"]["gpu_memory"] == expected, text


def test_the_older_duration_flag_names_still_work(tmp_path):
    """--request-timeout and --log-stats-interval are the -s flags' synonyms (scripts keep working)."""
    text = help_text(("serve",))
    assert "--request-timeout-s,--request-timeout" in text
    assert "--log-stats-interval-s,--log-stats-interval" in text
    r = run_cli("serve", str(tmp_path / "absent"), "--request-timeout", "abc", check=False)
    assert r.returncode == 1 and "--request-timeout" in r.stderr, r.stderr
