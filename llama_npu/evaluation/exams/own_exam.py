"""A user's own exam beside a benchmark's subjects: `eval --task ceval --data DIR my_exam.csv`.

A CSV (with a header) or JSONL file of multiple-choice questions: columns question, A, B, C,
D and answer (any letter case: C-Eval writes question/answer, CMMLU Question/Answer), and
optionally subject (else the file's name is the subject) and id. Each subject is scored as
the --task's own subjects are: the same lm-eval definition (prompt, choices, acc and
acc_norm), its description naming the subject as the task's descriptions name theirs.
It has no dev split, so it is scored at 0 shots.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Dict, Iterator, List, Sequence, Tuple

from ...data.encodings import decode_file
from ...data.readers import RecordError
from .layouts import LAYOUTS, LETTERS, Question, task_question

REQUIRED = ("question", *LETTERS, "answer")
OWN_SUFFIXES = (".csv", ".jsonl", ".json")
# the subject whose lm-eval definition an own subject takes, and the task's description with its name
TEMPLATE_SUBJECT = {"ceval": "computer_network", "cmmlu": "agronomy", "mmlu": "astronomy"}
DESCRIPTION = {"ceval": "以下是中国关于{}的单项选择题，请选出其中的正确答案。\n\n",
               "cmmlu": "以下是关于{}的单项选择题，请直接给出正确答案的选项。\n\n",
               "mmlu": "The following are multiple choice questions (with answers) about {}.\n\n"}


def _rows(path: Path) -> Iterator[Tuple[int, dict]]:
    """(line, row with lower-case keys) of a JSONL or CSV file."""
    text = decode_file(path)
    if path.suffix.lower() in (".jsonl", ".json"):
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise RecordError(f"{path}:{lineno}: not a JSON object ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise RecordError(f"{path}:{lineno}: not a JSON object")
                yield lineno, {str(k).strip().lower(): "" if v is None else str(v) for k, v in row.items()}
        return
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        for row in reader:
            yield reader.line_num, {str(k).strip().lower(): v or "" for k, v in row.items() if k is not None}
    except csv.Error as exc:
        raise RecordError(f"{path}:{reader.line_num}: not valid CSV ({exc})") from None


def read_own_exam(task: str, path: Path) -> Dict[str, List[Question]]:
    """subject -> questions of one file, each subject named '<subject> (<file name>)'."""
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"--data {path}: no such file (your own exam: a .csv or .jsonl file of questions)")
    subjects: Dict[str, List[Question]] = {}
    for lineno, row in _rows(path):
        where = f"{path}:{lineno}"
        missing = [name for name in REQUIRED if name.lower() not in row]
        if missing:
            raise RecordError(f"{where}: no {', '.join(missing)} column; your own exam has the columns "
                              f"question, A, B, C, D, answer (and subject); a benchmark is a directory in "
                              f"{LAYOUTS[task].describe()}")
        subject = row.get("subject", "").strip() or path.stem
        question = task_question(task, subject, where, row.get("id", "") or str(lineno), row["question"],
                                 [row[letter.lower()] for letter in LETTERS], row["answer"].upper())
        subjects.setdefault(f"{subject} ({path.name})", []).append(question)
    if not subjects:
        raise RecordError(f"{path}: no questions")
    return subjects


def read_own_exams(task: str, paths: Sequence[Path]) -> Dict[str, List[Question]]:
    """subject -> questions of every file in `paths`, for layouts.read_exam to put beside the
    benchmark's subjects."""
    return {subject: questions for path in paths for subject, questions in read_own_exam(task, path).items()}


def own_config(task: str, subject: str, template: dict) -> dict:
    """lm-eval's definition of a --task subject (`template`, task_config's) for an own subject."""
    name = subject.rsplit(" (", 1)[0]
    config = {k: v for k, v in template.items() if k not in ("tag", "task_alias")}
    config.update(task=f"own_{name}", dataset_name=name, description=DESCRIPTION[task].format(name))
    return config
