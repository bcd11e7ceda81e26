"""``vllm-uma serve``: vLLM's OpenAI-compatible server, with our defaults.

Runs in the command's own process, which becomes vLLM's API server; vLLM
spawns the engine core and the worker from it, and those load this plugin
through the ``vllm.platform_plugins`` entry point.

What this adds on top of ``vllm serve``:
- without MODEL, the default model is prepared (once) and served under the
  name ``SmolLM2-135M-Instruct``; a MODEL that is a recipe's name
  (``gemma-3-270m``, vllm_uma/models/) is prepared the same way and served
  under that name. Any other MODEL is a path or a hub id, as in vLLM: to
  serve a local directory that has a recipe's name, write ``./NAME``;
- vLLM's own compilation default (torch.compile): measured against eager
  mode here it prefills faster and decodes 1.4x faster, for about a minute
  more at start-up (docs/serving.md, tools/benchmark/eager_vs_compiled.py);
- one clear line, not a traceback, for a missing model, a directory that is
  not a model, a busy port (``preflight.py``), a JSON flag that does not
  parse or offloading settings the plugin refuses (``preflight_config.py``),
  4-bit weights this CPU or this --dtype cannot run (``preflight_int4.py``),
  in about a second: read from the raw command line (``serve_line.py``)
  before vLLM or torch is imported (10-40 s here); any other start-up error
  is shortened to its message (set VLLM_LOGGING_LEVEL=DEBUG for the traceback);
- ``/v1/uma/pins``: pin a prefix in the lower tiers with a time to live,
  list and unpin (kv_offload/pins/, docs/sessions.md); ``--warm FILE``
  pins a list of them once the server answers (pins/warm.py);
- ``--api-key-file PATH``: vLLM's ``--api-key`` read from a file (a key on
  the command line is world-readable in /proc), required on every path but
  /health and /metrics (fleet/server_guard.py): how a fleet's servers take
  only the fleet's requests.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from vllm_uma import exit_without_collection, lifeline, models
from vllm_uma.commands import runtime_preload
from vllm_uma.commands.argv import FlagValueMissing, given, take
from vllm_uma.commands.engine_watch import EngineDeathWatch
from vllm_uma.commands.preflight import PreflightError, check_model, check_port
from vllm_uma.commands.preflight_config import (
    asks_disk_tier,
    check_json_values,
    check_offloading,
    plugin_active,
)
from vllm_uma.commands.preflight_int4 import check_int4
from vllm_uma.commands.serve_line import ServeLine, read_serve_line
from vllm_uma.fleet.api_key import ApiKeyError, read_key_file
from vllm_uma.fleet.server_guard import KEY_FILE_ENV, GuardEveryPath
from vllm_uma.kv_offload.pins.warm import (
    WarmFileError,
    loopback_url,
    read_warm_file,
    start_warm_up,
)
from vllm_uma.plugin import cpu_features
from vllm_uma.plugin.uma_settings import NAMESPACE
from vllm_uma.plugin.vllm_version import UnsupportedVllmError, require_supported_vllm

PROG = "vllm-uma serve"
PIN_ROUTES = "vllm_uma.kv_offload.pins.http_api.PinRoutes"
_OTHER_RECIPES = sorted(name for name in models.RECIPES if name != models.DEFAULT_MODEL_NAME)

SERVE_DESCRIPTION = f"""vLLM's OpenAI-compatible server on the unified-memory platform.
Accepts every `vllm serve` flag. Without MODEL it serves
{models.DEFAULT_MODEL_NAME}, prepared locally (`vllm-uma prepare-model`); MODEL
may name another model prepare-model builds: {", ".join(_OTHER_RECIPES)}.
Compiled (torch.compile) as in vLLM, and loaded from vLLM's compile cache at a
restart; --enforce-eager starts sooner and decodes slower.

