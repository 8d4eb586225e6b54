"""The official CSV layouts of C-Eval, CMMLU and MMLU, as users download them, read into
the documents lm-eval's task definitions expect (the columns of the Hugging Face datasets
its YAMLs name), with every bad row one line naming its file and line.

- C-Eval (github.com/hkust-nlp/ceval, ceval-exam.zip): dev/, val/, test/, one
  `<subject>_<split>.csv` each, header `id,question,A,B,C,D,answer[,explanation]`.
- CMMLU (github.com/haonan-li/CMMLU, cmmlu_v1_0_1.zip): dev/, test/, one `<subject>.csv`
  each, header `,Question,A,B,C,D,Answer` (the first column is the row's index).
- MMLU (people.eecs.berkeley.edu/~hendrycks/data.tar): dev/, val/, test/, one
  `<subject>_<split>.csv` each, no header: question, A, B, C, D, answer.
"""
from __future__ import annotations

import csv
import io
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ...data.encodings import decode_file
from ...data.readers import RecordError

LETTERS = ("A", "B", "C", "D")


@dataclass(frozen=True)
class Layout:
    task: str
    title: str
    splits: Tuple[str, ...]
    default_split: str  # lm-eval's: C-Eval's test answers are not published
    columns: Optional[Tuple[str, ...]]  # the header's names; None: no header
    per_split_suffix: bool  # <subject>_<split>.csv rather than <subject>.csv

    def file(self, root: Path, split: str, subject: str) -> Path:
        return root / split / (f"{subject}_{split}.csv" if self.per_split_suffix else f"{subject}.csv")

    def subject_of(self, path: Path, split: str) -> Optional[str]:
        suffix = f"_{split}.csv" if self.per_split_suffix else ".csv"
        return path.name[: -len(suffix)] if path.name.endswith(suffix) else None

    def describe(self) -> str:
        name = "<subject>_<split>.csv" if self.per_split_suffix else "<subject>.csv"
        header = f"header {','.join(self.columns)}" if self.columns else "no header"
        return f"{self.title}'s layout: {', '.join(s + '/' for s in self.splits)} with {name} ({header})"


LAYOUTS = {
    "ceval": Layout("ceval", "C-Eval", ("dev", "val", "test"), "val",
                    ("id", "question", "A", "B", "C", "D", "answer"), True),
    "cmmlu": Layout("cmmlu", "CMMLU", ("dev", "test"), "test", ("", "Question", "A", "B", "C", "D", "Answer"), False),
    "mmlu": Layout("mmlu", "MMLU", ("dev", "val", "test"), "test", None, True),
}


@dataclass
class Question:
    """One row: `doc` in the columns lm-eval's task reads, `qid` the id --output reports."""
    subject: str
    qid: str
    doc: dict
    answer: str  # A-D
    where: str  # file:line


@dataclass
class ExamData:
    layout: Layout
    root: Path
    split: str
    questions: Dict[str, List[Question]]  # subject -> scored questions, in file order
    shots: Dict[str, List[Question]] = field(default_factory=dict)  # subject -> dev questions
    own: List[str] = field(default_factory=list)  # the subjects of the user's own exam files (own_exam.py)


def check_directory(layout: Layout, root: Path, split: str) -> List[str]:
    """The subjects of `split` under `root`, or RecordError when `root` is not in `layout`."""
    root = Path(root)
    if root.is_file():
        raise RecordError(f"--data {root}: a file; --task {layout.task} reads a directory in {layout.describe()} "
                          f"(for loss and perplexity over JSONL records, leave out --task)")
    if not root.is_dir():
        raise RecordError(f"--data {root}: no such directory; --task {layout.task} reads {layout.describe()}")
    if split not in layout.splits:
        raise RecordError(f"--split {split}: {layout.title} has the splits {', '.join(layout.splits)}")
    directory = root / split
    subjects = sorted(s for s in (layout.subject_of(p, split) for p in directory.glob("*.csv") if p.is_file()) if s) \
        if directory.is_dir() else []
    if not subjects:
        found = ", ".join(sorted(p.name + ("/" if p.is_dir() else "") for p in root.iterdir())[:6]) or "nothing"
        raise RecordError(f"--data {root}: no {layout.file(root, split, '<subject>').relative_to(root)} files; "
                          f"expected {layout.describe()}; found {found}")
    return subjects


def convert_layout_hint(path: Path, source: str) -> str:
    """The command that converts every CSV file of the layout holding `path` (ROOT/split/x.csv)
    to UTF-8 in place; a file that is UTF-8 already is left as it is, not converted twice."""
    root = shlex.quote(str(path.parent.parent))
    return (f"convert every file of {root} to UTF-8 in place: find {root} -name '*.csv' -exec sh -c 'for f; do "
            f"iconv -f UTF-8 -t UTF-8 \"$f\" >/dev/null 2>&1 || {{ iconv -f {source} -t UTF-8 \"$f\" > \"$f.tmp\" "
            f"&& mv \"$f.tmp\" \"$f\"; }}; done' sh {{}} +")


