"""One vLLM job's blocks moved between pool rows and the engine, pipelined.

Runs on the network tier's transfer threads (engine-core process), the only
place values cross the network while serving. A job is a prefix's blocks
(vLLM submits one per request and step): a load is one MGET per
``BATCH_BLOCKS`` names, a store one pipeline of SETs per batch, so a job
costs a round trip per batch, not per block, and at most a batch of values
(8 x 2.9 MB for the default model) is in this process's memory at once.

A function here never raises and never touches the tier's state: it says
what happened in a ``TransferDone`` that the scheduler thread applies
(tier.py), one per job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

from valkey.exceptions import OutOfMemoryError, ResponseError

from vllm_uma.kv_offload.disk.block_file import BadBlock
from vllm_uma.kv_offload.network.engine_link import LINK_ERRORS, EngineLink
from vllm_uma.kv_offload.network.value_format import pack_value, unpack_value

BATCH_BLOCKS = 8


class Miss(Enum):
    """Why a block was not moved, beside a bad value's BadReason (metric label)."""

    ABSENT = "absent"  # a load found no value: evicted by the engine, or never stored
    ENGINE_DOWN = "engine_down"  # no answer in time, or the link is down
    ENGINE_SLOW = "engine_slow"  # answers, but a load's batches took past its timeout
    ENGINE_FULL = "engine_full"  # a store refused with an OOM error
    REFUSED = "refused"  # another error reply (an ACL's NOPERM, ...)
    ERROR = "error"  # a bug of ours; the block is a miss all the same


@dataclass(frozen=True, slots=True)
class Transfer:
    """One vLLM job as a transfer thread sees it."""

    job_id: int
    is_load: bool
    keys: tuple[bytes, ...]
    names: tuple[bytes, ...]  # the engine's key per block (value_format.py)
    rows: tuple[memoryview, ...]  # the primary rows, pinned by vLLM until the result


@dataclass(slots=True)
class TransferDone:
    job_id: int
    is_load: bool
    failed: dict[bytes, str] = field(default_factory=dict)  # key -> Miss or BadReason value
    moved: list[bytes] = field(default_factory=list)
    nbytes: int = 0
    seconds: float = 0.0
    bad: list[str] = field(default_factory=list)  # what was wrong with each bad value


def failed_all(transfer: Transfer, reason: Miss) -> TransferDone:
    done = TransferDone(transfer.job_id, transfer.is_load)
    done.failed = dict.fromkeys(transfer.keys, reason.value)
    return done


def run_transfer(link: EngineLink, namespace: bytes, transfer: Transfer) -> TransferDone:
    if link.fail_fast():
        return failed_all(transfer, Miss.ENGINE_DOWN)
    try:
        move = load_blocks if transfer.is_load else store_blocks
        return move(link, namespace, transfer)
    except Exception as exc:  # a bug must still end its job, as misses
        done = failed_all(transfer, Miss.ERROR)
        done.bad.append(f"{type(exc).__name__}: {exc}")
        return done


def _batches(transfer: Transfer):
    for i in range(0, len(transfer.keys), BATCH_BLOCKS):
        end = i + BATCH_BLOCKS
        yield i, zip(transfer.keys[i:end], transfer.names[i:end], transfer.rows[i:end], strict=True)


def load_blocks(link: EngineLink, namespace: bytes, transfer: Transfer) -> TransferDone:
    done = TransferDone(transfer.job_id, transfer.is_load)
    bad_names: list[bytes] = []
    start = time.perf_counter()
    for i, batch in _batches(transfer):
        if time.perf_counter() - start > link.timeout_s:
            # A slow engine that still answers: the request waited a timeout
            # already; the rest is recomputed rather than waited for.
            done.failed.update(dict.fromkeys(transfer.keys[i:], Miss.ENGINE_SLOW.value))
            break
        blocks = list(batch)
        try:
            values = link.client.mget([name for _, name, _ in blocks])
        except LINK_ERRORS as exc:
            link.went_down(exc, "a load")
            done.failed.update(dict.fromkeys(transfer.keys[i:], Miss.ENGINE_DOWN.value))
            break
        except ResponseError:
            done.failed.update({key: Miss.REFUSED.value for key, _, _ in blocks})
            continue
        for (key, name, row), value in zip(blocks, values, strict=True):
            if value is None:
                done.failed[key] = Miss.ABSENT.value
                continue
            try:
                unpack_value(value, name, key, namespace, row)
            except BadBlock as bad:
                done.failed[key] = bad.reason.value
                done.bad.append(str(bad))
                bad_names.append(name)
                continue
            done.moved.append(key)
            done.nbytes += row.nbytes
    done.seconds = time.perf_counter() - start
    _forget(link, bad_names)
    return done


def _forget(link: EngineLink, names: list[bytes]) -> None:
    """Delete values that can never be served, so that no lookup finds them
    again. A good copy another server stored meanwhile may go too: a miss,
    never wrong bytes."""
    if not names:
        return
    try:
        link.client.delete(*names)
    except LINK_ERRORS as exc:
        link.went_down(exc, "deleting bad values")
    except ResponseError:
        pass  # the ACL may forbid DEL: the value stays a counted miss


def store_blocks(link: EngineLink, namespace: bytes, transfer: Transfer) -> TransferDone:
    done = TransferDone(transfer.job_id, transfer.is_load)
    start = time.perf_counter()
    for i, batch in _batches(transfer):
        blocks = list(batch)
        pipe = link.client.pipeline(transaction=False)
        for key, name, row in blocks:
            pipe.set(name, pack_value(key, namespace, row))
        try:
            replies = pipe.execute(raise_on_error=False)
        except LINK_ERRORS as exc:
            link.went_down(exc, "a store")
            done.failed.update(dict.fromkeys(transfer.keys[i:], Miss.ENGINE_DOWN.value))
            break
        finally:
            pipe.reset()  # the batch's values go now, not with the pipeline
        for (key, _, row), reply in zip(blocks, replies, strict=True):
            if isinstance(reply, OutOfMemoryError):
                link.refused_write(reply)
                done.failed[key] = Miss.ENGINE_FULL.value
            elif isinstance(reply, Exception):
                done.failed[key] = Miss.REFUSED.value
            else:
                done.moved.append(key)
                done.nbytes += row.nbytes
        if any(not isinstance(reply, Exception) for reply in replies):
            link.took_write()  # ends a full engine's episode, if one was on
    done.seconds = time.perf_counter() - start
    return done