Search by using: `--help=<ConfigGroup>` to explore options by section (e.g.,
--help=ModelConfig, --help=Frontend); `--help=all` shows every flag.
"""


def names_a_model(argv: list[str], parse) -> bool:
    """True if the command line names a model (positionally or with --model).

    ``parse`` is vLLM's serve parser. vLLM refuses --served-model-name unless
    the model comes first, so that case is decided before parsing.
    """
    if given(argv, "--model"):
        return True
    if (not argv or argv[0].startswith("-")) and given(argv, "--served-model-name"):
        return False
    return parse(argv).model_tag is not None


def apply_defaults(args: argparse.Namespace, argv: list[str], recipe: str | None) -> None:
    """Fill in what vllm-uma chooses when the user did not.

    ``recipe`` is the name of the recipe whose directory ``args`` serves
    (the default model when the command line named none), else None.
    """
    if recipe is not None and not given(argv, "--served-model-name"):
        args.served_model_name = [recipe]
    if args.model_tag is not None:
        # vLLM's serve command gives the positional MODEL precedence too.
        args.model = args.model_tag
    # Our own flag travels to the workers through vLLM's --additional-config.
    if getattr(args, "no_wire_weights", False):
        additional = dict(args.additional_config or {})
        additional[NAMESPACE] = {**additional.get(NAMESPACE, {}), "wire_weights": False}
        args.additional_config = additional
    if hasattr(args, "no_wire_weights"):
        del args.no_wire_weights


def parse_serve_args(argv: list[str], prepare_model=models.prepare) -> argparse.Namespace:
    """vLLM's serve parser; a recipe's directory for the default model or a
    MODEL that names a recipe; our defaults.

    ``prepare_model(name)`` builds recipe ``name`` (None: the default) if
    needed and returns its directory.
    """
    root = build_parser()

    def parse(line: list[str]) -> argparse.Namespace:
        return root.parse_args(["serve", *line])

    if not names_a_model(argv, parse):
        # Parsed as if the user had typed the directory, so vLLM treats the
        # default model exactly like a named one.
        recipe = models.DEFAULT_MODEL_NAME
        args = parse([str(prepare_model(None)), *argv])
    else:
        args = parse(argv)
        recipe = resolve_recipe(args, prepare_model)
    apply_defaults(args, argv, recipe)
    return args


def resolve_recipe(args: argparse.Namespace, prepare_model) -> str | None:
    """If the MODEL of ``args`` (positional or --model) names a recipe, point
    it at the recipe's directory and return the name; else None."""
    named = args.model_tag if args.model_tag is not None else args.model
    if not models.is_recipe(named):
        return None
    directory = str(prepare_model(named))
    if args.model_tag is not None:
        args.model_tag = directory
    args.model = directory
    return named


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
        "--api-key-file",
        default=None,
        metavar="PATH",
        help="vllm-uma: require a key of this file (one a line, mode 0600) on every path "
        "but /health and /metrics: vLLM's --api-key without the key on the command line, "
        "and also on the paths vLLM's --api-key leaves open (/tokenize, /abort_requests, ...).",
    )
    parser.add_argument(
        "--warm",
        default=None,
        metavar="FILE",
        help="vllm-uma: once the server answers, pin the prefixes of FILE (a JSON list of "
        "POST /v1/uma/pins bodies: name, prompt or messages or prompt_token_ids, ttl_s), "
        "prefilling what no tier holds; needs a disk tier (docs/sessions.md).",
    )
    parser.add_argument(
        "--no-wire-weights",
        action="store_true",
        help="vllm-uma: do not lock the weights in RAM (mlock). Same as "
        '--additional-config \'{"vllm_uma": {"wire_weights": false}}\'.',
    )
    return root


# Exit statuses, as argparse and vLLM use them: 2 means the command line is
# wrong (a flag, a value, the model path, the port) and running it again
# unchanged will fail again; 1 means it failed while running (the engine did
# not start, a crash, the default model could not be built).
EXIT_USAGE = 2
EXIT_FAILURE = 1


