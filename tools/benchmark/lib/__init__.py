"""What the benchmarks share: servers, the HTTP client, prompts, the machine, reports.

servers.py starts and stops them (vllm_uma.server_process.Server, and stock
vLLM beside it); client.py streams completions and reads /metrics;
prompts.py is the text every benchmark sends; environment.py records where a
run happened; report.py writes the JSON and lays out the tables; log.py the
progress lines; geometry.py and floors.py a model's KV bytes and the copy
and disk-read references a restore is held to. Runs in the benchmark's own
process.
"""
