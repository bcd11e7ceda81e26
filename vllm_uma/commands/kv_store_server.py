"""``vllm-uma kv-store URL COMMAND``: the administrator's view of a network tier.

    vllm-uma kv-store URL ls                         namespaces: model, dtype, blocks, size, share
    vllm-uma kv-store URL du                         bytes per namespace, in all, the KV server's
    vllm-uma kv-store URL clear --yes [--namespace ID]   delete our keys (of one namespace)

Each takes ``--password-env NAME`` or ``--password-file PATH``,
``--tls-ca-file PATH`` (``--tls-cert-file``, ``--tls-key-file``) and
``--timeout-s S``: the tier's own keys, read the same way (a password never
on the command line nor in the URL), over the tier's own TLS connection.

Why the disk tier's command, not a sibling: a user thinks "my KV store",
whichever tier holds it, and names it as the tier's settings do: the fs
tier's ``root_dir`` or the valkey tier's ``url``. ``kv-store`` tells them
apart by the ``://``. The disk store's ``verify`` and ``prune`` have no
KV server counterpart: a value is checked on every restore, and the KV server's
LRU prunes.

Other applications may share the KV server: only names of ours are read or
deleted (kv_offload/network/key_names.py), found with SCAN in batches,
deleted with UNLINK (server_usage.py). A clear under a running server is
safe: a key that is gone is a miss, and the block is recomputed.

Exit status: 0 done; 2 a usage error (a bad URL or namespace id, clear
without --yes); 3 the KV server did not answer or refused us (down, a timeout,
a wrong password, an ACL that forbids a command).
"""

from __future__ import annotations

import argparse
import sys

PROG = "vllm-uma kv-store"
USAGE_ERROR, KV_SERVER_ERROR = 2, 3
FLAGS_FOR_KEYS = (
    "On this command's line the tier's keys are flags: --password-env NAME, "
    "--password-file PATH, --tls-ca-file PATH, --tls-cert-file PATH, --tls-key-file PATH, "
    "--timeout-s S"
)


