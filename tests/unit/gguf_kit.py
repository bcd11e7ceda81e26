"""Tiny GGUF files and fake installed parts, for the recipes' unit tests.

A GGUF is written with the gguf package (the writer llama.cpp's converters
use), so the reader sees what a real file holds; a "part" is laid out as
pip installs one of the split-GGUF wheels: ``MODULE/data/partNN.bin`` and a
``.dist-info`` with its name and version, found through importlib.metadata.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vllm_uma.models.split_gguf import SplitGGUF


def tiny_gguf(path: Path, architecture: str = "qwen2", trailing: bytes = b"") -> bytes:
    """Two float32 tensors whose data (a multiple of 32 bytes) ends the file."""
    from gguf import GGUFWriter

    writer = GGUFWriter(path, architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.arange(64, dtype=np.float32).reshape(8, 8))
    writer.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    data = path.read_bytes() + trailing
    path.write_bytes(data)
    return data


def install(site: Path, split: SplitGGUF, n: int, body: bytes, version=None) -> None:
    """Part ``n`` as pip lays out a wheel: its module's data file and dist-info."""
    module = split.pip_name(n).replace("-", "_")
    info = site / f"{module}-{version or split.version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.4\nName: {split.pip_name(n)}\nVersion: {version or split.version}\n"
    )
    data_file = site / split.data_file(n)
    data_file.parent.mkdir(parents=True)
    data_file.write_bytes(body)
