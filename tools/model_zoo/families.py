"""The architectures of the models people serve, as their publishers configure them.

Each family has its published ``config.json`` fields for one real model
(``real``), and a *scaled-down* configuration of the same architecture for
fast end-to-end tests: two layers, a small hidden size, but the same
head_dim, the same ratio of query heads to KV heads and the same per-family
features (Qwen3's q/k norms, Qwen2's qkv bias, Llama 3's rope scaling,
Phi-3's fused projections and sliding window, Qwen3-MoE's experts). Every
build uses SmolLM2's tokenizer (the one we have: no model hub here), so
``vocab_size`` is set to its 49,152 tokens in both sizes; that changes the
embedding and the last projection, not the attention or the KV bytes.

The values were copied from the publishers' config.json files (Hugging Face
model cards of Qwen/Qwen3-0.6B, Qwen/Qwen3-30B-A3B, Qwen/Qwen2.5-1.5B,
meta-llama/Llama-3.2-1B, mistralai/Mistral-7B-v0.3,
microsoft/Phi-3-mini-4k-instruct), fields that do not shape the
computation (ids of special tokens, dtype) left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# K and V of every layer for one token, from config.json's fields.
from tools.benchmark.lib.geometry import kv_bytes_per_token_of as kv_bytes_per_token  # noqa: F401

TOKENIZER_VOCAB = 49_152  # SmolLM2's tokenizer
SCALED_LAYERS = 2


@dataclass(frozen=True)
class Family:
    name: str  # the family, as docs/models.md lists it
    model_type: str  # transformers' and vLLM's name of the architecture
    real_name: str  # the published model whose configuration ``real`` is
    real: dict  # its config.json fields that shape the computation
    scaled: dict  # overrides of ``real`` for the scaled-down build
    # The real configuration's weights fit this machine (2 cores, 24 GiB),
    # with a float32 reference beside them: a benchmark can build it.
    real_fits: bool = True
    notes: tuple[str, ...] = field(default_factory=tuple)

    def config(self, size: str) -> dict:
        """The config.json fields of the ``"real"`` or ``"scaled"`` build."""
        if size not in ("real", "scaled"):
            raise ValueError(f"size {size!r}: 'real' or 'scaled'")
        fields = {**self.real, "vocab_size": TOKENIZER_VOCAB, "model_type": self.model_type}
        if size == "scaled":
            fields.update(self.scaled, num_hidden_layers=SCALED_LAYERS)
        return fields


QWEN3 = Family(
    name="Qwen3",
    model_type="qwen3",
    real_name="Qwen3-0.6B",
    real=dict(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        hidden_act="silu",
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000,
        attention_bias=False,
        tie_word_embeddings=True,
        use_sliding_window=False,
    ),
    # 4 query heads on 2 KV heads: Qwen3's 2:1, head_dim 128 kept.
    scaled=dict(hidden_size=512, intermediate_size=1024, num_attention_heads=4,
                num_key_value_heads=2),
    notes=("q and k RMS norms per head", "head_dim 128 independent of the hidden size"),
)  # fmt: skip

QWEN2_5 = Family(
    name="Qwen2.5",
    model_type="qwen2",
    real_name="Qwen2.5-1.5B",
    real=dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        hidden_act="silu",
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000,
        tie_word_embeddings=True,
        use_sliding_window=False,
    ),
    # 6:1 as published, head_dim 128 (768 / 6).
    scaled=dict(hidden_size=768, intermediate_size=1024, num_attention_heads=6,
                num_key_value_heads=1),
    notes=("bias on the q, k and v projections",),
)  # fmt: skip

LLAMA3 = Family(
    name="Llama 3",
    model_type="llama",
    real_name="Llama-3.2-1B",
    real=dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        hidden_act="silu",
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=500_000.0,
        rope_scaling=dict(
            rope_type="llama3",
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=True,
    ),
    # 4:1 as published, head_dim 64.
    scaled=dict(hidden_size=512, intermediate_size=1024, num_attention_heads=8,
                num_key_value_heads=2),
    notes=("llama3 rope scaling",),
)  # fmt: skip

MISTRAL = Family(
    name="Mistral",
    model_type="mistral",
    real_name="Mistral-7B-v0.3",
    real=dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        hidden_act="silu",
        max_position_embeddings=32768,
        rms_norm_eps=1e-5,
        rope_theta=1_000_000.0,
        sliding_window=None,
        tie_word_embeddings=False,
    ),
    # 4:1 as published, head_dim 128.
    scaled=dict(hidden_size=512, intermediate_size=1024, num_attention_heads=4,
                num_key_value_heads=1),
    real_fits=False,  # 7.2 B parameters: 29 GB in float32
)  # fmt: skip

PHI3 = Family(
    name="Phi-3",
    model_type="phi3",
    real_name="Phi-3-mini-4k-instruct",
    real=dict(
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        hidden_act="silu",
        max_position_embeddings=4096,
        original_max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        rope_scaling=None,
        sliding_window=2047,
        tie_word_embeddings=False,
    ),
    # No grouped-query attention, as published; head_dim 96 (384 / 4).
    scaled=dict(hidden_size=384, intermediate_size=1024, num_attention_heads=4,
                num_key_value_heads=4),
    real_fits=False,  # 3.8 B parameters: 15 GB in float32, beside its reference
    notes=("fused qkv and gate/up projections", "sliding window of 2047 tokens"),
)  # fmt: skip

QWEN3_MOE = Family(
    name="Qwen3-MoE",
    model_type="qwen3_moe",
    real_name="Qwen3-30B-A3B",
    real=dict(
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        hidden_act="silu",
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        num_experts=128,
        num_experts_per_tok=8,
        decoder_sparse_step=1,
        norm_topk_prob=True,
        mlp_only_layers=[],
        attention_bias=False,
        tie_word_embeddings=False,
        use_sliding_window=False,
    ),
    # 8:1 as published, head_dim 128; 8 experts, 2 per token.
    scaled=dict(hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
                num_attention_heads=8, num_key_value_heads=1, num_experts=8,
                num_experts_per_tok=2),
    real_fits=False,  # 30 B parameters
    notes=("a mixture of experts in every layer", "q and k RMS norms per head"),
)  # fmt: skip

FAMILIES = {f.model_type: f for f in (QWEN3, QWEN2_5, LLAMA3, MISTRAL, PHI3, QWEN3_MOE)}


def build_name(family: Family, size: str) -> str:
    """The directory and served name of a build: ``zoo-qwen3-scaled``."""
    return f"zoo-{family.model_type.replace('_', '-')}-{size}"


def parse_build_name(name: str) -> tuple[Family, str]:
    for family in FAMILIES.values():
        for size in ("scaled", "real"):
            if build_name(family, size) == name:
                return family, size
    known = ", ".join(build_name(f, s) for f in FAMILIES.values() for s in ("scaled", "real"))
    raise ValueError(f"no model zoo build is called {name!r}; the builds: {known}")
