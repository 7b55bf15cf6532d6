"""Learning jobs: the queue that the gateway and triggers fill and workers drain.

Owns: ``JobQueue`` (enqueue, claim with a lease, heartbeat, complete, fail, cancel,
list) over the ``jobs`` table, a store on the ``reef.db.Database`` it is handed, the
``Job`` value and the queue's errors.
Does not own: what a job does (``reef.learning.worker``), the table's schema and
migrations (``reef.db``). Must not import ``reef.gateway``, ``reef.learning`` or another
store's package (experience, releases).
"""

from reef.jobs.queue import (
    DEFAULT_MAX_ATTEMPTS,
    JOB_STATES,
    Job,
    JobCancelledError,
    JobNotFoundError,
    JobQueue,
    LeaseLostError,
    NoRecipeError,
    job_holdings,
)

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "JOB_STATES",
    "Job",
    "JobCancelledError",
    "JobNotFoundError",
    "JobQueue",
    "LeaseLostError",
    "NoRecipeError",
    "job_holdings",
]
