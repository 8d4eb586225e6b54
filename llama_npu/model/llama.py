"""Llama 3.2 shapes (model/architecture.py) -> MindFormers LlamaConfig -> LlamaForCausalLM.

The architecture constants (llama3 RoPE scaling, theta 500000, tied embeddings, GQA,
128,256-token vocabulary) are Llama 3.2's published config; FACTS.md records that this
configuration reproduces the exact 1B and 3B parameter counts and matches the
`transformers` reference to 7.5e-8 on the logits.
"""
from __future__ import annotations

from .architecture import LlamaShape
from .tokens import BOS_ID, EOT_ID, IGNORE_ID, PAD_ID

ROPE_SCALING = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
ROPE_THETA = 500000.0
MAX_POSITIONS = 131072
RMS_NORM_EPS = 1e-5


def fused_kernels(on_ascend: bool, device_name: str = "") -> bool:
    """Whether flash attention and the fused RmsNorm can run: on Ascend, except on the 910A
    (Atlas training series), where CANN's FlashAttentionScore is not supported (it needs
    Atlas A2/A3) and MindFormers itself turns the fused RmsNorm off
    (mindformers/version_control.py, check_rmsnorm_big_kernel_valid)."""
    return on_ascend and device_name != "910a"


def llama_config(shape: LlamaShape, seq_len: int, on_ascend: bool, compute_dtype: str = "float32",
                 param_dtype: str = "float32", device_name: str = "", **extra):
    """A MindFormers LlamaConfig for `shape` on `device_name` (recipe device.name).

    Backend switches (FACTS.md): flash attention and the fused RmsNorm need Ascend and not a
    910A (fused_kernels); without flash attention packed rows keep their block-causal mask
    through model/loss.py's additive mask. The CPU backend rejects the broadcasting BatchMatMul of
    the default rotary path, so CPU runs use the sliced rotary embedding instead.
    """
    # imported here: MindFormers loads through common/frameworks.py mute_mindformers_info, stdout captured
    from mindformers.models.llama import LlamaConfig

    fused = fused_kernels(on_ascend, device_name)

    return LlamaConfig(
        batch_size=1, seq_length=seq_len,
        hidden_size=shape.hidden_size, num_layers=shape.num_layers, num_heads=shape.num_heads,
        n_kv_heads=shape.num_kv_heads, intermediate_size=shape.intermediate_size,
        vocab_size=shape.vocab_size, rms_norm_eps=RMS_NORM_EPS,
        theta=ROPE_THETA, extend_method="LLAMA3", scaling_factor=dict(ROPE_SCALING),
        max_position_embedding=MAX_POSITIONS, tie_word_embeddings=True,
        bos_token_id=BOS_ID, eos_token_id=EOT_ID, pad_token_id=PAD_ID, ignore_token_id=IGNORE_ID,
        compute_dtype=compute_dtype, param_init_type=param_dtype,
        # MindFormers keeps norms, softmax and rotary in fp32 under mixed precision.
        layernorm_compute_type="float32", softmax_compute_type="float32", rotary_dtype="float32",
        use_flash_attention=fused, fused_rms_norm=fused, use_rope_slice=not on_ascend,
        **extra)


def build_model(config):
    from mindformers.models.llama import LlamaForCausalLM  # imported here: as in llama_config

    return LlamaForCausalLM(config)


def count_parameters(shape: LlamaShape) -> int:
    """Exact trainable parameter count, from the real model built without allocating weights."""
    from mindspore.nn.utils import no_init_parameters  # imported here: `plan` loads MindSpore only to count

    with no_init_parameters():
        net = build_model(llama_config(shape, seq_len=128, on_ascend=False))
    return sum(p.size for p in net.trainable_params())
