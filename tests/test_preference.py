"""Preference tuning (train.objective dpo): the objective against TRL 0.24.0, and its recipe checks.

TRL's trainers tokenize text themselves (DPOTrainer.tokenize_row), so the same token ids are
given to TRL's own log-prob and loss functions instead (CPOTrainer.get_batch_logps,
DPOTrainer.dpo_loss, CPOTrainer.cpo_loss) on the tiny Hugging Face Llama's logits, and our
objective runs on its conversion (tests/conftest.py hf_dir, conversions)."""
from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
from llama_npu.model.tokens import IGNORE_ID
from llama_npu.recipe.load import load_recipe
from llama_npu.recipe.problems import RecipeError

from conftest import REPO, SMOKE

T = 12  # positions a row's model input holds; a row is T + 1 tokens
PROMPTS = ((5, 4, 3), (3, 6, 2))  # (prompt, chosen reply, rejected reply) tokens of each pair


def pair_batch():
    """(input_ids, labels), (4, T + 1): the 2 chosen rows, then the 2 rejected (TRL's order),
    right-padded, labels IGNORE_ID except the reply tokens."""
    rng = np.random.default_rng(3)
    rows = []
    for prompt_len, chosen_len, rejected_len in PROMPTS:
        prompt = rng.integers(0, 128000, prompt_len)
        rows.append((prompt, rng.integers(0, 128000, chosen_len)))
        rows.append((prompt, rng.integers(0, 128000, rejected_len)))
    rows = rows[0::2] + rows[1::2]
    ids = np.full((4, T + 1), 128009, np.int32)
    labels = np.full((4, T + 1), IGNORE_ID, np.int32)
    for i, (prompt, reply) in enumerate(rows):
        ids[i, :len(prompt) + len(reply)] = np.concatenate([prompt, reply])
        labels[i, len(prompt):len(prompt) + len(reply)] = reply
    return ids, labels


def trl_logps(model, ids, labels, average):
    """TRL's per-row reply log-probs of the Hugging Face model (CPOTrainer.get_batch_logps)."""
    import torch  # the test extra's (imported here: the quick tests here need neither torch nor trl)
    from trl.trainer.cpo_trainer import CPOTrainer

    logits = model(torch.from_numpy(ids.astype(np.int64))).logits
    return CPOTrainer.get_batch_logps(logits, torch.from_numpy(labels.astype(np.int64)), average_log_prob=average,
                                      label_pad_token_id=IGNORE_ID)


def trl_orpo_terms(section, model, ids, labels):
    """ORPOTrainer's own forward and loss (concatenated_forward, odds_ratio_loss, combined as
    get_batch_loss_metrics does) on the batch as TRL's chosen_* / rejected_* tensors: (loss,
    chosen rewards, rejected rewards, chosen logps, rejected logps, chosen NLL)."""
    from functools import partial

    import torch  # the test extra's, as in trl_logps
    from trl.trainer.orpo_trainer import ORPOTrainer

    trainer = SimpleNamespace(accelerator=SimpleNamespace(device="cpu"), beta=section.orpo_lambda,
                              is_encoder_decoder=False, label_pad_token_id=IGNORE_ID, padding_value=0,
                              aux_loss_enabled=False, concatenated_inputs=ORPOTrainer.concatenated_inputs,
                              get_batch_logps=ORPOTrainer.get_batch_logps)
    trainer.concatenated_forward = partial(ORPOTrainer.concatenated_forward, trainer)
    # Rows are right-padded and end at their reply's last token: the attention mask is 1 up to there.
    real = np.cumsum((labels != IGNORE_ID)[:, ::-1], axis=1)[:, ::-1] > 0
    batch = {f"{side}_{key}": torch.from_numpy(value[rows].astype(np.int64))
             for side, rows in (("chosen", slice(0, 2)), ("rejected", slice(2, 4)))
             for key, value in (("input_ids", ids), ("attention_mask", real), ("labels", labels))}
    chosen, rejected, _, _, nll = trainer.concatenated_forward(model, batch)
    losses, chosen_rewards, rejected_rewards, _, _ = ORPOTrainer.odds_ratio_loss(trainer, chosen, rejected)
    return nll - losses.mean(), chosen_rewards, rejected_rewards, chosen, rejected, nll


