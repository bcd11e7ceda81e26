"""One decode step's linear layers, timed kernel by kernel: bf16, vLLM CPU's int4, torch's int4.

    .venv/bin/python -m tools.benchmark.int4_kernel [--model Qwen2.5-Coder-1.5B-Instruct]
        [--rows 1,4] [--repeats 50] [--out bench-out/int4_kernel.json]

Issue 43 asks for decode at llama.cpp's speed with 4-bit weights, or, where
vLLM CPU's int4 path cannot get there, what shows why and what it would
take. A decode step of one request multiplies one row of activations by
every weight matrix once: memory-bound, so 4-bit weights (a quarter of
bf16's bytes) should make it up to 4x faster, as llama.cpp's Q4_K_M is.
This times, in this process, with the server's thread count (one OpenMP
thread a core, as vLLM CPU binds them), each linear layer of the model's
step (from its config.json; vLLM fuses q/k/v and gate/up as it serves
them) through:

- ``bf16``: the bf16 build's linear as vLLM CPU computes it: the layer
  given to vLLM's own ``dispatch_cpu_unquantized_gemm``, which picks its
  kernel by shape (oneDNN's matmul on a prepacked weight, or its small-GEMM
  kernel), then called as vLLM calls it;
- ``vllm int4``: ``torch.ops._C.cpu_gemm_wna16``, the op vLLM's
  CPUWNA16LinearKernel calls for a GPTQ layer (w4a16, ``isa_hint`` as vLLM
  picks it), on a weight of the shape vLLM repacks to; what 4-bit builds
  ran on before plugin/int4_linear.py;
- ``torch int4``: ``aten._weight_int4pack_mm_for_cpu``, PyTorch's own CPU
  int4 matmul (the one gpt-fast and torchao use), on the same shapes and
  group size: what our TorchInt4LinearKernel (plugin/int4_linear.py) calls.

Weights are random (timing does not depend on values). A step reads each
weight once from memory, so each kernel cycles through copies of its
weight worth 512 MiB (copies_for): a small layer timed on one copy would
be timed from the cache. Each figure is the median of ``--repeats`` calls
after a warm-up; the step's sum is the layer
times the layer count plus the lm_head (bf16 in our 4-bit builds). The
floor is the step's weight bytes over this machine's read bandwidth
(a large tensor summed with the same threads): what a kernel bound only by
memory would take.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GROUP = 128  # the group size of our 4-bit builds (models/gptq_rtn.py picks 128 where it divides)
# Each kernel cycles through copies of its weight worth this many bytes,
# well past any L3 here (tens of MB), at most MAX_COPIES of them.
ROTATION_BYTES = 512 * 2**20
MAX_COPIES = 64


def layer_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear of one decoder layer as vLLM fuses them."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or hidden // heads
    inter = config["intermediate_size"]
    return {
        "qkv_proj": (hidden, (heads + 2 * kv_heads) * head_dim),
        "o_proj": (heads * head_dim, hidden),
        "gate_up_proj": (hidden, 2 * inter),
        "down_proj": (inter, hidden),
    }


def step_bytes(config: dict, int4: bool) -> int:
    """Weight bytes one decode step reads: the layers' linears (4 bits and a
    bf16 scale per group, or bf16) and the bf16 lm_head."""
    per_layer = 0
    for k, n in layer_shapes(config).values():
        per_layer += k * n // 2 + (k // GROUP) * n * 2 if int4 else k * n * 2
    lm_head = config["hidden_size"] * config["vocab_size"] * 2
    return per_layer * config["num_hidden_layers"] + lm_head


def median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def read_bandwidth_gb_s(torch, gib: float = 1.0) -> float:
    """GB/s summing a tensor far larger than the caches, with this process's threads."""
    big = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32)
    ms = median_ms(lambda: big.sum(), 5)
    return big.numel() * 4 / (ms / 1000) / 1e9


