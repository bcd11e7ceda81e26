"""What of a server's configuration shapes its KV bytes, read once.

The disk tier's namespace (namespace.py) must change whenever the KV a
server computes for the same tokens could change. The engine-core process,
where the namespace is made, sees only vLLM's OffloadingConfig (a model
name, a dtype, the layout); the rest lives in the API server's VllmConfig.
So the API server reads it here, once, while the platform checks the flags,
and passes the result to the engine in the plugin's settings plan
(plugin/settings_plan.py) as :class:`NamespaceInputs`:

- the model as vLLM loads it: name or path, ``--revision``,
  ``--download-dir`` (another snapshot is other weights);
- ``--dtype``, ``--kv-cache-dtype``, ``--quantization`` (and its config),
  ``--hf-overrides`` (rope scaling and the like change every position's KV),
  ``--hf-config-path``, ``--code-revision``, ``--model-impl``,
  ``--config-format``, ``--load-format``;
- with ``--trust-remote-code``, a digest of the model directory's Python
  files (the model's own code computes the KV);
- the vLLM version (its kernels compute the KV).

Refused with a disk tier, each in one line with the fix, because their KV
would be filed under keys that do not say what computed it:
``--load-format dummy`` (random weights), LoRA adapters (vLLM keys them by
name only, and a name can be re-bound to other weights across restarts),
and multimodal models (inputs can be keyed by a user-given UUID alone).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_uma.plugin import vllm_contract
from vllm_uma.plugin.vllm_contract.entries_core import NAMESPACE_MODEL_FIELDS

# vLLM internals used here, checked now: a changed one fails this import in
# one line (plugin/vllm_contract/), not a request later.
vllm_contract.require(__name__)


@dataclass(frozen=True)
class NamespaceInputs:
    """The inputs, frozen as their canonical JSON text (their values nest:
    a tuple of items would still hold mutable dicts)."""

    text: str

    @classmethod
    def of(cls, values: dict[str, Any]) -> "NamespaceInputs":
        return cls(json.dumps(values, sort_keys=True))

    def values(self) -> dict[str, Any]:
        """A fresh dict each call: the reader may keep or change it."""
        return json.loads(self.text)


class NamespaceInputsError(ValueError):
    """A configuration whose KV the disk tier cannot file safely."""


def namespace_inputs(vllm_config) -> dict[str, Any]:
    """The KV-shaping settings of ``vllm_config``, JSON-ready; raises
    NamespaceInputsError for what a disk tier cannot serve."""
    model = vllm_config.model_config
    load = vllm_config.load_config
    _refuse_unkeyable(vllm_config)
    from vllm_uma.plugin.vllm_version import installed_vllm_version

    inputs: dict[str, Any] = {
        "model": model.model,
        "revision": model.revision,
        "download_dir": load.download_dir,
        "dtype": str(model.dtype),
        "kv_cache_dtype": str(vllm_config.cache_config.cache_dtype),
        "quantization": model.quantization,
        "hf_overrides": _plain(model.hf_overrides),
        "load_format": str(load.load_format),
        "vllm": installed_vllm_version(),
    }
    # Each can change the weights or the code that computes the KV; the
    # contract lists them and checks they are ModelConfig fields. Read
    # defensively: a field that is absent is simply not part of the namespace.
    for name in NAMESPACE_MODEL_FIELDS:
        inputs[name] = _plain(getattr(model, name, None))
    if model.trust_remote_code:
        inputs["remote_code_sha256"] = remote_code_digest(Path(model.model))
    return inputs


def _refuse_unkeyable(vllm_config) -> None:
    model, load = vllm_config.model_config, vllm_config.load_config
    if str(load.load_format) == "dummy":
        raise NamespaceInputsError(
            "--load-format dummy gives random weights, whose KV must never be stored "
            "for other servers: remove 'secondary_tiers' (the disk tier) or load real weights."
        )
    if vllm_config.lora_config is not None:
        raise NamespaceInputsError(
            "LoRA adapters cannot be used with the disk tier: vLLM keys their KV by "
            "adapter name only, and a name may mean other weights after a restart. "
            "Remove --enable-lora or 'secondary_tiers'."
        )
    if model.is_multimodal_model:
        raise NamespaceInputsError(
            f"{model.model!r} is a multimodal model: its inputs may be keyed by a "
            f"user-given id instead of their content, so the disk tier cannot tell "
            f"them apart across restarts. Remove 'secondary_tiers' for this model."
        )


def _plain(value: Any) -> Any:
    """A JSON-ready form; a callable hf_overrides is named by its qualname
    (its effect cannot be read, so its identity stands for it)."""
    if callable(value):
        return f"callable:{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}"
    return json.loads(json.dumps(value, sort_keys=True, default=repr))


def remote_code_digest(model_dir: Path) -> str | None:
    """sha256 over the model directory's ``*.py`` files (names and bytes);
    None when the model is not a local directory."""
    if not model_dir.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(model_dir.rglob("*.py")):
        digest.update(f"{path.relative_to(model_dir)}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()