def is_kv_server_url(argv: list[str]) -> bool:
    """Whether ``kv-store`` names a KV server (a URL) rather than a directory."""
    return any("://" in arg for arg in argv if not arg.startswith("-"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="the valkey tier's url: valkey://HOST[:PORT][/DB]")
    link = argparse.ArgumentParser(add_help=False)
    secret = link.add_mutually_exclusive_group()
    secret.add_argument("--password-env", metavar="NAME", help="the variable with the password")
    secret.add_argument("--password-file", metavar="PATH", help="the file with the password")
    link.add_argument("--tls-ca-file", metavar="PATH", help="the CA (valkeys:// only)")
    link.add_argument("--tls-cert-file", metavar="PATH", help="a client certificate (valkeys://)")
    link.add_argument("--tls-key-file", metavar="PATH", help="its key (valkeys://)")
    link.add_argument("--timeout-s", type=float, metavar="S", help="per command (default 2)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("ls", parents=[link], help="namespaces with model, blocks, size, share")
    commands.add_parser("du", parents=[link], help="bytes per namespace, in all, the KV server's")
    clear = commands.add_parser("clear", parents=[link], help="delete our keys")
    clear.add_argument("--namespace", metavar="ID", help="only this namespace (an id from ls)")
    clear.add_argument("--yes", action="store_true", help="required: this deletes")
    return parser


def _settings(args: argparse.Namespace):
    """The tier's settings from the flags, checked by the tier's own parser."""
    from vllm_uma.kv_offload.network.settings import parse_network_tier

    raw = {"type": "valkey", "url": args.url}
    keys = ("password_env", "password_file", "tls_ca_file", "tls_cert_file", "tls_key_file")
    for key in (*keys, "timeout_s"):
        if getattr(args, key) is not None:
            raw[key] = getattr(args, key)
    # It lists and deletes keys by name, never a value's bytes: no secret.
    return parse_network_tier(raw, reads_values=False)


def _client(config):
    """A plain client: the tier's pool (server_link.py) would import vLLM."""
    import valkey

    from vllm_uma.kv_offload.network.credentials import password_source

    kwargs = dict(
        host=config.host,
        port=config.port,
        db=config.db,
        socket_timeout=config.timeout_s,
        socket_connect_timeout=config.connect_timeout_s,
        credential_provider=password_source(config),
        client_name="vllm-uma-kv-store",
    )
    if config.tls:  # the tier's own TLS connection: the same checks, the same messages
        from vllm_uma.kv_offload.network.server_nodes import TlsConnection

        pool = valkey.ConnectionPool(connection_class=TlsConnection, tls_config=config, **kwargs)
        return valkey.Valkey(connection_pool=pool)
    return valkey.Valkey(**kwargs)


def _fail(message: str, status: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from vllm_uma.kv_offload.network.key_names import is_namespace_id
    from vllm_uma.kv_offload.network.settings import NetworkTierSettingsError

    if args.command == "clear":
        if args.namespace is not None and not is_namespace_id(args.namespace):
            return _fail(
                f"--namespace {args.namespace!r} is not a namespace id: it is 32 hex digits, "
                f"as `{PROG} URL ls` shows them.",
                USAGE_ERROR,
            )
        if not args.yes:
            what = f"namespace {args.namespace}" if args.namespace else "every namespace of ours"
            return _fail(f"clear deletes the keys of {what} at {args.url}; add --yes", USAGE_ERROR)
    try:
        config = _settings(args)
    except NetworkTierSettingsError as exc:
        return _fail(f"{exc} {FLAGS_FOR_KEYS}.", USAGE_ERROR)
    import valkey.exceptions as errors

    client = _client(config)
    try:
        return _run(client, config.url, args)
    except (errors.ValkeyError, OSError) as exc:
        return _fail(_explain(exc, config), KV_SERVER_ERROR)
    finally:
        client.close()


def _run(client, url: str, args: argparse.Namespace) -> int:
    from vllm_uma.kv_offload.network import server_usage

    if _is_cluster_node(client):
        # A cluster spreads our keys over every primary: one node's SCAN
        # sees a part of them, and a delete of several refuses across slots.
        print(
            f"{PROG}: error: {url} is a node of a Valkey/Redis Cluster (cluster_enabled:1); "
            f"this command walks one standalone KV server. List or clear each primary with "
            f"valkey-cli --cluster call, or use a KV server that is not a cluster.",
            file=sys.stderr,
        )
        return USAGE_ERROR
    if args.command == "clear":
        keys, nbytes = server_usage.clear(client, args.namespace)
        what = f"namespace {args.namespace}" if args.namespace else "every namespace of ours"
        print(f"deleted {keys} keys of {what}, {_size(nbytes)}")
        return 0
    from vllm_uma.kv_offload.network.server_check import check_server

    report = check_server(client, url)
    if report.problem is not None:
        print(f"{PROG}: warning: {report.problem}", file=sys.stderr)
    rows = server_usage.survey(client)
    (_ls if args.command == "ls" else _du)(rows, report)
    total = sum(u.bytes for u in rows)
    print(f"{url}: {report.summary()}; ours {_size(total)}, {report.share(total)}")
    return 0


def _is_cluster_node(client) -> bool:
    import valkey.exceptions as errors

    try:
        return bool(int(client.info("cluster").get("cluster_enabled", 0)))
    except errors.ResponseError:  # INFO refused by the ACL: the commands below will say
        return False


def _ls(rows, report) -> None:
    print(f"{'namespace':32}  {'model':40} {'kv dtype':9} {'blocks':>7} {'size':>10} {'share':>6}")
    for u in rows:
        print(
            f"{u.namespace:32}  {u.model[-40:]:40} {u.kv_dtype:9} {u.blocks:7d} "
            f"{_size(u.bytes):>10} {_percent(u.bytes, report):>6}"
        )
    if not rows:
        print("(no namespaces)")


def _du(rows, report) -> None:
    for u in rows:
        print(f"{_size(u.bytes):>10}  {u.namespace}  {u.model}  ({report.share(u.bytes)})")
    blocks = sum(u.blocks for u in rows)
    print(f"{_size(sum(u.bytes for u in rows)):>10}  total, {blocks} blocks")


def _percent(nbytes: int, report) -> str:
    """The share column: of maxmemory, or "-" without one."""
    return f"{nbytes / report.maxmemory:.1%}" if report.maxmemory else "-"


def _size(nbytes: int) -> str:
    from vllm_uma.commands.kv_store import human_size

    return human_size(nbytes)


def _explain(exc: BaseException, config) -> str:
    """The KV server's refusal or silence, with the fix."""
    from valkey.exceptions import AuthenticationError, ResponseError, TimeoutError

    from vllm_uma.kv_offload.network.tls import explain, wrong_transport

    url, name = config.url, f"{type(exc).__name__}: {exc}"
    transport = wrong_transport(config, config.host, config.port, url, exc) or explain(
        exc, config, url
    )
    if transport is not None:
        return transport
    if isinstance(exc, AuthenticationError):
        source = (
            f"the variable {config.password_env}"
            if config.password_env
            else f"the file {config.password_file}"
        )
        if config.password_env is None and config.password_file is None:
            return (
                f"the KV server at {url} asks for a password ({name}): pass --password-env NAME "
                f"or --password-file PATH, as the tier's password_env or password_file."
            )
        return (
            f"the KV server at {url} refused the password ({name}): check the password in "
            f"{source} and the ACL user in the URL (valkey://USER@HOST:PORT/DB)."
        )
    if isinstance(exc, ResponseError):
        return (
            f"the KV server at {url} refused a command ({name}): the ACL user needs SCAN, "
            f"MEMORY USAGE, GET and UNLINK on ~vllm-uma:kv:* (and INFO and CONFIG GET for "
            f"the share), e.g. ACL SETUSER USER +scan +memory|usage +get +unlink +info "
            f"+config|get ~vllm-uma:kv:*."
        )
    if isinstance(exc, TimeoutError):
        return (
            f"the KV server at {url} did not answer within {config.timeout_s:g} s ({name}): it is "
            f"busy or frozen; try again, or give it longer with --timeout-s S."
        )
    return (
        f"the KV server at {url} does not answer ({name}): check that it runs and that "
        f"{config.host}:{config.port} is its address (a firewall?)."
    )
