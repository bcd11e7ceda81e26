"""``vllm-uma serve``: vLLM's OpenAI-compatible server, with our defaults.

Runs in the command's own process, which becomes vLLM's API server; vLLM
spawns the engine core and the worker from it, and those load this plugin
through the ``vllm.platform_plugins`` entry point.

What this adds on top of ``vllm serve``:
- without MODEL, the default model is prepared (once) and served under the
  name ``SmolLM2-135M-Instruct``;
- eager mode unless the user chooses a compilation mode: vLLM's compiled CPU
  path gave wrong answers on this model here (docs/serving.md says more);
- one clear line, not a traceback, for a missing model, a directory that is
  not a model, or a busy port (``preflight.py``); any other start-up error is
  shortened to its message (set VLLM_LOGGING_LEVEL=DEBUG for the traceback).
"""

from __future__ import annotations

import argparse
import os
import sys

from vllm_uma import default_model
from vllm_uma.config import NAMESPACE
from vllm_uma.preflight import PreflightError, check_model, check_port

PROG = "vllm-uma serve"

SERVE_DESCRIPTION = f"""vLLM's OpenAI-compatible server on the unified-memory platform.
Accepts every `vllm serve` flag. Without MODEL it serves
{default_model.DEFAULT_MODEL_NAME}, prepared locally (`vllm-uma prepare-model`).
Eager mode unless you pass --no-enforce-eager, -O or --compilation-config.

Search by using: `--help=<ConfigGroup>` to explore options by section (e.g.,
--help=ModelConfig, --help=Frontend); `--help=all` shows every flag.
"""

# Flags with which the user takes charge of compilation; with any of them we
# leave vLLM's choice alone.
COMPILATION_FLAGS = (
    "--enforce-eager",
    "--no-enforce-eager",
    "-O",
    "--compilation-config",
    "-cc",
)


def _given(argv: list[str], *flags: str) -> bool:
    """True if any of ``flags`` appears in ``argv`` (``--f``, ``--f=x``, ``-O3``)."""
    for arg in argv:
        for flag in flags:
            if arg == flag or arg.startswith(flag + "="):
                return True
            # vLLM accepts -O3, -O.mode=..., -cc.mode=... glued to the flag.
            if flag in ("-O", "-cc") and arg.startswith(flag) and arg != flag:
                return True
    return False


def names_a_model(argv: list[str], parse) -> bool:
    """True if the command line names a model (positionally or with --model).

    ``parse`` is vLLM's serve parser. vLLM refuses --served-model-name unless
    the model comes first, so that case is settled before parsing.
    """
    if _given(argv, "--model"):
        return True
    if (not argv or argv[0].startswith("-")) and _given(argv, "--served-model-name"):
        return False
    return parse(argv).model_tag is not None


def apply_defaults(args: argparse.Namespace, argv: list[str], default_dir: str | None) -> None:
    """Fill in what vllm-uma chooses when the user did not.

    ``default_dir`` is the default model when the command line named none
    (``args`` was then parsed with it as MODEL), else None.
    """
    if default_dir is not None and not _given(argv, "--served-model-name"):
        args.served_model_name = [default_model.DEFAULT_MODEL_NAME]
    if args.model_tag is not None:
        # vLLM's serve command gives the positional MODEL precedence too.
        args.model = args.model_tag
    if not _given(argv, *COMPILATION_FLAGS):
        args.enforce_eager = True
    # Our own flag travels to the workers through vLLM's --additional-config.
    if getattr(args, "no_wire_weights", False):
        additional = dict(args.additional_config or {})
        additional[NAMESPACE] = {**additional.get(NAMESPACE, {}), "wire_weights": False}
        args.additional_config = additional
    if hasattr(args, "no_wire_weights"):
        del args.no_wire_weights


def parse_serve_args(argv: list[str], prepare_default=default_model.prepare) -> argparse.Namespace:
    """vLLM's serve parser, the default model when none is named, our defaults."""
    root = build_parser()

    def parse(line: list[str]) -> argparse.Namespace:
        return root.parse_args(["serve", *line])

    default_dir = None
    if not names_a_model(argv, parse):
        # Parsed as if the user had typed the directory, so vLLM treats the
        # default model exactly like a named one.
        default_dir = str(prepare_default())
    args = parse(argv if default_dir is None else [default_dir, *argv])
    apply_defaults(args, argv, default_dir)
    return args


def build_parser():
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    root = FlexibleArgumentParser(prog="vllm-uma")
    subparsers = root.add_subparsers(dest="subparser")
    command = ServeSubcommand()
    parser = command.subparser_init(subparsers)
    parser.usage = f"{PROG} [MODEL] [options]"
    parser.description = SERVE_DESCRIPTION
    parser.epilog = (parser.epilog or "").replace("vllm serve", PROG)
    parser.add_argument(
        "--no-wire-weights",
        action="store_true",
        help="vllm-uma: do not lock the weights in RAM (mlock). Same as "
        '--additional-config \'{"vllm_uma": {"wire_weights": false}}\'.',
    )
    return root


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    return 2


def serve_main(argv: list[str]) -> int:
    try:
        args = parse_serve_args(argv)
    except default_model.PrepareError as exc:
        return _fail(str(exc))
    try:
        check_model(args.model)
        if not args.uds:
            check_port(args.host, args.port)
    except PreflightError as exc:
        return _fail(str(exc))

    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.logger import configure_logging_from_args

    command = ServeSubcommand()
    configure_logging_from_args(args)
    try:
        command.validate(args)
        command.cmd(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place errors reach the user
        if os.environ.get("VLLM_LOGGING_LEVEL", "").upper() == "DEBUG":
            raise
        return _fail(one_line(exc))
    return 0


def one_line(exc: Exception) -> str:
    """An exception's message on one line.

    Our refusals raised inside vLLM's config validation reach here wrapped
    in pydantic's multi-line ValidationError: unwrap them to their text.
    """
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            messages = [str(e["msg"]).removeprefix("Value error, ") for e in errors()]
        except (TypeError, KeyError):
            messages = []
        if messages:
            return "; ".join(messages)
    return " ".join(f"{type(exc).__name__}: {exc}".split())