def _fail(message: str, status: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    return status


def is_usage_error(exc: BaseException) -> bool:
    """Errors of the command line: refusals raised while vLLM validates its
    config (ours included, all ValueError, reaching here as pydantic's
    ValidationError, itself a ValueError) and argument type errors. A
    failure after validation (engine start, model load) is not one: it
    reaches the API server as a RuntimeError."""
    return isinstance(exc, (ValueError, TypeError))


def preflight(
    argv: list[str], environ: Mapping[str, str], cpu: cpu_features.CpuFeatures | None = None
) -> bool:
    """Every refusal the raw command line decides, before vLLM or torch is
    imported; what it leaves undecided (serve_line.py) is checked again once
    vLLM's parser has read the line, and by the platform. Returns whether
    the line asks for --help (nothing checked then). ``cpu``: this CPU's
    features (None: read them)."""
    line = read_serve_line(argv)
    if line.help:
        return True
    if line.model is not None and not models.is_recipe(line.model):
        check_model(line.model, models.RECIPES)
        cpu = cpu or cpu_features.read()
        check_int4(line.model, line.dtype, line.decided_dtype, cpu, plugin_active(environ))
    if line.port is not None:
        check_port(line.host, line.port)
    check_json_values(line)
    check_offloading(line, environ)
    try:
        key_file = take(list(argv), "--api-key-file")
    except FlagValueMissing:
        key_file = None  # vLLM's parser says so, with the usage
    if key_file is not None:
        try:
            read_key_file(key_file)
        except ApiKeyError as exc:
            raise PreflightError(str(exc)) from None
    check_warm(argv, line, environ)
    return False


def check_warm(argv: list[str], line: ServeLine, environ: Mapping[str, str]) -> None:
    """``--warm FILE``: the file read and checked, and a disk tier asked for
    (pins live in its ledger), where the line decides it."""
    try:
        path = take(list(argv), "--warm")
    except FlagValueMissing:
        return  # vLLM's parser says so, with the usage
    if path is None:
        return
    try:
        read_warm_file(path)
    except WarmFileError as exc:
        raise PreflightError(str(exc)) from None
    if given(argv, "--uds"):
        raise PreflightError(
            "--warm pins through the server's own HTTP port, and --uds serves a Unix socket "
            "only: drop one of them."
        )
    if line.decided_offloading and plugin_active(environ) and not asks_disk_tier(line):
        raise PreflightError(
            "--warm pins prefixes in the disk KV tier, and this line has none: add an fs tier, "
            'e.g. --kv-offloading-size 1 --kv-transfer-config \'{"kv_connector_extra_config": '
            '{"secondary_tiers": [{"type": "fs", "root_dir": "/path"}]}}\' (docs/sessions.md).'
        )


def apply_api_key_file(args: argparse.Namespace, environ) -> None:
    """``--api-key-file``: vLLM's ``--api-key`` set from the file (every key
    of it accepted), and every other path guarded too (fleet/server_guard.py,
    which reads the file that ``environ`` names). ApiKeyError for a key also
    on the command line, or a file that cannot be used."""
    path = args.api_key_file
    del args.api_key_file  # ours: vLLM's code never sees it
    if path is None:
        return
    if args.api_key:
        raise ApiKeyError(
            "--api-key and --api-key-file both give the key: keep --api-key-file (a key on "
            "the command line is readable by every user of this host in /proc/PID/cmdline)."
        )
    args.api_key = list(read_key_file(path).keys)
    environ[KEY_FILE_ENV] = os.path.abspath(path)
    args.middleware = [*args.middleware, f"{GuardEveryPath.__module__}.GuardEveryPath"]


def main(argv: list[str]) -> int:
    # A server started by one of our supervisors stops when it exits; the
    # engine core vLLM starts follows this process (vllm_uma/lifeline.py).
    lifeline.stop_with_supervisor()
    os.environ[lifeline.API_SERVER_ENV] = str(os.getpid())
    prepared = prepare(argv)
    if isinstance(prepared, int):
        return prepared
    args, runtime_note = prepared

    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.logger import configure_logging_from_args

    from vllm_uma.commands import kv_events_endpoint

    command = ServeSubcommand()
    configure_logging_from_args(args)
    from vllm_uma.log import get_logger

    get_logger(__name__).info(runtime_note)  # --help exited in vLLM's parser
    try:
        kv_events_endpoint.choose_endpoint(args, argv)
    except PreflightError as exc:
        return _fail(str(exc), EXIT_USAGE)
    warm = vars(args).pop("warm", None)  # ours: vLLM's code never sees it
    if warm is not None:
        api_key = (args.api_key or [os.environ.get("VLLM_API_KEY")])[0]
        url = loopback_url(args.host, args.port, bool(args.ssl_keyfile))
        start_warm_up(read_warm_file(warm), url, api_key, get_logger(__name__))
    try:
        with EngineDeathWatch() as engine:
            command.validate(args)
            command.cmd(args)
    except KeyboardInterrupt:
        # Ctrl-C is a stop on purpose too (uvicorn raises SIGINT again).
        exit_without_collection.arm(130)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place errors reach the user
        if os.environ.get("VLLM_LOGGING_LEVEL", "").upper() == "DEBUG":
            raise
        return _fail(one_line(exc), EXIT_USAGE if is_usage_error(exc) else EXIT_FAILURE)
    if engine.report is not None:
        # vLLM shut the server down after its engine died and returned as if
        # stopped on purpose: a supervisor must see a failure.
        return _fail(
            f"the engine core died while serving ({engine.report}); its last lines "
            f"in the log above say why. Restart the server.",
            EXIT_FAILURE,
        )
    exit_without_collection.arm(0)  # served and stopped: exit 1.5 s sooner
    return 0


def prepare(argv: list[str]) -> tuple[argparse.Namespace, str] | int:
    """Everything before vLLM's serve command: the preflight, the engine's
    runtime libraries, vLLM's version and its parser. The parsed arguments
    and the runtime's log line (empty for --help), or the exit status of a
    refusal, already reported."""
    try:
        helped = preflight(argv, os.environ)
        # For the engine core vLLM spawns from this process (it inherits
        # the environment): tcmalloc and Intel's OpenMP if the user asks.
        # --help starts no engine core, so a bad VLLM_UMA_PRELOAD waits.
        runtime_note = "" if helped else runtime_preload.prepare_engine_environment()
    except (PreflightError, runtime_preload.PreloadError) as exc:
        return _fail(str(exc), EXIT_USAGE)
    try:
        # Imports vLLM, and torch with it: after the preflight.
        require_supported_vllm()
    except UnsupportedVllmError as exc:
        return _fail(str(exc), EXIT_FAILURE)
    try:
        args = parse_serve_args(argv)
    except models.PrepareError as exc:
        return _fail(str(exc), EXIT_FAILURE)
    # The pins API (docs/sessions.md), innermost of our middlewares: the
    # --api-key-file guard and a user's own sit outside it.
    args.middleware = [PIN_ROUTES, *args.middleware]
    try:
        apply_api_key_file(args, os.environ)
    except ApiKeyError as exc:
        return _fail(str(exc), EXIT_USAGE)
    try:
        # Again, for what the preflight left to vLLM's parser (MODEL after
        # other flags, a --config file's values).
        check_model(args.model, models.RECIPES)
        check_int4(args.model, args.dtype, True, cpu_features.read(), plugin_active(os.environ))
        if not args.uds and not args.headless:
            check_port(args.host, args.port)
    except PreflightError as exc:
        return _fail(str(exc), EXIT_USAGE)
    return args, runtime_note


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
