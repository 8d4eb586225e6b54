"""Recipe loading, overrides and the one-line errors users get for bad input."""
import pytest

from llama_npu.recipe.load import load_recipe
from llama_npu.recipe.problems import RecipeError

from conftest import REPO, SMOKE, run_cli


@pytest.mark.quick
def test_smoke_recipe_loads_and_overrides_coerce_types():
    recipe = load_recipe(SMOKE, ["train.max_steps=20", "train.optimizer.lr=1e-4",
                                 "data.train_on_prompt=true", "data.eval_files=[]"])
    assert recipe.train.max_steps == 20 and isinstance(recipe.train.max_steps, int)
    assert recipe.train.optimizer.lr == pytest.approx(1e-4) and isinstance(recipe.train.optimizer.lr, float)
    assert recipe.data.train_on_prompt is True
    assert recipe.data.eval_files == []


@pytest.mark.parametrize("override, message", [
    ("train.max_step=5", "unknown key 'train.max_step' (did you mean 'train.max_steps'?)"),
    ("trian.max_steps=5", "unknown key 'trian' (did you mean 'train'?)"),
    ("train.max_steps=ten", "train.max_steps: expected an integer, got 'ten'"),
    ("train.max_steps=-3", "train.max_steps: expected a value > 0, got -3"),
    ("train.optimizer.lr=0", "train.optimizer.lr: expected a value > 0, got 0.0"),
    ("train.optimizer.name=adam", "train.optimizer.name: expected one of adamw, sgd, got 'adam'"),
    ("train.micro_batch_size=3", "train.global_batch_size=8 is not divisible by train.micro_batch_size=3"),
    ("model.num_kv_heads=3", "model.num_heads=4 is not divisible by model.num_kv_heads=3"),
])
def test_bad_override_is_a_one_line_error_with_exit_2(tmp_path, override, message):
    out = tmp_path / "run"
    proc = run_cli("train", SMOKE, "--set", override, "--output-dir", out)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists(), "nothing may be written for a refused recipe"


