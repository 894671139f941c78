"""Weighted source mixtures ([[data.sources]], docs/data.md "Mixtures"): the instances a run reads, found
again from its batch hashes by search over the sources' windows, against the per-step source counts it logs
and the global batch's floor/ceil of each ratio; RUN/data_mixture.json against counts computed here; a
bit-exact resume; 2 Gloo ranks reading the same global batches as one process; per-source validation
losses against transformers; the max_repetition error and the configuration errors; and the OLMo 3 stage 2
file (the Dolmino mix) parsing.

The three sources use disjoint token ranges (web 2-33, code 34-65, math 66-95), so a window names its source.
"""
import json
import math
import subprocess
import tomllib

import numpy as np
import pytest
import torch

from conftest import BINARY, REPO, run_cli, save_random_olmo3, tiny_olmo3_config
from test_distributed import assert_close_runs, torchrun
from test_train import VOCAB, base_sections, expect_error, final_weights, metrics, write_shards, write_toml
from tolerances import forward_bound, logprob_bound

SEQ = 16
GLOBAL_BATCH = 8  # micro_batch 2 x grad_accum 4 (or x 2 ranks x grad_accum 2)
RATIOS = {"web": 0.5, "code": 0.3, "math": 0.2}
RANGES = {"web": (2, 34), "code": (34, 66), "math": (66, 96)}
TOKENS = {"web": 2000, "code": 900, "math": 200}
PER_SHARD = {"web": 700, "code": 900, "math": 200}
MIX_TOKENS = 40 * SEQ  # one epoch: 40 instances = 5 steps; 8 steps cross into the second epoch
STEPS = 8


def source_tokens(name, n, seed):
    lo, hi = RANGES[name]
    rng = np.random.default_rng(seed)
    base = lo + np.arange(n) % (hi - lo)  # a pattern to learn, with noise
    return np.where(rng.random(n) < 0.3, rng.integers(lo, hi, n), base)


def windows(tokens, per_shard):
    """A source's windows in storage order: whole windows of each shard (a window never crosses a shard)."""
    out = []
    for start in range(0, len(tokens), per_shard):
        shard = tokens[start:start + per_shard]
        out += [list(map(int, shard[i:i + SEQ])) for i in range(0, len(shard) - SEQ + 1, SEQ)]
    return out


def mixture_toml(path, sections, sources, eval_sources=()):
    write_toml(path, sections)
    text = path.read_text()
    for s in sources:
        text += "\n[[data.sources]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in s.items())
    for s in eval_sources:
        text += "\n[[eval.sources]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in s.items())
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mixture")
    data = {name: source_tokens(name, TOKENS[name], seed) for seed, name in enumerate(RATIOS)}
    for name, tokens in data.items():
        write_shards(tmp / name, tokens, per_shard=PER_SHARD[name])
    valid = {name: source_tokens(name, 40 * SEQ, 10 + seed) for seed, name in enumerate(("web", "math"))}
    for name, tokens in valid.items():
        write_shards(tmp / f"valid-{name}", tokens)
    save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), tmp / "init")

    def config(run, grad_accum=4, shuffle=True, sources=None, **extra):
        s = base_sections(tmp, tmp / "init", run=run, data={"shuffle": shuffle, "mix_tokens": MIX_TOKENS},
                          train={"max_steps": STEPS, "grad_accum": grad_accum, "threads": 1},
                          checkpoint={"interval": 2, "keep_last": 5}, eval={"interval": 4, "batches": 2})
        del s["data"]["train"], s["debug"]
        for section, values in extra.items():
            s.setdefault(section, {}).update(values)
        if sources is None:
            sources = [{"name": n, "path": str(tmp / n), "ratio": r} for n, r in RATIOS.items()]
        eval_sources = [{"name": n, "path": str(tmp / f"valid-{n}")} for n in valid]
        return mixture_toml(tmp / f"{run}.toml", s, sources, eval_sources)

    config.tmp, config.data, config.valid = tmp, data, valid
    config.windows = {n: windows(t, PER_SHARD[n]) for n, t in data.items()}
    return config


def straight_run(mix):
    """The shuffled one-process run the resume and data-parallel tests compare with (trained once)."""
    if not (mix.tmp / "straight" / "checkpoints" / "final").exists():
        run_cli("train", "--config", mix("straight"))
    return mix.tmp / "straight"


