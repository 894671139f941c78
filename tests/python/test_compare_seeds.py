"""archspace compare with several seeds per side (eval/seed_statistics.h): runs paired by seed, every mismatch named
for every run, and the convergence statistics against independent references: the seed resamples redrawn in numpy
(SplitMix64, as compare.h and seed_statistics.h state the draws) with numpy.percentile over the same statistics,
Student's t intervals and p against scipy.stats (ttest_rel, ttest_ind with equal_var=False, t.ppf), and the
seeds-per-arm formula against scipy's exact noncentral-t power and a simulation of the t-test."""
import json

import numpy as np
import pytest
import scipy.stats

from conftest import run_cli
from test_compare import mix

GAMMA = 0x9E3779B97F4A7C15


def write_seeded_run(path, losses, seed, valid=None, tokens_per_step=256, lr=None, hashes=None):
    """A run directory as `train` leaves it, as far as compare reads it: metrics.jsonl and one checkpoint's
    trainer_state.json (with its seed)."""
    path.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, loss in enumerate(losses):
        lines.append({"step": i + 1, "tokens": (i + 1) * tokens_per_step, "loss": float(loss),
                      "lr": (lr or [1e-3] * len(losses))[i],
                      "batch_hash": (hashes or [f"s{seed}-{i}" for i in range(len(losses))])[i]})
    for step, loss in (valid or []):
        lines.append({"step": step, "tokens": step * tokens_per_step, "valid_loss": float(loss)})
    (path / "metrics.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    ckpt = path / "checkpoints" / f"step-{len(losses):08d}"
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"seed": seed, "sequence_length": 128, "global_batch": 8}))
    (ckpt / "checksums.json").write_text("{}")  # a finished checkpoint (io/run_dir.h)
    return path


def seeded_curves(rng, k, steps, offset, spread=0.01):
    """k runs' loss curves: a shared decay, a per-seed level (the seed effect) and step noise."""
    t = np.arange(1, steps + 1)
    base = 2.0 + 3.0 * np.exp(-t / 15)
    return [base + offset + rng.normal(0, spread) + rng.normal(0, 0.02, steps) for _ in range(k)]


def ema(values, weight):
    out, last, norm = [], 0.0, 0.0
    for v in values:
        last, norm = weight * last + (1 - weight) * v, weight * norm + (1 - weight)
        out.append(last / norm)
    return np.array(out)


