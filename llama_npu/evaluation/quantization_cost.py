"""What `llama-npu quantize --data` reports: the accuracy cost of INT8, measured. The float
checkpoint and the quantized directory are evaluated by `eval`'s own code on the same
records at the same length (perplexity.evaluate_checkpoint), and, given a C-Eval / CMMLU /
MMLU directory, scored by `eval --task --compare` (exams/run.run_exam) in the same prompt
format, so the two columns differ by the quantization alone."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..data.readers import RecordError, read_records
from ..objectives import records_of, sft
from .exams.layouts import read_exam
from .exams.report import format_summary
from .exams.prompt_format import chat_default
from .exams.run import run_exam
from .perplexity import DEFAULT_MAX_SEQ_LEN, detect_format, evaluate_checkpoint


def check_inputs(data_files, task: Optional[str], task_data: Optional[Path], shots: int) -> None:
    """The records and the exam directory read as eval reads them, before anything is written:
    one line naming the file and line of the first problem."""
    if (task is None) != (task_data is None):
        raise RecordError("--task and --task-data: give both (a benchmark and its directory) or neither")
    if task is not None and not data_files:
        raise RecordError(f"--task {task}: only with --data (the held-out records it is reported beside)")
    for path in data_files or ():
        read_records([path], detect_format(Path(path)), kind=records_of(sft.OBJECTIVE))
    if task is not None:
        read_exam(task, Path(task_data), None, None, shots)


def held_out_cost(source: Path, quantized: Path, data_files, max_seq_len: Optional[int], batch_size: int,
                  device: str) -> dict:
    """The loss of both models on `data_files`, the quantized one at the length the float one
    was evaluated at (a run's own data.max_seq_len unless --max-seq-len says otherwise)."""
    before = evaluate_checkpoint(Path(source), data_files, max_seq_len, batch_size, device)
    after = evaluate_checkpoint(Path(quantized), data_files, before["max_seq_len"], batch_size, device)
    return {"float": before, "int8": after, "loss_delta": after["loss"] - before["loss"],
            "perplexity_ratio": after["perplexity"] / before["perplexity"]}


def exam_cost(source: Path, quantized: Path, task: str, data_dir: Path, shots: int, max_seq_len: Optional[int],
              batch_size: int, device: str) -> dict:
    """`eval --task TASK --compare` of the float (A) and the int8 (B) model, both in the prompt
    format the float checkpoint is scored in by default (a converted directory, which
    `quantize` writes, would otherwise default to the plain prompt)."""
    chat, _ = chat_default(Path(source))
    return run_exam(task, Path(source), Path(data_dir), shots, compare=Path(quantized), chat=chat,
                    max_seq_len=max_seq_len or DEFAULT_MAX_SEQ_LEN, batch_size=batch_size, device=device)


def format_held_out(cost: dict) -> str:
    """The two models' loss and perplexity side by side, and what INT8 costs."""
    first = cost["float"]
    lines = [f"held-out loss over {first['target_tokens']} target tokens of {first['evaluated']} records "
             f"(max_seq_len {first['max_seq_len']}, {first['max_seq_len_from']}):",
             f"{'':<6} {'loss':>8} {'perplexity':>11}"]
    lines += [f"{name:<6} {cost[name]['loss']:>8.4f} {cost[name]['perplexity']:>11.3f}" for name in ("float", "int8")]
    # a fine-tune's cost can be far below the table's 4 decimals: the difference gets 6
    lines.append(f"int8 - float: loss {cost['loss_delta']:+.6f} ({cost['loss_delta'] / first['loss']:+.4%}), "
                 f"perplexity {cost['perplexity_ratio'] - 1:+.4%}")
    return "\n".join(lines)


def format_exam(result: dict) -> str:
    """eval --task's comparison table, A the float model and B the int8 one."""
    return "A: float, B: int8\n" + format_summary(result)
