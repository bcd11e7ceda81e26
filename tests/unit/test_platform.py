"""The platform's memory accounting and registration (vllm_uma/platform.py)."""

from importlib.metadata import entry_points
from types import SimpleNamespace

import psutil
import pytest

import vllm_uma
from vllm_uma.platform import UmaPlatform, keep_single_worker_in_process


def test_registered_as_a_vllm_platform_plugin():
    plugins = {ep.name: ep for ep in entry_points(group="vllm.platform_plugins")}
    assert plugins["uma"].value == "vllm_uma:register"
    assert plugins["uma"].load()() == "vllm_uma.platform.UmaPlatform"


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
