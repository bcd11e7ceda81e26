"""GGUF -> Hugging Face directory, the conversion every recipe shares.

transformers reads a GGUF file (config, tokenizer, quantized weights) and
dequantizes it; the result is saved as safetensors in bfloat16, which vLLM
loads like any other Hugging Face directory. Recipes add what their model
needs around it (gemma3.py: the tokenizer's <bos>).

Process: runs in the ``vllm-uma prepare-model`` process; imports torch and
transformers only when called.
"""

from __future__ import annotations

from pathlib import Path

from vllm_uma.models.recipe import Progress


def load_gguf(gguf: Path, progress: Progress, expected_seconds: int):
    """The model (bfloat16, no quantization config left) and the tokenizer
    of ``gguf``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress(f"loading and dequantizing {gguf.name} (about {expected_seconds} s)")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16
    )
    # The weights are dequantized now; a leftover GGUF quantization config
    # would make vLLM look for GGUF files in the saved directory.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    return model, tokenizer


def save(model, tokenizer, out_dir: Path, progress: Progress) -> None:
    progress(f"writing bfloat16 safetensors to {out_dir}")
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
