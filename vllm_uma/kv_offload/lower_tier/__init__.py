"""The skeleton every lower tier (disk/, network/) plugs into: threads, jobs, reports.

Engine-core process. vLLM's TieringOffloadingManager calls a secondary
tier on the scheduler thread, and no call may block on the medium; so a
tier hands its I/O to threads of its own and answers vLLM from what they
report back. That machinery is the same for every tier, and lives here:

    threads.py   TierThreads: daemon threads running a tier's work by
                 priority (loads, deletes, stores), some of them for loads
                 only if the tier asks; a stop drains the stores queued
                 before it within a deadline and drops the loads
    jobs.py      Job and JobBook: one vLLM job in flight until its one
                 JobResult (a partly failed load keeps what it restored)
    metrics.py   the counters every tier has (blocks and bytes moved,
                 hits, stores failed and skipped, bad values), named
                 vllm:kv_offload_{tier}_..., and the counts per interval
    reports.py   TierReports: those counts, KV events, bad values counted
                 and warned of, warnings rate-limited by kind, the
                 start-up line ("{tier} at {where}: {facts}.")

    scheduler thread (vLLM calls the tier)     the tier's threads
    submit_store / submit_load
      a Job tracked in the JobBook
      its parts -> TierThreads.submit  ----->  task(part) -> result
                                               (a task that raised:
                                                failed(part, exc);
    get_finished_jobs                           dropped at a stop:
      drain(results) <---- results queue -----  dropped(part))
      the tier applies each result;
      Job.part_done: the last part finishes
      the Job -> JobBook.take_results -> vLLM

What a tier supplies:

    what          disk/                            network/
    a part        one block file (io_tasks.py)     one job's blocks (transfers.py)
    its task      store, load or delete the file   pipelined SETs or MGETs
    priorities    LOAD, DELETE, STORE              LOAD, STORE
    threads       8, uma-kv-disk-{i}, all alike    2, uma-kv-net-{i}, the first
                                                   for loads only
    failed        the block an io_error            the job's blocks misses (error)
    dropped       nothing (counted, for the stop   the job's blocks misses
                  line)                            (engine_down)
    results queue shared with the ledger feed      its own
    a result's    the index, the ledger's touches, the recent keys, load misses
    meaning       bad files deleted                and bad values by reason
    its metrics   eviction, peers' changes, loads  load misses, the KV server up,
                  given up, used and cap bytes     refused nodes
    warnings      each kind once                   each kind once a minute
    bad values    block files (bad_blocks)         values (bad_values)
    KV events     LOCAL, no ownership              REMOTE, the cache's id
    start-up      root_dir: files, GiB, cap, I/O   URL, KV server, namespace: share,
    line                                           signing

What stays in a tier, because one shared form would change what it does:
the load deadline. The disk tier gives up, on the scheduler thread, a load
no I/O thread has started in time (disk/io_descriptors.py's ``Ticket``):
a read from a hung mount cannot time out, so only the loads it is inside
wait for it. The network tier's deadline travels with the job, and every
socket read of its round trips honours it; with its load-only thread a
load waits only for the loads before it, so the scheduler never gives one
up.

Each tier reports through one TierReports (reports.py) on its own logger,
so its lines keep their tier's name and logger; what it counts besides
the shared counters its own metrics module names and defines.
"""