def trl_terms(section, model, ids, labels, reference):
    """(mean loss, chosen rewards, rejected rewards, chosen logps, rejected logps) as TRL computes them."""
    from trl.trainer.cpo_trainer import CPOTrainer  # the test extra's, as in trl_logps
    from trl.trainer.dpo_trainer import DPOTrainer, FDivergenceType

    if section.loss == "orpo":
        return trl_orpo_terms(section, model, ids, labels)[:5]

    trainer = SimpleNamespace(accelerator=SimpleNamespace(device="cpu"), beta=section.beta,
                              label_smoothing=section.label_smoothing, simpo_gamma=section.simpo_gamma,
                              loss_type=section.loss, alpha=0.0, reference_free=reference is None,
                              f_divergence_type=FDivergenceType.REVERSE_KL)
    logps = trl_logps(model, ids, labels, average=section.loss in ("ipo", "simpo"))
    chosen, rejected = logps[:2], logps[2:]
    if section.loss == "simpo":
        losses, cr, rr = CPOTrainer.cpo_loss(trainer, chosen, rejected)
    else:
        losses, cr, rr = DPOTrainer.dpo_loss(trainer, chosen, rejected, reference[:2], reference[2:], section.loss)
    return losses.mean(), cr, rr, chosen, rejected


def ours(ms, recipe_sets, checkpoint):
    """(the converted network, its PreferenceLoss) for the smoke recipe with `recipe_sets`."""
    from llama_npu.objectives.dpo.loss import PreferenceLoss
    from llama_npu.strategies.network import build_network

    recipe = load_recipe(SMOKE, [f"data.max_seq_len={T}", f"model.checkpoint={checkpoint}", "train.objective=dpo",
                                 "data.eval_files=[]", *recipe_sets])
    net, _ = build_network(recipe, on_ascend=False)
    chunk = recipe.strategies.chunked_ce.chunk_size if recipe.strategies.chunked_ce.enabled else None
    return net, PreferenceLoss(net, recipe.dpo, chunk), recipe.dpo


class Terms:
    """Our (mean loss, chosen rewards, rejected rewards, chosen logps, rejected logps) as numpy."""

    def __init__(self, ms, loss_cell):
        from mindspore import nn

        class Cell(nn.Cell):
            def __init__(self):
                super().__init__(auto_prefix=False)
                self.loss = loss_cell

            def construct(self, ids, labels, reference):
                losses, *rest = self.loss.terms(ids, labels, reference)
                return (losses.mean(), *rest)

        self.cell, self.ms = Cell(), ms

    def __call__(self, ids, labels, reference):
        out = self.cell(*(self.ms.Tensor(a) for a in (ids, labels, reference)))
        return [t.asnumpy() for t in out]