def apportion(total, ratios):
    """Largest remainders, ties to the earlier source: the counts the engine must give each source."""
    quotas = [total * r / sum(ratios) for r in ratios]
    counts = [math.floor(q) for q in quotas]
    for i in sorted(range(len(ratios)), key=lambda i: (-(quotas[i] - counts[i]), i))[:total - sum(counts)]:
        counts[i] += 1
    return counts


def fnv1a(h, row):
    for t in row:
        h = ((h ^ t) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def find_sources(windows, taken, batch_hash):
    """Every assignment of the global batch's positions to sources, each source read in storage order from
    where it stands (`taken`), whose instances give `batch_hash`."""
    names = list(windows)
    found = []

    def search(position, h, used, order):
        if position == GLOBAL_BATCH:
            if f"{h:016x}" == batch_hash:
                found.append(list(order))
            return
        for name in names:
            k = (taken[name] + used[name]) % len(windows[name])
            used[name] += 1
            order.append(name)
            search(position + 1, fnv1a(h, windows[name][k]), used, order)
            order.pop()
            used[name] -= 1

    search(0, 1469598103934665603, {n: 0 for n in names}, [])
    return found


def test_instances_shares_and_the_mixture_record(mix):
    """Unshuffled, each source is read in storage order, so each step's batch is found again by search over
    which source each of its 8 positions came from: exactly one assignment gives the logged hash, and its
    counts are the logged source_tokens, floor or ceil of 8 x ratio each, the epoch's totals the
    apportionment of its 40 instances."""
    run_cli("train", "--config", mix("ordered", shuffle=False))
    run = mix.tmp / "ordered"
    steps = metrics(run)
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
    n = dict(zip(RATIOS, apportion(40, list(RATIOS.values()))))  # {web: 20, code: 12, math: 8}
    taken = {name: 0 for name in RATIOS}
    per_epoch = {name: 0 for name in RATIOS}
    for m in steps:
        if (m["step"] - 1) % 5 == 0:  # an epoch starts: each source from its first window again
            taken = {name: 0 for name in RATIOS}
        found = find_sources(mix.windows, taken, m["batch_hash"])
        assert len(found) == 1, f"step {m['step']}: {len(found)} assignments give the batch hash"
        counts = {name: found[0].count(name) for name in RATIOS}
        assert m["source_tokens"] == {name: c * SEQ for name, c in counts.items()}, m
        for name, c in counts.items():
            assert c in (math.floor(GLOBAL_BATCH * RATIOS[name]), math.ceil(GLOBAL_BATCH * RATIOS[name])), (m, name)
            taken[name] += c
        if m["step"] <= 5:
            for name, c in counts.items():
                per_epoch[name] += c
    assert per_epoch == n

    record = json.loads((run / "data_mixture.json").read_text())
    assert (record["instances_per_epoch"], record["tokens_per_epoch"]) == (40, 40 * SEQ)
    assert (record["requested_tokens"], record["global_batch"], record["sequence_length"]) == (MIX_TOKENS, 8, SEQ)
    assert [s["name"] for s in record["sources"]] == list(RATIOS)
    for s in record["sources"]:
        name = s["name"]
        available = len(mix.windows[name])
        files = sorted((mix.tmp / name).glob("part-*.npy"))
        assert s["files"] == [str(f) for f in files]
        assert s["available_tokens"] == TOKENS[name]
        assert s["available_instances"] == available
        assert s["requested_tokens"] == int(RATIOS[name] * MIX_TOKENS)
        assert (s["instances"], s["tokens"]) == (n[name], n[name] * SEQ)
        assert s["repetition"] == pytest.approx(n[name] / available, rel=1e-12)
        assert s["share"] == pytest.approx(n[name] / 40, rel=1e-12)


def test_validation_per_source_equals_transformers(mix):
    """valid/NAME/loss after the last step: the final weights' mean loss over the source's first
    eval.batches x micro_batch windows, against transformers' forward on the same windows."""
    from transformers import Olmo3ForCausalLM

    run = mix.tmp / "ordered"
    if not (run / "checkpoints" / "final").exists():
        run_cli("train", "--config", mix("ordered", shuffle=False))
    lines = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    valid = [l for l in lines if "valid/web/loss" in l]
    assert [l["step"] for l in valid] == [4, 8] and all("valid/math/loss" in l for l in valid)
    assert not any("valid_loss" in l for l in lines)  # no data.valid: only the sources' own
    final = (run / "checkpoints" / "final").read_text().strip()
    model = Olmo3ForCausalLM.from_pretrained(run / "checkpoints" / final / "model").eval()
    bound_logits = forward_bound(model, SEQ)
    for name, tokens in mix.valid.items():
        ids = torch.tensor(np.asarray(tokens[:4 * SEQ]).reshape(4, SEQ), dtype=torch.long)  # 2 batches of 2
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits.double(), -1)
        picked = -logp[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        want = float(picked.mean())
        # Each of the 60 log-probabilities within logprob_bound of transformers' (two fp32 forwards of the
        # same weights); their mean within the same.
        bound = logprob_bound(bound_logits, VOCAB, float(picked.abs().max()))
        assert abs(valid[-1][f"valid/{name}/loss"] - want) <= bound, (name, valid[-1], want, bound)


def test_resume_is_bit_exact(mix):
    straight = straight_run(mix)
    run_cli("train", "--config", mix("stopped"), "--stop-after", "5")  # checkpoint at 4; step 5 is lost
    run_cli("train", "--config", mix("stopped"), "--resume")
    a, b = metrics(straight), metrics(mix.tmp / "stopped")
    for key in ("batch_hash", "loss", "source_tokens"):
        assert [m[key] for m in a] == [m[key] for m in b], key
    wa, wb = final_weights(straight), final_weights(mix.tmp / "stopped")
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)
    # Shuffled, the instances are not the unshuffled run's (the comparison above is not of a trivial order).
    ordered = mix.tmp / "ordered"
    if (ordered / "metrics.jsonl").exists():
        assert [m["batch_hash"] for m in metrics(ordered)] != [m["batch_hash"] for m in a]


