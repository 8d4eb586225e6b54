"""The recipe's schema: one dataclass a section, each key with its default and what it takes.
The strategies' sections are their modules' own (strategies/), gathered here in their order,
and so are the objectives' (objectives/).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ..data.truncation import DEFAULT as TRUNCATION_DEFAULT
from ..objectives import OBJECTIVES
from ..strategies import STRATEGIES


@dataclass
class ModelSection:
    preset: str = "tiny"  # llama3.2-1b | llama3.2-3b | tiny
    checkpoint: str = ""  # a `llama-npu convert hf-to-ms` directory to start from (else random init)
    # true: start from random weights on purpose when checkpoint is empty; a LoRA recipe needs
    # it or model.checkpoint (recipe/base_weights.py), adapters over a random base being no model.
    random_init: bool = False
    # Optional size overrides on top of the preset (tests shrink shipped recipes with these).
    hidden_size: Optional[int] = None
    num_layers: Optional[int] = None
    num_heads: Optional[int] = None
    num_kv_heads: Optional[int] = None
    intermediate_size: Optional[int] = None


@dataclass
class DataSection:
    format: str = "alpaca"  # alpaca | sharegpt | text (of train_files and eval_files)
    train_files: List[str] = field(default_factory=list)  # raw files, prepared in memory at start
    prepared: str = ""  # or a `llama-npu prepare-data` directory (MindRecord)
    eval_files: List[str] = field(default_factory=list)
    tokenizer: str = "llama3.2"  # or a path to a Hugging Face tokenizer.json
    max_seq_len: int = 64  # positions the model sees; a sample holds up to max_seq_len + 1 tokens
    train_on_prompt: bool = False
    pack: bool = False  # pack raw train_files into full rows (prepared data says it itself)
    on_bad_record: str = "error"  # error: refuse the run, listing them | skip: train on the good records
    # record key -> the column (or JSON key) holding it, e.g. {instruction: 指令, output: 输出} (data/tables.py)
    columns: Dict[str, str] = field(default_factory=dict)
    encoding: str = ""  # of CSV/TSV/JSON/JSONL files; "" reads UTF-8 (and UTF-16 by its BOM); e.g. gbk
    # LLaMA-Factory's dataset_info.json, its tags and KTO's label values (data/dataset_info.py,
    # data/turn_tags.py, objectives/kto/records.py; docs/recipes-and-data.md)
    dataset_dir: str = "data"  # the folder holding dataset_info.json, as LLaMA-Factory's dataset_dir
    dataset: List[str] = field(default_factory=list)  # its entries trained on ("a, b" is a and b), or train_files
    eval_dataset: List[str] = field(default_factory=list)  # its held-out entries, or eval_files
    max_samples: Optional[int] = None  # the first N records of each dataset (LLaMA-Factory's max_samples)
    tags: Dict[str, str] = field(default_factory=dict)  # role_tag ... system_tag; {}: each turn's keys decide
    label_values: Dict[str, List[str]] = field(default_factory=dict)  # {desirable: [...], undesirable: [...]}
    # issue 56, LLaMA-Factory's habits: the chat template (LLaMA-Factory's `template`), named
    # in prepared data's meta.json too; llama3 is the one there is (data/chat_template.py)
    template: str = "llama3"
    # A record longer than max_seq_len + 1 tokens, for every objective (data/truncation.py):
    # keep_end | keep_start | keep_prompt | drop
    truncation: str = TRUNCATION_DEFAULT


@dataclass
class OptimizerSection:
    name: str = "adamw"  # adamw | sgd
    lr: float = 3e-4
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8


DEFAULT_MAX_STEPS = 100


@dataclass
class TrainSection:
    # optimizer steps; DEFAULT_MAX_STEPS when train.epochs is not given either (recipe/load.py)
    max_steps: Optional[int] = None
    micro_batch_size: int = 4
    # Samples per optimizer step over all data-parallel ranks; 0 means micro_batch_size x data.
    global_batch_size: int = 0
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0  # 0 disables clipping
    seed: int = 0
    save_every: int = 50
    keep_last: int = 2
    # Stop after this many skipped non-finite steps in a row that loss scaling cannot explain
    # (no dynamic scaling, or its scale at the floor); 0 never stops.
    max_nonfinite_steps: int = 10
    eval_every: int = 0  # 0: evaluate only at the end (when eval files are given)
    mode: str = "graph"  # graph | pynative
    objective: str = "sft"  # one of objectives/ NAMES; its section, if any, is the key of that name
    # issue 56, LLaMA-Factory's habits (recipe/run_length.py, recipe/resume_checks.py):
    # passes over the training data instead of max_steps (num_train_epochs): the steps follow
    # from the data's rows and the global batch, as the Hugging Face Trainer counts them
    epochs: Optional[float] = None
    # on resume with another max_steps or epochs: true stretches the lr schedule to the new
    # length; false keeps the schedule the run started with, then its floor past its end
    reschedule: bool = False
    # RUN/images/*.png at each checkpoint, the end and a stop (llama_npu/report/); false draws none
    plots: bool = True
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)


StrategiesSection = dataclasses.make_dataclass(
    "StrategiesSection", [(s.KEY, s.SECTION, field(default_factory=s.SECTION)) for s in STRATEGIES if s.SECTION])


@dataclass
class DeviceSection:
    target: str = "cpu"  # cpu | ascend
    name: str = "cpu"  # cpu | 910a | 910b | 910b4
    max_device_memory: str = ""  # e.g. "29GB"; empty keeps MindSpore's default


@dataclass
class Sections:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    strategies: StrategiesSection = field(default_factory=StrategiesSection)
    device: DeviceSection = field(default_factory=DeviceSection)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def digest(self) -> str:
        text = json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# The objectives' sections (objectives/), after the others, in the registry's order.
Recipe = dataclasses.make_dataclass(
    "Recipe", [(o.NAME, o.SECTION, field(default_factory=o.SECTION)) for o in OBJECTIVES if o.SECTION],
    bases=(Sections,))


def with_absolute_paths(recipe: Recipe) -> Recipe:
    """The recipe with its file paths resolved against the current directory, as a run
    stores it (its recipe.yaml), so that eval, generate, ms-to-hf and resume find the same
    files from any directory. The tokenizer name llama3.2 is a name, not a path."""
    def absolute(path: str) -> str:
        return os.path.abspath(path) if path else path

    d = recipe.data
    return dataclasses.replace(
        recipe, model=dataclasses.replace(recipe.model, checkpoint=absolute(recipe.model.checkpoint)),
        data=dataclasses.replace(d, train_files=[absolute(p) for p in d.train_files], prepared=absolute(d.prepared),
                                 eval_files=[absolute(p) for p in d.eval_files],
                                 dataset_dir=absolute(d.dataset_dir) if d.dataset or d.eval_dataset else d.dataset_dir,
                                 tokenizer=d.tokenizer if d.tokenizer == "llama3.2" else absolute(d.tokenizer)))