def sgd_losses_ours(ms, loss_cell, ids, labels, reference, lr, steps):
    from mindspore import nn

    class Mean(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.loss = loss_cell

        def construct(self, ids, labels, reference):
            return self.loss(ids, labels, reference) / 2

    params = [p for p in loss_cell.trainable_params()]
    step = nn.TrainOneStepCell(Mean(), nn.SGD(params, learning_rate=lr))
    step.set_train(True)
    batch = [ms.Tensor(a) for a in (ids, labels, reference)]
    return [float(step(*batch).asnumpy()) for _ in range(steps)]


def sgd_losses_trl(section, model, ids, labels, reference, lr, steps):
    import torch  # the test extra's, as in trl_logps

    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = trl_terms(section, model, ids, labels, reference)[0]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    return losses


@pytest.mark.parametrize("sets", [["dpo.loss=sigmoid", "dpo.label_smoothing=0.1", "dpo.beta=0.5"],
                                  ["dpo.loss=simpo", "dpo.reference=none", "dpo.beta=2.0", "dpo.simpo_gamma=0.6",
                                   "strategies.chunked_ce.enabled=true", "strategies.chunked_ce.chunk_size=5"],
                                  ["dpo.loss=orpo", "dpo.reference=none", "dpo.orpo_lambda=0.5"]],
                         ids=["sigmoid", "simpo-chunked", "orpo"])
def test_first_step_and_three_sgd_steps_equal_trl(ms, hf_dir, conversions, sets):
    """The first step's loss, rewards and log-probs within 1e-4 of TRL's, three SGD steps'
    losses within 1e-3; the reference is the starting weights' own log-probs (precomputed).
    ORPO against ORPOTrainer's own forward and loss: its NLL term is TRL's mean over the batch's
    chosen tokens, ours the mean of each chosen row's (equal for one pair a micro-batch, and
    here, where both chosen rows are 9 tokens)."""
    import torch  # the test extra's, as in trl_logps

    ids, labels = pair_batch()
    net, loss_cell, section = ours(ms, sets, conversions["float32"])
    terms = Terms(ms, loss_cell)
    model = copy.deepcopy(hf_dir[1]).float()
    with torch.no_grad():
        trl_reference = trl_logps(model, ids, labels, average=False)
    # The starting weights' log-probs, as dpo.reference precomputed stores them: the policy's
    # own, read with a zero reference (for simpo, length-averaged: it reads no reference).
    free = section.loss in ("simpo", "orpo")
    reference = np.concatenate(terms(ids, labels, np.zeros(4, np.float32))[3:5])
    if not free:
        np.testing.assert_allclose(reference, trl_reference.numpy(), atol=1e-4)
    with torch.no_grad():
        theirs = trl_terms(section, model, ids, labels, None if free else trl_reference)
    mine = terms(ids, labels, reference)
    for a, b in zip(mine, theirs):
        np.testing.assert_allclose(a, b.numpy(), atol=1e-4)
    if section.loss == "orpo":  # ORPOTrainer's nll_loss metric
        with torch.no_grad():
            nll = trl_orpo_terms(section, model, ids, labels)[5]
        assert mine[5].mean() == pytest.approx(float(nll), abs=1e-4)
    if section.loss == "sigmoid":  # the policy is its reference: ln 2 whatever the smoothing
        assert mine[0] == pytest.approx(math.log(2), abs=1e-5) and np.abs(mine[1:3]).max() < 1e-5
    lr = 2.0
    ours_sgd = sgd_losses_ours(ms, loss_cell, ids, labels, reference, lr, 3)
    trl_sgd = sgd_losses_trl(section, model, ids, labels, None if free else trl_reference, lr, 3)
    assert abs(ours_sgd[2] - ours_sgd[0]) > 1e-2  # the steps moved the loss: the comparison below means something
    np.testing.assert_allclose(ours_sgd, trl_sgd, atol=1e-3)


@pytest.mark.parametrize("sets, message", [
    (["dpo.reference=adapters_off"], "dpo.reference=adapters_off needs strategies.lora.enabled=true"),
    (["dpo.reference=none"], "dpo.reference=none with dpo.loss=sigmoid"),
    (["dpo.loss=ipo", "dpo.reference=none"], "dpo.reference=none with dpo.loss=ipo"),
    (["dpo.loss=simpo"], "dpo.loss=simpo with dpo.reference=precomputed"),
    (["dpo.beta=0"], "dpo.beta: expected a value > 0"),
    (["dpo.loss=orpo"], "dpo.loss=orpo with dpo.reference=precomputed: orpo is reference-free"),
    (["dpo.loss=orpo", "dpo.reference=none", "dpo.orpo_lambda=0"], "dpo.orpo_lambda: expected a value > 0"),
    (["device.target=ascend", "device.name=910b", "strategies.parallel.model=2"],
     "train.objective=dpo with strategies.parallel model=2, pipeline=1: DPO's pair loss splits only the batch"),
    (["device.target=ascend", "device.name=910b", "strategies.parallel.optimizer_shard=true", "strategies.lora.enabled=true",
      "dpo.reference=adapters_off"], "dpo.reference=adapters_off with strategies.parallel.optimizer_shard=true"),
])
def test_bad_preference_recipes_are_refused_naming_the_key(sets, message):
    with pytest.raises(RecipeError) as raised:
        load_recipe(SMOKE, ["train.objective=dpo", "data.eval_files=[]", *sets])
    assert message in raised.value.problems[0] and len(raised.value.problems) == 1


@pytest.mark.quick
def test_a_bad_objective_is_one_line_exit_2_and_a_good_one_validates():
    from conftest import run_cli

    result = run_cli("validate", SMOKE, "--set", "train.objective=rlhf")
    assert result.returncode == 2 and result.stderr.strip() == (
        "llama-npu: error: train.objective: expected one of sft, dpo, kto, got 'rlhf'"), result.stderr
    recipe = load_recipe(SMOKE, ["train.objective=dpo", "dpo.loss=simpo", "dpo.reference=none", "data.eval_files=[]"])
    assert (recipe.train.objective, recipe.dpo.loss, recipe.dpo.reference) == ("dpo", "simpo", "none")


# ---------------------------------------------------------------- a DPO run through the real CLI

PAIRS = [{"instruction": q, "chosen": good, "rejected": bad} for q, good, bad in (
    ("一加一等于几？", "一加一等于二。", "等于三。"),
    ("北京是哪个国家的首都？", "北京是中国的首都。", "不知道。"),
    ("水的化学式是什么？", "水的化学式是H2O。", "是CO2。"),
    ("一周有几天？", "一周有七天。", "五天吧。"),
    ("太阳从哪边升起？", "太阳从东边升起。", "西边。"),
)]
# The smoke recipe as a DPO run (sigmoid, beta 0.1, no smoothing, a precomputed reference: the defaults).
DPO_RUN = ["--set", "train.objective=dpo", "--set", "data.eval_files=[]", "--set", "data.max_seq_len=32",
           "--set", "train.max_steps=3", "--set", "train.save_every=2",
           "--set", "train.keep_last=5", "--set", "train.micro_batch_size=1", "--set", "train.global_batch_size=2",
           "--set", "train.warmup_steps=0"]


def as_prompt(pair: dict) -> dict:
    return {"prompt" if key == "instruction" else key: value for key, value in pair.items()}


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory, conversions):
    """(pairs file, run dir): 3 steps of 2 micro-batches of one pair from the tiny Hugging Face
    model's conversion, checkpoints at 2 and 3; the pairs' question is under 'prompt', which
    the run's data.columns maps, as a preference set exported from elsewhere names it."""
    import json

    from conftest import run_cli

    root = tmp_path_factory.mktemp("dpo")
    pairs = root / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(as_prompt(p), ensure_ascii=False) + "\n" for p in PAIRS), encoding="utf-8")
    sets = ["--set", f"data.train_files=[{pairs}]", "--set", f"model.checkpoint={conversions['float32']}",
            "--set", "data.columns={instruction: prompt}", *DPO_RUN]
    run_cli("train", SMOKE, "--output-dir", root / "run", *sets, check=True)
    return pairs, root / "run", sets


