"""Loggers that print through vLLM's logging set-up.

vLLM configures handlers and its format ("(Worker pid=..) INFO ... [file:line]")
on the ``vllm`` logger only, so a logger outside that hierarchy prints nothing
at INFO. Ours are children of it.
"""

from vllm.logger import init_logger


def get_logger(module_name: str):
    return init_logger(f"vllm.plugins.{module_name}")
