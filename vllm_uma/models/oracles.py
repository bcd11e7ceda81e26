"""What "the same output" means, judged so that rounding luck cannot decide it.

Greedy decoding picks the larger of two logits. When two candidates are
within a few rounding steps of each other (a near-tie), any change in the
order of a floating-point sum can flip the choice: another kernel path
(oneDNN's AVX-512 or AMX code, vLLM's attention ISA), another chunk shape
(a cold prefill computes a prompt's last tokens in one chunk with the rest,
a prefix-cache hit or a restore computes them alone), or another library.
So each comparison is made where it is fair:

- float32, same server: tokens must be identical, whatever computed the
  prefix (cold, L1 hit, host-pool or disk restore). The default model is
  upcast exactly, and float32 has 2^16 times bfloat16's precision, so a
  kernel's summation order no longer reaches the argmax.
- bfloat16, same server: a restored prefix is compared with an L1 hit of the
  same prompt, made before the prefix left L1: the same prefix/tail split
  and the same KV bytes (the restore copies them), so any difference is a
  restore that changed bytes. Never with a cold run.
- against transformers: exact in float32; in bfloat16 tokens must agree
  until the reference's own top two candidates are within ``tolerance``
  logits of each other (a near-tie), after which the runs are not
  comparable.

Each comparison returns a :class:`Verdict` whose ``detail`` says where and
by how much two runs parted, so a failing test explains itself.

Runs in the calling process (prepare-model's served check, tests, tools).
The transformers reference they compare against is harness code:
tools/harness/reference.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# A near-tie for bfloat16 at the logit magnitudes of small models (~20-30):
# one bfloat16 step there is 0.125, and kernels differ by a few steps.
BF16_NEAR_TIE = 0.5


@dataclass(frozen=True)
class Verdict:
    agree: bool
    detail: str

    def __bool__(self) -> bool:
        return self.agree


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ, counting a
    length difference; None if they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def exact(reference: Sequence[int], served: Sequence[int], what: str = "tokens") -> Verdict:
    """Token for token equality (float32, or bf16 restore vs L1 hit)."""
    i = first_difference(reference, served)
    if i is None:
        return Verdict(True, f"{what}: {len(served)} tokens identical")
    return Verdict(
        False,
        f"{what}: differ at token {i} of {len(reference)}: "
        f"reference {list(reference[i : i + 4])}, served {list(served[i : i + 4])}",
    )


def until_near_tie(
    reference: Sequence[int],
    served: Sequence[int],
    reference_logits: Sequence[Sequence[float]],
    tolerance: float = BF16_NEAR_TIE,
) -> Verdict:
    """Agreement up to the first near-tie of the reference.

    ``reference_logits[i]`` are the reference's logits for step ``i``. Where
    the served token differs, the reference's margin of its own choice over
    the served one must be within ``tolerance``; past that point the two
    runs continue from different text and are not compared.
    """
    i = first_difference(reference, served)
    if i is None:
        return Verdict(True, f"{len(served)} tokens identical")
    if i >= min(len(reference), len(served)):
        # Same tokens, then one stopped: the stop token itself was a choice.
        return Verdict(False, f"identical for {i} tokens, then one run stopped early")
    want, got = reference[i], served[i]
    gap = float(reference_logits[i][want]) - float(reference_logits[i][got])
    if gap <= tolerance:
        return Verdict(True, f"identical for {i} tokens, then a near-tie ({gap:.3f} logits)")
    return Verdict(
        False,
        f"token {i}: served {got}, reference {want}, which the reference prefers "
        f"by {gap:.3f} logits (> {tolerance}: not a near-tie)",
    )
