"""Learning jobs: the queue that the gateway and triggers fill and workers drain.

Owns: ``JobQueue`` (enqueue, claim with a lease, heartbeat, complete, fail, cancel,
list) over the ``jobs`` table, the ``Job`` value and the queue's errors.
Does not own: what a job does (``reef.learning.worker``), the table's schema and
migrations (``reef.experience``). Must not import ``reef.gateway`` or ``reef.learning``.
"""

from reef.jobs.queue import (
    DEFAULT_MAX_ATTEMPTS,
    Job,
    JobCancelledError,
    JobNotFoundError,
    JobQueue,
    LeaseLostError,
)

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "Job",
    "JobCancelledError",
    "JobNotFoundError",
    "JobQueue",
    "LeaseLostError",
]
