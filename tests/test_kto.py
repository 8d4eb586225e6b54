"""KTO (train.objective kto): the objective against TRL 0.24.0's KTOTrainer, its step-wide KL
estimate composed with the strategies, its data and its recipe checks.

TRL's trainer tokenizes text itself (kto_trainer.py _tokenize, _process_tokens), so the same
token ids are given to TRL's own functions instead: _get_kl_dataset (the mismatched replies),
forward / _compute_kl_logps (the log-probs of the tiny Hugging Face Llama) and
get_batch_loss_metrics / kto_loss; our objective runs on its conversion (tests/conftest.py
hf_dir, conversions)."""
from __future__ import annotations

import copy
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
from llama_npu.model.tokens import IGNORE_ID, PAD_ID
from llama_npu.recipe.load import load_recipe

from conftest import SMOKE

T = 12  # positions a row's model input holds; a row is T + 1 tokens
# (prompt tokens, reply tokens, desirable) of each record
RECORDS = ((5, 4, True), (3, 6, False), (4, 3, False), (2, 5, True))


def kto_batch():
    """(ids, labels, desirable) of the 4 records, right-padded to T + 1, labels on the replies."""
    rng = np.random.default_rng(5)
    ids = np.full((len(RECORDS), T + 1), PAD_ID, np.int32)
    labels = np.full((len(RECORDS), T + 1), IGNORE_ID, np.int32)
    for i, (prompt_len, reply_len, _) in enumerate(RECORDS):
        row = rng.integers(0, 128000, prompt_len + reply_len)
        ids[i, :len(row)] = row
        labels[i, prompt_len:len(row)] = row[prompt_len:]
    return ids, labels, np.array([d for _, _, d in RECORDS], np.float32)


def trl_kl_rows(ids, labels):
    """TRL's KL rows of the batch: its answers rotated by _get_kl_dataset, after each prompt."""
    from trl.trainer.kto_trainer import _get_kl_dataset

    prompts = [list(row[:RECORDS[i][0]]) for i, row in enumerate(ids)]
    answers = [list(ids[i, RECORDS[i][0]:RECORDS[i][0] + RECORDS[i][1]]) for i in range(len(RECORDS))]
    rotated = _get_kl_dataset({"answer_input_ids": answers, "answer_attention_mask": [[1] * len(a) for a in answers]})
    kl_ids = np.full_like(ids, PAD_ID)
    kl_labels = np.full_like(labels, IGNORE_ID)
    for i, (prompt, answer) in enumerate(zip(prompts, rotated["answer_input_ids"])):
        kl_ids[i, :len(prompt) + len(answer)] = prompt + answer
        kl_labels[i, len(prompt):len(prompt) + len(answer)] = answer
    return kl_ids, kl_labels


def trl_trainer(section):
    """A stand-in for KTOTrainer's self: what its forward, kto_loss and get_batch_loss_metrics read."""
    from trl.trainer.kto_trainer import KTOTrainer

    trainer = SimpleNamespace(accelerator=SimpleNamespace(device="cpu", gather_for_metrics=lambda x: x),
                              args=SimpleNamespace(use_liger_loss=False), calculate_KL=True, is_encoder_decoder=False,
                              aux_loss_enabled=False, label_pad_token_id=IGNORE_ID, loss_type="kto",
                              beta=section.beta, desirable_weight=section.desirable_weight,
                              undesirable_weight=section.undesirable_weight,
                              get_batch_logps=KTOTrainer.get_batch_logps)
    for name in ("forward", "_compute_kl_logps", "kto_loss"):
        setattr(trainer, name, partial(getattr(KTOTrainer, name), trainer))
    return trainer


def trl_batch(ids, labels, desirable, kl_ids, kl_labels, reference=None, kl_reference=None):
    import torch  # the test extra's (imported here: the quick tests need neither torch nor trl)

    def tensor(a):
        return torch.from_numpy(a.astype(np.int64))
    batch = {"completion_input_ids": tensor(ids), "completion_attention_mask": tensor(ids != PAD_ID),
             "completion_labels": tensor(labels), "KL_completion_input_ids": tensor(kl_ids),
             "KL_completion_attention_mask": tensor(kl_ids != PAD_ID), "KL_completion_labels": tensor(kl_labels),
             "label": [bool(d) for d in desirable]}
    if reference is not None:
        batch["reference_logps"], batch["reference_KL_logps"] = reference, kl_reference
    return batch


