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