def test_a_dpo_run_starts_at_ln2_with_zero_rewards_and_logs_trl_metrics(dpo_run):
    from conftest import read_metrics

    records = read_metrics(dpo_run[1])
    first = records[0]
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-5) and first["target_tokens"] == 2  # pairs
    for name in ("rewards/chosen", "rewards/rejected", "rewards/margins"):
        assert abs(first[name]) < 1e-5, name
    assert first["logps/chosen"] < 0 and first["logps/rejected"] < 0
    assert records[2]["loss"] != first["loss"] and records[2]["rewards/margins"] != 0  # it trained
    assert (dpo_run[1] / "reference_logps.npz").is_file()


def test_a_resumed_dpo_run_reuses_its_reference_exactly_and_refuses_another(dpo_run, tmp_path):
    import shutil

    import numpy as np

    from conftest import assert_same_steps, read_metrics, run_cli

    pairs, run, sets = dpo_run
    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_3")
    result = run_cli("train", SMOKE, "--output-dir", resumed, "--resume", "auto", *sets, check=True)
    assert "reference log-probs of 5 pairs reused" in result.stdout
    assert_same_steps(resumed, run, [3])
    assert read_metrics(resumed)[2]["rewards/margins"] == pytest.approx(read_metrics(run)[2]["rewards/margins"],
                                                                         abs=1e-7)
    stored = dict(np.load(resumed / "reference_logps.npz"))
    stored["weights_sha256"] = np.array("0123456789abcdef")
    np.savez(resumed / "reference_logps.npz", **stored)
    shutil.rmtree(resumed / "checkpoints" / "step_3")
    refused = run_cli("train", SMOKE, "--output-dir", resumed, "--resume", "auto", *sets)
    assert refused.returncode == 2, refused.stderr
    assert "weights sha256 0123456789abcdef (stored) != " in refused.stderr and (
        "(this run)" in refused.stderr), refused.stderr


def test_a_run_stopped_during_its_reference_pass_keeps_nothing_and_its_rerun_is_exact(dpo_run, tmp_path):
    """SIGTERM while the reference pass runs (a preempted job that always runs `--resume
    auto`): one line, exit 143, the run directory removed with no partial reference file; the
    same command then computes the reference again and trains the uninterrupted run's steps."""
    import signal

    from conftest import assert_same_steps, read_metrics, run_cli, start_training, wait_until

    _, run, sets = dpo_run
    out, logs = tmp_path / "run", tmp_path / "logs"
    proc = start_training(out, "--resume", "auto", *sets, log_dir=logs)
    wait_until(lambda: "reference pass: " in (logs / "stdout").read_text(), proc, "the reference pass")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    stderr = (logs / "stderr").read_text()
    assert stderr.strip().splitlines()[-1] == ("llama-npu: error: SIGTERM received during start-up, before the first "
                                               "step; nothing of this run was kept")
    assert "reference:   0%" in stderr and "reference: 100%" not in stderr  # stopped inside the pass
    assert "Traceback" not in stderr
    assert not out.exists()
    result = run_cli("train", SMOKE, "--output-dir", out, "--resume", "auto", *sets, check=True)
    assert "reference pass: the starting weights' log-probs of 5 pairs" in result.stdout
    assert_same_steps(out, run, [1, 2, 3])
    assert [r["rewards/margins"] for r in read_metrics(out)] == pytest.approx(
        [r["rewards/margins"] for r in read_metrics(run)], abs=1e-7)


