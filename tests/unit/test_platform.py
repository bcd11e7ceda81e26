"""The platform's memory accounting and registration (vllm_uma/plugin/platform.py)."""

from importlib.metadata import entry_points
from types import SimpleNamespace

import psutil
import pytest

import vllm_uma
from vllm_uma.plugin.platform import (
    UmaPlatform,
    keep_single_worker_in_process,
    use_releasing_scheduler,
)
from vllm_uma.plugin.uma_settings import UmaSettings, UmaSettingsError


def test_registered_as_a_vllm_platform_plugin():
    plugins = {ep.name: ep for ep in entry_points(group="vllm.platform_plugins")}
    assert plugins["uma"].value == "vllm_uma:register"
    assert plugins["uma"].load()() == "vllm_uma.plugin.platform.UmaPlatform"


def test_vllm_resolves_to_our_platform():
    from vllm.platforms import current_platform

    assert isinstance(current_platform, UmaPlatform)
    assert current_platform.is_cpu()  # vLLM's CPU code paths still apply


def test_device_memory_is_all_of_the_ram():
    # Not the NUMA node's figure, which is a third of the RAM on some VMs.
    assert UmaPlatform.get_device_total_memory() == psutil.virtual_memory().total


def test_one_device_no_pinned_memory():
    assert UmaPlatform.device_count() == 1
    assert UmaPlatform.is_pin_memory_available() is False


def test_register_declines_off_linux(monkeypatch):
    monkeypatch.setattr(vllm_uma.sys, "platform", "darwin")
    assert vllm_uma.register() is None


@pytest.mark.parametrize(
    "requested, after_cpu_platform, world_size, expected",
    [
        ("uni", "mp", 1, "uni"),  # vLLM CPU's flip is undone for one worker
        ("mp", "mp", 1, "mp"),  # an explicit choice is kept
        ("uni", "mp", 2, "mp"),  # several workers stay in their processes
        ("uni", "uni", 1, "uni"),  # VLLM_ENABLE_V1_MULTIPROCESSING=0: nothing to undo
    ],
)
def test_single_worker_runs_in_process(requested, after_cpu_platform, world_size, expected):
    config = SimpleNamespace(distributed_executor_backend=after_cpu_platform, world_size=world_size)
    keep_single_worker_in_process(config, requested)
    assert config.distributed_executor_backend == expected


# -- the scheduler with the KV memory release thread ---------------------------

RELEASE_OFF = UmaSettings(release_free_kv=False, memory_pressure="off", warm_kv_tokens=0)


@pytest.mark.parametrize(
    "async_scheduling, name",
    [(False, "UmaScheduler"), (True, "UmaAsyncScheduler")],
)
@pytest.mark.parametrize(
    "uma",
    [
        UmaSettings(),
        UmaSettings(release_free_kv=False),
        UmaSettings(memory_pressure="off"),
        UmaSettings(release_free_kv=False, memory_pressure="off"),
    ],
    ids=["both", "pressure-only", "idle-only", "warm-reserve-only"],
)
def test_the_releasing_scheduler_matches_async_scheduling(async_scheduling, name, uma):
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    config = SimpleNamespace(scheduler_cls=None, async_scheduling=async_scheduling)
    use_releasing_scheduler(config, uma)
    assert config.scheduler_cls == f"vllm_uma.memory_release.scheduler.{name}"
    cls = resolve_obj_by_qualname(config.scheduler_cls)
    assert issubclass(cls, AsyncScheduler if async_scheduling else Scheduler)
    assert issubclass(cls, Scheduler)
    assert issubclass(cls, AsyncScheduler) is async_scheduling


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_engine_core_rerunning_the_hook_keeps_the_scheduler(async_scheduling):
    config = SimpleNamespace(scheduler_cls=None, async_scheduling=async_scheduling)
    use_releasing_scheduler(config, UmaSettings())
    chosen = config.scheduler_cls
    use_releasing_scheduler(config, UmaSettings())
    assert config.scheduler_cls == chosen


def test_diffusion_models_keep_the_scheduler_vllm_picks_for_them():
    config = SimpleNamespace(scheduler_cls=None, async_scheduling=False)
    use_releasing_scheduler(config, UmaSettings(), diffusion=True)
    assert config.scheduler_cls is None


@pytest.mark.parametrize("user_cls", [None, "my.sched.Custom"])
def test_release_off_leaves_the_scheduler_alone(user_cls):
    config = SimpleNamespace(scheduler_cls=user_cls, async_scheduling=True)
    use_releasing_scheduler(config, RELEASE_OFF)
    assert config.scheduler_cls == user_cls


@pytest.mark.parametrize(
    "user_cls",
    ["my.sched.Custom", "vllm.v1.core.sched.scheduler.Scheduler", "vllm_uma.memory_release.x"],
)
def test_a_user_scheduler_is_refused_with_the_fix(user_cls):
    config = SimpleNamespace(scheduler_cls=user_cls, async_scheduling=False)
    with pytest.raises(UmaSettingsError) as err:
        use_releasing_scheduler(config, UmaSettings())
    message = str(err.value)
    assert message.startswith(f"--scheduler-cls {user_cls!r} replaces the scheduler")
    assert "Remove --scheduler-cls" in message
    assert '"release_free_kv": false, "memory_pressure": "off", "warm_kv_tokens": 0' in message
    assert config.scheduler_cls == user_cls