def copies_for(weight_bytes: int) -> int:
    """How many copies of a weight to cycle through so that one pass reads
    more than any CPU cache holds: a decode step reads each weight once,
    from memory, and a layer timed on one copy would be timed from cache."""
    return max(1, min(MAX_COPIES, -(-ROTATION_BYTES // weight_bytes)))


def _cycling(calls: list):
    """One call a time, each to the next copy in turn."""
    state = {"i": 0}

    def call():
        state["i"] = (state["i"] + 1) % len(calls)
        return calls[state["i"]]()

    return call


def dense_linear(torch, k: int, n: int, rows: int):
    """x[rows, k] @ W[k, n] in bf16 as vLLM CPU computes an unquantized linear."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    x = torch.randn(rows, k, dtype=torch.bfloat16)
    calls = []
    for _ in range(copies_for(k * n * 2)):
        dense = torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16)
        dense.weight.requires_grad_(False)
        dispatch_cpu_unquantized_gemm(dense, remove_weight=False)
        calls.append(lambda d=dense: d.cpu_linear(x, d.weight, None))
    return _cycling(calls)


def vllm_int4(torch, ops, k: int, n: int, rows: int):
    """The same through vLLM CPU's int4 op, on weights of the shape its
    CPUWNA16LinearKernel repacks GPTQ's to (16 output channels a block, 8
    nibbles an int32, blocks contiguous over k)."""
    x = torch.randn(rows, k, dtype=torch.bfloat16)
    isa = "amx" if torch.cpu._is_amx_tile_supported() else "vec"
    calls = []
    for _ in range(copies_for(k * n // 2)):
        q_weight = torch.randint(-(2**31), 2**31 - 1, (n // 16, k * 2), dtype=torch.int32)
        scales = torch.rand(k // GROUP, n, dtype=torch.bfloat16)
        calls.append(lambda q=q_weight, s=scales: ops.cpu_gemm_wna16(x, q, s, None, None, 8, isa))
    return _cycling(calls)


def torch_int4(torch, k: int, n: int, rows: int):
    """The same through PyTorch's CPU int4 matmul, as our kernel calls it."""
    x = torch.randn(rows, k, dtype=torch.bfloat16)
    calls = []
    for _ in range(copies_for(k * n // 2)):
        codes = torch.randint(0, 16, (n, k), dtype=torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        scale_zeros = torch.rand(k // GROUP, n, 2, dtype=torch.bfloat16)
        calls.append(
            lambda p=packed, sz=scale_zeros: torch.ops.aten._weight_int4pack_mm_for_cpu(
                x, p, GROUP, sz
            )
        )
    return _cycling(calls)


def kernels(torch, ops, k: int, n: int, rows: int) -> dict:
    """The three ways to compute x[rows, k] @ W[k, n], ready to call."""
    return {
        "bf16": dense_linear(torch, k, n, rows),
        "vllm int4": vllm_int4(torch, ops, k, n, rows),
        "torch int4": torch_int4(torch, k, n, rows),
    }


def measure(config: dict, rows_list: list[int], repeats: int, threads: int) -> dict:
    import torch
    from vllm import _custom_ops as ops

    torch.set_num_threads(threads)
    layers = config["num_hidden_layers"]
    out: dict = {"threads": threads, "read_gb_s": round(read_bandwidth_gb_s(torch), 1)}
    for rows in rows_list:
        table = {}
        for name, (k, n) in layer_shapes(config).items():
            table[name] = {
                kind: round(median_ms(fn, repeats), 4)
                for kind, fn in kernels(torch, ops, k, n, rows).items()
            }
        lm_ms = median_ms(
            dense_linear(torch, config["hidden_size"], config["vocab_size"], rows),
            max(5, repeats // 5),
        )
        step = {
            kind: round(layers * sum(t[kind] for t in table.values()) + lm_ms, 2)
            for kind in ("bf16", "vllm int4", "torch int4")
        }
        out[f"rows={rows}"] = {"layers_ms": table, "lm_head_ms": round(lm_ms, 3), "step_ms": step}
    gb = out["read_gb_s"]
    out["floor_ms"] = {
        "bf16": round(step_bytes(config, False) / gb / 1e6, 2),
        "int4": round(step_bytes(config, True) / gb / 1e6, 2),
    }
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Qwen2.5-Coder-1.5B-Instruct", help="a recipe or directory")
    ap.add_argument("--rows", default="1,4", help="activation rows (requests decoding at once)")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--threads", type=int, default=None, help="default: this process's cores")
    ap.add_argument("--out", type=Path, default=REPO / "bench-out" / "int4_kernel.json")
    args = ap.parse_args(argv)
    try:
        args.rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        ap.error(f"--rows {args.rows!r}: give whole numbers, comma-separated")
    if min(args.rows) < 1 or args.repeats < 1:
        ap.error(f"--rows {args.rows}, --repeats {args.repeats}: give numbers >= 1")
    return args


def main(argv=None) -> int:
    import os

    from tools.benchmark.lib import model_choice
    from tools.benchmark.lib.environment import environment
    from tools.benchmark.lib.report import write_json

    args = parse_args(argv)
    config = json.loads((model_choice.choose(args.model).directory / "config.json").read_text())
    threads = args.threads or len(os.sched_getaffinity(0))
    result = {"environment": environment(args), **measure(config, args.rows, args.repeats, threads)}
    write_json(args.out, result)
    print(f"{args.model}: one decode step's linears, {threads} threads, "
          f"read bandwidth {result['read_gb_s']} GB/s")  # fmt: skip
    for rows in args.rows:
        r = result[f"rows={rows}"]
        print(f"rows={rows}: " + ", ".join(f"{k} {v} ms" for k, v in r["step_ms"].items()))
        for name, t in r["layers_ms"].items():
            print(f"  {name:13s} " + ", ".join(f"{k} {v:.3f}" for k, v in t.items()))
    floor = result["floor_ms"]
    print(f"memory floor of a step: bf16 {floor['bf16']} ms, int4 {floor['int4']} ms")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