def test_dpo_data_parallel_over_two_launched_workers_equals_one_process(dpo_run, tmp_path):
    """scripts/launch.sh over 2 CPU workers (data: auto -> 2), one pair a rank and step,
    against the one-process run's 2 micro-batches of one pair: the same 2 pairs a step, the
    loss a mean over both ranks' pairs; both ranks computed the same reference."""
    import re

    from conftest import read_metrics, run_launch

    pairs, run, sets = dpo_run
    out = tmp_path / "run"
    proc = run_launch(SMOKE, 2, "--output-dir", out, *sets, log_dir=tmp_path / "logs",
                      env={"CLUSTER_TIME_OUT": "60"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 worker(s), data parallel: data 2 x model 1 x pipeline 1" in proc.stdout
    digests = re.findall(r"rank \d weights sha256 (\w+)", proc.stdout)
    assert len(digests) == 2 and len(set(digests)) == 1
    launched, single = read_metrics(out), read_metrics(run)
    assert [r["step"] for r in launched] == [1, 2, 3] and launched[0]["target_tokens"] == 2  # pairs of both ranks
    for a, b in zip(launched, single):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5) and a["samples_consumed"] == b["samples_consumed"]
    assert launched[2]["loss"] != launched[0]["loss"]  # it trained: the comparison means something
    np.testing.assert_array_equal(np.load(out / "reference_logps.npz")["log_probs"],
                                  np.load(run / "reference_logps.npz")["log_probs"])


# ---------------------------------------------------------------- composition with the strategies, in process

def dpo_step(ms, sets, k, checkpoint=""):
    """(network, loss cell, TrainStep of k micro-batches) of the tiny random model (or of
    `checkpoint`), SGD."""
    from llama_npu.strategies.precision import LossScaler
    from llama_npu.steps.optimizer import build_optimizer
    from llama_npu.objectives.dpo.parts import pairs_of
    from llama_npu.steps.graph_step import TrainStep

    net, cell, _ = ours(ms, ["train.optimizer.name=sgd", "train.optimizer.lr=0.5", *sets], checkpoint)
    recipe = load_recipe(SMOKE, ["train.optimizer.name=sgd", "train.optimizer.lr=0.5", *sets])
    cell.set_train(True)
    optimizer = build_optimizer(net.trainable_params(), recipe.train)
    return net, cell, TrainStep(cell, optimizer, LossScaler(recipe.strategies.precision), 1.0, k, count=pairs_of)


def split_pairs(ids, labels, reference):
    """The 2-pair batch as two micro-batches of one pair each (chosen row, rejected row)."""
    return [(ids[[i, i + 2]], labels[[i, i + 2]], reference[[i, i + 2]]) for i in (0, 1)]


def test_two_micro_batches_of_one_pair_equal_one_batch_of_two(ms):
    ids, labels = pair_batch()
    reference = np.array([-40.0, -30.0, -35.0, -20.0], np.float32)
    ms.set_seed(0)
    net_1, cell_1, one = dpo_step(ms, [], 1)
    ms.set_seed(0)
    net_2, cell_2, two = dpo_step(ms, [], 2)
    whole = one([(ids, labels, reference)], 0.5)
    split = two(split_pairs(ids, labels, reference), 0.5)
    assert (whole.target_tokens, split.target_tokens) == (2, 2)  # pairs
    assert split.loss == pytest.approx(whole.loss, abs=1e-6) and split.grad_norm == pytest.approx(whole.grad_norm,
                                                                                                   rel=1e-5)
    assert cell_2.take_metrics(2) == pytest.approx(cell_1.take_metrics(2), abs=1e-5)
    for a, b in zip(net_1.trainable_params(), net_2.trainable_params()):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), atol=1e-6)


def test_simpo_under_fp16_dynamic_loss_scale_recompute_and_lora_trains(ms):
    """AMP O2 in float16 with a dynamic loss scale, full recompute and LoRA: the fp32 run's
    first loss within fp16's reach, then the loss moves."""
    ids, labels = pair_batch()
    free = ["dpo.loss=simpo", "dpo.reference=none"]
    ms.set_seed(0)
    _, _, fp32 = dpo_step(ms, [*free, "strategies.lora.enabled=true"], 1)
    first = fp32([(ids, labels, np.zeros(4, np.float32))], 0.5).loss
    ms.set_seed(0)
    _, cell, fp16 = dpo_step(ms, [*free, "strategies.lora.enabled=true", "strategies.precision.amp_level=O2",
                                   "strategies.precision.loss_scale=dynamic", "strategies.recompute.mode=full"], 1)
    losses = [fp16([(ids, labels, np.zeros(4, np.float32))], 0.5) for _ in range(3)]
    assert not any(r.overflow for r in losses) and losses[0].loss_scale > 1
    assert losses[0].loss == pytest.approx(first, rel=2e-2)
    assert losses[2].loss < losses[0].loss - 1e-3
    assert set(cell.take_metrics(6)) == {"rewards/chosen", "rewards/rejected", "rewards/accuracies",
                                         "rewards/margins", "logps/chosen", "logps/rejected"}


