"""The device check's dry run (scripts/device_check.py --cpu): the script that runs on a GPU machine
goes through every step here on the CPU with tiny sizes, so it cannot rot between GPU loans. The checks
must pass on the CPU too (the flash path through its CPU stand-in), and every figure must be produced."""
import json
import subprocess
import sys

from conftest import BINARY, REPO


def test_dry_run_passes_every_check_and_measures_every_figure(tmp_path):
    out = tmp_path / "summary.json"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "device_check.py"), "--cpu", "--build",
                        str(BINARY.parent), "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert out.exists(), r.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert json.loads(r.stdout.strip().splitlines()[-1]) == summary  # ONE JSON document on stdout
    assert summary["mode"] == "cpu dry run" and summary["device"] == "cpu"
    checks = summary["checks"]
    assert set(checks) == {"logits_fp32", "logits_bf16", "flash_attention", "cache_decode", "train_bf16",
                           "sharded_training"}
    failed = {name: c for name, c in checks.items() if not c.get("pass")}
    assert not failed, json.dumps(failed, indent=1)
    assert checks["flash_attention"]["kernel"] == "cpu stand-in"
    assert {c["window"] for c in checks["flash_attention"]["cases"]} >= {0, 8}
    assert len([c for c in checks["flash_attention"]["cases"] if "documents" in c]) == 2  # variable-length form
    assert len(checks["train_bf16"]["losses"]["bf16"]) == 3
    # 2 Gloo ranks, "full" against "none": not skipped on the CPU, every dtype's losses of every step compared.
    sharded = checks["sharded_training"]
    assert "skipped" not in sharded and sharded["backend"] == "gloo"
    assert all(len(sharded[d]["full"]) == 4 and sharded[d]["same_batches"] for d in ("fp32", "bf16"))
    assert all(sharded[d]["max_relative"] == 0 for d in ("fp32", "bf16"))  # bitwise at 2 Gloo ranks, clipping off
    m = summary["measurements"]
    assert m["training_1b"]["tokens_per_s_median"] > 0 and m["training_1b"]["model_flops_per_token"] > 0
    assert m["training_1b"]["mfu"] is None  # no GPU peak to divide by on the CPU
    assert m["decode"]["engine_decode_tok_s"] > 0 and m["decode"]["transformers_decode_tok_s"] > 0
    assert m["prefill_65536"]["prompt_tokens"] == 512 and m["prefill_65536"]["prefill_tok_s"] > 0
    assert m["sharded_1b"]["world"] == 2 and m["sharded_1b"]["tokens_per_s_per_gpu"] > 0
    assert m["sharded_1b"]["planned_bytes_per_rank"]["sharding_buffers"] > 0  # plan's FSDP figures, 2 ranks
    assert m["sharded_1b"]["mfu"] is None and m["sharded_1b"]["peak_gpu_memory_mib_per_rank"] is None
    assert summary["pass"] and r.returncode == 0, r.stderr[-3000:]
