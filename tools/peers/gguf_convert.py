"""A Hugging Face model directory as a bf16 or f32 GGUF for llama.cpp, cached beside the model.

The converter is the one the pinned sdist ships (``llama.cpp/convert_hf_to_gguf.py``),
run in this Python with ``PYTHONPATH=llama.cpp/gguf-py``, so that it reads
GGUF with the ``gguf`` package of its own release, not the venv's (the
project depends on gguf 0.19 for prepare-model; the converter of b11434
expects its own tree's). Its other imports (torch, numpy, safetensors,
transformers, sentencepiece, pyyaml, tqdm) are the venv's.

On disk, beside the model directory ``<parent>/<name>/``::

    <parent>/<name>.<type>.gguf        the GGUF (type: bf16 or f32)
    <parent>/<name>.<type>.gguf.json   its record, written last

The record is the key: the model directory (resolved), the newest mtime
of the files in it, the converter's build and the output type. A GGUF is
reused only when its record equals the one expected now, so a model
rebuilt in place (prepare-model, a zoo build: new mtimes) converts again.
The converter writes to a temp file beside the GGUF, renamed into place
when it succeeded: a failed conversion leaves no GGUF to be taken.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.peers.errors import PeerError

# The converter's --outtype for each precision the benchmark serves in.
OUTTYPES = {"bfloat16": "bf16", "float32": "f32"}


def gguf_path(model_dir: Path, outtype: str = "bf16") -> Path:
    model_dir = model_dir.resolve()
    return model_dir.parent / f"{model_dir.name}.{outtype}.gguf"


def record_path(gguf: Path) -> Path:
    return gguf.with_name(gguf.name + ".json")


def expected_record(model_dir: Path, converter_build: str, outtype: str = "bf16") -> dict:
    """The key of ``model_dir``'s GGUF: where the model is, when it last
    changed (the newest mtime of its top-level files, nanoseconds), and
    what converted it."""
    model_dir = model_dir.resolve()
    mtimes = [p.stat().st_mtime_ns for p in model_dir.iterdir() if p.is_file()]
    return {
        "model_dir": str(model_dir),
        "model_mtime_ns": max(mtimes, default=0),
        "converter": converter_build,
        "outtype": outtype,
    }


def is_converted(gguf: Path, record: dict) -> bool:
    try:
        return json.loads(record_path(gguf).read_text()) == record and gguf.is_file()
    except (OSError, ValueError):
        return False


def ensure_gguf(
    model_dir: Path,
    llama_cpp_dir: Path,
    converter_build: str,
    log_dir: Path,
    say=print,
    outtype: str = "bf16",
) -> Path:
    """``model_dir`` as a GGUF of ``outtype`` (bf16, f32): reused if its
    record matches, else converted with ``llama_cpp_dir``'s converter (its
    output in ``log_dir``)."""
    gguf = gguf_path(model_dir, outtype)
    record = expected_record(model_dir, converter_build, outtype)
    if is_converted(gguf, record):
        return gguf
    if not os.access(gguf.parent, os.W_OK):
        raise PeerError(
            f"cannot write the GGUF of {model_dir} beside it: {gguf.parent} is not writable; "
            f"make it writable, or pass --gguf FILE (a GGUF of the same weights)"
        )
    say(f"converting {model_dir} to a {outtype} GGUF with llama.cpp {converter_build}'s converter")
    record_path(gguf).unlink(missing_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"convert-{model_dir.resolve().name}.{outtype}.log"
    fd, tmp_name = tempfile.mkstemp(prefix=f".{gguf.name}.", suffix=".partial", dir=gguf.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        _convert(model_dir, tmp, llama_cpp_dir, log, outtype)
        tmp.replace(gguf)
    finally:
        tmp.unlink(missing_ok=True)
    record_path(gguf).write_text(json.dumps(record, indent=2) + "\n")
    return gguf


def converter_command(
    model_dir: Path, out: Path, llama_cpp_dir: Path, outtype: str = "bf16"
) -> list[str]:
    return [
        sys.executable,
        str(llama_cpp_dir / "convert_hf_to_gguf.py"),
        str(model_dir),
        "--outtype",
        outtype,
        "--outfile",
        str(out),
    ]


def _convert(model_dir: Path, out: Path, llama_cpp_dir: Path, log: Path, outtype: str) -> None:
    script = llama_cpp_dir / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise PeerError(
            f"no converter at {script}: the llama.cpp tree is incomplete; delete "
            f"{llama_cpp_dir.parents[2]} and run again to unpack it anew"
        )
    env = {**os.environ, "PYTHONPATH": str(llama_cpp_dir / "gguf-py")}
    with log.open("w") as f:
        done = subprocess.run(
            converter_command(model_dir, out, llama_cpp_dir, outtype),
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=llama_cpp_dir,
            check=False,
        )
    if done.returncode != 0:
        raise PeerError(
            f"converting {model_dir} to GGUF failed (exit {done.returncode}): {_cause(log)}; "
            f"the converter's output is in {log}. It runs in {sys.executable} and needs torch, "
            f"numpy, safetensors, transformers, sentencepiece, pyyaml and tqdm there: run "
            f"`make install`, or pass --gguf FILE"
        )


def _cause(log: Path) -> str:
    """The converter's last exception line, else its last line."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line.split(":")[0]]
    return (errors or lines or ["(no output)"])[-1]