def draws(seed, count):
    """The first `count` outputs of the seeds' stream, as fractions u in [0, 1)."""
    state = int(mix(np.uint64((seed + (1 << 32)) & ((1 << 64) - 1))))
    k = np.arange(1, count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return (mix(np.uint64(state) + k * np.uint64(GAMMA)) >> np.uint64(11)).astype(float) * 2.0 ** -53


def reach(tokens, curve, level):
    hit = np.nonzero(curve <= level)[0]
    return tokens[hit[0]] if len(hit) else None


@pytest.fixture(scope="module")
def five_seeds(tmp_path_factory):
    """Five seeds per side, B 0.03 lower: A's seeds in order 0..4, B's listed in another order."""
    tmp = tmp_path_factory.mktemp("seeds")
    rng = np.random.default_rng(11)
    steps, seeds = 60, [0, 1, 2, 3, 4]
    ca, cb = seeded_curves(rng, 5, steps, 0.0), seeded_curves(rng, 5, steps, -0.03)
    va = [c[-1] + rng.normal(0, 0.01) for c in ca]
    vb = [c[-1] + rng.normal(0, 0.01) for c in cb]
    runs_a = [write_seeded_run(tmp / f"A{s}", ca[s], s, valid=[(steps, va[s])]) for s in seeds]
    order_b = [3, 0, 4, 1, 2]
    runs_b = [write_seeded_run(tmp / f"B{s}", cb[s], s, valid=[(steps, vb[s])]) for s in order_b]
    out = tmp / "out"
    resamples, seed, smooth = 400, 9, 0.6
    r = run_cli("compare", "--a", *runs_a, "--b", *runs_b, "--resamples", resamples, "--seed", seed, "--smooth", smooth,
                "--out", out, "--no-plot")
    report = json.loads((out / "compare.json").read_text())
    return dict(report=report, stdout=r.stdout, ca=ca, cb=[cb[s] for s in order_b], va=va, vb=[vb[s] for s in order_b],
                order_b=order_b, steps=steps, resamples=resamples, seed=seed, smooth=smooth)


def test_runs_are_paired_by_seed(five_seeds):
    r = five_seeds["report"]
    assert r["pairing"] == "seed" and r["matched"], r["differences"]
    s = r["seeds"]
    assert s["paired"] and s["runs_a"] == 5 and s["runs_b"] == 5
    partners = {a.rsplit("/", 1)[1]: b.rsplit("/", 1)[1] for a, b in s["pairs"]}
    assert partners == {f"A{i}": f"B{i}" for i in range(5)}


def test_seed_intervals_against_numpy_and_scipy(five_seeds):
    f = five_seeds
    s, resamples = f["report"]["seeds"], f["resamples"]
    # Pairs (A seed i, B seed i): B's runs were listed in order_b.
    b_of = {seed: j for j, seed in enumerate(f["order_b"])}
    A = np.array([ema(c, f["smooth"]) for c in f["ca"]])
    B = np.array([ema(f["cb"][b_of[i]], f["smooth"]) for i in range(5)])
    VA, VB = np.array(f["va"]), np.array([f["vb"][b_of[i]] for i in range(5)])
    tokens = np.arange(1, f["steps"] + 1) * 256.0
    n = f["steps"]
    checkpoints = sorted({int(np.floor(q * (n - 1) + 0.5)) for q in (0.25, 0.5, 0.75, 1.0)})
    picks = np.floor(draws(f["seed"], resamples * 5).reshape(resamples, 5) * 5).astype(int)
    for row, j in zip(s["loss_at_tokens"], checkpoints):
        assert row["tokens"] == tokens[j]
        d = B[:, j] - A[:, j]
        assert row["diff"] == pytest.approx(d.mean(), abs=1e-12)
        resampled = np.array([d[p].mean() for p in picks])
        assert row["bootstrap"]["low"] == pytest.approx(np.percentile(resampled, 2.5), abs=1e-12)
        assert row["bootstrap"]["high"] == pytest.approx(np.percentile(resampled, 97.5), abs=1e-12)
        t = scipy.stats.ttest_rel(B[:, j], A[:, j])
        lo, hi = t.confidence_interval(0.95)
        assert row["t"]["p"] == pytest.approx(t.pvalue, rel=1e-9, abs=1e-14)
        assert (row["t"]["low"], row["t"]["high"]) == (pytest.approx(lo, abs=1e-12), pytest.approx(hi, abs=1e-12))
        assert row["sd"] == pytest.approx(d.std(ddof=1), abs=1e-14)
    v = s["final_valid"]
    dv = VB - VA
    assert v["diff"] == pytest.approx(dv.mean(), abs=1e-12)
    resampled = np.array([dv[p].mean() for p in picks])
    assert v["bootstrap"]["low"] == pytest.approx(np.percentile(resampled, 2.5), abs=1e-12)
    assert v["t"]["p"] == pytest.approx(scipy.stats.ttest_rel(VB, VA).pvalue, rel=1e-9)
    # Tokens-to-reach ratios: the side mean curves of the drawn pairs.
    for row in s["tokens_to_reach"]:
        level = row["loss"]
        ratios = []
        for p in picks:
            ta, tb = reach(tokens, A[p].mean(0), level), reach(tokens, B[p].mean(0), level)
            ratios.append(tb / ta if ta and tb else np.nan)
        ratios = np.array(ratios)
        ok = ratios[~np.isnan(ratios)]
        assert row["defined"] == len(ok)
        if len(ok):
            assert row["low"] == pytest.approx(np.percentile(ok, 2.5), abs=1e-12)
            assert row["high"] == pytest.approx(np.percentile(ok, 97.5), abs=1e-12)
        ta, tb = reach(tokens, A.mean(0), level), reach(tokens, B.mean(0), level)
        assert row["ratio"] == (pytest.approx(tb / ta, abs=1e-12) if ta and tb else None)
    # The bands: mean +- t_{0.975, 4} sd / sqrt(5) of each side's smoothed curves.
    half = scipy.stats.t.ppf(0.975, 4) * A.std(0, ddof=1) / np.sqrt(5)
    assert np.allclose(s["band_a"]["low"], A.mean(0) - half, atol=1e-12, rtol=0)
    assert "## Seeds" in f["stdout"] and "final validation loss" in f["stdout"]


def test_unpaired_sides_use_welch_and_resample_each_side(tmp_path):
    rng = np.random.default_rng(5)
    ca, cb = seeded_curves(rng, 3, 30, 0.0), seeded_curves(rng, 4, 30, 0.05)
    runs_a = [write_seeded_run(tmp_path / f"A{i}", c, i) for i, c in enumerate(ca)]
    runs_b = [write_seeded_run(tmp_path / f"B{i}", c, 10 + i) for i, c in enumerate(cb)]
    out, resamples, seed = tmp_path / "out", 300, 2
    run_cli("compare", "--a", *runs_a, "--b", *runs_b, "--resamples", resamples, "--seed", seed, "--smooth", 0,
            "--out", out, "--no-plot")
    r = json.loads((out / "compare.json").read_text())
    s = r["seeds"]
    assert not s["paired"] and s["final_valid"] is None
    # Every run named: A's three paired in order with B's first three, each pair's seeds named; B's fourth unpaired.
    assert r["pairing"] == "position"
    for i in range(3):
        assert any(d.startswith(f"seed: {i} vs {10 + i} (") for d in r["differences"]), r["differences"]
    assert [d for d in r["differences"] if d.startswith("runs: 3 vs 4;")] == \
        [f"runs: 3 vs 4; B run {runs_b[3]} (seed 13) has no partner"]
    A, B = np.array(ca), np.array(cb)
    u = draws(seed, resamples * 7).reshape(resamples, 7)
    pa, pb = np.floor(u[:, :3] * 3).astype(int), np.floor(u[:, 3:] * 4).astype(int)
    row = s["loss_at_tokens"][-1]
    j = 29
    resampled = np.array([B[pb[k], j].mean() - A[pa[k], j].mean() for k in range(resamples)])
    assert row["bootstrap"]["low"] == pytest.approx(np.percentile(resampled, 2.5), abs=1e-12)
    welch = scipy.stats.ttest_ind(B[:, j], A[:, j], equal_var=False)
    assert row["t"]["p"] == pytest.approx(welch.pvalue, rel=1e-9)
    lo, hi = welch.confidence_interval(0.95)
    assert row["t"]["low"] == pytest.approx(lo, abs=1e-10) and row["t"]["high"] == pytest.approx(hi, abs=1e-10)


def test_every_mismatch_is_named_for_every_run(tmp_path):
    """A third seed of A trained with another schedule, paired with a B run of a seed A lacks, and a fourth B run
    without a partner: each named, with its runs."""
    losses = [3.0, 2.5, 2.2, 2.0]
    runs_a = [write_seeded_run(tmp_path / "A0", losses, 0), write_seeded_run(tmp_path / "A1", losses, 1),
              write_seeded_run(tmp_path / "A2", losses, 2, lr=[2e-3] * 4)]
    runs_b = [write_seeded_run(tmp_path / "B0", losses, 0, hashes=[f"s0-{i}" for i in range(4)]),
              write_seeded_run(tmp_path / "B1", losses, 1), write_seeded_run(tmp_path / "B7", losses, 7),
              write_seeded_run(tmp_path / "B8", losses, 8)]
    out = tmp_path / "out"
    run_cli("compare", "--a", *runs_a, "--b", *runs_b, "--out", out, "--no-plot")
    report = json.loads((out / "compare.json").read_text())
    d = report["differences"]
    assert any(x.startswith("schedule:") and "A0" in x and "A2" in x and x.endswith("A2)") for x in d), d
    assert any(x.startswith("seed: 2 vs 7 (") and "A2" in x and "B7" in x for x in d), d
    assert any(x.startswith("batches:") and "A2" in x and "B7" in x for x in d), d  # another seed, other batches
    assert any(x.startswith("runs: 3 vs 4;") and "B8" in x and "(seed 8) has no partner" in x for x in d), d
    assert not any(x.startswith("batches:") and ("A0 vs" in x or "A1 vs" in x) for x in d), d
    assert report["pairing"] == "position" and not report["seeds"]["paired"]


@pytest.mark.parametrize("paired", [True, False])
def test_seeds_needed_against_exact_power_and_a_simulation(tmp_path, paired):
    """compare's seeds per arm for the final validation loss equal the formula it names (scipy's normal quantiles),
    and that count is, by scipy's exact noncentral-t power of the test it stands for, within one of the smallest
    count reaching 80%; a simulation of that t-test confirms the exact power within 4 Monte-Carlo standard errors."""
    rng = np.random.default_rng(21 if paired else 22)
    k = 6
    va, vb = 3.0 + rng.normal(0, 0.01, k), 3.0 + rng.normal(0, 0.01, k)
    if paired:  # a shared seed effect: the pair differences spread less than the runs
        shared = rng.normal(0, 0.01, k)
        va, vb = va + shared, vb + shared
    runs_a = [write_seeded_run(tmp_path / f"A{i}", [3.5, 3.2, 3.0], i, valid=[(3, va[i])]) for i in range(k)]
    runs_b = [write_seeded_run(tmp_path / f"B{i}", [3.5, 3.2, 3.0], i if paired else 100 + i, valid=[(3, vb[i])])
              for i in range(k)]
    out = tmp_path / "out"
    run_cli("compare", "--a", *runs_a, "--b", *runs_b, "--resamples", 100, "--out", out, "--no-plot")
    v = json.loads((out / "compare.json").read_text())["seeds"]["final_valid"]
    sd = np.std(vb - va, ddof=1) if paired else np.sqrt((np.var(va, ddof=1) + np.var(vb, ddof=1)) / 2)
    assert v["sd"] == pytest.approx(sd, rel=1e-12)
    za, zb = scipy.stats.norm.ppf(0.975), scipy.stats.norm.ppf(0.8)
    for entry in v["seeds_needed"]:
        delta = entry["delta"]
        base = ((za + zb) * sd / delta) ** 2
        n_formula = max(2, int(np.ceil(base + za * za / 2 if paired else 2 * base + za * za / 4)))
        assert entry["seeds_per_arm"] == n_formula, (delta, entry)

        def exact_power(n):
            if paired:
                dof, nc = n - 1, delta / (sd / np.sqrt(n))
            else:
                dof, nc = 2 * n - 2, delta / (sd * np.sqrt(2 / n))
            crit = scipy.stats.t.ppf(0.975, dof)
            return scipy.stats.nct.sf(crit, dof, nc) + scipy.stats.nct.cdf(-crit, dof, nc)

        smallest = next(n for n in range(2, 10000) if exact_power(n) >= 0.8)
        assert abs(n_formula - smallest) <= 1, (delta, n_formula, smallest)
    # The exact power against a simulation of the t-test, at the count for 0.01 nats.
    n, delta, sims = v["seeds_needed"][1]["seeds_per_arm"], 0.01, 4000
    sim = np.random.default_rng(3)
    if paired:
        x = sim.normal(delta, sd, (sims, n))
        p = scipy.stats.ttest_1samp(x, 0, axis=1).pvalue
    else:
        x, y = sim.normal(0, sd, (sims, n)), sim.normal(delta, sd, (sims, n))
        p = scipy.stats.ttest_ind(y, x, axis=1).pvalue
    rate = (p < 0.05).mean()
    expected = exact_power(n)
    assert abs(rate - expected) <= 4 * np.sqrt(expected * (1 - expected) / sims), (rate, expected)


def test_the_suite_table_of_two_models_equals_their_own_evaluations(tmp_path):
    """`eval downstream --suite olmo3-sft --requests-out` of two models, then `compare --suite olmo3-sft` on their
    rows: eight rows (bbh at its micro aggregate, minerva_math and mmlu at their macro, truthfulqa mc2 scored per
    document from the rows) and the macro, whose per-side values equal each model's own suite table in --out."""
    import test_downstream as ds
    from test_chat_eval import suite_request_files
    from test_compare import write_run

    suite_request_files(tmp_path / "tasks")  # bbh's 27 subtasks, ifeval, popqa, truthfulqa as OLMES writes them
    outs, rows = {}, {}
    for variant in ("base", "siamese"):
        hf = ds.export(tmp_path, variant)
        outs[variant], rows[variant] = tmp_path / f"{variant}.json", tmp_path / f"{variant}.jsonl"
        run_cli("eval", "downstream", "--model", hf, "--suite", "olmo3-sft", "--tasks-dir", tmp_path / "tasks",
                "--limit", 1, "--out", outs[variant], "--requests-out", rows[variant])
    runs = [write_run(tmp_path / f"run-{v}", [3.0, 2.5]) for v in ("base", "siamese")]
    out = tmp_path / "cmp"
    run_cli("compare", *runs, "--eval-a", rows["base"], "--eval-b", rows["siamese"], "--suite", "olmo3-sft",
            "--resamples", 200, "--out", out, "--no-plot")
    suite = json.loads((out / "compare.json").read_text())["evaluation"]["suite"]
    own = {v: {r["task"]: r for r in json.loads(outs[v].read_text())["suite"]["rows"]} for v in outs}
    assert [r["task"] for r in suite["rows"]] == list(own["base"]) and not suite["missing"]
    assert len(suite["rows"]) == 8
    for row in suite["rows"]:
        for side, variant in (("a", "base"), ("b", "siamese")):
            expected = own[variant][row["task"]]
            assert row["metric"] == expected["metric"]
            assert row[side] == pytest.approx(expected["value"], abs=1e-12), (row["task"], side)
        assert row["low"] <= row["diff"] <= row["high"] or row["low"] == row["high"]
    for side, variant in (("a", "base"), ("b", "siamese")):
        assert suite["macro"][side] == pytest.approx(json.loads(outs[variant].read_text())["suite"]["macro"], abs=1e-12)


def test_acc_uncond_is_scored_from_the_unconditional_rows(tmp_path):
    """A task whose primary metric is acc_uncond (ARC-Challenge's installed RC files, the config's primary set to
    it): compare scores each document from its choices' log-likelihoods over their unconditional rows, and the
    per-side means equal each model's acc_uncond in eval downstream's --out."""
    import shutil

    import test_downstream as ds
    from test_compare import write_run
    from test_generation_metrics import OE_TASKS

    variant = OE_TASKS / "arc_challenge" / "rc_0shot"
    task = tmp_path / "tasks" / "arc_challenge" / "rc_0shot"
    shutil.copytree(variant, task)
    config = json.loads((task / "config.json").read_text())
    config["task_config"]["primary_metric"] = "acc_uncond"
    (task / "config.json").write_text(json.dumps(config))
    values, rows = {}, {}
    for model in ("base", "siamese"):
        hf = ds.export(tmp_path, model)
        out, rows[model] = tmp_path / f"{model}.json", tmp_path / f"{model}.jsonl"
        run_cli("eval", "downstream", "--model", hf, "--tasks", "arc_challenge", "--tasks-dir", tmp_path / "tasks",
                "--format", "rc", "--shots", 0, "--limit", 12, "--out", out, "--requests-out", rows[model])
        result = [r for r in json.loads(out.read_text())["results"] if r["task"] == "arc_challenge"]
        (values[model],) = [r["value"] for r in result if r["metric"] == "acc_uncond" and r["primary"]]
    runs = [write_run(tmp_path / f"run-{m}", [3.0, 2.5]) for m in ("base", "siamese")]
    run_cli("compare", *runs, "--eval-a", rows["base"], "--eval-b", rows["siamese"], "--resamples", 200,
            "--out", tmp_path / "cmp", "--no-plot")
    (t,) = json.loads((tmp_path / "cmp" / "compare.json").read_text())["evaluation"]["tasks"]
    assert t["metric"] == "acc_uncond" and t["n"] == 12
    assert t["a"] == pytest.approx(values["base"], abs=1e-12) and t["b"] == pytest.approx(values["siamese"], abs=1e-12)


def test_seeds_needed_per_task_from_the_runs_means(tmp_path):
    """Four seeds per side with evaluation rows: each task's seeds per arm for 1 and 2 points from the spread of the
    pair differences of the runs' task means, by the formula the seeds section names."""
    from test_compare import gen_rows, write_rows

    rng = np.random.default_rng(8)
    k, n = 4, 200
    A = [(rng.random(n) < 0.40 + 0.03 * rng.normal()).astype(float) for _ in range(k)]
    B = [(rng.random(n) < 0.45 + 0.03 * rng.normal()).astype(float) for _ in range(k)]
    files_a = [write_rows(tmp_path / f"a{i}.jsonl", gen_rows("gsm8k", list(x))) for i, x in enumerate(A)]
    files_b = [write_rows(tmp_path / f"b{i}.jsonl", gen_rows("gsm8k", list(x))) for i, x in enumerate(B)]
    runs_a = [write_seeded_run(tmp_path / f"A{i}", [3.0, 2.5], i) for i in range(k)]
    runs_b = [write_seeded_run(tmp_path / f"B{i}", [3.0, 2.4], i) for i in range(k)]
    r = run_cli("compare", "--a", *runs_a, "--b", *runs_b, "--eval-a", *files_a, "--eval-b", *files_b,
                "--resamples", 200, "--out", tmp_path / "out", "--no-plot")
    (t,) = json.loads((tmp_path / "out" / "compare.json").read_text())["evaluation"]["tasks"]
    d = np.array([b.mean() - a.mean() for a, b in zip(A, B)])
    sd = d.std(ddof=1)
    assert t["seeds_needed"]["sd"] == pytest.approx(sd, rel=1e-12)
    za, zb = scipy.stats.norm.ppf(0.975), scipy.stats.norm.ppf(0.8)
    for row in t["seeds_needed"]["rows"]:
        expected = max(2, int(np.ceil(((za + zb) * sd / row["delta"]) ** 2 + za * za / 2)))
        assert row["seeds_per_arm"] == expected
    assert "Seeds per arm to detect 1 / 2 points" in r.stdout


@pytest.mark.parametrize("config_b,named", [("runs/config-siamese_depth.json", False),
                                            ("runs/config-other.json", True)])
def test_a_model_config_named_by_the_variant_is_the_change_under_test(tmp_path, config_b, named):
    """A sweep's model.config = "runs/config-{variant}.json" expands to each variant's path: that difference is the
    variant itself; a path that differs otherwise is named."""
    runs = []
    for side, variant, config in (("A", "base", "runs/config-base.json"), ("B", "siamese_depth", config_b)):
        run = write_seeded_run(tmp_path / side, [3.0, 2.5], 0)
        ckpt = next((run / "checkpoints").iterdir())
        (ckpt / "train_config.toml").write_text(f'[model]\nvariant = "{variant}"\nconfig = "{config}"\n'
                                                f'[train]\nseed = 0\nrun_dir = "{run}"\n')
        runs.append(run)
    out = tmp_path / "out"
    run_cli("compare", *runs, "--out", out, "--no-plot")
    d = json.loads((out / "compare.json").read_text())["differences"]
    assert any(x.startswith("config: model.config:") for x in d) == named, d


@pytest.mark.parametrize("multi_true,fragment", [
    (None, "needs the row's \"multi_true\" labels"),
    ({"labels": [1], "mc1_indices": [0, 1], "mc2_indices": [0, 1]}, "choice 1 has no label or no row"),
    ({"labels": [1, 0], "mc1_indices": [0, 5], "mc2_indices": [0]}, "choice 5 has no label or no row"),
    ({"labels": "x", "mc1_indices": [0], "mc2_indices": [0]}, "its multi_true labels do not fit its choices"),
])
def test_truthfulqa_rows_with_bad_labels_are_named(tmp_path, multi_true, fragment):
    from test_compare import write_rows, write_run

    rows = []
    for idx in range(2):
        row = {"task": "truthfulqa", "format": "rc", "doc_id": 0, "idx": idx, "loglikelihood": -1.0 - idx,
               "n_continuation_tokens": 2, "label": 0, "primary_metric": "mc2", "continuation": " x"}
        if multi_true is not None:
            row["multi_true"] = multi_true
        rows.append(row)
    f = write_rows(tmp_path / "rows.jsonl", rows)
    runs = [write_run(tmp_path / s, [3.0, 2.5]) for s in "AB"]
    r = run_cli("compare", *runs, "--eval-a", f, "--eval-b", f, "--no-plot", check=False)
    assert r.returncode != 0 and fragment in r.stderr and "rows.jsonl:1" in r.stderr, r.stderr
