"""The fuzz suite (#41): every input kind of tests/fuzz_inputs.py, malformed in every way its
generator knows, gets a clean refusal (the project's own error, one line, nothing on disk
changed) or a correct acceptance (a valid record trains into the same tokens whatever its
container, encoding, column map or unused keys). In-process, below the CLI, with a fixed
seed so CI draws the same cases every run; scripts/fuzz.py runs thousands more.

Cost: about 40 s in all on one core (the records kind, which writes Parquet and workbooks and
tokenizes, is most of it).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from fuzz_inputs import KINDS, attempt

# Cases a kind in CI; scripts/fuzz.py --cases N for a long run.
CI_CASES = {"recipes": 150, "set": 150, "records": 150, "exams": 100, "hf": 60, "checkpoints": 60, "flags": 150}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_malformed_input_is_refused_cleanly_or_accepted(kind):
    @settings(max_examples=CI_CASES.get(kind, 100), deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(KINDS[kind].cases())
    def one(case):
        with tempfile.TemporaryDirectory() as work:
            assert attempt(kind, case, Path(work)) in ("accepted", "refused")

    one()


def test_the_readers_kind_runs_a_reader_on_damaged_steps_and_counts_no_defect(six_step_run, tmp_path):
    """scripts/fuzz.py --kind readers (#59), at its smallest: two damaged copies of the shared
    run, ms-to-hf (the reader without MindSpore) in its own limited process on each."""
    import subprocess
    import sys

    from conftest import REPO

    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "fuzz.py"), "--kind", "readers", "--cases", "2",
                           "--reader", "convert", "--run", str(six_step_run[0])],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    row = proc.stdout.strip().splitlines()[-1].split()
    assert row[0] == "convert" and row[1] == "2" and int(row[2]) + int(row[3]) + int(row[4]) == 2, proc.stdout
    assert proc.stderr.count("case ") == 2 and "given the " in proc.stderr
