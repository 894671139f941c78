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
    assert set(checks) == {"logits_fp32", "logits_bf16", "flash_attention", "fused_kernels", "cache_decode",
                           "train_bf16", "sharded_training"}
    failed = {name: c for name, c in checks.items() if not c.get("pass")}
    assert not failed, json.dumps(failed, indent=1)
    assert checks["flash_attention"]["kernel"] == "cpu stand-in"
    # The fused training kernels: every check within its bound (the CPU launch here), each kernel timed.
    fused = checks["fused_kernels"]
    assert fused["device"] == "cpu" and all(c["pass"] and c["worst_share_of_bound"] <= 1 for c in fused["checks"])
    assert {c["check"].split()[0] for c in fused["checks"]} == {"rms_norm", "add_rms_norm", "rms_norm_rope", "swiglu",
                                                                 "fp8_cast"}
    # FP8's fused cast: bit for bit the composite's (every entry), and timed beside it.
    assert all(c["bit_equal"] == 1 for c in fused["checks"] if c["check"].startswith("fp8_cast"))
    assert fused["fp8_cast_timing_ms"]["fused_ms"] > 0 and fused["fp8_cast_timing_ms"]["composite_ms"] > 0
    assert set(fused["timing_ms"]) == {"rms_norm", "add_rms_norm", "rms_norm_rope", "swiglu"}
    assert all(t["fused_ms"] > 0 and t["composite_ms"] > 0 for t in fused["timing_ms"].values())
    assert fused["timing_ms"]["rms_norm"]["aten_rms_norm_ms"] > 0
    assert {c["window"] for c in checks["flash_attention"]["cases"]} >= {0, 8}
    assert len([c for c in checks["flash_attention"]["cases"] if "documents" in c]) == 2  # variable-length form
    assert len(checks["train_bf16"]["losses"]["bf16"]) == 3
    assert len(checks["train_bf16"]["losses"]["fp8"]) == 3 and checks["train_bf16"]["last_step_fp8_vs_bf16_relative"] > 0
    assert checks["train_bf16"]["first_step_fp32_engine_vs_transformers"] <= 2e-4  # the loss itself, not only bf16's drift
    # 2 Gloo ranks, "full" against "none": not skipped on the CPU, every dtype's losses of every step compared.
    sharded = checks["sharded_training"]
    assert "skipped" not in sharded and sharded["backend"] == "gloo"
    assert all(len(sharded[d]["full"]) == 4 and sharded[d]["same_batches"] for d in ("fp32", "bf16"))
    assert all(sharded[d]["max_relative"] == 0 for d in ("fp32", "bf16"))  # bitwise at 2 Gloo ranks, clipping off
    m = summary["measurements"]
    assert m["training_1b"]["tokens_per_s_median"] > 0 and m["training_1b"]["model_flops_per_token"] > 0
    assert m["training_1b"]["mfu"] is None  # no GPU peak to divide by on the CPU
    assert m["training_1b_fp8"]["tokens_per_s_median"] > 0 and m["training_1b_fp8"]["last_loss_vs_bf16_relative"] > 0
    # train.fused_kernels on the same run: its speed over bf16's, and a loss that the kernels' roundings move little.
    # Item 1's other runs: siamese_depth beside base, 2 x the sequence, and the micro-batch plan says fits (on the
    # CPU, where there is no memory to fit, the largest candidate: 8).
    assert m["training_1b_siamese_depth"]["variant"] == "siamese_depth"
    assert m["training_1b_siamese_depth"]["tokens_per_s_over_base"] > 0
    assert m["training_1b_8192"]["sequence_length"] == 128 and m["training_1b_8192"]["tokens_per_s_median"] > 0
    assert m["training_1b_plan_micro_batch"]["micro_batch"] == 8
    assert m["training_1b_plan_micro_batch"]["tokens_per_s_median"] > 0
    fused_run = m["training_1b_fused"]
    assert fused_run["fused_kernels"] is True and fused_run["tokens_per_s_over_bf16"] > 0
    assert fused_run["last_loss_vs_bf16_relative"] < 0.01
    # Issue 49's baseline: the same shapes under transformers + torch.compile + fused AdamW, and the ratio.
    hf = m["training_1b_transformers_compiled"]
    assert hf["tokens_per_s_median"] > 0 and hf["engine_over_transformers_compiled"] > 0
    assert hf["steps"] == m["training_1b"]["steps"] and hf["micro_batch"] == m["training_1b"]["micro_batch"]
    # Each training run's plan (the fp8 run against the bf16 plan), its memory measured on a GPU only.
    for name in ("training_1b", "training_1b_fp8", "training_1b_fused"):
        assert m[name]["planned_bytes"]["total"] > 0 and m[name]["planned_total_mib"] > 0
        assert m[name]["peak_gpu_memory_mib"] is None and m[name]["measured_over_planned"] is None
    assert m["training_1b_fp8"]["plan_counts_fp8"] is True
    assert m["training_1b_fp8"]["planned_total_mib"] < m["training_1b"]["planned_total_mib"]  # one e4m3 input copy, not bf16 ones
    assert m["training_1b_fused"]["plan_counts_fused"] is True
    assert m["training_1b_fused"]["planned_total_mib"] < m["training_1b"]["planned_total_mib"]  # no fp32 norm copies
    assert m["decode"]["engine_decode_tok_s"] > 0 and m["decode"]["transformers_decode_tok_s"] > 0
    # Every way of running decoding steps the CPU has, checked and timed (CUDA graphs: on a GPU only).
    assert checks["cache_decode"]["mismatches"] == {"eager": 0, "fixed-shapes": 0}
    assert set(m["decode"]["engine_decode_tok_s_by_mode"]) == {"eager", "fixed-shapes"}
    assert m["prefill_65536"]["prompt_tokens"] == 512 and m["prefill_65536"]["prefill_tok_s"] > 0
    # Issue 49 item 4's figures: several rows at once in every mode the CPU has, and gsm8k against transformers.
    batched = m["decode_batched"]["decode_tok_s_by_rows_and_mode"]
    assert set(batched) == {"2", "4"} and all(set(v) == {"eager", "fixed-shapes"} for v in batched.values())
    assert all(t > 0 for v in batched.values() for t in v.values())
    gsm8k = m["gsm8k_generation"]
    assert gsm8k["requests"] == 4 and gsm8k["max_new_tokens"] == 512
    assert gsm8k["engine_requests_per_s"] > 0 and gsm8k["transformers_requests_per_s"] > 0
    assert gsm8k["engine_generated_tokens"] > 0 and gsm8k["transformers_generated_tokens"] > 0
    assert 0 <= gsm8k["same_texts"] <= 4
    # eval downstream --decode-steps: eager and the fastest mode the device has (fixed shapes here), both timed.
    assert gsm8k["decode_steps"] == "fixed-shapes" and set(gsm8k["engine_requests_per_s_by_decode_steps"]) == {
        "eager", "fixed-shapes"}
    assert 0 <= gsm8k["same_texts_eager_and_fixed_shapes"] <= 4
    assert m["sharded_1b"]["world"] == 2 and m["sharded_1b"]["tokens_per_s_per_gpu"] > 0
    assert m["sharded_1b"]["planned_bytes_per_rank"]["sharding_buffers"] > 0  # plan's FSDP figures, 2 ranks
    assert m["sharded_1b"]["mfu"] is None and m["sharded_1b"]["peak_gpu_memory_mib_per_rank"] is None
    assert checks["flash_attention"]["decode_sdpa_backend"] not in ("cudnn_attention", "error")
    for name in ("decode_profile", "training_profile"):  # the CPU tables; no GPU kernels on the CPU
        assert m[name]["cpu_ops_by_self_time"] and m[name]["gpu_kernels_by_time"] == []
    assert any(row["op"] == "aten::mm" for row in m["training_profile"]["cpu_ops_by_self_time"])
    assert "decode 4 tokens" in m["decode_profile"]["report"]
    assert summary["complete"] and not summary["skipped_for_time"]
    assert summary["pass"] and r.returncode == 0, r.stderr[-3000:]