def test_two_ranks_read_the_same_global_batches_as_one_process(mix):
    straight = straight_run(mix)
    torchrun("train", "--config", mix("ranks2", grad_accum=2))
    assert_close_runs(straight, mix.tmp / "ranks2", "mixture: 2 ranks vs 1 process", steps=STEPS)
    assert [m["source_tokens"] for m in metrics(straight)] == [m["source_tokens"] for m in metrics(mix.tmp / "ranks2")]


def test_resume_under_another_mixture_is_refused(mix):
    run_cli("train", "--config", mix("remixed"), "--stop-after", "2")
    sources = [{"name": n, "path": str(mix.tmp / n), "ratio": r} for n, r in {"web": 0.6, "code": 0.2, "math": 0.2}.items()]
    expect_error(["train", "--config", mix("remixed", sources=sources), "--resume"], "cannot resume",
                 "[[data.sources]] or data.mix_tokens changed")


def test_a_source_short_of_its_share_is_named(mix):
    # math: 12 windows; at 0.5 of 40 instances it needs 20, 1.67 times over, more than max_repetition 1.5 allows.
    sources = [{"name": "web", "path": str(mix.tmp / "web"), "ratio": 0.5},
               {"name": "math", "path": str(mix.tmp / "math"), "ratio": 0.5, "max_repetition": 1.5}]
    expect_error(["train", "--config", mix("short", sources=sources)], "key 'data.sources[1]' (source \"math\"): its ratio 0.5", f"needs {20 * SEQ} tokens (20 instances of {SEQ})", "hold 200 tokens (12 instances)",
                 "1.66667 times over", "max_repetition 1.5", "(18 instances)")


def entry(mix, **fields):
    return {"name": "web", "path": str(mix.tmp / "web"), "ratio": 1.0, **fields}


