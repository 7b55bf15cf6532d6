"""The learners' own error (re-exported as ``reef.learning.learners.NoCandidateError``)."""

from reef.core.errors import ReefError


class NoCandidateError(ReefError):
    """A learner found nothing worth proposing; the message says why."""
