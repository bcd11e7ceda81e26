"""The ``vllm-uma`` command line, one module per subcommand.

main.py dispatches ``vllm-uma SUBCOMMAND`` to serve.py, prepare_model.py,
fleet.py or kv_store.py; each has the same shape: ``build_parser()``, a
``main(argv)`` that returns an exit status, errors in one line the vLLM way.
preflight.py and engine_watch.py serve ``serve``; venv_check.py is run by
scripts/install.sh.

Runs in the process the user starts; vLLM's processes never import it.
"""