def trl_loss_metrics(section, model, batch):
    from trl.trainer.kto_trainer import KTOTrainer

    return KTOTrainer.get_batch_loss_metrics(trl_trainer(section), model, batch)


def section_of(**keys):
    from llama_npu.objectives.kto.section import KtoSection

    return KtoSection(**keys)


def kto_parts(ms, section, sets, k, checkpoint="", lr=0.5):
    """(network, KtoLoss, the step: the KL estimate (`step.estimate`), then a TrainStep of k
    micro-batches, SGD at `lr`, no clipping, as the loop runs them) of the tiny model (random,
    or `checkpoint`) under the smoke recipe with `sets`; the KL reference (precomputed) is
    given by the test (`step.estimate.kl_reference`)."""
    from llama_npu.objectives.kto.kl_estimate import KlEstimate
    from llama_npu.objectives.kto.loss import KlLogRatios, KtoLoss, adapter_switch
    from llama_npu.objectives.kto.parts import replies_of
    from llama_npu.strategies.network import build_network
    from llama_npu.strategies.precision import LossScaler
    from llama_npu.steps.optimizer import build_optimizer
    from llama_npu.steps.graph_step import TrainStep

    recipe = load_recipe(SMOKE, [f"data.max_seq_len={T}", f"model.checkpoint={checkpoint}", "data.eval_files=[]",
                                 "train.optimizer.name=sgd", f"train.optimizer.lr={lr}", *sets])
    net, _ = build_network(recipe, on_ascend=False)
    chunk = recipe.strategies.chunked_ce.chunk_size if recipe.strategies.chunked_ce.enabled else None
    switch = adapter_switch(net, section)
    cell = KtoLoss(net, section, chunk, switch)
    cell.set_train(True)
    optimizer = build_optimizer(net.trainable_params(), recipe.train)
    step = TrainStep(cell, optimizer, LossScaler(recipe.strategies.precision), 0.0, k, count=replies_of)
    estimate = KlEstimate(KlLogRatios(net, chunk, switch), None)

    def prepared_step(batches, lr):
        return step(estimate(batches), lr)
    prepared_step.estimate = estimate
    return net, cell, prepared_step


def policy_log_probs(ms, kl_cell, ids, labels, rows):
    """(N,) summed reply log-probs of the policy, `rows` a pass, through the step's own KL pass
    (KlLogRatios with a zero reference: the same graph, no second compile)."""
    zeros = np.zeros(rows, np.float32)
    return np.concatenate([kl_cell(*map(ms.Tensor, (ids[s:s + rows], labels[s:s + rows], zeros))).asnumpy()
                           for s in range(0, len(ids), rows)])


def micro_batches(ids, labels, desirable, reference, k):
    """The 4 records as k micro-batches, in order; record i's index is i."""
    extra = np.zeros((len(ids), 4), np.float32)
    extra[:, 0], extra[:, 1], extra[:, 3] = reference, desirable, np.arange(len(ids))
    size = len(ids) // k
    return [(ids[s:s + size], labels[s:s + size], extra[s:s + size]) for s in range(0, len(ids), size)]


def precomputed(ms, step, ids, labels, rows):
    """What kto.reference precomputed stores, from the starting weights: the replies' log-probs
    and those of the KL rows, keyed (record, partner)."""
    from llama_npu.objectives.kto.replies import kl_partners, kl_rows

    partners = kl_partners(len(ids))
    kl_ids, kl_labels = kl_rows(ids, labels, partners)
    kl = policy_log_probs(ms, step.estimate.kl_cell, kl_ids, kl_labels, rows)
    replies = policy_log_probs(ms, step.estimate.kl_cell, ids, labels, rows)
    return replies, {(i, int(j)): kl[i] for i, j in enumerate(partners)}


def test_the_kl_rows_are_trls_mismatched_replies():
    from llama_npu.objectives.kto.replies import kl_partners, kl_rows

    ids, labels, _ = kto_batch()
    ours = kl_rows(ids, labels, kl_partners(len(ids)))
    theirs = trl_kl_rows(ids, labels)
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])


