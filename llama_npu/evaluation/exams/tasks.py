"""lm-eval's own task definitions for C-Eval, CMMLU and MMLU (their YAMLs under
lm_eval/tasks/{ceval,cmmlu,mmlu/default}: prompt, few-shot sampler, choices, metrics), with the
Hugging Face Hub dataset they name replaced by the questions read from --data, so nothing
is downloaded: lm-eval's `custom_dataset` hook (lm_eval/api/task.py ConfigurableTask.download)
returns in-memory `datasets.Dataset`s."""
from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import List

from ...data.readers import RecordError
from .layouts import ExamData, Question
from .own_exam import TEMPLATE_SUBJECT, own_config

# lm-eval imports `datasets`, which would otherwise look for the Hub; everything is local.
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


def task_yaml(task: str, subject: str) -> Path:
    import lm_eval.tasks  # imported here: lm-eval and datasets, only after OFFLINE is set

    tasks = Path(lm_eval.tasks.__file__).parent
    return {"ceval": tasks / "ceval" / f"ceval-valid_{subject}.yaml",
            "cmmlu": tasks / "cmmlu" / f"cmmlu_{subject}.yaml",
            "mmlu": tasks / "mmlu" / "default" / f"mmlu_{subject}.yaml"}[task]


def task_config(task: str, subject: str, where: Path) -> dict:
    """lm-eval's config of `subject`, `include`s resolved."""
    os.environ.update(OFFLINE)
    from lm_eval.tasks._yaml_loader import load_yaml  # imported here: lm-eval and datasets, only after OFFLINE is set

    path = task_yaml(task, subject)
    if not path.is_file():
        raise RecordError(f"{where}: {subject!r} is not a subject of lm-eval's {task} tasks (no {path.name} in "
                          f"{path.parent})")
    config = load_yaml(path)
    if not any(m["metric"] == "acc_norm" for m in config["metric_list"]):
        # MMLU's YAML lists acc only; acc_norm (length-normalised) is what the summary shows
        # beside it for every task. With one-letter choices the two are equal.
        config["metric_list"] = config["metric_list"] + [{"metric": "acc_norm", "aggregation": "mean",
                                                          "higher_is_better": True}]
    return config


def _dataset(questions: List[Question]):
    import datasets  # imported here: lm-eval and datasets, only after OFFLINE is set

    return datasets.Dataset.from_list([q.doc for q in questions])


def compile_templates_once() -> None:
    """lm-eval renders every prompt field through utils.apply_template, which compiles its
    Jinja template anew at each call (lm_eval/utils.py: env.from_string, then render): 80-90%
    of building a prompt (0.12 of 0.14 s for 48 C-Eval questions at 0 shots, 0.36 of 0.38 at
    5). A string's compiled template is the same at every call, so each is compiled once; the
    rendering is lm-eval's own."""
    from lm_eval import utils  # imported here: lm-eval and datasets, only after OFFLINE is set

    if getattr(utils.apply_template, "compiles_once", False):
        return
    template = functools.lru_cache(maxsize=None)(utils.env.from_string)

    def apply_template(text: str, doc: dict) -> str:
        return template(text).render(**doc)

    apply_template.compiles_once = True
    utils.apply_template = apply_template


def build_tasks(data: ExamData) -> dict:
    """subject -> lm-eval ConfigurableTask whose eval docs are the split's questions (in
    file order) and whose few-shot docs are the dev split's."""
    os.environ.update(OFFLINE)
    from lm_eval.api.task import ConfigurableTask  # imported here: after OFFLINE, which lm-eval reads at import

    logging.getLogger("lm_eval").setLevel(logging.ERROR)  # its custom_dataset notice is for its CLI
    compile_templates_once()
    tasks = {}
    task = data.layout.task
    for subject, questions in data.questions.items():
        if subject in data.own:  # scored as the task's subjects are: one of them's definition, renamed
            config = own_config(task, subject, task_config(task, TEMPLATE_SUBJECT[task], Path(subject)))
        else:
            config = task_config(task, subject, data.layout.file(data.root, data.split, subject))
        splits = {"eval": _dataset(questions)}
        if data.shots.get(subject):
            splits["dev"] = _dataset(data.shots[subject])
        config.update(validation_split=None, test_split="eval", fewshot_split="dev" if "dev" in splits else None,
                      custom_dataset=lambda _splits=splits, **_: _splits)
        if "dev" not in splits:
            config.pop("fewshot_config", None)
        tasks[subject] = ConfigurableTask(config=config)
    return tasks
