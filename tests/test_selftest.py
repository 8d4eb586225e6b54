"""llama-npu selftest on the CPU: the command CI runs, and each CPU check broken on purpose."""
import json
import re

import pytest

from conftest import free_port, run_cli
from llama_npu.memory.devices import DEVICE_TARGETS


@pytest.fixture(scope="session")
def cpu_selftest(tmp_path_factory):
    out = tmp_path_factory.mktemp("selftest") / "selftest.json"
    proc = run_cli("selftest", "--device", "cpu", "--json", out, timeout=900)
    return proc, json.loads(out.read_text()) if out.exists() else None


def test_cpu_selftest_passes_its_checks_and_gives_every_skip_a_reason(cpu_selftest):
    proc, report = cpu_selftest
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = report["checks"]
    passed = [c["name"] for c in checks if c["status"] == "pass"]
    assert len(passed) >= 6 and not [c for c in checks if c["status"] == "fail"]
    assert all(c["reason"] for c in checks if c["status"] == "skip")
    assert {c["category"] for c in checks} == {"overflow", "precision", "mask", "memory", "speed", "parallel", "export",
                                                   "int8", "offload"}
    # A check the CPU cannot run is a skip, never a pass.
    status = {c["name"]: c["status"] for c in checks}
    assert status["precision_bf16_vs_fp32"] == status["mask_flash_vs_plain"] == status["memory_vs_plan"] == "skip"
    # The sharded export runs what a host can (shards saved, merged, exported, compared) and
    # still skips: the shards of a compiled sharded graph need a card.
    export = next(c for c in checks if c["name"] == "export_merge_sharded")
    assert (export["status"], export["figure"]) == ("skip", 0.0) and "bit-exactly" in export["reason"]
    assert set(report["device"]) >= {"soc", "cann", "mindspore", "mindformers", "hbm_bytes", "overflow_mode",
                                     "jit_level", "backend"}
    assert report["device"]["overflow_mode"] == "is-finite reduction"
    assert (report["device"]["jit_level"], report["device"]["backend"]) == ("O0", "ms_backend")  # what the CPU runs
    assert all(c["bound"] == "max" for c in checks if c["tolerance"] is not None)
    lines = proc.stdout.splitlines()
    assert len(lines) == len(checks) + 1  # the table is the checks' lines and the summary, nothing else
    for c, line in zip(checks, lines):  # one printed line a check: name, status, figure against tolerance or reason
        assert line.startswith(c["name"]) and c["status"] in line
    assert "8 passed, 0 failed" in proc.stdout.splitlines()[-1]
    # the optimizer on the host lands within the derived bound of the graph's, and the copies each way were timed
    host = next(c for c in checks if c["name"] == "host_optimizer")
    assert host["status"] == "pass" and 0 < host["figure"] <= host["tolerance"] == 1.0
    assert "GB/s to the host" in host["reason"]
    assert set(report["device"]["host_optimizer"]) == {"to_device_gbs", "to_host_gbs"}


def test_selftest_on_ascend_without_an_npu_is_one_line_and_exit_2():
    proc = run_cli("selftest", "--device", "ascend")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "no Ascend NPU on this host" in proc.stderr


@pytest.mark.parametrize("name", ["overflow_skips_update", "precision_fp16", "mask_packed",
                                  "mask_packed_sharded_loss", "resume_exact", "export_exact", "export_sharded",
                                  "int8_matmul", "host_optimizer"])
def test_each_cpu_check_fails_when_its_subject_is_broken(ms, name):
    """The fault of each check (a scale that cannot overflow, a half run at 10^5 x the rate,
    packed rows without their mask, a resume without the optimizer state, a float16
    export, a rank saving another rank's shards) makes it fail: none of them passes
    whatever happens."""
    from llama_npu.selftest import run as selftest

    check = getattr(selftest, f"check_{name}")(selftest.Context("cpu", "cpu"), fault=True)
    assert check.status == "fail" and check.reason
    assert check.figure > check.tolerance


def test_host_optimizer_fails_when_the_host_kernel_swaps_the_moments_rates(ms, monkeypatch):
    """The host update broken from outside the check: the fused AdamW kernel
    (steps/host/kernel.py) called with beta1 and beta2 swapped, so its first steps move each
    weight by about 1e-3 of what the graph's do. The check's three steps then leave the graph's
    weights by far more than its bound (and the same check passes in the full CPU run,
    test_cpu_selftest_passes_its_checks_and_gives_every_skip_a_reason)."""
    from llama_npu.selftest import run as selftest
    from llama_npu.selftest.host_optimizer import TOLERANCE
    from llama_npu.steps.host import kernel as host_kernel

    fused = host_kernel.adamw

    def swapped(w, g, m, v, lr, beta1, beta2, *rest):
        fused(w, g, m, v, lr, beta2, beta1, *rest)

    monkeypatch.setattr(host_kernel, "adamw", swapped)
    check = selftest.check_host_optimizer(selftest.Context("cpu", "cpu"))
    assert check.status == "fail" and check.tolerance == TOLERANCE
    assert check.figure > 100 * TOLERANCE, check.figure


