"""What ``vllm-uma serve``'s raw command line says, read without vLLM.

vLLM's parser takes 10-40 s to import here; the preflight (preflight.py,
preflight_config.py) must refuse a wrong model path or a busy port before
that. So this reads the few flags the preflight checks, the way vLLM's
FlexibleArgumentParser (vllm/utils/argparse_utils.py) will: ``--flag VALUE``
and ``--flag=VALUE``, the last one wins, ``_`` for ``-`` in a flag's name,
``--model X`` moved to MODEL, dotted ``--flag.key VALUE`` merged into one
JSON value given after every other.

It does not know vLLM's ~500 flags, so where a flag's meaning depends on
them it decides nothing (None), and vLLM's parser decides later:
- MODEL only from ``--model`` or the first word (``--enforce-eager /m``:
  only vLLM knows --enforce-eager takes no value);
- nothing that a ``--config`` YAML file may set (its values come before
  the command line's, but its dotted keys after);
- no flag that a word could abbreviate (argparse takes ``--po 9000`` for
  ``--port 9000``);
- nothing after ``--``.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PORT = 8000  # vLLM's FrontendArgs.port
# Whole JSON values, checked for syntax (every one given: vLLM's parser
# converts each, even one a later flag replaces).
JSON_FLAGS = ("--kv-transfer-config", "--kv-events-config", "--additional-config")
VALUE_FLAGS = frozenset(
    {
        "--model",
        "--host",
        "--port",
        "--uds",
        "--config",
        "--api-server-count",
        "--kv-offloading-backend",
        "--kv-offloading-size",
        "--weight-transfer-config",
        "--dtype",
        *JSON_FLAGS,
    }
)
# With any of these the API server does not listen on --port as given
# (a Unix socket, no API server, one port per rank) or another server does.
NOT_LISTENING = ("--uds", "--headless", "--api-server-count", "--grpc",
                 "--data-parallel-multi-port-external-lb")  # fmt: skip
SWITCHES = frozenset({"--headless", "--grpc", "--data-parallel-multi-port-external-lb", "--help"})
OURS = VALUE_FLAGS | SWITCHES


@dataclass(frozen=True)
class ServeLine:
    """The preflight's view of the command line; None: not decided here."""

    model: str | None  # MODEL as named (a path, a hub id or a recipe's name)
    host: str | None  # None: every interface (vLLM's default) or not decided
    port: int | None  # the port the API server will listen on, when that is sure
    help: bool  # --help, -h or an abbreviation: nothing to check
    json_values: tuple[tuple[str, str], ...]  # (flag, text), each whole JSON value
    kv_transfer_config: str | None  # the text vLLM will use
    kv_offloading_backend: str | None
    kv_offloading_size: str | None
    decided_offloading: bool  # the three above are all vLLM will see
    # --weight-transfer-config given (whole or dotted): the weights may change
    # at run time (kv_offload/weight_updates.py); False where a --config file
    # or an abbreviation leaves it to vLLM's parser.
    weight_transfer: bool = False
    dtype: str | None = None  # --dtype as given (None: not given, vLLM's "auto")
    decided_dtype: bool = False  # dtype is what vLLM will use


def normalized(flag: str) -> str:
    """``--kv_transfer_config.a_b`` -> ``--kv-transfer-config.a_b``, as vLLM
    renames a flag: underscores before the first dot of the name. A value
    given inline (``--host=my_host``) is the user's text and kept as is."""
    word, eq, value = flag[2:].partition("=")
    name, dot, rest = word.partition(".")
    return "--" + name.replace("_", "-") + dot + rest + eq + value


@dataclass
class _Scan:
    given: dict[str, list[str | None]]  # flag -> its values in order (None: no value)
    dotted: set[str]  # flags given in dotted form
    abbreviated: set[str]  # our flags some word may abbreviate
    short: set[str]  # single-dash words


