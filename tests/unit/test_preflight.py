"""One-line errors before vLLM starts (vllm_uma/commands/preflight.py)."""

import socket

import pytest

from vllm_uma.commands.preflight import (
    PreflightError,
    check_model,
    check_port,
    looks_like_local_path,
)


@pytest.mark.parametrize(
    "model, is_path",
    [
        ("/abs/dir", True),
        ("./rel", True),
        ("../up", True),
        ("~/models/x", True),
        ("a/b/c", True),
        ("dir/", True),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", False),
        ("gpt2", False),
    ],
)
def test_what_counts_as_a_local_path(model, is_path):
    assert looks_like_local_path(model) is is_path


def test_missing_directory(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(PreflightError) as err:
        check_model(missing)
    assert str(err.value) == (
        f"model directory {missing!r} does not exist. Check the path, or leave "
        "MODEL out to serve the default model."
    )


def test_directory_without_config_is_not_a_model(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(PreflightError, match="is not a model: it has no config.json"):
        check_model(str(tmp_path))


def test_plain_file_is_not_a_model_directory(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"\0")
    with pytest.raises(PreflightError, match="is a file, not a model directory"):
        check_model(str(f))


def test_model_directory_and_hub_ids_pass(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    check_model(str(tmp_path))
    check_model("HuggingFaceTB/SmolLM2-135M-Instruct")  # left to vLLM


RECIPES = ("SmolLM2-135M-Instruct", "gemma-3-270m")


@pytest.mark.parametrize(
    "typo", ["gemma-3-270", "Gemma-3-270M", "gemma3-270m", "smollm2-135m-instruct"]
)
def test_a_name_close_to_a_recipe_is_a_typo_not_a_hub_id(typo):
    # vLLM would ask the hub for it and fail after a minute of retries.
    with pytest.raises(PreflightError) as err:
        check_model(typo, RECIPES)
    message = str(err.value)
    assert message.startswith(f"model {typo!r} is neither a local directory nor a model")
    assert "did you mean" in message and "SmolLM2-135M-Instruct, gemma-3-270m" in message


@pytest.mark.parametrize(
    "model", ["gemma-3-270m", "google/gemma-3-270", "me/gemma-3-270m", "gpt2", "llama"]
)
def test_recipes_and_other_hub_ids_pass(model):
    check_model(model, RECIPES)


def test_busy_port_names_the_port_and_the_fix():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        with pytest.raises(PreflightError) as err:
            check_port("127.0.0.1", port)
        msg = str(err.value)
        assert msg.startswith(f"127.0.0.1:{port} is already in use")
        assert "choose another port with --port" in msg
        assert "\n" not in msg
    finally:
        holder.close()


def test_free_port_passes_and_is_left_free():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    check_port("127.0.0.1", port)
    again = socket.socket()
    again.bind(("127.0.0.1", port))  # the check did not keep it
    again.close()


def test_host_that_is_not_ours():
    with pytest.raises(PreflightError, match="is not an address of this machine"):
        check_port("192.0.2.1", 8000)  # TEST-NET-1: never local


# -- vllm_uma.commands.serve.preflight: the raw command line, before vLLM


def serve_preflight(argv) -> bool:
    """Whether the line asks for --help (then nothing is checked)."""
    from vllm_uma.commands.serve import preflight

    return preflight(argv, {})


@pytest.fixture
def checked(monkeypatch) -> list[tuple[str, object]]:
    """The model and port checks serve's preflight makes, in order (each
    still made: a refusal still raises)."""
    from vllm_uma.commands import serve

    made = []
    real_model, real_port = serve.check_model, serve.check_port

    def model(name, recipes):
        made.append(("model", name))
        real_model(name, recipes)

    def port(host, number):
        made.append(("port", number))
        real_port(host, number)

    monkeypatch.setattr(serve, "check_model", model)
    monkeypatch.setattr(serve, "check_port", port)
    return made


def test_preflight_refuses_a_missing_model_named_first(tmp_path):
    with pytest.raises(PreflightError, match="does not exist"):
        serve_preflight([str(tmp_path / "nope"), "--port", "0"])


def test_preflight_leaves_a_recipe_to_be_prepared(checked):
    assert serve_preflight(["gemma-3-270m", "--port", "0"]) is False  # not --help: checked
    assert checked == [("port", 0)]  # a recipe's name is no path to check: built later


def test_preflight_refuses_a_busy_port():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(PreflightError, match=f"127.0.0.1:{port} is already in use"):
            serve_preflight(["--host", "127.0.0.1", "--port", str(port)])
        serve_preflight(["--host", "127.0.0.1", "--port", str(port), "--uds", "/tmp/x.sock"])


def test_preflight_checks_nothing_for_help(tmp_path, checked):
    assert serve_preflight([str(tmp_path / "nope"), "--help", "--port", "0"]) is True
    assert checked == []