def test_a_spent_deadline_skips_every_step_and_still_writes_a_failing_summary(tmp_path):
    out = tmp_path / "summary.json"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "device_check.py"), "--cpu", "--build",
                        str(BINARY.parent), "--out", str(out), "--deadline-s", "1"],
                       capture_output=True, text=True, timeout=900)
    summary = json.loads(out.read_text())
    assert json.loads(r.stdout.strip().splitlines()[-1]) == summary
    assert r.returncode == 1 and not summary["pass"] and summary["complete"]
    steps = {**summary["checks"], **summary["measurements"]}
    assert set(summary["skipped_for_time"]) == set(steps) - {"logits_bf16"}  # logits_bf16 comes with logits_fp32
    assert all(steps[n]["skipped"].startswith("time budget") for n in summary["skipped_for_time"])


def test_gpu_kernels_are_summed_by_name_from_the_trace(tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    import device_check

    trace = tmp_path / "t.pt.trace.json"
    events = [{"cat": "kernel", "name": "gemm", "dur": 300.0}, {"cat": "kernel", "name": "gemm", "dur": 100.0},
              {"cat": "kernel", "name": "softmax", "dur": 100.0}, {"cat": "cpu_op", "name": "aten::mm", "dur": 900.0}]
    trace.write_text(json.dumps({"traceEvents": events}))
    (tmp_path / "t.pt.trace.json.top-ops.txt").write_text(
        "op (by self time)                                   calls     self ms  self %    total ms\n"
        "autograd::engine::evaluate_function: MmBackward0        2       3.000   75.0%       4.000\n"
        "aten::mm                                                4       1.000   25.0%       1.000\n"
        "2 op kinds, 4.000 ms self time in ops over 5.000 ms wall, 120 page faults\n")
    t = device_check.top_ops(trace)
    assert t["gpu_kernels_ms_total"] == 0.5
    assert t["gpu_kernels_by_time"] == [{"kernel": "gemm", "calls": 2, "ms": 0.4, "pct": 80.0},
                                        {"kernel": "softmax", "calls": 1, "ms": 0.1, "pct": 20.0}]
    assert t["cpu_ops_by_self_time"][0] == {"op": "autograd::engine::evaluate_function: MmBackward0", "calls": 2,
                                            "self_ms": 3.0, "self_pct": "75.0%"}
    assert t["cpu_summary"].startswith("2 op kinds")
