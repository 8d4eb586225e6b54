"""Write a tiny random Llama 3.2 as a Hugging Face directory, to try `convert`, `eval`
(`--task`, `--compare`) and `generate` without downloading a model. The test suite builds its
model with this same function (tests/conftest.py, `hf_dir`).

    .venv/bin/python scripts/make_tiny_hf_model.py weights/tiny-llama3.2

It has Llama 3.2's layout at toy size: llama3 RoPE scaling, grouped-query attention (4 query
heads over 2 key/value heads), tied embeddings, the full 128,256-token vocabulary and the
Llama 3 tokenizer (tokenizer.json, as a real download has), 2 layers of hidden size 64:
about 8 M parameters, 33 MB in float32. Its weights are random (seeded), so what it scores
or generates means nothing; `model.preset: tiny` is its shape in a recipe. Needs the test
extra's torch and transformers (scripts/setup_env.sh installs them).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from llama_npu.data.tokenizer import default_tokenizer_path  # noqa: E402


def make_tiny_hf_model(path: Path, seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 4,
                       kv_heads: int = 2, intermediate: int = 128):
    """Save the model and its tokenizer under `path`; return the transformers model (eval mode).
    The sizes default to the tiny shape; benchmarks/exam_throughput.py asks for a larger one."""
    import torch  # imported here: only this script and the tests' reference need torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=128256, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192}, tie_word_embeddings=True,
        bos_token_id=128000, eos_token_id=128009)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # make the norms non-trivial so a misplaced norm weight shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    (Path(path) / "tokenizer.json").write_bytes(default_tokenizer_path().read_bytes())
    return model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="the directory to write (must not exist)")
    parser.add_argument("--seed", type=int, default=0, help="the random weights' seed (default 0, as the tests)")
    args = parser.parse_args(argv)
    if args.output.exists():
        print(f"{args.output}: exists; choose a new directory", file=sys.stderr)
        return 2
    make_tiny_hf_model(args.output, args.seed)
    print(f"wrote {args.output} (a tiny random Llama 3.2 in Hugging Face format)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
