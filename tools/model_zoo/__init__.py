"""The model zoo: checkpoints of the architectures people serve, with synthetic weights.

- ``families.py``: each family's published configuration and its
  scaled-down sibling (same head_dim, KV-head ratio and features, two
  layers);
- ``build.py``: a build from a fixed seed into the cache, SmolLM2's
  tokenizer beside it;
- ``__main__.py``: ``python -m tools.model_zoo build|list``.

For tests and benchmarks, not users: the text is meaningless (build.py says
why this is not a ``vllm-uma prepare-model`` recipe). docs/models.md lists
what each family was checked for.
"""