def _scan(argv: list[str]) -> _Scan:
    scan = _Scan({}, set(), set(), set())
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if not word.startswith("--"):
            if word.startswith("-"):
                scan.short.add(word)
            continue
        name, eq, inline = normalized(word).partition("=")
        if "." in name:
            scan.dotted.add(name.split(".", 1)[0])
            if not eq:
                i += 1  # vLLM takes the next word as the value, whatever it is
            continue
        if name in VALUE_FLAGS:
            value = inline if eq else _next_value(argv, i)
            if not eq and value is not None:
                i += 1
            scan.given.setdefault(name, []).append(value)
        elif name in SWITCHES:
            scan.given.setdefault(name, []).append(None)
        elif len(name) > 2:
            scan.abbreviated |= {flag for flag in OURS if flag.startswith(name)}
    return scan


def _next_value(argv: list[str], i: int) -> str | None:
    """The word argparse takes as a flag's value; None where it refuses
    (none left, or an option: a word that starts with "-" and is no number)."""
    if i >= len(argv):
        return None
    word = argv[i]
    if word.startswith("-") and not _is_number(word):
        return None
    return word


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _model(argv: list[str]) -> str | None:
    """MODEL where vLLM's parser will surely find it: ``--model`` (vLLM moves
    the first one to the front), else the first word."""
    at = [i for i, word in enumerate(argv) if word == "--model" or word.startswith("--model=")]
    if at:
        i = at[0]
        if argv[i] == "--model":
            return argv[i + 1] if i + 1 < len(argv) and argv[0].startswith("-") else None
        value = argv[i].removeprefix("--model=")
        return value if value and argv[0].startswith("-") else None
    return argv[0] if argv and not argv[0].startswith("-") else None


def read_serve_line(argv: list[str]) -> ServeLine:
    """The preflight's view of ``vllm-uma serve``'s arguments."""
    scan = _scan(argv)
    helped = "--help" in scan.given or "--help" in scan.abbreviated
    helped = helped or any(word.startswith("-h") for word in scan.short)
    if helped or "--" in argv:
        return ServeLine(None, None, None, helped, (), None, None, None, False)
    config = "--config" in scan.given or "--config" in scan.abbreviated

    def last(flag: str) -> tuple[bool, str | None]:
        """(decided, the value vLLM will use: None when not given)."""
        values = scan.given.get(flag, [])
        if config or flag in scan.abbreviated or flag in scan.dotted or None in values:
            return False, None
        return True, values[-1] if values else None

    json_values = tuple(
        (flag, value) for flag in JSON_FLAGS for value in scan.given.get(flag, []) if value
    )
    ktc, backend, size = (last(f) for f in JSON_FLAGS[:1] + ("--kv-offloading-backend",
                                                             "--kv-offloading-size"))  # fmt: skip
    dtype = last("--dtype")
    return ServeLine(
        model=_model(argv),
        host=last("--host")[1],
        port=_port(scan, last),
        help=False,
        json_values=json_values,
        kv_transfer_config=ktc[1],
        kv_offloading_backend=backend[1],
        kv_offloading_size=size[1],
        decided_offloading=ktc[0] and backend[0] and size[0],
        weight_transfer="--weight-transfer-config" in scan.given
        or "--weight-transfer-config" in scan.dotted,
        dtype=dtype[1],
        decided_dtype=dtype[0],
    )


def _port(scan: _Scan, last) -> int | None:
    """The port the API server will listen on, when the line makes it sure."""
    if any(flag in scan.given or flag in scan.abbreviated for flag in NOT_LISTENING):
        return None
    if any(word.startswith(("-asc", "-dp")) for word in scan.short):
        return None  # --api-server-count, or a data-parallel mode, by its short name
    host_known, _ = last("--host")
    port_known, port = last("--port")
    if not (host_known and port_known):
        return None
    if port is None:
        return DEFAULT_PORT
    try:
        number = int(port)
    except ValueError:
        return None  # vLLM's parser refuses it, in its words
    return number if 0 <= number <= 65535 else None
