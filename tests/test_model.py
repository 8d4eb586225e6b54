"""The presets build MindFormers' Llama with the exact Llama 3.2 parameter counts."""
import pytest

from llama_npu.model.architecture import PRESETS
from llama_npu.model.llama import count_parameters


@pytest.mark.parametrize("preset, expected", [("llama3.2-1b", 1_235_814_400), ("llama3.2-3b", 3_212_749_824)])
def test_exact_parameter_counts(preset, expected):
    assert count_parameters(PRESETS[preset]) == expected
