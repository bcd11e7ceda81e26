"""How a 4-bit build (int4.py) is checked before it is published.

1. transformers, in bfloat16, with the weights this directory's GPTQ
   tensors stand for (gptq_rtn.dequantize: the packing read back, the
   scales in bfloat16 as vLLM casts them), answers the recipe's Int4Check
   question greedily; the answer must start as recorded. This reads only
   the published files, so a wrong packing or a model that 4 bits broke
   fails here, on any CPU.
2. A real ``vllm-uma serve --dtype bfloat16 --enforce-eager`` of the
   directory answers the same question through /v1/chat/completions; the
   answer must start the same way. That runs vLLM's loader and its int4
   kernel, which exists on AVX-512 CPUs alone; on any other x86 CPU the
   server would refuse the model (preflight_int4.py), so the step is
   skipped and the progress says why.

Not token for token against transformers (chat_check.py does that in
float32 for the unquantized builds): vLLM computes 4-bit weights in
bfloat16 only, where kernels' rounding may change a near-tie, so each
recipe's Int4Check judges only the answer's start, whose narrowest margin
it records.
"""

from __future__ import annotations

from pathlib import Path

from vllm_uma.models.recipe import Int4Check, PrepareError, Progress
from vllm_uma.plugin import cpu_features

SERVE_ARGS = ("--dtype", "bfloat16", "--enforce-eager")


def dequantized_state(directory: Path, dtype) -> dict:
    """The directory's tensors, each GPTQ layer's four as one ``.weight``."""
    from safetensors.torch import load_file

    from vllm_uma.models import gptq_rtn

    raw: dict = {}
    for path in sorted(directory.glob("*.safetensors")):
        raw.update(load_file(path))
    state = {}
    for name, tensor in raw.items():
        stem, _, part = name.rpartition(".")
        if part == "qweight":
            state[f"{stem}.weight"] = gptq_rtn.dequantize(gptq_rtn.Packed.of(raw, stem), dtype)
        elif part not in gptq_rtn.PARTS:
            state[name] = tensor.to(dtype)
    return state


def load_model(directory: Path):
    """The build as a transformers model in bfloat16, from its own files."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    config = AutoConfig.from_pretrained(directory)
    del config.quantization_config  # transformers would ask for a GPTQ library
    # Every weight is loaded next: a random init would cost a minute at 1.5B.
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    missing, unexpected = model.load_state_dict(
        dequantized_state(directory, torch.bfloat16), strict=False
    )
    model.tie_weights()
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise PrepareError(
            f"the 4-bit build's tensors do not fit its model: missing "
            f"{sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}. "
            f"Nothing was published."
        )
    return model


def in_transformers(check: Int4Check, directory: Path, progress: Progress) -> str:
    from transformers import AutoTokenizer

    from vllm_uma.models.chat_check import greedy, top_two_gaps

    progress(f"checking the 4-bit build in transformers (bfloat16): {check.question!r}")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = load_model(directory)
    messages = [{"role": "user", "content": check.question}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    out = greedy(model, ids, check.tokens)
    answer = tokenizer.decode(out.sequences[0][ids.shape[1] :], skip_special_tokens=True)
    judge("transformers", check, answer)
    margin = min(top_two_gaps(out.logits))
    progress(f"transformers: {answer!r} (narrowest margin {margin:.2f} logits)")
    return answer


def judge(who: str, check: Int4Check, answer: str) -> None:
    if not answer.startswith(check.start):
        raise PrepareError(
            f"{who} answered {check.question!r} with {answer!r} from the 4-bit build, "
            f"expected it to start with {check.start!r}: round-to-nearest (or its "
            f"packing) broke the model. Nothing was published."
        )


def served(check: Int4Check, name: str, directory: Path, progress: Progress) -> None:
    cpu = cpu_features.read()
    if cpu is not None and not cpu.avx512:
        progress(
            "no served check: this CPU has no AVX-512, and vLLM CPU 0.32 has its int4 "
            "kernel (cpu_gemm_wna16) in its AVX-512 build alone, so no server here can "
            "run this model. On an AVX-512 CPU the build is also checked through "
            "vllm-uma serve."
        )
        return
    import requests

    from vllm_uma.models.served_check import ServedCheckError, serving

    progress(f"serving the 4-bit build (vllm-uma serve {' '.join(SERVE_ARGS)})")
    try:
        with serving(directory, name, SERVE_ARGS) as server:
            reply = server.chat(name, check.question, check.tokens)
    except (ServedCheckError, requests.RequestException) as exc:
        raise PrepareError(f"{exc} Nothing was published.") from None
    answer = reply["choices"][0]["message"]["content"]
    judge("the server", check, answer)
    progress(f"server: {answer!r}")
