"""API server process: a pin carried over HTTP, as one tar (issue 46).

Two routes of the pins API (http_api.py routes them here, behind the same
API-key check):

    GET  /v1/uma/pins/NAME/bundle[?namespace=HEX]   the pin's bundle as a tar
    POST /v1/uma/pins/import[?ttl_s=S]              such a tar in: checked,
                                                    written, pinned

Both are ``vllm-uma kv-store ROOT export|import`` (bundle_export.py,
bundle_import.py) on the server's own store, with its cap and pin_share;
bundle_tar.py turns a bundle directory into a tar and back. Every file
operation runs in a thread, never on the event loop.

Where the bundle sits meanwhile: a private scratch directory per request
under ``ROOT/.noindex/http-bundles/`` (0700, where desktop indexers do not
look: KV bytes give prompts away), on the store's volume, so an 8k-token
pin in float32 (~350 MB) is streamed from and to disk, never held in
memory. The scratch is removed when the request ends, however it ends:
an error, a refusal, a client gone mid-stream (a task watches for the
disconnect, since uvicorn's ``send`` then returns quietly). A server
killed meanwhile leaves its scratch behind; the next bundle request of any
server on the store removes those whose process is gone (the pid in the
name), and an earlier life of this server's pid (the token in the name).
The scratch copy is outside the cap: the volume needs room for one more
copy of the pin's blocks while a request runs.

Statuses: 400 a body that is not a bundle's tar, a manifest or block
that fails bundle.py's checks, a namespace refused; 404 no such pin; 409
a pin over the budget (from the manifest alone, before its blocks are
uploaded, when it is over the whole budget); 413 a member larger than the
manifest lists, or a bundle larger than the volume's free space.

An import is refused with nothing written unless the bundle's namespace is
this server's: the server asks its engine once (a one-token request with
the pin flag, whose reply names the namespace; request_keys.py), since
only the engine core computes it (disk/namespace.py). If the engine
cannot say, the store's own check stands alone (bundle_import.py: the
store must know the namespace).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import shutil
import stat
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs, unquote

from vllm_uma.kv_offload.disk import admin
from vllm_uma.kv_offload.disk.block_file import pid_is_alive
from vllm_uma.kv_offload.pins import book, bundle_tar
from vllm_uma.kv_offload.pins.api_requests import PREFIX, ApiError, namespace_arg, warm_request
from vllm_uma.kv_offload.pins.asgi_call import post_json
from vllm_uma.kv_offload.pins.bundle import BundleError, Manifest
from vllm_uma.kv_offload.pins.bundle_export import export_pin
from vllm_uma.kv_offload.pins.bundle_import import StoreLimits, check_namespace, import_bundle
from vllm_uma.kv_offload.pins.http_stream import AsgiBody, Scratch, TarReply
from vllm_uma.kv_offload.pins.request_keys import PIN_PARAM
from vllm_uma.log import get_logger, human_size

logger = get_logger(__name__)

SCRATCH = "http-bundles"  # under .noindex; not a namespace's name, so no scan reads it
IMPORT = PREFIX + "/import"
BUNDLE = "/bundle"
PROBE_PROMPT = "."  # shorter than any KV block: nothing stored, nothing pinned


class BundleRoutes:
    """The two routes; one per pins middleware (one per API-server process)."""

    def __init__(self, app):
        self.app = app  # vLLM's app below the pins middleware
        self._token = secrets.token_hex(4)  # names this life's scratch directories
        self._namespace: bytes | None = None  # this server's, once its engine said
        self._removals: set[asyncio.Task] = set()

    @staticmethod
    def handles(method: str, path: str) -> bool:
        if method == "POST":
            return path == IMPORT
        return method == "GET" and path.startswith(PREFIX + "/") and path.endswith(BUNDLE)

    async def answer(self, scope, receive, disk) -> tuple[int, dict | TarReply]:
        """The import's JSON, or the export's TarReply (http_api's _route
        sends it); ApiError or book.PinError before anything is sent."""
        query = parse_qs(scope.get("query_string", b"").decode())
        root = Path(disk.root_dir)
        if scope["method"] == "GET":
            name = book.check_name(unquote(scope["path"][len(PREFIX) + 1 : -len(BUNDLE)]))
            namespace = namespace_arg(query.get("namespace", [None])[0])
            work = functools.partial(self._export, receive, root, name, namespace)
        else:
            work = functools.partial(self._import, scope, receive, disk, _ttl_arg(query))
        with _refusals():
            scratch = await asyncio.to_thread(self._scratch, root)
        try:
            reply = await work(scratch)
        except BaseException:
            await scratch.remove()
            raise
        if not isinstance(reply, TarReply):  # a TarReply removes it once sent
            await scratch.remove()
        return 200, reply

    async def _export(self, receive, root: Path, name: str, namespace, scratch) -> TarReply:
        started = time.monotonic()
        out = scratch.path / "bundle"
        with _refusals():
            done = await scratch.run(export_pin, root, name, out, namespace)
            files = await scratch.run(bundle_tar.members, out, done.manifest)
        m = done.manifest
        logger.info(
            "Sending pin %r as a bundle: %d of its %d blocks, %s%s (exported in %.1f s).",
            name, len(m.blocks), len(m.pin.keys), human_size(sum(f.size for f in files)),
            "" if done.stopped is None else f"; only a prefix, it stops at {done.stopped}",
            time.monotonic() - started,
        )  # fmt: skip
        return TarReply(scratch, files, receive, f"{name}.tar")

    async def _import(self, scope, receive, disk, ttl_s: float | None, scratch) -> dict:
        started = time.monotonic()
        root, out = Path(disk.root_dir), scratch.path / "bundle"
        limits = StoreLimits(disk.cap_bytes, disk.cap_reason, disk.pin_share)

        async def admit(manifest: Manifest) -> None:
            """Before any block is read: the checks a manifest alone allows."""
            await self._check_namespace(scope, manifest)
            await scratch.run(check_namespace, root, manifest)
            await scratch.run(_check_room, root, manifest, limits)

        with _refusals():
            await bundle_tar.unpack(AsgiBody(receive), out, scratch.run, admit)
            done = await scratch.run(import_bundle, root, out, limits, ttl_s)
        m, pin = done.manifest, done.pin
        logger.info(
            "Imported pin %r (model %s) over HTTP: %d blocks written, %d already in the store, "
            "%d of its %d blocks on disk, in %.1f s.",
            pin.name, m.model, done.written, done.already, pin.blocks_on_disk, pin.blocks,
            time.monotonic() - started,
        )  # fmt: skip
        return {
            **pin.as_json(time.time()),
            "model": m.model,
            "blocks_written": done.written,
            "blocks_already": done.already,
        }

    async def _check_namespace(self, scope, manifest: Manifest) -> None:
        ours = self._namespace or await self._ask_engine(scope)
        if ours is None or ours == manifest.namespace:
            return
        args = scope["app"].state.args
        raise ApiError(
            400,
            f"bundle of model {manifest.model!r} (namespace {manifest.namespace.hex()}) refused, "
            f"nothing written: this server ({(args.served_model_name or [args.model])[0]}) "
            f"writes namespace {ours.hex()}, so it would never serve these blocks. Import it "
            f"into a server of {manifest.model!r} with the same KV settings.",
        )

    async def _ask_engine(self, scope) -> bytes | None:
        """The namespace this server's engine stores under, or None if it
        cannot say (logged)."""
        path, body = warm_request(scope["app"], {"prompt": PROBE_PROMPT})
        status, reply = await post_json(self.app, scope, path, body)
        try:
            self._namespace = bytes.fromhex(reply["kv_transfer_params"][PIN_PARAM]["namespace"])
        except (KeyError, TypeError, ValueError):
            logger.warning(
                "Bundle import: the engine did not say which namespace it writes (HTTP %d: "
                "%.200r); the store's own check stands alone.", status, reply,
            )  # fmt: skip
        return self._namespace

    def _scratch(self, root: Path) -> Scratch:
        """A new private directory for one request, leftovers removed first."""
        base = admin.store_dir(root) / SCRATCH
        with contextlib.suppress(FileExistsError):
            os.mkdir(base, 0o700)
        if not stat.S_ISDIR(os.lstat(base).st_mode):
            raise ApiError(500, f"{base} is not a directory (a symlink?): remove it")
        for entry in os.scandir(base):
            if _left_behind(entry.name, self._token):
                shutil.rmtree(entry.path, ignore_errors=True)
        path = tempfile.mkdtemp(prefix=f"{os.getpid()}-{self._token}-", dir=base)
        return Scratch(Path(path), self._removals)


def _left_behind(name: str, token: str) -> bool:
    """A scratch directory (``<pid>-<token>-<random>``) of a process gone,
    or of an earlier life of this one's pid (a restarted container's)."""
    pid, _, rest = name.partition("-")
    if not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return not rest.startswith(token + "-")
    return not pid_is_alive(int(pid))


def _check_room(root: Path, manifest: Manifest, limits: StoreLimits) -> None:
    """Refuse what could never land, before its blocks are uploaded: a pin
    over the whole pin budget (book.pin would refuse it after), a bundle
    larger than the volume's free space (its scratch copy)."""
    budget = book.PinBudget(limits.pin_share, limits.cap_bytes).disk_bytes
    pin_bytes = len(manifest.pin.keys) * manifest.block_bytes
    if budget is not None and pin_bytes > budget:
        raise book.PinOverBudget(
            f"pin {manifest.pin.name!r} refused, nothing written: its {len(manifest.pin.keys)} "
            f"blocks ({human_size(pin_bytes)}) are over this server's pin budget of "
            f"{human_size(budget)} even with no other pin (pin_share {limits.pin_share:g} of "
            f"the {human_size(limits.cap_bytes or 0)} cap). Raise pin_share or max_size_gib "
            f"in the fs tier's settings."
        )
    need = sum(block.size for block in manifest.blocks)
    vfs = os.statvfs(root)
    free = vfs.f_bavail * vfs.f_frsize
    if need > free:
        raise bundle_tar.TarRefused(
            413,
            f"the bundle's {len(manifest.blocks)} blocks ({human_size(need)}) are more than the "
            f"{human_size(free)} free on the store's volume: free some space, then send it again.",
        )


@contextlib.contextmanager
def _refusals():
    """The bundle modules' errors as the API's statuses (book.PinError and
    its PinNotFound: http_api's own 400 and 404)."""
    try:
        yield
    except bundle_tar.TarRefused as exc:
        raise ApiError(exc.status, str(exc)) from None
    except book.PinOverBudget as exc:
        logger.warning("Bundle import refused: %s", exc)
        raise ApiError(409, str(exc)) from None
    except admin.StoreError as exc:  # the server's own store is not one any more
        raise ApiError(500, str(exc)) from None
    except BundleError as exc:
        raise ApiError(400, str(exc)) from None
    except OSError as exc:  # a full disk while the scratch copy is written
        raise ApiError(500, f"the bundle could not be handled: {exc}") from None


def _ttl_arg(query: dict) -> float | None:
    raw = query.get("ttl_s", [None])[0]
    if raw is None:
        return None
    try:
        return book.check_ttl(float(raw))
    except ValueError:  # float's, or check_ttl's PinError
        raise ApiError(
            400, f"ttl_s={raw!r} is not valid: seconds above 0, at most ten years"
        ) from None
