"""A lower tier's jobs (vllm_uma/kv_offload/lower_tier/jobs.py): one
JobResult per vLLM job, when its last part ends; a partly failed load keeps
the blocks it restored; the time is the I/O's span, None when nothing moved."""

from __future__ import annotations

from vllm_uma.kv_offload.lower_tier.jobs import Job, JobBook

KEYS = [b"a", b"b", b"c"]


def test_a_job_ends_with_its_last_part_and_times_the_io_span():
    job = Job(7, KEYS, is_load=True, pending=2)
    assert not job.part_done(100, start=10.0, end=10.5)
    assert job.part_done(50, start=10.2, end=11.0)
    result = job.result()
    assert (result.job_id, result.success, result.successful_keys) == (7, True, None)
    assert (result.transfer_time, result.transfer_bytes) == (1.0, 150)


def test_a_partly_failed_load_keeps_what_it_restored_in_prefix_order():
    job = Job(1, KEYS, is_load=True, pending=1, failed=[b"b"])
    job.part_done(10, 0.0, 1.0)
    result = job.result()
    assert not result.success and result.successful_keys == [b"a", b"c"]


def test_a_failed_store_or_a_wholly_failed_load_names_no_keys():
    store = Job(1, KEYS, is_load=False, failed=[b"b"]).result()
    load = Job(2, KEYS, is_load=True, failed=list(KEYS)).result()
    assert (store.success, store.successful_keys) == (False, None)
    assert (load.success, load.successful_keys) == (False, None)
    assert store.transfer_time is None and store.transfer_bytes == 0  # nothing moved


def test_the_book_hands_each_result_over_once_in_the_order_jobs_finished():
    book: JobBook[Job] = JobBook()
    first, second = Job(1, KEYS, is_load=False, pending=1), Job(2, [], is_load=False)
    book.track(first)
    book.track(second)
    assert 1 in book and book[2] is second and book.has_pending_work()
    book.finish(second)
    book.finish(first)
    assert [r.job_id for r in book.take_results()] == [2, 1]
    assert book.take_results() == [] and not book.has_pending_work() and 1 not in book


def test_a_part_that_moved_nothing_does_not_stretch_the_span():
    # A disk store whose block another server already wrote ends with no
    # bytes and a start of 0.0: counted, it made the span the clock itself.
    job = Job(1, ["a", "b"], is_load=False, pending=2)
    job.part_done(0, 0.0, 0.0)
    assert job.part_done(1000, 50.0, 50.5)
    assert job.result().transfer_time == 0.5
