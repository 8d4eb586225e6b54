"""The summary table `llama-npu eval --task` prints: acc and acc_norm with the question
counts per subject, per category and overall; with --compare, both checkpoints and the
difference (second - first)."""
from __future__ import annotations

from typing import List

from .layouts import LAYOUTS


def _prompt_line(result: dict, label: str) -> str:
    chat = _format_name(result["chat"])
    line = f"{label}{result['checkpoint']}: {chat} ({result['chat_reason']})"
    if result["fewer_shots"] or result["truncated"]:
        line += (f"; {result['fewer_shots']} questions with fewer shots to fit --max-seq-len, "
                 f"{result['truncated']} cut even at 0 shots")
    return line


def _format_name(chat: bool) -> str:
    return "Llama 3 chat format" if chat else "plain prompt"


def _compare_line(result: dict, other: dict) -> str:
    """With --compare: the one format both sides were scored in, or that each Δ mixes two changes."""
    if result["chat"] == other["chat"]:
        return (f"one prompt format for both, the {_format_name(result['chat'])}: "
                "Δ = B - A compares the checkpoints only")
    return (f"Δ = B - A changes two things: the checkpoint and the prompt format (A {_format_name(result['chat'])}, "
            f"B {_format_name(other['chat'])}); without --compare-chat both are scored in one format")


def _title(result: dict) -> str:
    task, own = LAYOUTS[result["task"]].title, sum(row["n"] for row in result["own"].values())
    if result["data"] is None:
        return f"your own exams, scored as {task}'s subjects are, 0-shot, {own} questions"
    title = f"{task} {result['split']}, {result['shots']}-shot, {result['overall']['n']} questions"
    return title + (f"; beside its subjects, your own exams (0-shot: no dev examples; in no category and not in "
                    f"overall), {own} questions" if own else "")


def format_summary(result: dict) -> str:
    other = result.get("compare")
    title = _title(result)
    lines: List[str] = [title, _prompt_line(result, "A " if other else "")]
    if other:
        lines += [_prompt_line(other, "B "), _compare_line(result, other)]
        header = f"{'':<40} {'n':>5} {'acc A':>7} {'acc B':>7} {'Δacc':>7} {'norm A':>7} {'norm B':>7} {'Δnorm':>7}"
    else:
        header = f"{'':<40} {'n':>5} {'acc':>7} {'acc_norm':>8}"
    lines.append(header)

    def row(name: str, section: str) -> str:
        mine = result[section] if section == "overall" else result[section][name]
        if not other:
            return f"{name:<40} {mine['n']:>5} {mine['acc']:>7.4f} {mine['acc_norm']:>8.4f}"
        theirs = other[section] if section == "overall" else other[section][name]
        return (f"{name:<40} {mine['n']:>5} {mine['acc']:>7.4f} {theirs['acc']:>7.4f} "
                f"{theirs['acc'] - mine['acc']:>+7.4f} {mine['acc_norm']:>7.4f} {theirs['acc_norm']:>7.4f} "
                f"{theirs['acc_norm'] - mine['acc_norm']:>+7.4f}")

    lines += [row(s, "subjects") for s in result["subjects"]]
    lines += [row(s, "own") for s in result["own"]]
    if result["categories"]:
        lines.append("-" * len(header))
        lines += [row(c, "categories") for c in result["categories"]]
    lines.append("-" * len(header))
    lines.append(row("overall", "overall"))
    if other and result["chat"] != other["chat"]:
        lines.append(f"{'':<40} Δ: checkpoint and prompt format changed together")
    return "\n".join(lines)
