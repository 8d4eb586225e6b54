"""The keys users bring from other trainers -- Hugging Face TrainingArguments, LLaMA-Factory
(which takes TrainingArguments and its own FinetuningArguments/DataArguments) and MindFormers'
YAML (runner_config, parallel_config, lr_schedule, context) -- and the llama-npu key that
does the same job, so that an unknown key's error ends with the fix, not only a near-typo."""
from __future__ import annotations

import dataclasses
import typing
import json
from pathlib import Path
from typing import Iterator, List, Optional

# foreign name (the last part of the key, lower case) -> our key, and what differs if anything
FOREIGN_NAMES = {
    "learning_rate": "train.optimizer.lr",
    "lr": "train.optimizer.lr",
    "weight_decay": "train.optimizer.weight_decay",
    "adam_beta1": "train.optimizer.beta1",
    "adam_beta2": "train.optimizer.beta2",
    "adam_epsilon": "train.optimizer.eps",
    "optim": "train.optimizer.name",
    "max_grad_norm": "train.grad_clip",
    "per_device_train_batch_size": "train.micro_batch_size",
    "batch_size": "train.micro_batch_size",
    "gradient_accumulation_steps": "train.global_batch_size (micro-batch x data parallel x accumulation steps)",
    "warmup_ratio": "train.warmup_steps (a number of steps)",
    "num_train_epochs": "train.epochs (or train.max_steps, in optimizer steps)",
    "epochs": "train.epochs (or train.max_steps, in optimizer steps)",
    "save_steps": "train.save_every",
    "save_total_limit": "train.keep_last",
    "eval_steps": "train.eval_every",
    "cutoff_len": "data.max_seq_len",
    "seq_length": "data.max_seq_len",
    "max_seq_length": "data.max_seq_len",
    "model_max_length": "data.max_seq_len",
    # LLaMA-Factory's data arguments (issue 56; data.dataset and its neighbours read dataset_info.json)
    "dataset": "data.dataset (names in dataset_info.json; or data.train_files, a list of files)",
    "dataset_dir": "data.dataset_dir (the folder holding dataset_info.json)",
    "eval_dataset": "data.eval_dataset (names in dataset_info.json; or data.eval_files, a list of files)",
    "max_samples": "data.max_samples",
    "template": "data.template (llama3)",
    "formatting": "data.format",
    "packing": "data.pack",
    "finetuning_type": "strategies.lora.enabled (true for lora)",
    "lora_rank": "strategies.lora.rank",
    "lora_alpha": "strategies.lora.alpha",
    "lora_dropout": "strategies.lora.dropout",
    "lora_target": "strategies.lora.target_modules",
    "bf16": "strategies.precision.dtype (bfloat16)",
    "fp16": "strategies.precision.dtype (float16)",
    "gradient_checkpointing": "strategies.recompute.mode",
    "recompute": "strategies.recompute.mode",
    "data_parallel": "strategies.parallel.data",
    "model_parallel": "strategies.parallel.model",
    "pipeline_stage": "strategies.parallel.pipeline",
    "micro_batch_num": "strategies.parallel.micro_batches",
    "enable_parallel_optimizer": "strategies.parallel.optimizer_shard",
    "model_name_or_path": "model.checkpoint (a `llama-npu convert hf-to-ms` directory)",
    "load_checkpoint": "model.checkpoint",
    "output_dir": "the --output-dir option of train",
    # DeepSpeed's config (a `deepspeed:` JSON, or its sections pasted in): a dotted name is
    # matched against the end of the key's path, before the last part alone is
    "deepspeed": "strategies.offload and strategies.parallel (ZeRO's jobs; no DeepSpeed here)",
    "zero_optimization.stage": "strategies.parallel.optimizer_shard: true (ZeRO-1: the optimizer's states split "
                               "over data parallel)",
    "offload_optimizer.device": "strategies.offload.optimizer: host",
    "train_micro_batch_size_per_gpu": "train.micro_batch_size",
    "train_batch_size": "train.global_batch_size",
    "gradient_clipping": "train.grad_clip",
    "fp16.enabled": "strategies.precision.dtype: float16",
    "bf16.enabled": "strategies.precision.dtype: bfloat16",
    "optimizer.type": "train.optimizer.name",
    "warmup_num_steps": "train.warmup_steps",
}


def _leaf_keys(cls, prefix: str = "") -> List[str]:
    keys = []
    for name, tp in typing.get_type_hints(cls).items():
        keys += _leaf_keys(tp, f"{prefix}{name}.") if dataclasses.is_dataclass(tp) else [prefix + name]
    return keys


def key_elsewhere(key: str) -> Optional[str]:
    """The key `key` means: ours under its name in another section (train.lr ->
    train.optimizer.lr's section aside, train.weight_decay -> train.optimizer.weight_decay),
    or another trainer's name for one of ours; None when neither."""
    from .schema import Recipe  # imported here: schema imports the strategies, which import recipe modules

    parts = key.lower().split(".")
    names = foreign_names()
    dotted = [".".join(parts[i:]) for i in range(len(parts) - 1)]  # the longest end of the path first
    meant = next((names[end] for end in dotted if end in names), None)
    if meant:
        return meant
    ours = [k for k in _leaf_keys(Recipe) if k.rsplit(".", 1)[-1] == key.rsplit(".", 1)[-1] and k != key]
    if len(ours) == 1:
        return ours[0]
    return names.get(parts[-1])


def leaves(tree: dict, prefix: str = "") -> Iterator[str]:
    """The dotted paths to the values of a nested mapping, at any depth."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from leaves(value, f"{path}.")
        else:
            yield path


def named_config(value) -> Optional[dict]:
    """The mapping a key's value names, when it is a JSON file's path (LLaMA-Factory's
    `deepspeed: ds_z3_config.json`), read so that its keys can be hinted at; else None."""
    if not isinstance(value, str) or not value.endswith(".json"):
        return None
    try:
        tree = json.loads(Path(value).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return tree if isinstance(tree, dict) else None


def foreign_names() -> dict:
    """FOREIGN_NAMES with LLaMA-Factory's `stage` and each objective's own (objectives/)."""
    from ..objectives import NAMES, OBJECTIVES  # imported here: as the schema above

    names = dict(FOREIGN_NAMES, stage=f"train.objective ({', '.join(NAMES[:-1])} or {NAMES[-1]})")
    for objective in OBJECTIVES:
        names.update(objective.FOREIGN_NAMES)
    return names