@pytest.mark.parametrize("keys, sets, kl_shift", [
    ({"beta": 0.5}, [], 0.0),
    ({"beta": 2.0, "desirable_weight": 0.7}, ["strategies.chunked_ce.enabled=true", "strategies.chunked_ce.chunk_size=5"],
     0.3)], ids=["weights", "chunked-kl"])
def test_first_step_and_three_sgd_steps_equal_trl(ms, hf_dir, conversions, keys, sets, kl_shift):
    """The first step's loss, KL and TRL's metrics within 1e-4 of get_batch_loss_metrics', three
    SGD steps' losses within 1e-3; the reference is the starting weights' own log-probs of the
    replies and of the KL rows (precomputed, as TRL's precompute_ref_log_probs); `kl_shift`
    lowers the KL rows' reference by that much, so that the KL is positive and enters every loss.
    With both weights 1 and no shift, step 1 is 0.5 with zero rewards and KL (the policy is its
    reference), and the desirable replies' rewards then rise above the undesirable ones'."""
    import torch  # the test extra's, as in trl_batch

    section = section_of(**keys)
    ids, labels, desirable = kto_batch()
    kl_ids, kl_labels = trl_kl_rows(ids, labels)
    lr = 2.0
    net, cell, step = kto_parts(ms, section, sets, 1, conversions["float32"], lr=lr)
    reference, kl_reference = precomputed(ms, step, ids, labels, len(ids))
    model = copy.deepcopy(hf_dir[1]).float()
    with torch.no_grad():  # TRL's precomputed reference: the starting model's log-probs (get_train_dataloader)
        trl_reference, trl_kl_reference = (trl_trainer(section).get_batch_logps(
            model(torch.from_numpy(a.astype(np.int64))).logits, torch.from_numpy(b.astype(np.int64)),
            label_pad_token_id=IGNORE_ID) for a, b in ((ids, labels), (kl_ids, kl_labels)))
    np.testing.assert_allclose(reference, trl_reference.numpy(), atol=1e-4)
    np.testing.assert_allclose(list(kl_reference.values()), trl_kl_reference.numpy(), atol=1e-4)
    step.estimate.kl_reference = {pair: value - kl_shift for pair, value in kl_reference.items()}
    batch = trl_batch(ids, labels, desirable, kl_ids, kl_labels, trl_reference, trl_kl_reference - kl_shift)
    with torch.no_grad():
        theirs = trl_loss_metrics(section, model, batch)

    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    trl_losses, ours = [], []
    for i in range(3):
        loss, metrics = trl_loss_metrics(section, model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        trl_losses.append(float(loss.detach()))
        result = step(micro_batches(ids, labels, desirable, reference, 1), lr)
        mine = cell.take_metrics(step.estimate.kl)
        ours.append(result.loss)
        if i == 0:
            assert result.loss == pytest.approx(float(theirs[0]), abs=1e-4)
            assert mine["kl"] == pytest.approx(metrics["kl"], abs=1e-4)
            assert mine["kl"] == pytest.approx(kl_shift, abs=1e-5)  # the policy is its reference
            assert abs(mine["rewards/chosen"]) < 1e-6 and abs(mine["rewards/rejected"]) < 1e-6
            for side in ("chosen", "rejected"):
                count = metrics[f"count/{side}"]
                for name in ("rewards", "logps"):
                    assert mine[f"{name}/{side}"] == pytest.approx(metrics[f"{name}/{side}_sum"] / count, abs=1e-4)
    assert abs(ours[2] - ours[0]) > 1e-2  # the steps moved the loss: the comparison below means something
    np.testing.assert_allclose(ours, trl_losses, atol=1e-3)
    assert step.estimate.kl == pytest.approx(metrics["kl"], abs=1e-3)
    if not kl_shift:
        assert ours[0] == pytest.approx(0.5, abs=1e-6) and mine["rewards/margins"] > 0, mine


# ---------------------------------------------------------------- composition with the strategies, in process

def trained_steps(ms, section, sets, k, steps, checkpoint="", kl_shift=0.3, lr=0.5):
    """(network, [(StepResult, metrics)] of `steps` steps on the 4 records as k micro-batches),
    the reference precomputed from the starting weights, the KL rows' lowered by `kl_shift`
    (a positive KL from step 1, so that it enters every loss)."""
    ms.set_seed(0)
    net, cell, step = kto_parts(ms, section, sets, k, checkpoint, lr=lr)
    ids, labels, desirable = kto_batch()
    reference = np.zeros(len(ids), np.float32)  # adapters_off: the graphs compute it
    if section.reference == "precomputed":
        reference, kl_reference = precomputed(ms, step, ids, labels, len(ids) // k)
        step.estimate.kl_reference = {pair: value - kl_shift for pair, value in kl_reference.items()}
    out = []
    for _ in range(steps):
        result = step(micro_batches(ids, labels, desirable, reference, k), lr)
        out.append((result, cell.take_metrics(step.estimate.kl)))
    return net, out


def test_two_micro_batches_of_two_equal_one_batch_of_four(ms):
    """The KL estimate is the step's: k = 2 gives k = 1's losses, KL, metrics and weights."""
    section = section_of(beta=0.5, undesirable_weight=1.5)
    net_1, one = trained_steps(ms, section, [], 1, 2)
    net_2, two = trained_steps(ms, section, [], 2, 2)
    for (a, metrics_a), (b, metrics_b) in zip(one, two):
        assert (a.target_tokens, b.target_tokens) == (4, 4)  # replies
        assert b.loss == pytest.approx(a.loss, abs=1e-6) and b.grad_norm == pytest.approx(a.grad_norm, rel=1e-5)
        assert metrics_b == pytest.approx(metrics_a, abs=1e-5)
    assert one[0][1]["kl"] == pytest.approx(0.3, abs=1e-5) and one[1][1]["kl"] != one[0][1]["kl"]
    for a, b in zip(net_1.trainable_params(), net_2.trainable_params()):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), atol=1e-6)