@pytest.mark.parametrize("case, fragments", [
    ("sum", ["key 'data.sources': the ratios sum to 0.9 (0.5 + 0.4), not 1 (within 1e-6)"]),
    ("no_path", ["key 'data.sources[0].path' is required (or 'paths', a list)"]),
    ("both_paths", ["key 'data.sources[0].path' and 'paths' are exclusive"]),
    ("empty_paths", ["key 'data.sources[0].paths' must list at least one path"]),
    ("missing_path", ["key 'data.sources[0].paths': '", "nowhere' does not exist"]),
    ("duplicate", ["key 'data.sources[1].name': \"web\" names two sources; names must be unique"]),
    ("bad_name", ["key 'data.sources[0].name' must be 1 to 64 letters, digits", "not \"web/x\""]),
    ("negative_ratio", ["key 'data.sources[0].ratio' must be in (0, 1], got -0.5"]),
    ("repetition", ["key 'data.sources[0].max_repetition' must be a finite number >= 1, got 0.5"]),
    ("unknown", ["unknown key 'data.sources[0].weight'"]),
    ("not_table", ["key 'data.sources' must be an array of tables ([[data.sources]])"]),
    ("with_train", ["key 'data.train' and [[data.sources]] are exclusive"]),
    ("negative_budget", ["key 'data.mix_tokens' must be >= 1 (or 0: the run's tokens)"]),
    ("budget_alone", ["key 'data.mix_tokens' is the token budget of a mixture, and there is no [[data.sources]]"]),
    ("eval_no_path", ["key 'eval.sources[0].path' is required"]),
    ("eval_duplicate", ["key 'eval.sources[1].name': \"web\" names two sources"]),
])
def test_bad_mixture_tables_are_refused(mix, case, fragments):
    tmp = mix.tmp
    sources = {
        "sum": [entry(mix, ratio=0.5), entry(mix, name="code", path=str(tmp / "code"), ratio=0.4)],
        "no_path": [{"name": "web", "ratio": 1.0}],
        "both_paths": [entry(mix, paths=[str(tmp / "web")])],
        "empty_paths": [{"name": "web", "paths": [], "ratio": 1.0}],
        "missing_path": [{"name": "web", "paths": [str(tmp / "web"), str(tmp / "nowhere")], "ratio": 1.0}],
        "duplicate": [entry(mix, ratio=0.5), entry(mix, ratio=0.5)],
        "bad_name": [entry(mix, name="web/x")],
        "negative_ratio": [entry(mix, ratio=-0.5)],
        "repetition": [entry(mix, max_repetition=0.5)],
        "unknown": [entry(mix, weight=2)],
    }.get(case, [entry(mix)])
    path = mix(f"bad-{case}", sources=sources)
    text = path.read_text()
    if case == "not_table":
        text = text.split("[[data.sources]]")[0].replace("[data]", '[data]\nsources = "web"').split("[[eval")[0]
    if case == "with_train":
        text = text.replace("[data]", f'[data]\ntrain = "{tmp / "web"}"')
    if case == "negative_budget":
        text = text.replace(f"mix_tokens = {MIX_TOKENS}", "mix_tokens = -5")
    if case == "budget_alone":
        text = text.split("[[data.sources]]")[0].replace("[data]", f'[data]\ntrain = "{tmp / "web"}"')
    if case == "eval_no_path":
        text = text.split("[[eval.sources]]")[0] + '[[eval.sources]]\nname = "web"\n'
    if case == "eval_duplicate":
        text = text.replace('name = "math"\npath = ', 'name = "web"\npath = ')
    path.write_text(text)
    expect_error(["train", "--config", path], str(path), *fragments)


def test_sources_cannot_be_set_on_the_command_line(mix):
    expect_error(["train", "--config", mix("set"), "--set", "data.sources=web"],
                 "key 'data.sources' is a table; set it in the TOML file")


def test_the_stage_2_file_parses_with_the_dolmino_mix(tmp_path):
    """reproduce/olmo3-1b/stage2.toml: its sources' placeholder paths made to exist, both variants' configs
    are checked (sweep --dry-run loads each as train would, without data or model)."""
    stage = tomllib.loads((REPO / "reproduce" / "olmo3-1b" / "stage2.toml").read_text())
    sources = stage["data"]["sources"]
    shares = {s["name"]: s["ratio"] for s in sources}
    assert shares == {"web": 0.275, "code": 0.2, "math": 0.2, "qa": 0.139, "thinking": 0.075, "instruction": 0.061,
                      "pdfs": 0.05}
    assert sum(shares.values()) == pytest.approx(1, abs=1e-12)
    for s in sources:
        for p in s.get("paths", [s.get("path")]):
            (tmp_path / p).mkdir(parents=True)
    (tmp_path / stage["data"]["valid"]).mkdir(parents=True)
    (tmp_path / "reproduce").symlink_to(REPO / "reproduce")
    result = subprocess.run([str(BINARY), "sweep", "--config", "reproduce/olmo3-1b/stage2.toml", "--grid",
                             "model.variant=base,siamese_depth", "--dry-run"], cwd=tmp_path, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    assert "variant=base" in result.stdout + result.stderr and "variant=siamese_depth" in result.stdout + result.stderr