def test_host_optimizer_runs_the_offload_recipes_precision_optimizer_and_accumulation():
    """The check's offload run is the shipped 910A offload recipe's path at selftest's size: O2
    float16 with a dynamic loss scale, AdamW with its decay and clipping on the host, more than
    one micro-batch a step."""
    from llama_npu.recipe.load import load_recipe
    from llama_npu.selftest.host_optimizer import OFFLOAD
    from llama_npu.selftest.parts import REPO, Context
    from llama_npu.strategies.accumulation import accumulation_steps

    shipped = load_recipe(REPO / "recipes" / "llama3_2_3b_zh_full_offload_910a.yaml")
    checked = Context("cpu", "cpu").recipe(*OFFLOAD)

    def path(r):
        p, o = r.strategies.precision, r.train.optimizer
        return (p.amp_level, p.dtype, p.loss_scale, r.strategies.offload.optimizer, o.name, o.weight_decay,
                r.train.grad_clip, accumulation_steps(r) > 1)

    assert path(checked) == path(shipped) == ("O2", "float16", "dynamic", "host", "adamw", 0.1, 1.0, True)


def test_host_optimizer_fails_when_the_update_never_reaches_the_card(ms, monkeypatch):
    """The push broken from outside the check: the first cast of the weights to float16 reaches
    the card, no update after it does. The read-back sees the card's weights unchanged after
    step 2 and unlike the host's masters, and the next loss far outside the bound."""
    from llama_npu.selftest import run as selftest
    from llama_npu.steps.host.optimizer import HostAdamW

    push = HostAdamW.push

    def first_only(self):
        if not getattr(self, "pushed_once", False):
            push(self)
            self.pushed_once = True

    monkeypatch.setattr(HostAdamW, "push", first_only)
    check = selftest.check_host_optimizer(selftest.Context("cpu", "cpu"))
    assert check.status == "fail" and check.figure > 1000 * check.tolerance
    assert check.reason.startswith("step 2 updated, yet the card's ")
    assert "did not change (" in check.reason
    assert "is not the host's fp32 master cast to float16" in check.reason


def test_host_optimizer_fails_when_the_overflow_step_changes_the_card_weights(ms, monkeypatch):
    """The overflow flag ignored by the host, from outside the check: the host updates from the
    overflowed step's gradients and pushes the result, so the card's weights change on the
    step that must leave them bit-identical."""
    from llama_npu.selftest import run as selftest
    from llama_npu.steps.host.optimizer import HostAdamW

    step = HostAdamW.step
    monkeypatch.setattr(HostAdamW, "step", lambda self, lr, scale, clip, overflow, square_sum:
                        step(self, lr, scale, clip, False, square_sum))
    check = selftest.check_host_optimizer(selftest.Context("cpu", "cpu"))
    assert check.status == "fail"
    assert check.reason.startswith("step 1 overflowed, yet the card's ")
    assert "step 1 overflowed, yet the host's masters or moments changed" in check.reason


def test_resume_exact_fails_when_the_loss_scale_state_is_not_restored(ms):
    """A resume that restores weights and optimizer but not the dynamic loss scale's state
    (its scale and clean-step count, which the 2 steps after the resume change) fails."""
    from llama_npu.selftest import run as selftest

    check = selftest.check_resume_exact(selftest.Context("cpu", "cpu"), fault="loss_scale")
    assert check.status == "fail" and check.figure >= 1
    assert "loss scale {'scale': 1024.0, 'clean_steps': 0} where the run without a resume had {'scale': 1024.0, " \
           "'clean_steps': 1}" in check.reason