def test_kto_over_an_int8_lora_base_with_adapters_off_micro_batch_1_recompute_chunked_ce_and_fp16(ms, conversions):
    """An int8 LoRA base (the tiny conversion) with kto.reference adapters_off, k = 4
    micro-batches of one reply, full recompute, chunked CE and AMP O2 fp16 with a dynamic loss
    scale: step 1 is 0.5 with zero rewards and KL (the adapters are off or zero), and the
    reference the metrics imply later (logps - rewards / beta) stays the base's while the
    adapters train."""
    sets = ["strategies.lora.enabled=true", "strategies.lora.base_dtype=int8", "strategies.recompute.mode=full",
            "strategies.chunked_ce.enabled=true", "strategies.chunked_ce.chunk_size=5",
            "strategies.precision.amp_level=O2", "strategies.precision.loss_scale=dynamic"]
    section = section_of(reference="adapters_off")
    _, steps = trained_steps(ms, section, sets, 4, 3, checkpoint=conversions["float32"], lr=1.0)
    first, base = steps[0]
    assert first.loss == pytest.approx(0.5, abs=1e-5) and first.loss_scale > 1
    assert all(abs(base[name]) < 1e-5 for name in ("kl", "rewards/chosen", "rewards/rejected"))
    for result, metrics in steps[1:]:
        assert not result.overflow
        for side in ("chosen", "rejected"):
            implied = metrics[f"logps/{side}"] - metrics[f"rewards/{side}"] / section.beta
            assert implied == pytest.approx(base[f"logps/{side}"], abs=1e-3), side
    assert result.loss < 0.5 - 1e-4 and metrics["rewards/margins"] > 0
    # The policy moved away from the base: a reference that followed it would have failed above.
    assert abs(metrics["logps/rejected"] - base["logps/rejected"]) > 1e-2


# ---------------------------------------------------------------- records and recipe checks

@pytest.mark.quick
@pytest.mark.parametrize("value, expected", [(True, True), (False, False), ("true", True), (" TRUE ", True),
                                             ("Yes", True), ("1", True), (1, True), ("false", False),
                                             ("No", False), ("0", False), (0, False), ("False", False),
                                             ("👍", True), (" 👎", False)])
def test_label_spellings(value, expected):
    from llama_npu.objectives.kto.records import parse_label

    assert parse_label({"label": value}, "f.csv:3") is expected