def test_eval_of_a_dpo_run_on_pairs_scores_against_its_own_reference(dpo_run):
    """eval rebuilds the reference from the run's starting weights: on the training pairs its
    reference log-probs (logps - rewards / beta) are the run's precomputed ones."""
    import json

    import numpy as np

    from conftest import run_cli

    pairs, run, _ = dpo_run
    result = run_cli("eval", "--checkpoint", run, "--data", pairs, "--json", "--device", "cpu", check=True)
    scores = json.loads(result.stdout.strip().splitlines()[-1])
    stored = np.load(run / "reference_logps.npz")["log_probs"]
    beta = 0.1
    assert scores["pairs"] == 5 and 0 <= scores["rewards/accuracies"] <= 1
    assert scores["logps/chosen"] - scores["rewards/chosen"] / beta == pytest.approx(stored[:, 0].mean(), abs=1e-3)
    assert scores["logps/rejected"] - scores["rewards/rejected"] / beta == pytest.approx(stored[:, 1].mean(),
                                                                                          abs=1e-3)
    assert scores["rewards/margins"] != 0 and 0 < scores["loss"] < 2


def test_eval_scores_a_dpo_runs_pairs_in_every_layout_train_reads_with_the_runs_columns(dpo_run, tmp_path):
    """Held-out pairs under the run's own column names ('prompt', data.columns={instruction:
    prompt}), as a JSON array, CSV, TSV, .xlsx and Parquet file: scored together, the
    JSONL's loss and reward accuracy over five times the pairs."""
    import json

    from conftest import run_cli, write_layouts

    _, run, _ = dpo_run
    held_out = [as_prompt(p) for p in ({"instruction": "一年有几个月？", "chosen": "一年有十二个月。", "rejected": "十个。"},
                                       {"instruction": "猫会飞吗？", "chosen": "猫不会飞。", "rejected": "会飞。"})]
    paths = write_layouts(held_out, tmp_path, "held_out")

    def scores(*files):
        result = run_cli("eval", "--checkpoint", run, "--data", *files, "--json", "--device", "cpu", check=True)
        return json.loads(result.stdout.strip().splitlines()[-1])
    jsonl = scores(paths[".jsonl"])
    every = scores(*(paths[s] for s in (".json", ".csv", ".tsv", ".xlsx", ".parquet")))
    assert (jsonl["pairs"], every["pairs"]) == (2, 10)
    for key in ("loss", "rewards/accuracies", "rewards/margins", "logps/chosen"):
        assert every[key] == pytest.approx(jsonl[key], rel=1e-5, abs=1e-6), key


def test_the_planner_counts_two_sequences_a_pair_and_no_reference_weights():
    """A DPO micro-batch of 2 pairs plans as an SFT micro-batch of 4 sequences: the same
    activations and logits; the weights, gradients and optimizer states are the SFT run's."""
    from dataclasses import replace

    from llama_npu.memory.devices import DEVICES
    from llama_npu.memory.planner import estimate, strategy_from_recipe
    from llama_npu.model.architecture import PRESETS
    from llama_npu.model.llama import count_parameters

    sets = ["model.preset=llama3.2-1b", "data.eval_files=[]", "train.micro_batch_size=2",
            "train.global_batch_size=8", "device.target=ascend", "device.name=910a"]
    dpo = load_recipe(SMOKE, [*sets, "train.objective=dpo"])
    sft = load_recipe(SMOKE, sets)
    shape, device = PRESETS["llama3.2-1b"], DEVICES["910a"]
    params = count_parameters(shape)
    plan = estimate(shape, params, device, strategy_from_recipe(dpo, "910a"))
    same_rows = estimate(shape, params, device, replace(strategy_from_recipe(sft, "910a"), micro_batch=4,
                                                        global_batch=16))
    as_sft = estimate(shape, params, device, strategy_from_recipe(sft, "910a"))
    assert plan.strategy.accumulation == as_sft.strategy.accumulation == 4  # pairs: 8 / 2
    for part in ("activations", "logits_loss"):
        assert plan.components[part] == same_rows.components[part] > as_sft.components[part], part
    for part in ("weights", "gradients", "optimizer_states"):
        assert plan.components[part] == as_sft.components[part], part


