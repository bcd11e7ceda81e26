"""`vllm-uma kv-store URL ...` without a KV server: a URL refused before any
connection, its help, and which key names are the tier's. On a real
valkey-server: tests/integration/test_kv_store_server.py."""

from __future__ import annotations

import pytest
from disk_tier_kit import NS

from vllm_uma.commands import main as cli
from vllm_uma.kv_offload.network.key_names import namespace_of


def run(capsys, *argv) -> tuple[int, str, str]:
    status = cli.main(["kv-store", *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.mark.parametrize(
    "url, message",
    [
        ("valkey://kv:secret@127.0.0.1:6390/0", "holds a password"),
        ("http://127.0.0.1:6390/0", "has the scheme 'http'"),
        ("valkey://127.0.0.1:6390/zero", "it is the database number"),
    ],
)
def test_a_bad_url_exits_2_with_the_rule_and_no_secret(capsys, url, message):
    status, out, err = run(capsys, url, "ls")
    assert status == 2 and out == ""
    assert message in err and "secret" not in err
    assert "--password-env NAME" in err  # the tier's keys, as this command's flags


def test_kv_store_help_names_the_kv_server_form(capsys):
    with pytest.raises(SystemExit):
        cli.main(["kv-store", "--help"])
    assert "URL ls|du|clear" in capsys.readouterr().out


@pytest.mark.parametrize(
    "name, ours",
    [
        (f"vllm-uma:kv:{NS.hex()}:{{{'ab' * 32}}}:0".encode(), (NS.hex(), True)),
        (f"vllm-uma:kv:{NS.hex()}:{{{'ab' * 32}}}:1f".encode(), (NS.hex(), True)),
        (f"vllm-uma:kv:{NS.hex()}:namespace".encode(), (NS.hex(), False)),
        (f"vllm-uma:kv:{NS.hex()}:namespace2".encode(), None),
        (f"vllm-uma:kv:{NS.hex()}:{{zz}}:0".encode(), None),
        (f"vllm-uma:kv:{NS.hex()[:-1]}:{{ab}}:0".encode(), None),
        (b"vllm-uma:kv:other", None),
        (b"app:vllm-uma:kv:" + NS.hex().encode() + b":namespace", None),
    ],
)
def test_only_names_of_our_two_shapes_are_ours(name, ours):
    assert namespace_of(name) == ours