@pytest.mark.quick
@pytest.mark.parametrize("value", ["maybe", "", "2", 2, None, [True]])
def test_any_other_label_is_refused_naming_file_row_and_column(value):
    from llama_npu.data.errors import RecordError
    from llama_npu.objectives.kto.records import parse_label

    with pytest.raises(RecordError) as raised:
        parse_label({"label": value}, "f.csv:3")
    assert str(raised.value).startswith(f"f.csv:3: column 'label' holds {value!r}; expected a desirable value "
                                        f"(true, 1, yes, 👍) or an undesirable one (false, 0, no, 👎)")
    assert "\n" not in str(raised.value)


@pytest.mark.quick
@pytest.mark.parametrize("sets, message", [
    (["train.global_batch_size=1", "train.micro_batch_size=1"],
     "train.objective=kto with 1 reply a step on each rank"),
    (["kto.reference=adapters_off"], "kto.reference=adapters_off needs strategies.lora.enabled=true"),
    (["kto.beta=0"], "kto.beta: expected a value > 0"),
    (["kto.undesirable_weight=-1"], "kto.undesirable_weight: expected a value > 0"),
    (["data.pack=true"], "data.pack: true with train.objective: kto"),
    (["data.eval_files=[data/zh_kto_eval.jsonl]"], "data.eval_files with train.objective=kto"),
    (["device.target=ascend", "device.name=910b", "strategies.parallel.model=2"],
     "train.objective=kto with strategies.parallel model=2, pipeline=1, optimizer_shard=false"),
])
def test_bad_kto_recipes_are_refused_naming_the_key(sets, message):
    from llama_npu.recipe.problems import RecipeError

    with pytest.raises(RecipeError) as raised:
        load_recipe(SMOKE, ["train.objective=kto", "data.eval_files=[]", "train.global_batch_size=4",
                            "train.micro_batch_size=1", *sets])
    assert message in raised.value.problems[0] and len(raised.value.problems) == 1, raised.value.problems


# ---------------------------------------------------------------- a KTO run through the real CLI

REPLIES = [{"instruction": q, "output": a, "kto_tag": good} for q, a, good in (
    ("一加一等于几？", "一加一等于二。", True),
    ("北京是哪个国家的首都？", "不知道。", False),
    ("水的化学式是什么？", "水的化学式是H2O。", True),
    ("一周有几天？", "五天吧。", False),
    ("太阳从哪边升起？", "太阳从东边升起。", True),
    ("猫会飞吗？", "会飞。", False),
)]
# The smoke recipe as a KTO run (beta 0.1, weights 1, a precomputed reference: the defaults),
# LLaMA-Factory's kto_tag column read as the label.
KTO_RUN = ["--set", "train.objective=kto", "--set", "data.eval_files=[]", "--set", "data.max_seq_len=32",
           "--set", "train.max_steps=3", "--set", "train.save_every=2", "--set", "train.keep_last=5",
           "--set", "train.micro_batch_size=1",
           "--set", "train.global_batch_size=2", "--set", "train.warmup_steps=0", "--set", "train.optimizer.lr=0.01",
           "--set", "data.columns={label: kto_tag}"]


@pytest.fixture(scope="module")
def kto_run(tmp_path_factory, conversions):
    """(replies file, run dir, its --set): 3 steps of 2 micro-batches of one reply from the tiny
    Hugging Face model's conversion, checkpoints at 2 and 3."""
    import json

    from conftest import run_cli

    root = tmp_path_factory.mktemp("kto")
    replies = root / "replies.jsonl"
    replies.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in REPLIES), encoding="utf-8")
    sets = ["--set", f"data.train_files=[{replies}]", "--set", f"model.checkpoint={conversions['float32']}", *KTO_RUN]
    run_cli("train", SMOKE, "--output-dir", root / "run", *sets, check=True)
    return replies, root / "run", sets


def test_a_kto_run_starts_at_one_half_with_zero_rewards_and_logs_trl_metrics(kto_run):
    from conftest import read_metrics

    records = read_metrics(kto_run[1])
    first = records[0]
    assert first["loss"] == pytest.approx(0.5, abs=1e-6) and first["target_tokens"] == 2  # replies
    for name in ("kl", "rewards/chosen", "rewards/rejected", "rewards/margins"):
        assert abs(first[name]) < 1e-5, name
    assert records[2]["loss"] != first["loss"] and records[2]["rewards/margins"] != 0  # it trained
    assert (kto_run[1] / "reference_logps.npz").is_file()