@pytest.mark.quick
def test_fit_offers_a_dpo_run_only_layouts_its_validation_takes():
    """`plan --fit` without LoRA for the 3B full DPO recipe: on its 8 x 910B it puts the optimizer
    on the host over data 8, or keeps data 8 x optimizer sharding without offload; on 8 x 910A
    (32 GB) only the host optimizer fits a layout DPO takes, where without offload the same rows
    as SFT would be offered model or pipeline stages, which DPO refuses (objectives/dpo/section.py)."""
    from dataclasses import replace

    from llama_npu.memory.devices import DEVICES
    from llama_npu.memory.fit_choice import recommend
    from llama_npu.memory.planner import strategy_from_recipe
    from llama_npu.model.architecture import PRESETS

    recipe = load_recipe(REPO / "recipes" / "llama3_2_3b_zh_dpo_full_8x910b.yaml")
    shape, params = PRESETS["llama3.2-3b"], 3_212_749_824
    dpo = strategy_from_recipe(recipe, "910b")
    best, _ = recommend(shape, params, DEVICES["910b"], dpo, 8, False, None)
    s = best.strategy  # the optimizer on the host, data 8: a DPO run trains with it as without
    assert (s.data, s.model, s.pipeline, s.optimizer_shard, s.offload) == (8, 1, 1, False, True)
    best, _ = recommend(shape, params, DEVICES["910b"], dpo, 8, False, None, allow_offload=False)
    s = best.strategy
    assert (s.data, s.model, s.pipeline, s.optimizer_shard) == (8, 1, 1, True)
    on_910a = replace(dpo, dtype="float16")
    assert recommend(shape, params, DEVICES["910a"], on_910a, 8, False, None, allow_offload=False)[0] is None
    s = recommend(shape, params, DEVICES["910a"], on_910a, 8, False, None)[0].strategy  # the host takes the states
    assert (s.offload, s.model, s.pipeline) == (True, 1, 1)
    same_rows = replace(on_910a, sequences_per_sample=1, micro_batch=2, global_batch=64)
    sft_like = recommend(shape, params, DEVICES["910a"], same_rows, 8, False, None, allow_offload=False)[0].strategy
    assert sft_like.model > 1 or sft_like.pipeline > 1  # model 4 x data 2 since --fit ranks by the step time



def test_adapters_off_reference_equals_the_precomputed_one_at_every_step(ms):
    """LoRA over a frozen base: the adapters-off network is the base, which is also the
    starting policy (LoRA B = 0), so the in-graph reference equals the precomputed one at
    every step: ln 2 and zero rewards at step 1, then the same losses and metrics."""
    from llama_npu.objectives.sequence_logps import SequenceLogProbs

    ids, labels = pair_batch()
    ms.set_seed(0)
    net, pre_cell, pre = dpo_step(ms, ["strategies.lora.enabled=true"], 1)
    reference = SequenceLogProbs(net)(ms.Tensor(ids), ms.Tensor(labels))[0].asnumpy()  # as reference_pass does
    ms.set_seed(0)
    _, off_cell, off = dpo_step(ms, ["strategies.lora.enabled=true", "dpo.reference=adapters_off"], 1)
    ignored = np.full(4, -1e3, np.float32)  # adapters_off reads no reference from the batch
    for step in range(3):
        a, b = pre([(ids, labels, reference)], 0.5), off([(ids, labels, ignored)], 0.5)
        metrics_a, metrics_b = pre_cell.take_metrics(2), off_cell.take_metrics(2)
        if step == 0:
            assert b.loss == pytest.approx(math.log(2), abs=1e-5)
            assert all(abs(metrics_b[f"rewards/{n}"]) < 1e-5 for n in ("chosen", "rejected", "margins"))
        assert b.loss == pytest.approx(a.loss, abs=1e-5), step
        assert metrics_b == pytest.approx(metrics_a, abs=1e-5), step
    assert b.loss < math.log(2) - 1e-3 and metrics_b["rewards/margins"] > 0  # the adapters trained


def test_dpo_over_an_int8_lora_base_with_accumulation_recompute_chunked_ce_and_fp16(ms, conversions):
    """An int8 LoRA base (the tiny conversion) with dpo.reference adapters_off, k = 2
    micro-batches of one pair, full recompute, chunked CE and AMP O2 fp16 with a dynamic loss
    scale: step 1 is ln 2 with zero rewards (its log-probs are the base's), and the reference
    the metrics imply later (logps - rewards / beta) stays the base's while the adapters train.
    (dpo.reference=precomputed passes the same checks.)"""
    ids, labels = pair_batch()
    sets = ["strategies.lora.enabled=true", "strategies.lora.base_dtype=int8", "strategies.recompute.mode=full",
            "strategies.chunked_ce.enabled=true", "strategies.chunked_ce.chunk_size=5",
            "strategies.precision.amp_level=O2", "strategies.precision.loss_scale=dynamic",
            "dpo.reference=adapters_off"]
    _, cell, step = dpo_step(ms, sets, 2, checkpoint=conversions["float32"])
    ignored = np.full(4, -1e3, np.float32)  # adapters_off reads no reference from the batch
    first = step(split_pairs(ids, labels, ignored), 0.5)
    base = cell.take_metrics(2)
    assert first.loss == pytest.approx(math.log(2), abs=1e-5)
    assert all(abs(base[f"rewards/{n}"]) < 1e-5 for n in ("chosen", "rejected", "margins"))
    for _ in range(2):
        result, metrics = step(split_pairs(ids, labels, ignored), 0.5), cell.take_metrics(2)
        for side in ("chosen", "rejected"):
            implied = metrics[f"logps/{side}"] - metrics[f"rewards/{side}"] / 0.1
            assert implied == pytest.approx(base[f"logps/{side}"], abs=1e-3), side
    assert not result.overflow and result.loss < math.log(2) - 1e-3 and metrics["rewards/margins"] > 0
    # The policy moved away from the base: a reference that followed it would have failed above.
    assert abs(metrics["logps/rejected"] - base["logps/rejected"]) > 1e-2


