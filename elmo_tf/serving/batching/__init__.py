"""Batching, as TF Serving's batching/ (like --enable_batching): concurrent requests queued, merged into one model
call and split back.

    scheduler.py  BatchScheduler and BatchingOptions: the queue, its threads and timeouts, BatchStats
    merge.py      merged calls: requests concatenated into one model call and split back (run_batch)
    packed.py     the packed signature: sentences of many requests packed into rows of one call (run_packed)
"""