def test_a_resumed_kto_run_reuses_its_reference_and_repeats_the_step_exactly(kto_run, tmp_path):
    """--resume auto from step 2: the stored reference (the replies' and the planned KL rows')
    is reused, and step 3's loss, KL and rewards are the uninterrupted run's."""
    import shutil

    from conftest import assert_same_steps, read_metrics, run_cli

    _, run, sets = kto_run
    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_3")
    result = run_cli("train", SMOKE, "--output-dir", resumed, "--resume", "auto", *sets, check=True)
    assert "reference log-probs of 12 rows reused" in result.stdout  # 6 replies and 6 KL rows of 3 steps
    assert_same_steps(resumed, run, [3])
    again, first = read_metrics(resumed)[2], read_metrics(run)[2]
    for key in ("loss", "kl", "rewards/chosen", "rewards/rejected", "logps/chosen"):
        assert again[key] == pytest.approx(first[key], abs=1e-7), key


def test_eval_scores_a_kto_runs_replies_in_every_layout_train_reads_with_the_runs_columns(kto_run, tmp_path):
    """Held-out replies under LLaMA-Factory's kto_tag (the run's data.columns) as JSONL, a JSON
    array, CSV, TSV, .xlsx and Parquet (the labels as booleans, or as the text the tables
    hold): scored together, the JSONL's loss and rewards over five times the replies."""
    import json

    from conftest import run_cli, write_layouts

    _, run, _ = kto_run
    paths = write_layouts(REPLIES[:4], tmp_path, "held_out")

    def scores(*files):
        result = run_cli("eval", "--checkpoint", run, "--data", *files, "--json", "--device", "cpu", check=True)
        return json.loads(result.stdout.strip().splitlines()[-1])
    jsonl = scores(paths[".jsonl"])
    every = scores(*(paths[s] for s in (".json", ".csv", ".tsv", ".xlsx", ".parquet")))
    assert (jsonl["replies"], every["replies"]) == (4, 20)
    for key in ("loss", "rewards/chosen", "rewards/rejected", "logps/chosen"):
        assert every[key] == pytest.approx(jsonl[key], rel=1e-5, abs=1e-6), key
    assert jsonl["rewards/margins"] != 0 and 0 < jsonl["loss"] < 1


def test_a_label_no_spelling_means_is_one_line_exit_2_naming_file_row_and_column(kto_run, tmp_path):
    from conftest import run_cli

    replies, _, sets = kto_run
    table = tmp_path / "replies.csv"
    table.write_text("instruction,output,kto_tag\n一加一等于几？,一加一等于二。,true\n猫会飞吗？,会飞。,maybe\n",
                     encoding="utf-8")
    sets = [f"data.train_files=[{table}]" if s == f"data.train_files=[{replies}]" else s for s in sets]
    result = run_cli("train", SMOKE, "--output-dir", tmp_path / "run", *sets)
    assert result.returncode == 2 and not (tmp_path / "run").exists()
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"llama-npu: error: {table}:3: column 'kto_tag' holds 'maybe'; expected a desirable value"), result.stderr


@pytest.mark.quick
def test_the_planner_counts_the_kl_pass_as_a_forward_phase_and_one_row_a_reply():
    """A KTO micro-batch plans as an SFT one of the same rows (activations, logits, model
    states), plus the KL pass: a forward without gradients, a phase of its own."""
    from llama_npu.memory.devices import DEVICES
    from llama_npu.memory.planner import estimate, strategy_from_recipe
    from llama_npu.model.architecture import PRESETS
    from llama_npu.model.llama import count_parameters

    sets = ["model.preset=llama3.2-1b", "data.eval_files=[]", "train.micro_batch_size=2",
            "train.global_batch_size=8", "device.target=ascend", "device.name=910a"]
    shape, device = PRESETS["llama3.2-1b"], DEVICES["910a"]
    kto, sft = (estimate(shape, count_parameters(shape), device, strategy_from_recipe(
        load_recipe(SMOKE, [*sets, f"train.objective={name}"]), "910a")) for name in ("kto", "sft"))
    assert "reference" not in sft.phases and 0 < kto.components["reference_forward"]
    assert kto.phases["reference"] > kto.components["reference_forward"] and kto.total_bytes >= kto.phases["reference"]
    for part in ("weights", "gradients", "optimizer_states", "activations", "logits_loss"):
        assert kto.components[part] == sft.components[part], part
