"""Peer servers built from pinned sources, for the side-by-side benchmark
(tools/benchmark/peers.py): llama.cpp's ``llama-server`` and its GGUF converter.

    errors.py        PeerError: one line that names what failed and the fix
    pypi_sdist.py    a source package's file from a PyPI simple index, sha256 checked
    llama_cpp.py     llama-server built from the pinned sdist, cached with a stamp
    gguf_convert.py  an HF model directory as a bf16 GGUF, cached beside the model
    exec_tied.py     a command that dies with the process that started it

Everything is cached outside the repository (the cache root of
vllm_uma.models, ``$VLLM_UMA_CACHE_DIR`` first), so a second run builds
nothing. Runs in the benchmark's process (or ``python -m
tools.peers.llama_cpp`` to build ahead).
"""
