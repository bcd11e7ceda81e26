"""What vLLM loads in every process it starts: the platform and the worker.

The platform (platform.py, named by the ``vllm.platform_plugins`` entry
point) and the worker that wires the weights and allocates the KV cache
lazily (worker.py, wiring.py, lazy_kv.py), the memory budget and its
breakdown line (memory.py; the worker measures its figures in
worker_memory.py), the CPU kernel set-up (cpu_kernels.py), what the CPU
computes in (precision.py; cpu_features.py, read without torch for
``vllm-uma serve``'s preflight), the user's ``vllm_uma``
keys parsed into settings (uma_settings.py), the settings plan the API
server carries to the engine core (settings_plan.py), the one vLLM version
they are written against (vllm_version.py), and what the scheduler side and the worker side of one
engine core share (engine_context.py).

Runs in the API server, the engine core and each worker; importing this
package imports none of its modules, so vLLM's plugin discovery stays cheap.
"""
