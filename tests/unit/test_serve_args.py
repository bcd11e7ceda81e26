"""How `vllm-uma serve` fills in its defaults (vllm_uma/commands/serve.py).

Uses vLLM's real `serve` parser, so a flag vLLM renames breaks these tests.
The default model is not built here: a stand-in returns its directory.
"""

import json

import pytest

from vllm_uma.commands.serve import parse_serve_args

DEFAULT_DIR = "/cache/models/SmolLM2-135M-Instruct"
GEMMA_DIR = "/cache/models/gemma-3-270m"


class FakePrepare:
    """Stands in for vllm_uma.models.prepare: records the names asked for."""

    def __init__(self):
        self.names = []

    @property
    def calls(self):
        return len(self.names)

    def __call__(self, name):
        self.names.append(name)
        return GEMMA_DIR if name == "gemma-3-270m" else DEFAULT_DIR


def parse(argv, prepare=None):
    return parse_serve_args(argv, prepare_model=prepare or FakePrepare())


def test_no_model_serves_the_default_under_its_name():
    prepare = FakePrepare()
    args = parse(["--port", "8123"], prepare)
    assert args.model == DEFAULT_DIR
    assert args.served_model_name == ["SmolLM2-135M-Instruct"]
    assert args.port == 8123
    assert prepare.calls == 1


@pytest.mark.parametrize("argv", [["/m"], ["--port", "1", "/m"], ["--model", "/m"], ["--model=/m"]])
def test_a_named_model_never_prepares_the_default(argv):
    prepare = FakePrepare()
    args = parse(argv, prepare)
    assert args.model == "/m"
    assert args.served_model_name is None
    assert prepare.calls == 0


@pytest.mark.parametrize(
    "argv",
    [["gemma-3-270m"], ["--port", "1", "gemma-3-270m"], ["--model", "gemma-3-270m"]],
)
def test_a_recipe_name_serves_the_recipe_under_its_name(argv):
    prepare = FakePrepare()
    args = parse(argv, prepare)
    assert prepare.names == ["gemma-3-270m"]
    assert args.model == GEMMA_DIR
    assert args.served_model_name == ["gemma-3-270m"]


def test_a_recipe_under_a_name_of_the_users_choice():
    args = parse(["gemma-3-270m", "--served-model-name", "g"])
    assert (args.model, args.served_model_name) == (GEMMA_DIR, ["g"])


@pytest.mark.parametrize("model", ["./gemma-3-270m", "google/gemma-3-270m", "Gemma-3-270M"])
def test_a_path_or_hub_id_that_is_not_a_recipe_is_left_as_typed(model):
    prepare = FakePrepare()
    args = parse([model], prepare)
    assert prepare.calls == 0
    assert (args.model, args.served_model_name) == (model, None)


def test_default_model_under_a_name_of_the_users_choice():
    args = parse(["--served-model-name", "mine"])
    assert args.model == DEFAULT_DIR
    assert args.served_model_name == ["mine"]


def test_compiled_by_default_as_in_vllm():
    # Measured: compiled prefills faster and decodes 1.4x faster (docs/serving.md).
    assert parse([]).enforce_eager is False


@pytest.mark.parametrize(
    "flags, eager",
    [
        (["--enforce-eager"], True),
        (["--no-enforce-eager"], False),
        (["-O3"], False),
        (["--compilation-config", "{}"], False),
    ],
)
def test_user_compilation_choice_is_kept(flags, eager):
    assert parse(flags).enforce_eager is eager


def test_no_wire_weights_travels_in_additional_config():
    args = parse(["--no-wire-weights", "--additional-config", '{"other": 1}'])
    assert args.additional_config == {"other": 1, "vllm_uma": {"wire_weights": False}}
    assert not hasattr(args, "no_wire_weights")


def test_every_vllm_flag_is_accepted():
    args = parse(["--max-model-len", "2048", "--kv-cache-memory-bytes", "1073741824"])
    assert args.max_model_len == 2048
    assert args.kv_cache_memory_bytes == 1 << 30


def test_config_refusals_reach_the_user_as_one_line():
    import pydantic

    from vllm_uma.commands.serve import one_line

    class Config(pydantic.BaseModel):
        x: int

        @pydantic.field_validator("x")
        @classmethod
        def refuse(cls, v):
            raise ValueError("--flag=1 is invalid: do this instead.")

    try:
        Config(x=1)
    except pydantic.ValidationError as exc:
        assert one_line(exc) == "--flag=1 is invalid: do this instead."
    assert one_line(RuntimeError("a\n  b")) == "RuntimeError: a b"


# -- the preflight's reading of the raw line (serve_line.py) against vLLM's parser


@pytest.fixture(scope="module")
def vllm_parse():
    from vllm_uma.commands.serve import build_parser

    root = build_parser()
    return lambda argv: root.parse_args(["serve", *argv])


@pytest.mark.parametrize(
    "argv",
    [
        ["/m"],
        ["/m", "--port", "9000", "--host", "127.0.0.1"],
        ["--port=9000", "--model", "/m"],
        ["--model=/m", "--port", "9000", "--port", "9001"],
        ["/m", "--kv_transfer_config", '{"kv_connector_extra_config": {}}'],
        ["/m", "--enforce-eager", "--additional-config.x", "--port"],
        ["--port", "9000", "/m"],
        ["--enforce-eager", "/m", "--port=9001"],
        ["/m", "--kv-offloading-backend", "native", "--kv_offloading_size=2"],
    ],
)
def test_what_the_preflight_decides_vllm_decides_the_same(vllm_parse, argv):
    from vllm_uma.commands.serve_line import read_serve_line

    line, args = read_serve_line(argv), vllm_parse(argv)
    if line.model is not None:
        assert line.model == (args.model_tag or args.model)
    if line.port is not None:
        assert (line.host, line.port) == (args.host, args.port)
    if line.decided_offloading:
        assert line.kv_offloading_backend in (None, args.kv_offloading_backend)
        if line.kv_offloading_size is not None:
            assert float(line.kv_offloading_size) == args.kv_offloading_size
        assert (line.kv_transfer_config is None) == (args.kv_transfer_config is None)


@pytest.mark.parametrize(
    "flag, text",
    [
        ("--kv-transfer-config", '{"kv_connector": '),
        ("--kv-transfer-config", "[1]"),
        ("--kv-events-config", '"x"'),
        ("--additional-config", "{nope}"),
        ("--kv-transfer-config", '{"cpu_bytes_to_use": 1.5G}'),
    ],
)
def test_vllm_refuses_the_json_the_preflight_refuses(vllm_parse, flag, text):
    from vllm_uma.commands.preflight import PreflightError
    from vllm_uma.commands.preflight_config import check_json_values
    from vllm_uma.commands.serve_line import read_serve_line

    with pytest.raises(PreflightError):
        check_json_values(read_serve_line(["/m", flag, text]))
    with pytest.raises((SystemExit, ValueError)):  # argparse exits 2; vLLM raises some itself
        vllm_parse(["/m", flag, text])


def test_numbers_in_json_as_vllm_expands_them():
    from vllm.engine.arg_utils import _expand_json_human_readable_numbers

    from vllm_uma.commands.preflight_config import loads

    text = '{"a": 80m, "b": [1K, 2.5g], "c": "3G", "d": 7}'
    assert loads(text) == json.loads(_expand_json_human_readable_numbers(text))
