"""Nothing lost at the edges of a run (docs/faults.md, "Nothing saved is lost"): a final save interrupted at any of its
stages, or by a full disk at any of its files, is completed by `train --resume` into exactly the checkpoints an
uninterrupted run leaves; a run directory whose final save was cut short is refused by the commands that read it,
saying how to complete it; every load of a checkpoint for use verifies its checksums (or says that it skips them);
every write error names the file and the system's reason."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import types

import pytest

from conftest import BINARY, save_random_olmo3, tiny_olmo3_config
from test_serve import Server
from test_tokenizer import DOLMA2
from test_train import base_sections, synthetic_tokens, write_shards, write_toml

MAX_STEPS = 6  # checkpoints at 2, 4 and 6 (the final one); keep_last 2 prunes step 2 in the final save
FINAL = "step-00000006"
KILL = "ARCHSPACE_TEST_KILL_DURING_CHECKPOINT"
# The kill hook's stages (src/train/checkpoint.cpp, kSaveStages), in the order a save reaches them.
STAGES = ["model", "optimizer", "state", "checksums", "published", "latest", "final", "pruning"]
# The files of a save, in the order it writes them (model/ first: weights, config, tokenizer), then its pointers.
SAVE_FILES = ["model/model.safetensors", "model/config.json", "model/tokenizer.json", "optimizer.safetensors",
              "trainer_state.json", "train_config.toml", "checksums.json", "latest", "final"]
CHECKPOINT_FILES = SAVE_FILES[:7]


def tree(directory):
    """Every file under `directory` (relative path -> bytes) and every directory: two runs left the same checkpoints
    when their trees are equal."""
    return {str(p.relative_to(directory)): (p.read_bytes() if p.is_file() else "dir")
            for p in sorted(directory.rglob("*"))}


def run(cwd, *args, env=None, timeout=300):
    return subprocess.run([str(BINARY), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """Shards carrying a tokenizer file (the dolma2 file's bytes: training only hashes and copies it), a tiny model,
    and one config whose run_dir is relative ("run"), so that every case writes the same train_config.toml; and the
    checkpoints of the uninterrupted run, which every case must end with, byte for byte."""
    w = tmp_path_factory.mktemp("edges")
    shards = write_shards(w / "shards", synthetic_tokens(3000), per_shard=1500)
    shutil.copy(DOLMA2, shards / "tokenizer.json")
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["tokenizer"]["sha256"] = hashlib.sha256(DOLMA2.read_bytes()).hexdigest()
    (shards / "manifest.json").write_text(json.dumps(manifest))
    save_random_olmo3(tiny_olmo3_config(num_key_value_heads=2), w / "init")
    s = base_sections(w, w / "init", train={"max_steps": MAX_STEPS}, checkpoint={"interval": 2, "keep_last": 2},
                      data={"shuffle": True})
    s["train"]["run_dir"] = "run"
    del s["debug"]
    config = write_toml(w / "edge.toml", s)
    (w / "reference").mkdir()
    done = run(w / "reference", "train", "--config", config)
    assert done.returncode == 0, done.stderr
    reference = w / "reference" / "run" / "checkpoints"
    assert sorted(p.name for p in reference.iterdir()) == ["final", "latest", "step-00000004", FINAL]
    return types.SimpleNamespace(dir=w, config=config, reference=reference, shards=shards)


def eval_ppl(cwd, workspace, model, *extra):
    return run(cwd, "eval", "ppl", "--model", model, "--data", workspace.shards, "--context", 16, "--max-tokens", 64,
               *extra)


@pytest.mark.parametrize("stage", STAGES)
def test_a_final_save_killed_at_each_stage_is_completed_by_resume(workspace, tmp_path, stage):
    killed = run(tmp_path, "train", "--config", workspace.config, env={KILL: f"{MAX_STEPS}:{stage}"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    checkpoints = tmp_path / "run" / "checkpoints"
    if stage not in ("final", "pruning"):
        # No `final` yet: the run cannot be used as a model, and the error says how to complete it.
        refused = eval_ppl(tmp_path, workspace, "run")
        assert refused.returncode == 1, refused.stderr
        for fragment in ("run: the run has not finished", "checkpoints/final is missing", "--resume",
                         "train_config.toml"):
            assert fragment in refused.stderr, refused.stderr
    resumed = run(tmp_path, "train", "--config", workspace.config, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    published = STAGES.index(stage) >= STAGES.index("published")  # step 6 was complete when the kill came
    assert ("completed the interrupted final save of step 6" in resumed.stderr) == published, resumed.stderr
    assert tree(checkpoints) == tree(workspace.reference)
    assert eval_ppl(tmp_path, workspace, "run").returncode == 0
    # Resuming a finished run changes nothing and says so.
    again = run(tmp_path, "train", "--config", workspace.config, "--resume")
    assert again.returncode == 0 and "already finished (step 6)" in again.stderr, again.stderr
    assert tree(checkpoints) == tree(workspace.reference)


def test_an_unknown_kill_stage_is_an_error_not_a_run_that_never_dies(workspace, tmp_path):
    r = run(tmp_path, "train", "--config", workspace.config, env={KILL: f"{MAX_STEPS}:renamed"})
    assert r.returncode == 1 and "no save stage 'renamed'" in r.stderr and "published" in r.stderr, r.stderr


def mount_namespace():
    """The command prefix that gives a script its own mount namespace where it may mount a tmpfs: as root
    `unshare -m`, otherwise a user namespace (`unshare -rm`); None where neither works here."""
    for prefix in (["unshare", "-m"] if os.geteuid() == 0 else [], ["unshare", "-rm"]):
        if not prefix or shutil.which("unshare") is None:
            continue
        probe = subprocess.run([*prefix, "sh", "-c", "d=$(mktemp -d) && mount -t tmpfs -o size=1m tmpfs $d"],
                               capture_output=True)
        if probe.returncode == 0:
            return prefix
    return None


PAGE = 4096


def pages(n):
    return -(-n // PAGE)


def room_before(reference, target):
    """The tmpfs pages a final save uses before it writes `target`, plus half of `target`'s own when it spans several:
    a disk with this much room fills inside `target`. Directories take no pages on a tmpfs; a pointer is written as
    NAME.tmp and renamed over the old one, which frees the old one's page."""
    sizes = {f: (reference / FINAL / f).stat().st_size for f in CHECKPOINT_FILES}
    sizes["latest"] = sizes["final"] = len(FINAL) + 1
    index = SAVE_FILES.index(target)
    before = sum(pages(sizes[f]) for f in SAVE_FILES[:min(index, len(CHECKPOINT_FILES))])
    if target == "final":
        before += 1  # latest.tmp's page (the case removes the old `latest`, whose page its rename would free)
    return before + pages(sizes[target]) // 2


@pytest.mark.parametrize("target", SAVE_FILES)
def test_a_full_disk_at_each_file_of_the_final_save(workspace, tmp_path, target):
    """The run's checkpoints/ on a tmpfs with room for the final save up to `target` only: the error names that file
    and "No space left on device", nothing saved is lost, and with room again `train --resume` completes the run."""
    prefix = mount_namespace()
    if prefix is None:
        pytest.skip("no tmpfs can be mounted here (neither as root nor in a user namespace)")
    stopped = run(tmp_path, "train", "--config", workspace.config, "--stop-after", 4)  # checkpoints 2 and 4
    assert stopped.returncode == 0, stopped.stderr
    checkpoints = tmp_path / "run" / "checkpoints"
    shutil.move(checkpoints, tmp_path / "before")
    checkpoints.mkdir()
    if target == "final":
        # Renaming latest.tmp over the old `latest` frees a page, which `final` would then take: without an old
        # `latest` (--resume finds the newest checkpoint without it) the disk can fill at `final` itself.
        (tmp_path / "before" / "latest").unlink()
    script = f"""set -eu
mount -t tmpfs -o size=256m tmpfs run/checkpoints
cp -a before/. run/checkpoints/
set -- $(stat -f -c '%S %b %f' run/checkpoints)
mount -o remount,size=$(( ($2 - $3 + {room_before(workspace.reference, target)}) * $1 )) run/checkpoints
set +e
{BINARY} train --config {workspace.config} --resume >full.out 2>full.err; echo $? >full.rc
set -e
cp -a run/checkpoints/. after-full/
mount -o remount,size=256m run/checkpoints
{BINARY} train --config {workspace.config} --resume >resumed.out 2>resumed.err; echo $? >resumed.rc
cp -a run/checkpoints/. completed/
"""
    (tmp_path / "after-full").mkdir()
    (tmp_path / "completed").mkdir()
    done = subprocess.run([*prefix, "bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    full_err = (tmp_path / "full.err").read_text()
    assert (tmp_path / "full.rc").read_text().strip() == "1", full_err
    named = "checkpoints/" + target if target in ("latest", "final") else f".tmp-{FINAL}/{target}"
    assert named in full_err and "No space left on device" in full_err, full_err
    after = tree(tmp_path / "after-full")
    if target in ("latest", "final"):  # step 6 was complete and renamed into place before its pointers
        assert after[f"{FINAL}/checksums.json"] == tree(workspace.reference)[f"{FINAL}/checksums.json"]
    else:  # the previous checkpoints exactly as they were, and no half checkpoint left behind
        assert after == tree(tmp_path / "before")
    assert (tmp_path / "resumed.rc").read_text().strip() == "0", (tmp_path / "resumed.err").read_text()
    assert tree(tmp_path / "completed") == tree(workspace.reference)


def flip_bit(path, offset=None):
    data = bytearray(path.read_bytes())
    offset = len(data) // 2 if offset is None else offset
    data[offset] ^= 0x04
    path.write_bytes(bytes(data))
    return offset


def init_from_config(workspace, tmp_path, model):
    s = base_sections(workspace.dir, model, run="next", train={"max_steps": 2})
    s["train"]["run_dir"] = str(tmp_path / "next")
    del s["debug"]
    return write_toml(tmp_path / "next.toml", s)


COMMANDS = {
    "eval": lambda w, t, model, *extra: eval_ppl(t, w, model, *extra),
    "generate": lambda w, t, model, *extra: run(t, "generate", "--model", model, "--prompt-tokens", "2 3 4",
                                                "--max-new-tokens", 2, *extra),
    "serve": lambda w, t, model, *extra: run(t, "serve", model, "--port", 0, *extra, timeout=60),
    "init_from": lambda w, t, model: run(t, "train", "--config", init_from_config(w, t, model)),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_flipped_bit_in_any_checkpoint_file_is_refused_naming_it_and_the_intact_one(workspace, tmp_path, command):
    shutil.copytree(workspace.reference.parent, tmp_path / "run")
    final = tmp_path / "run" / "checkpoints" / FINAL
    for name in CHECKPOINT_FILES:
        original = (final / name).read_bytes()
        if name == "checksums.json":  # a bit of the digest listed for config.json
            offset = original.index(b'"model/config.json": "') + len('"model/config.json": "') + 3
        else:
            offset = None
        flip_bit(final / name, offset)
        r = COMMANDS[command](workspace, tmp_path, "run")
        assert r.returncode == 1, f"{name}: {r.stderr}"
        shown = "model/config.json" if name == "checksums.json" else name
        for fragment in (f"{FINAL}/{shown}", "checksum mismatch", "the newest intact checkpoint of the run is",
                         "step-00000004"):
            assert fragment in r.stderr, f"{name}: {r.stderr}"
        (final / name).write_bytes(original)


def test_skip_checksums_loads_a_damaged_checkpoint_saying_so(workspace, tmp_path):
    shutil.copytree(workspace.reference.parent, tmp_path / "run")
    weights = tmp_path / "run" / "checkpoints" / FINAL / "model" / "model.safetensors"
    flip_bit(weights, weights.stat().st_size - 3)  # a weight's high byte: another model, still a valid file
    assert eval_ppl(tmp_path, workspace, "run").returncode == 1
    r = eval_ppl(tmp_path, workspace, "run", "--skip-checksums")
    assert r.returncode == 0, r.stderr
    assert "--skip-checksums" in r.stderr and "loaded without verifying its checksums" in r.stderr, r.stderr
    # A model directory without checksums (a Hugging Face model) loads as it is, without a note.
    plain = eval_ppl(tmp_path, workspace, workspace.dir / "init")
    assert plain.returncode == 0 and "checksums" not in plain.stderr, plain.stderr


def test_a_completed_run_is_a_model_for_every_command(tmp_path):
    """A run with the dolma2 vocabulary (so that text goes in and out) whose final save was killed after the rename:
    `train --resume` completes it, and eval, generate, serve and model.init_from all take the run directory."""
    (tmp_path / "doc.txt").write_text("Nothing saved is lost at the edges of a run. " * 60)
    assert run(tmp_path, "tokenize", "--out", tmp_path / "shards", tmp_path / "doc.txt").returncode == 0
    save_random_olmo3(tiny_olmo3_config(vocab_size=100278, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, eos_token_id=100257,
                                        pad_token_id=100277), tmp_path / "init")
    s = base_sections(tmp_path, tmp_path / "init", train={"max_steps": 4}, checkpoint={"interval": 2, "keep_last": 1})
    del s["debug"]
    config = write_toml(tmp_path / "run.toml", s)
    killed = run(tmp_path, "train", "--config", config, env={KILL: "4:latest"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert run(tmp_path, "generate", "--model", "run", "--prompt", "hi").returncode == 1  # not finished yet
    assert run(tmp_path, "train", "--config", config, "--resume").returncode == 0
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["final", "latest", "step-00000004"]
    ppl = run(tmp_path, "eval", "ppl", "--model", "run", "--data", tmp_path / "shards", "--context", 16,
              "--max-tokens", 64)
    assert ppl.returncode == 0, ppl.stderr
    generated = run(tmp_path, "generate", "--model", "run", "--prompt", "Nothing saved", "--max-new-tokens", 3)
    assert generated.returncode == 0, generated.stderr
    server = Server(tmp_path / "run")
    try:
        import requests
        models = requests.get(server.url + "/v1/models", timeout=30).json()
        assert models["data"][0]["id"] == "run"
    finally:
        assert server.stop() == 0
    s2 = base_sections(tmp_path, tmp_path / "run", run="next", train={"max_steps": 2})
    del s2["debug"]
    nxt = run(tmp_path, "train", "--config", write_toml(tmp_path / "next.toml", s2))
    assert nxt.returncode == 0, nxt.stderr
