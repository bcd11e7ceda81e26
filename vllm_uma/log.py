"""Loggers that print through vLLM's logging set-up.

vLLM configures handlers and its format ("(Worker pid=..) INFO ... [file:line]")
on the ``vllm`` logger only, so a logger outside that hierarchy prints nothing
at INFO. Ours are children of it.

vLLM is imported on the first call only: the admin commands that print
sizes (``vllm-uma kv-store``) stay free of its seconds of import.
"""


def get_logger(module_name: str):
    from vllm.logger import init_logger

    return init_logger(f"vllm.plugins.{module_name}")


def human_size(nbytes: int) -> str:
    """A size as people read it, one way for every line the plugin prints."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"