def _rows(layout: Layout, path: Path):
    """(line number, row as a list of strings) after the header, which is checked."""

    # newline="": the csv module ends rows itself, so U+2028 or U+0085 in a cell stays in it
    reader = csv.reader(io.StringIO(decode_file(path, hint=convert_layout_hint), newline=""))
    try:
        if layout.columns is not None:
            header = next(reader, None)
            if header is None or [h.strip() for h in header[: len(layout.columns)]] != list(layout.columns):
                raise RecordError(f"{path}:1: header is {','.join(header or [])!r}; {layout.title} files start with "
                                  f"{','.join(layout.columns)!r}")
        for row in reader:
            if any(cell.strip() for cell in row):
                yield reader.line_num, row
    except csv.Error as exc:  # e.g. a cell past the csv module's field limit (an unclosed quote)
        raise RecordError(f"{path}:{reader.line_num}: not valid CSV ({exc})") from None


def _question(layout: Layout, subject: str, path: Path, lineno: int, row: List[str], index: int) -> Question:
    where = f"{path}:{lineno}"
    width = len(layout.columns) if layout.columns else 6
    if len(row) < width:
        raise RecordError(f"{where}: {len(row)} fields; a {layout.title} row has {width} "
                          f"({','.join(layout.columns) if layout.columns else 'question,A,B,C,D,answer'})")
    if layout.columns is None:  # MMLU: no id column; the row's index is its id
        qid, question, choices, answer = str(index), row[0], row[1:5], row[5]
    else:
        qid, question, choices, answer = row[0], row[1], row[2:6], row[6]
    return task_question(layout.task, subject, where, qid, question, choices, answer,
                         row[7] if layout.task == "ceval" and len(row) > 7 else "")


def task_question(task: str, subject: str, where: str, qid: str, question: str, choices, answer: str,
                  explanation: str = "") -> Question:
    """One question as the documents of `task`'s lm-eval definition hold it; RecordError
    naming `where` (file:line) for an empty choice or an answer outside A-D."""
    answer = answer.strip()
    for letter, choice in zip(LETTERS, choices):
        if not choice.strip():
            raise RecordError(f"{where}: choice {letter} is empty; every question needs four choices A-D")
    if answer not in LETTERS:
        raise RecordError(f"{where}: answer {answer!r} is not one of A, B, C, D")
    if task == "ceval":  # ceval/ceval-exam's columns
        doc = {"id": qid, "question": question, **dict(zip(LETTERS, choices)), "answer": answer,
               "explanation": explanation}
    elif task == "cmmlu":  # haonan-li/cmmlu's
        doc = {"Question": question, **dict(zip(LETTERS, choices)), "Answer": answer}
    else:  # cais/mmlu's: the answer is the choice's index
        doc = {"question": question, "subject": subject, "choices": list(choices), "answer": LETTERS.index(answer)}
    return Question(subject, qid.strip(), doc, answer, where)


def read_subject(layout: Layout, root: Path, split: str, subject: str) -> List[Question]:
    path = layout.file(root, split, subject)
    return [_question(layout, subject, path, lineno, row, index)
            for index, (lineno, row) in enumerate(_rows(layout, path))]


def read_exam(task: str, root: Optional[Path], split: Optional[str], subjects: Optional[List[str]], shots: int,
              own: Optional[Dict[str, List[Question]]] = None) -> ExamData:
    """Every question of the chosen subjects of `split`, and with shots > 0 their dev
    examples, then `own`, the subjects of the user's own exam files, read first by the caller
    (own_exam.read_own_exams; none under `root` None); RecordError (one line naming the file
    and line) on anything malformed."""
    layout = LAYOUTS[task]
    split = split or layout.default_split
    own = own or {}
    if root is None:
        return ExamData(layout, Path("."), split, own, own=list(own))
    data = read_benchmark(layout, Path(root), split, subjects, shots)
    data.questions.update(own)
    data.own = list(own)
    return data


def read_benchmark(layout: Layout, root: Path, split: str, subjects: Optional[List[str]], shots: int) -> ExamData:
    present = check_directory(layout, root, split)
    chosen = subjects or present
    for subject in chosen:
        if subject not in present:
            raise RecordError(f"--subjects {subject}: no {layout.file(root, split, subject)}; the {split} split "
                              f"here has {', '.join(present)}")
    data = ExamData(layout, root, split, {s: read_subject(layout, root, split, s) for s in chosen})
    for subject, questions in data.questions.items():
        if not questions:
            raise RecordError(f"{layout.file(root, split, subject)}: no questions")
    if shots > 0:
        for subject in chosen:
            dev = layout.file(root, "dev", subject)
            if not dev.is_file():
                raise RecordError(f"{dev}: missing; --shots {shots} takes its examples from the dev split "
                                  f"(--shots 0 needs none)")
            data.shots[subject] = read_subject(layout, root, "dev", subject)
    return data