def test_the_planner_counts_the_adapters_off_reference_forward_as_its_own_phase():
    """dpo.reference adapters_off: no reference weights, and a no-grad forward of the pair's
    rows in every micro-step, a phase of its own beside the model states."""
    from llama_npu.memory.devices import DEVICES
    from llama_npu.memory.planner import estimate, strategy_from_recipe
    from llama_npu.model.architecture import PRESETS
    from llama_npu.model.llama import count_parameters

    sets = ["model.preset=llama3.2-1b", "data.eval_files=[]", "train.micro_batch_size=2", "train.objective=dpo",
            "train.global_batch_size=8", "device.target=ascend", "device.name=910a", "strategies.lora.enabled=true"]
    shape, device = PRESETS["llama3.2-1b"], DEVICES["910a"]
    plans = {ref: estimate(shape, count_parameters(shape), device, strategy_from_recipe(
        load_recipe(SMOKE, [*sets, f"dpo.reference={ref}"]), "910a")) for ref in ("precomputed", "adapters_off")}
    pre, off = plans["precomputed"], plans["adapters_off"]
    assert "reference" not in pre.phases and 0 < off.components["reference_forward"]
    assert off.phases["reference"] > off.phases["update"]  # the model states and a forward's buffers
    for part in ("weights", "gradients", "optimizer_states", "activations", "logits_loss"):
        assert off.components[part] == pre.components[part], part
    assert off.total_bytes == max(pre.total_bytes, off.phases["reference"] + off.components["margin"])


def test_the_sharded_pair_loss_on_interleaved_rows_equals_the_unsharded_step(ms):
    """What the CPU can run of the sharded DPO step (stand-alone: semi-auto parallel needs
    Ascend; _VirtualDatasetCell, which has no CPU kernel, left out): MindFormers' accumulation
    cell around the pair loss, fed 2 micro-batches of 2 pairs interleaved as ShardedStep feeds them, give as numerator the
    summed pair losses, as denominator the 4 pairs, the gradients of the sum and the metrics
    of the unsharded loss cell on the same pairs in TRL's order."""
    from mindformers.wrapper.wrapper import GradAccumulationCellWithTwoOutput
    from mindspore import ParameterTuple

    from llama_npu.objectives.dpo.loss import PreferenceLoss
    from llama_npu.objectives.dpo.sharded import PairLossTwoOutputs, interleave
    from llama_npu.steps.sharded_step import step_inputs

    ids, labels = pair_batch()
    micro_batches = [(ids, labels, np.array([-40.0, -30.0, -35.0, -20.0], np.float32)),
                     (ids[[1, 0, 3, 2]], labels[[1, 0, 3, 2]], np.array([-31.0, -42.0, -22.0, -33.0], np.float32))]
    net, unsharded, section = ours(ms, [], "")
    unsharded.set_train(True)
    weights = ParameterTuple(net.trainable_params())
    sums, expected = zip(*(ms.value_and_grad(unsharded, None, weights)(*map(ms.Tensor, batch))
                           for batch in micro_batches))
    expected_metrics = unsharded.take_metrics(4)

    cell = PreferenceLoss(net, section, None, data_parallel=2)
    cell.set_train(True)
    network = GradAccumulationCellWithTwoOutput(PairLossTwoOutputs(cell), 2)
    inputs = step_inputs(micro_batches, interleave)
    assert inputs[0].shape == (8, T + 1)
    numerator, denominator, grads = forward_then_gradients(network, weights)(*inputs)
    assert float(denominator.asnumpy()) == 4.0
    assert float(numerator.asnumpy()) == pytest.approx(sum(float(s.asnumpy()) for s in sums), rel=1e-5)
    for got, *parts in zip(grads, *expected):
        np.testing.assert_allclose(got.asnumpy(), sum(p.asnumpy() for p in parts), rtol=1e-4, atol=1e-6)
    assert cell.take_metrics(4) == pytest.approx(expected_metrics, abs=1e-4)


def forward_then_gradients(network, weights):
    """MindFormers' grads_for_legacy as one graph (mindformers/wrapper/wrapper.py): the
    two-output network's forward, then the gradients of its numerator alone (sens 1 and 0)."""
    from mindspore import nn, ops

    class ForwardThenGradients(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.network, self.weights = network, weights
            self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

        def construct(self, *inputs):
            numerator, denominator = self.network(*inputs)
            sens = (ops.ones_like(numerator), ops.zeros_like(denominator))
            return numerator, denominator, self.grad(self.network, self.weights)(*inputs, sens)

    return ForwardThenGradients()