def test_unknown_key_in_file_names_it(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(SMOKE.read_text() + "\nstrategies2: {}\n")
    with pytest.raises(RecipeError, match="unknown key 'strategies2' \\(did you mean 'strategies'\\?\\)"):
        load_recipe(bad)


def test_missing_recipe_file(tmp_path):
    proc = run_cli("train", tmp_path / "nope.yaml")
    assert proc.returncode == 2
    assert "recipe file not found" in proc.stderr and "nope.yaml" in proc.stderr


def test_bfloat16_on_910a_is_refused():
    with pytest.raises(RecipeError, match="910A has no BF16"):
        load_recipe(SMOKE, ["device.target=ascend", "device.name=910a",
                            "strategies.precision.amp_level=O2", "strategies.precision.dtype=bfloat16"])


@pytest.mark.quick
def test_every_shipped_recipe_validates():
    recipes = sorted((REPO / "recipes").glob("*.yaml"))
    assert recipes
    for path in recipes:
        load_recipe(path)


@pytest.mark.parametrize("size, accepted", [("28G", False), ("512MB", False), ("28", False), ("0.0GB", False),
                                            ("28GB", True), ("30.5GB", True)])
def test_max_device_memory_takes_exactly_mindspores_form(size, accepted):
    # ms.runtime.set_memory (mindspore/runtime/memory.py _MEMORY_PATTERN) takes "<number>GB" only; a card's
    # init_runtime would refuse the others after validate passed them
    proc = run_cli("validate", SMOKE, "--set", f"device.max_device_memory={size}")
    assert proc.returncode == (0 if accepted else 2), proc.stderr
    if not accepted:
        assert proc.stderr.strip() == (f"llama-npu: error: device.max_device_memory: expected a size above zero in "
                                       f"MindSpore's form <number>GB, such as 29GB or 30.5GB, got '{size}'")


@pytest.mark.parametrize("override, fix", [
    ("train.learning_rate=1e-4", "unknown key 'train.learning_rate'; use train.optimizer.lr"),  # HF, LLaMA-Factory
    ("train.weight_decay=0.1", "unknown key 'train.weight_decay'; use train.optimizer.weight_decay"),  # ours, elsewhere
    ("train.num_train_epochs=3", "unknown key 'train.num_train_epochs'; use train.epochs (or train.max_steps, in "
                                 "optimizer steps)"),
    ("data.cutoff_len=1024", "unknown key 'data.cutoff_len'; use data.max_seq_len"),  # LLaMA-Factory
    ("strategies.parallel.data_parallel=8", "unknown key 'strategies.parallel.data_parallel'; use "
                                            "strategies.parallel.data"),  # MindFormers' parallel_config
    ("train.global_batch_size=10", "train.global_batch_size=10 is not divisible by train.micro_batch_size=4 x data "
                                   "parallel 1 = 4; set train.global_batch_size=8 or train.global_batch_size=12, or "
                                   "train.micro_batch_size=2 or train.micro_batch_size=5"),
])
def test_an_error_line_ends_with_the_fix(override, fix, tmp_path):
    proc = run_cli("validate", SMOKE, "--set", "train.micro_batch_size=4", "--set", override,
                   "--output-dir", tmp_path / "run")
    assert (proc.returncode, proc.stderr.strip()) == (2, f"llama-npu: error: {fix}")


def test_every_foreign_name_points_to_a_key_the_recipe_takes():
    import dataclasses

    from llama_npu.recipe.foreign_names import FOREIGN_NAMES
    from llama_npu.recipe.schema import Recipe

    def has(cls, key):
        head, _, rest = key.partition(".")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        return head in fields and (not rest or has(getattr(cls(), head).__class__, rest))
    meant = {target.split(" ")[0].rstrip(":") for target in FOREIGN_NAMES.values() if not target.startswith("the ")}
    assert sorted(key for key in meant if not has(Recipe, key)) == []


@pytest.mark.parametrize("recipe", ["cpu_smoke", "cpu_dpo_smoke", "cpu_kto_smoke"])
@pytest.mark.parametrize("degree, line", [("0", "expected a value > 0, got 0"), ("-1", "expected a value > 0, got -1"),
                                          ("1.5", "expected an integer, got 1.5")])
def test_a_data_degree_below_1_is_one_line_for_every_objective(recipe, degree, line, tmp_path):
    # KTO's batch check divided the global batch by it first: "internal error ... ZeroDivisionError"
    proc = run_cli("train", REPO / "recipes" / f"{recipe}.yaml", "--set", f"strategies.parallel.data={degree}",
                   "--output-dir", tmp_path / "run")
    assert (proc.returncode, proc.stderr.strip()) == (2, f"llama-npu: error: strategies.parallel.data: {line}")


# LLaMA-Factory's flat YAML: each of its data and epoch names gets a line naming our key (the hint text only:
# data.dataset and its neighbours are issue 56's dataset_info.json keys)
LLAMA_FACTORY_NAMES = {
    "dataset_dir": "data.dataset_dir", "dataset": "data.dataset", "eval_dataset": "data.eval_dataset",
    "cutoff_len": "data.max_seq_len", "max_samples": "data.max_samples", "template": "data.template",
    "num_train_epochs": "train.epochs"}


def test_llama_factorys_top_level_names_each_get_a_line_naming_our_key(tmp_path):
    recipe = tmp_path / "llama_factory.yaml"
    recipe.write_text(SMOKE.read_text() + "".join(f"{name}: 1\n" for name in LLAMA_FACTORY_NAMES))
    proc = run_cli("validate", recipe)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == len(LLAMA_FACTORY_NAMES), proc.stderr
    for line, (name, ours) in zip(lines, LLAMA_FACTORY_NAMES.items()):
        assert line.startswith(f"llama-npu: error: unknown key '{name}'; use {ours}"), line


DEEPSPEED = {"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": 1.0, "bf16": {"enabled": True},
             "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                                   "overlap_comm": True}}
DEEPSPEED_LINES = [("train_micro_batch_size_per_gpu", "train.micro_batch_size"),
                   ("gradient_clipping", "train.grad_clip"), ("bf16.enabled", "strategies.precision.dtype: bfloat16"),
                   ("zero_optimization.stage", "strategies.parallel.optimizer_shard: true"),
                   ("zero_optimization.offload_optimizer.device", "strategies.offload.optimizer: host")]


def test_a_deepspeed_config_pasted_in_or_named_gets_a_line_for_each_key_naming_ours(tmp_path):
    import json

    import yaml
    # pasted in: the hints look inside the unknown mappings, at any depth (one line for the
    # section before, naming nothing); named by `deepspeed:` as LLaMA-Factory takes it: read
    pasted = tmp_path / "pasted.yaml"
    pasted.write_text(SMOKE.read_text() + yaml.safe_dump(DEEPSPEED))
    lines = run_cli("validate", pasted).stderr.strip().splitlines()
    assert len(lines) == len(DEEPSPEED_LINES), lines  # the keys naming none of ours (overlap_comm) say nothing
    for key, ours in DEEPSPEED_LINES:
        assert any(line.startswith(f"llama-npu: error: unknown key '{key}'; use {ours}") for line in lines), key
    config = tmp_path / "ds_z2_offload_config.json"
    config.write_text(json.dumps(DEEPSPEED))
    named = tmp_path / "named.yaml"
    named.write_text(SMOKE.read_text() + f"deepspeed: {config}\n")
    lines = run_cli("validate", named).stderr.strip().splitlines()
    assert lines[0].startswith("llama-npu: error: unknown key 'deepspeed'; use strategies.offload and strategies.parallel")
    for key, ours in DEEPSPEED_LINES:
        assert any(line.startswith(f"llama-npu: error: unknown key 'deepspeed' ({config} sets {key}); use {ours}")
                   for line in lines), key


def test_max_steps_and_epochs_both_given_is_one_line(tmp_path):
    proc = run_cli("train", SMOKE, "--set", "train.epochs=2", "--output-dir", tmp_path / "run")
    assert (proc.returncode, proc.stderr.strip()) == (
        2, "llama-npu: error: train.max_steps=80 and train.epochs=2.0: give one of them (--set train.max_steps=null "
           "to count the run in epochs)")
    assert not (tmp_path / "run").exists()


def test_prepared_data_names_its_template_and_another_one_is_refused(tmp_path):
    import json

    from llama_npu.common.checksums import write_manifest
    src = tmp_path / "train.jsonl"
    src.write_text("".join((REPO / "data" / "zh_instruct_train.jsonl").read_text().splitlines(True)[:8]))
    prepared = tmp_path / "prepared"
    run_cli("prepare-data", "--format", "alpaca", "--input", src, "--output", prepared, "--max-seq-len", "64",
            check=True)
    meta = json.loads((prepared / "meta.json").read_text())
    assert meta["template"] == "llama3"
    args = ["validate", SMOKE, "--set", "data.train_files=[]", "--set", f"data.prepared={prepared}", "--set",
            "data.max_seq_len=64"]
    assert run_cli(*args).returncode == 0
    meta["template"] = "qwen"  # a directory made in another template, with its checksums whole
    (prepared / "meta.json").write_text(json.dumps(meta))
    write_manifest(prepared, "prepare-data")
    proc = run_cli(*args)
    assert (proc.returncode, proc.stderr.strip()) == (
        2, f"llama-npu: error: data.prepared={prepared} was prepared in the qwen chat template, but "
           f"data.template=llama3; prepare it again, or set data.template: qwen")
