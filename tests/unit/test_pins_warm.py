"""``vllm-uma serve --warm FILE`` (vllm_uma/kv_offload/pins/warm.py): the file
checked before vLLM loads, one line per refusal; the server's own address.
The warm-up on a real server: tests/e2e/test_pins.py."""

from __future__ import annotations

import json

import pytest

from vllm_uma.commands.preflight import PreflightError
from vllm_uma.commands.serve import preflight
from vllm_uma.kv_offload.pins.warm import WarmFileError, loopback_url, read_warm_file

DISK = json.dumps(
    {"kv_connector_extra_config": {"secondary_tiers": [{"type": "fs", "root_dir": "/tmp/kv"}]}}
)


def warm_file(tmp_path, content) -> str:
    path = tmp_path / "warm.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def test_a_good_file_is_read(tmp_path):
    entries = [
        {"name": "system", "prompt": "You are ...", "ttl_s": 86400},
        {"name": "tools", "messages": [{"role": "system", "content": "..."}]},
        {"name": "ids", "prompt_token_ids": [1, 2, 3], "ttl_s": None, "model": "m"},
    ]
    assert read_warm_file(warm_file(tmp_path, entries)) == entries


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{nope", "is not JSON"),
        ([], "non-empty JSON list"),
        ({"name": "a"}, "non-empty JSON list"),
        (["a"], "entry 0 is str"),
        ([{"name": "a", "prompt": "x", "tll_s": 5}], "unknown key(s) ['tll_s']"),
        ([{"name": "a"}], "give exactly one of"),
        ([{"name": "a", "prompt": "x", "messages": []}], "give exactly one of"),
        ([{"name": "a b", "prompt": "x"}], "pin name 'a b' is not valid"),
        ([{"name": "a", "prompt": "x", "ttl_s": 0}], "ttl_s 0"),
        ([{"name": "a", "prompt": "x"}, {"name": "a", "prompt": "y"}], "pinned twice"),
    ],
)
def test_a_bad_file_is_refused_naming_the_entry(tmp_path, content, words):
    with pytest.raises(WarmFileError) as refused:
        read_warm_file(warm_file(tmp_path, content))
    assert words in str(refused.value) and "--warm" in str(refused.value)


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(WarmFileError, match="cannot be read"):
        read_warm_file(str(tmp_path / "none.json"))


def test_the_preflight_refuses_before_vllm_loads(tmp_path):
    bad = warm_file(tmp_path, [{"name": "a"}])
    with pytest.raises(PreflightError, match="entry 0"):
        preflight(["--port", "0", "--warm", bad], {})
    good = warm_file(tmp_path, [{"name": "a", "prompt": "x"}])
    with pytest.raises(PreflightError, match="needs|has none"):
        preflight(["--port", "0", "--warm", good, "--kv-offloading-size", "1"], {})
    with pytest.raises(PreflightError, match="--uds"):
        preflight(["--warm", good, "--uds", "/tmp/x.sock"], {})
    line = ["--port", "0", "--warm", good, "--kv-offloading-size", "1"]
    assert preflight([*line, "--kv-transfer-config", DISK], {}) is False


@pytest.mark.parametrize(
    ("host", "port", "tls", "url"),
    [
        (None, 8000, False, "http://127.0.0.1:8000"),
        ("0.0.0.0", 8000, False, "http://127.0.0.1:8000"),
        ("::", 8000, True, "https://[::1]:8000"),
        ("10.1.2.3", 9000, False, "http://10.1.2.3:9000"),
    ],
)
def test_the_warm_up_reaches_the_server_where_it_listens(host, port, tls, url):
    assert loopback_url(host, port, tls) == url
