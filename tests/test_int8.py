"""INT8 at run time (issue 30): a quantized model that stays int8 in eval/generate, and LoRA over
an int8 frozen base. The refusals first (validate only), then tiny real runs on the CPU."""
import pytest

from llama_npu.recipe.load import load_recipe
from llama_npu.recipe.problems import RecipeError

from conftest import SMOKE, run_cli


@pytest.fixture(scope="session")
def quantized(conversions, tmp_path_factory):
    """The tiny float32 conversion, quantized by `llama-npu quantize`'s own function."""
    from llama_npu.weights.quantize import quantize_checkpoint

    dst = tmp_path_factory.mktemp("int8") / "tiny-int8"
    quantize_checkpoint(conversions["float32"], dst)
    return dst


@pytest.mark.parametrize("overrides, message", [
    (["strategies.lora.base_dtype=int8"], "strategies.lora.base_dtype=int8 needs strategies.lora.enabled=true: a "
                                          "full fine-tune trains the base weights"),
    (["strategies.lora.base_dtype=fp8"], "strategies.lora.base_dtype: expected one of compute, int8, got 'fp8'"),
    (["strategies.lora.enabled=true", "strategies.lora.base_dtype=int8", "strategies.parallel.model=2"],
     "strategies.lora.base_dtype=int8 with strategies.parallel.model=2: the int8 base is not sharded"),
])
def test_int8_base_refusals(overrides, message):
    with pytest.raises(RecipeError) as caught:
        load_recipe(SMOKE, overrides)
    assert message in str(caught.value)


def test_quantized_directory_cannot_start_a_full_fine_tune(quantized, tmp_path):
    proc = run_cli("validate", SMOKE, "--set", f"model.checkpoint={quantized}", "--set", "model.preset=tiny",
                   "--output-dir", tmp_path / "run")
    assert proc.returncode == 2
    assert f"model.checkpoint={quantized} is quantized (int8, by llama-npu quantize): a full fine-tune" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    lora = run_cli("validate", SMOKE, "--set", f"model.checkpoint={quantized}", "--set", "model.preset=tiny",
                   "--set", "strategies.lora.enabled=true", "--set", "strategies.lora.base_dtype=int8",
                   "--output-dir", tmp_path / "run")
    assert lora.returncode == 0, lora.stderr
