"""The raw command line as the preflight reads it (vllm_uma/commands/serve_line.py).

What it decides must be what vLLM's parser will decide; where it cannot be
sure it decides nothing (None). tests/unit/test_serve_args.py compares it
with vLLM's real parser."""

import pytest

from vllm_uma.commands.serve_line import DEFAULT_PORT, read_serve_line


@pytest.mark.parametrize(
    "argv, model",
    [
        (["/m"], "/m"),
        (["/m", "--port", "9000"], "/m"),
        (["--model", "/m"], "/m"),
        (["--port", "9000", "--model=/m"], "/m"),
        ([], None),
        # Only vLLM's flag table says whether a word after a flag is its value.
        (["--port", "9000", "/m"], None),
        (["--enforce-eager", "/m"], None),
        (["-O3", "/m"], None),
        # vLLM refuses both at once: its own message.
        (["/a", "--model", "/b"], None),
        (["--model"], None),
    ],
)
def test_model_only_where_vllm_surely_finds_it(argv, model):
    assert read_serve_line(argv).model == model


@pytest.mark.parametrize(
    "argv, host, port",
    [
        ([], None, DEFAULT_PORT),
        (["--port", "9000"], None, 9000),
        (["--port=9000", "--port", "9001"], None, 9001),  # the last one wins
        (["--host", "127.0.0.1", "--port=9000"], "127.0.0.1", 9000),
        (["--port", "-1"], None, None),  # vLLM's to refuse
        (["--port", "x"], None, None),
        (["--port"], None, None),
        (["--host", "--port", "9000"], None, None),
    ],
)
def test_host_and_port(argv, host, port):
    line = read_serve_line(argv)
    assert (line.host, line.port) == (host, port)


@pytest.mark.parametrize(
    "argv",
    [
        ["--uds", "/tmp/s.sock"],
        ["--headless"],
        ["--api-server-count", "0"],
        ["-asc", "0"],
        ["--grpc"],
        ["-dpm"],
        ["--po", "9000"],  # argparse's abbreviation of --port
        ["--ho=::1"],
        ["--config", "serve.yaml", "--port", "9000"],  # the file may set uds
        ["--", "/m"],
    ],
)
def test_no_port_to_check_when_it_is_not_sure(argv):
    assert read_serve_line(argv).port is None


@pytest.mark.parametrize("argv", [["--help"], ["--help=ModelConfig"], ["/m", "-h"], ["--hel"]])
def test_help_checks_nothing(argv):
    line = read_serve_line(argv)
    assert line.help and line.model is None and line.port is None


def test_json_flags_underscores_and_equals():
    line = read_serve_line(
        ["--kv_transfer_config", "{}", '--kv-events-config={"a": 1}', "--additional-config", "x"]
    )
    assert line.json_values == (
        ("--kv-transfer-config", "{}"),
        ("--kv-events-config", '{"a": 1}'),
        ("--additional-config", "x"),
    )
    assert line.kv_transfer_config == "{}" and line.decided_offloading


def test_offloading_flags_last_one_wins():
    line = read_serve_line(
        ["--kv-offloading-backend", "native", "--kv_offloading_backend=lmcache",
         "--kv-offloading-size", "2"]
    )  # fmt: skip
    assert (line.kv_offloading_backend, line.kv_offloading_size) == ("lmcache", "2")
    assert line.decided_offloading


@pytest.mark.parametrize(
    "argv",
    [
        # vLLM merges dotted keys into one value given after every other.
        ["--kv-transfer-config", "{}", "--kv-transfer-config.kv_role", "kv_both"],
        ["--config", "serve.yaml", "--kv-transfer-config", "{}"],
        ["--kv-offloading", "1"],  # abbreviates two flags: argparse refuses it
    ],
)
def test_offloading_left_to_vllm_when_not_sure(argv):
    line = read_serve_line(argv)
    assert not line.decided_offloading
    # A whole JSON value is still checked: vLLM's parser converts each one.
    expected = (("--kv-transfer-config", "{}"),) if "--kv-transfer-config" in argv else ()
    assert line.json_values == expected


def test_a_dotted_flag_takes_the_next_word_whatever_it_is():
    line = read_serve_line(["/m", "--additional-config.x", "--port", "9000"])
    assert line.port == DEFAULT_PORT  # "--port" was the dotted flag's value


def test_an_inline_value_is_kept_as_typed():
    # Only the flag's name is renamed: --host=my_host.lan is the user's text.
    line = read_serve_line(["--host=my_host.lan", '--kv_transfer_config={"kv_connector": 1}'])
    assert line.host == "my_host.lan"
    assert line.kv_transfer_config == '{"kv_connector": 1}'


@pytest.mark.parametrize(
    "argv, given",
    [
        (["/m", "--weight-transfer-config", '{"backend": "ipc"}'], True),
        (["/m", '--weight_transfer_config={"backend": "ipc"}'], True),
        (["/m", "--weight-transfer-config.backend", "ipc"], True),
        (["/m", "--kv-offloading-size", "1"], False),
        (["--help", "--weight-transfer-config", "{}"], False),  # --help checks nothing
    ],
)
def test_a_weight_transfer_config_in_any_form(argv, given):
    assert read_serve_line(argv).weight_transfer is given