def test_launch_selftest_runs_the_multi_card_checks_on_two_workers(tmp_path):
    """scripts/launch.sh --selftest 2: two msrun workers step a data-parallel model 3 times
    (once with one micro-batch a rank, twice with 2 accumulated); the ranks' weights hash the
    same and equal one process stepping the global batch. The
    sharded layouts are built through train.setup and the reference stepped; comparing them
    needs a card, so that check and the sharded export are skips saying what ran."""
    import os
    import subprocess

    out = tmp_path / "parallel.json"
    env = {**os.environ, "LOG_DIR": str(tmp_path / "logs"), "MASTER_PORT": str(free_port())}
    proc = subprocess.run(["bash", "scripts/launch.sh", "--selftest", "2", "--json", str(out)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check, sharded, export = json.loads(out.read_text())["checks"]
    assert (check["name"], check["status"]) == ("data_parallel_equals_one_process", "pass")
    assert check["figure"] <= check["tolerance"] and "data_parallel_equals_one_process" in proc.stdout
    assert (sharded["name"], sharded["status"], export["status"]) == ("sharded_model_pipeline_optimizer", "skip", "skip")
    assert "built model2 (data 1), pipeline2 (data 1), optimizer_shard (data 2) through train.setup" in sharded["reason"]
    assert "3 steps on packed rows (losses " in sharded["reason"]  # the sharded loss's block-causal mask on a card
    losses = [float(v) for v in sharded["reason"].split("(losses ")[1].split(")")[0].split(", ")]
    assert losses[0] > losses[1] > losses[2]  # the reference learns the batch it sees again
    assert "needs Ascend" in sharded["reason"] and "sharded_model_pipeline_optimizer" in proc.stdout


@pytest.mark.parametrize("soc", list(DEVICE_TARGETS))
def test_dry_run_builds_every_check_for_every_soc_in_the_catalogue(tmp_path, soc):
    """`selftest --dry-run --soc S` (with --device ascend, on a host without an NPU) builds and
    validates every check's recipes for S and lists them, running nothing: no check is in
    error (a bf16 run with a static loss scale, which recipe validation refuses, was one on
    every 910B), each says what it compares, and what the card will be asked is visible."""
    out = tmp_path / "dry.json"
    proc = run_cli("selftest", "--device", "ascend", "--dry-run", "--soc", soc, "--json", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    checks = {c["name"].split(" (")[0]: c for c in report["checks"]}
    assert not [c for c in checks.values() if c["status"] == "error"]
    assert len(checks) == 18 and all(c["compares"] for c in checks.values())
    assert all(c["status"] == "planned" or c["reason"] for c in checks.values())
    assert f"on {soc}: " in proc.stdout.splitlines()[-1] and "0 in error (nothing was run)" in proc.stdout
    assert len(proc.stdout.splitlines()) == 19  # a line a check and the summary
    device = report["device"]
    # MindSpore 2.9.0's default: O2 on the GE backend on a 910A, kernel by kernel elsewhere (selftest/jit.py).
    assert (device["jit_level"], device["backend"]) == (("O2", "GE") if soc == "910a" else ("O0", "ms_backend"))
    # Atlas A2/A3: the int8 check names the kernel's arguments, the scale (n,) CANN takes there
    # (tests/test_int8.py checks the cell passes exactly these).
    int8 = checks["int8_matmul"]["compares"]
    assert ("WeightQuantBatchMatmul: forward x (32, 96), weight (64, 96), antiquant_scale (64,), transpose_weight "
            "True; backward x (32, 64), weight (64, 96), antiquant_scale (96,), transpose_weight False" in int8) \
        == (soc not in ("cpu", "910a"))
    registers, speed = checks["overflow_saturation_registers"], checks["speed_1b_mfu"]
    assert registers["status"] == ("skip" if soc == "cpu" else "planned")
    assert checks["overflow_forward_saturation"]["status"] == registers["status"]
    # On a card the sharded layouts step packed rows, and the export merges a model, a pipeline
    # and an optimizer-shard cut.
    assert "on packed rows" in checks["sharded_model_pipeline_optimizer"]["compares"]
    assert "each of the model2, pipeline2, optimizer_shard runs' shards" in checks["export_merge_sharded"]["compares"]
    if soc in ("910a", "910b"):  # what the card is asked: every check with a tolerance, the 910A's speed a floor
        assert all(c["tolerance"] is not None for name, c in checks.items() if name != "speed_1b_mfu")
        floor = 0.15 if soc == "910a" else None  # the 910B's peak is unknown (memory/peaks.py)
        assert (speed["status"], speed["bound"], speed["tolerance"]) == ("planned", "min", floor)
        assert checks["precision_bf16_vs_fp32"]["status"] == ("skip" if soc == "910a" else "planned")
        host = checks["host_optimizer"]  # the optimizer on the host against the graph, and the copies' bandwidth
        assert (host["status"], host["tolerance"]) == ("planned", 1.0) and "host-to-device" in host["compares"]
        assert "overflowing on the first" in host["compares"] and "update_bound.py" in host["compares"]
    if soc == "910b":
        assert "no known fp16 peak for the 910b (910b stands for the 910b2 and the 910b3" in speed["compares"]
    if soc == "910b4":
        assert speed["tolerance"] is None and "no known fp16 peak" in speed["compares"]
        # the 910B recipe needs a 58 GB pool: the 910B4's speed step is one that fits its 32 GB by the planner
        assert "device.name=910b4, device.max_device_memory=29GB" in speed["compares"]
        assert checks["speed_accumulation_overhead"]["status"] == "skip"
    if soc != "cpu":
        planned_gb, usable_gb = map(float, re.search(r"planned ([\d.]+) GiB with the margin, of ([\d.]+) GiB usable "
                                                     f"on the {soc}", speed["compares"]).groups())
        assert planned_gb <= usable_gb <= {"910b": 64}.get(soc, 32) - 2
    # The mask checks run at the compute dtype the SoC's shipped recipes train at.
    dtype = {"cpu": "fp32", "910a": "float16"}.get(soc, "bfloat16")
    assert f"at {dtype}" in checks["mask_packed"]["compares"]
    assert f"at {dtype}, " in checks["mask_packed_sharded_loss"]["compares"]


def test_forward_only_saturation_setting_keeps_the_backward_inside_fp16(ms):
    """overflow_forward_saturation's setting (Ascend only: a 910A saturates where the CPU gives
    inf), run here in fp32 with the same layer scaled: layer 0's value projection, which
    selective recompute does not redo, reaches 4 x 65504 in the forward, while the loss is as
    the unscaled model's and every gradient, summed over the step's tokens as the backward
    computes them at loss scale 1, stays far inside fp16. So on a card the only saturation
    is in that forward layer, and only a clear before the forward lets the step see it."""
    from llama_npu.selftest.forward_saturation import projection_peak, saturate_value_projection
    from llama_npu.selftest.parts import Context, build, random_batch, train_step

    recipe, net, cell = build(Context("cpu", "cpu"), "strategies.recompute.mode=selective")
    batch = random_batch(2, 7)
    assert projection_peak(net, batch[0]) < 1.0
    saturate_value_projection(net, batch[0])
    assert projection_peak(net, batch[0]) == pytest.approx(4 * 65504)
    result = train_step(recipe, net, cell)([batch], lr=1e-2)
    assert not result.overflow and 10 < result.loss < 13  # ln(128256) = 11.76: the model still predicts
    assert result.grad_norm * result.target_tokens < 65504 / 100


def test_a_speed_step_the_planner_does_not_fit_is_refused():
    """The 910B recipe (4 rows of 2,048) on a 910B4's 29 GB pool, which the speed check ran there
    before: speed_plan refuses it, so the dry run lists it as an error, not as planned."""
    from llama_npu.recipe.load import load_recipe
    from llama_npu.selftest.speed import recipe_file, speed_plan
    from llama_npu.selftest.parts import Context

    too_big = load_recipe(recipe_file(Context("ascend", "910b4")), ["device.name=910b4",
                                                                     "device.max_device_memory=29GB"])
    with pytest.raises(ValueError, match=r"the speed step \(4 row\(s\) of 2,048 tokens\) does not fit the 910b4 "
                                         r"by the planner: [\d.]+ GiB planned, 29.00 GiB usable"):
        speed_plan(too_big)


@pytest.mark.parametrize("args", [("--dry-run", "--soc", "910c"), ("--dry-run",), ("--soc", "910b")])
def test_selftest_soc_outside_the_catalogue_or_without_dry_run_is_one_line_and_exit_2(args):
    proc = run_cli("selftest", *args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "--soc" in proc.stderr
    if "--dry-run" in args:
        assert "cpu, 910a, 910b, 910b4" in proc.stderr


@pytest.mark.parametrize("soc, tokens_per_s, status", [("910b", 12_000, "skip"), ("910a", 6_000, "pass"),
                                                       ("910a", 4_000, "fail"), ("910b4", 9_000, "skip")])
def test_speed_check_fails_below_its_mfu_floor_and_skips_without_a_known_peak(soc, tokens_per_s, status):
    """The speed check judges the timed 1B step (given here as its measured figures): below 15%
    MFU of a 910A's fp16 peak it fails; on a 910B (the B2 or the B3, whose peaks differ by
    source) and a 910B4, whose peaks are unknown (memory/peaks.py), it is a skip that still
    gives tokens/s."""
    from llama_npu.selftest.parts import Context
    from llama_npu.selftest.speed import check_speed

    ctx = Context("ascend", soc, speed=True)
    params, tokens = 1_235_814_400, 8192
    ctx.speed_run = {"recipe": "r.yaml", "rows": 4, "tokens": tokens, "params": params, "one": tokens / tokens_per_s}
    check = check_speed(ctx)
    assert check.status == status and f"{tokens_per_s:,} tokens/s" in check.reason
    if status != "skip":
        mfu = 6 * params * tokens_per_s / 256e12
        assert check.figure == pytest.approx(mfu) and check.bound == "min"
        assert f"MFU {mfu:.1%}" in check.reason and "floor" in check.reason
        assert ("at least" in check.line()) and check.status in check.line()
    else:
        assert f"no known fp16 peak for the {soc}" in check.reason


@pytest.mark.parametrize("target, soc, cell, glob, env, want", [
    ("ascend", "910a", {}, {}, {}, ("O2", "GE")),
    ("ascend", "910b", {}, {}, {}, ("O0", "ms_backend")),
    ("cpu", "cpu", {}, {}, {}, ("O0", "ms_backend")),
    ("ascend", "910a", {}, {"jit_level": "O0"}, {}, ("O0", "ms_backend")),
    ("ascend", "910a", {"jit_level": "O1", "backend": "ms_backend"}, {"jit_level": "O2"}, {}, ("O1", "ms_backend")),
    ("ascend", "910b", {}, {"jit_level": "O0"}, {"RANK_TABLE_FILE": "r.json"}, ("O2", "GE")),
    ("ascend", "910b", {}, {}, {"RANK_TABLE_FILE": "r.json", "MS_ROLE": "MS_WORKER"}, ("O0", "ms_backend")),
])
def test_jit_level_follows_mindspore_2_9_rule(target, soc, cell, glob, env, want):
    """A cell's own config, else the global one, else O2 on a 910A and O0 elsewhere; a
    rank-table launch without msrun is O2 whatever was set (ms_context.cc, GetJitLevel)."""
    from llama_npu.selftest.jit import jit_level_and_backend

    got = jit_level_and_backend(target, soc, cell, glob, env)
    assert (got["jit_level"], got["backend"]) == want


@pytest.mark.parametrize("soc", ["910a", "910b", "910b4"])
def test_memory_check_covers_accumulation_and_a_decoder_dominated_long_sequence(soc):
    """memory_vs_plan's cases, as the card will build them: one accumulates 2 micro-batches,
    and one runs 2,048 tokens at a size where the planner puts most of the step's memory in
    the decoder (its share of the weights and their states, and its activations), not in
    the embedding and the logits."""
    from llama_npu.memory.devices import get_device
    from llama_npu.memory.planner import estimate, strategy_from_recipe
    from llama_npu.model.architecture import resolve_shape
    from llama_npu.selftest.checks import memory_spec
    from llama_npu.selftest.parts import Context
    from llama_npu.strategies.accumulation import accumulation_steps

    ctx = Context("ascend", soc)
    recipes = [ctx.recipe(*overrides) for overrides in memory_spec(ctx).recipes]
    assert sorted(accumulation_steps(r) for r in recipes) == [1, 1, 1, 2]
    long = [r for r in recipes if r.data.max_seq_len == 2048]
    assert len(long) == 1
    s = resolve_shape(long[0].model)
    kv = s.hidden_size // s.num_heads * s.num_kv_heads
    decoder = s.num_layers * (2 * s.hidden_size * (s.hidden_size + kv) + 3 * s.hidden_size * s.intermediate_size)
    params = decoder + s.vocab_size * s.hidden_size
    plan = estimate(s, params, get_device(soc), strategy_from_recipe(long[0], soc))
    c = plan.components
    states = sum(c[k] for k in ("weights", "weight_compute_copies", "gradients", "optimizer_states"))
    assert states * decoder / params + c["activations"] > (plan.total_bytes - c["margin"]) / 2


def test_mask_check_at_the_910a_compute_dtype_passes_and_fails_when_broken(ms, monkeypatch):
    """mask_packed at fp16 (the 910A's compute dtype; the CPU backend runs fp16 too): packed
    rows give each sample its own loss, and without their mask they do not, at the half
    precision tolerance."""
    from llama_npu.selftest import checks
    from llama_npu.selftest.parts import Context

    monkeypatch.setattr(checks, "compute_dtype", lambda ctx: (("strategies.precision.amp_level=O2",
                                                               "strategies.precision.dtype=float16"), 1e-3))
    good, broken = (checks.check_mask_packed(Context("cpu", "cpu"), fault=fault) for fault in (None, True))
    assert good.status == "pass" and good.compares.endswith("at float16")
    assert broken.status == "fail" and broken.figure > broken.tolerance == 1e-3
