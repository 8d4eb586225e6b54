"""Per-step metrics: one JSON object per optimizer step in metrics.jsonl, and the same
scalars as TensorBoard events."""
from __future__ import annotations

import json
from pathlib import Path

from ..common.atomic import replace_file


class MetricLogger:
    def __init__(self, run_dir: Path, resume_step: int = 0):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.discarded = 0  # steps after the resumed checkpoint that a killed run had logged
        if resume_step:
            self._truncate_after(resume_step)
        elif self.path.exists():
            self.path.unlink()
        from tensorboardX import SummaryWriter  # imported here: tensorboardX, only on the rank that logs

        # purge_step hides events a killed run wrote after the checkpoint we resume from.
        self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=resume_step + 1)
        self.file = open(self.path, "a", encoding="utf-8")

    def _truncate_after(self, step: int) -> None:
        """Drop records of steps after `step` (a killed run may have logged past its last
        checkpoint); those steps are about to be trained again."""
        if not self.path.exists():
            return
        lines = [line for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]
        kept = [line for line in lines if json.loads(line).get("step", 0) <= step]
        self.discarded = len(lines) - len(kept)
        replace_file(self.path, lambda tmp: tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8"))

    def log(self, record: dict) -> None:
        self.file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.file.flush()
        step = record["step"]
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"train/{key}" if not key.startswith("eval") else key, value, step)

    def close(self) -> None:
        self.file.close()
        self.writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
