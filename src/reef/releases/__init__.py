"""Releases: content-addressed artifacts, candidates, and the append-only release chain.

Owns: the artifact store (adapters and harness bundles stored by sha256 digest, local
directory or any fsspec URL, atomic writes, verified reads, garbage collection of what
no release or live candidate references); release manifests (every component by
digest); candidates and their lifecycle; each scenario's append-only chain of releases
(create, learn, promote, rollback, adopt) whose head moves only by compare-and-swap, recording
who, when, why and the evaluation evidence; noticing head moves (polling, and
LISTEN/NOTIFY on PostgreSQL); the fingerprint format of trained artifacts and how a
server's answers are compared with it (``fingerprints``).
Does not own: the SQL schema and its migrations (``db`` — one migration stream covers
the database; this package reads and writes the ``candidates``, ``releases``,
``heads`` and ``artifacts`` tables), harness bundle contents (``harness``), deciding
whether a candidate passes (``evaluation``), loading adapters into servers or serving
(``gateway``, ``upstream``). Must not import gateway, learning or torch.
Extend: a new artifact backend implements ``ArtifactStore``; the chain is one class
(``ReleaseChain``) on the ``reef.db.Database`` it is handed, no plugin point.
Must not import another store's package (experience, evaluation, jobs).
"""

# -- artifacts (artifacts*.py) ---------------------------------------------------------
from reef.releases.artifacts import (
    ArtifactCorruptError,
    ArtifactInfo,
    ArtifactLayout,
    ArtifactNotFoundError,
    ArtifactStore,
    ArtifactTransferError,
    InvalidDigestError,
    collect_garbage,
)
from reef.releases.artifacts_fsspec import FsspecArtifactStore, open_artifact_store

# -- release chain (chain.py, manifest.py, values.py, errors.py, headwatch.py) -------------
from reef.releases.chain import MAX_PAGE, ReleaseChain, ScenarioHoldings
from reef.releases.errors import (
    CandidateNotFoundError,
    InvalidTransitionError,
    ReleaseConflictError,
    ReleaseNotFoundError,
    ScenarioHasNoReleaseError,
    ScenarioInUseError,
    ScenarioNotFoundError,
)

# -- fingerprints (fingerprints.py) -------------------------------------------------------
from reef.releases.fingerprints import (
    BUILTIN_PROMPTS,
    FINGERPRINT_FILE,
    FINGERPRINT_META_KEY,
    FINGERPRINT_TOLERANCE,
    MAX_NEW_TOKENS,
    Dtype,
    Fingerprint,
    FingerprintMismatch,
    FingerprintProbe,
    ProbeAnswer,
    compare_fingerprint,
    distinguishes_base,
    parse_probe_answer,
    probe_prompts,
    probe_request,
    read_fingerprint,
    serving_tolerance,
)
from reef.releases.headwatch import HEADS_CHANNEL, listen_heads, watch_heads
from reef.releases.manifest import (
    EscalationRules,
    ModelComponent,
    ReleaseManifest,
    RoutingComponent,
    TeacherEndpoint,
)
from reef.releases.values import (
    CANDIDATE_STATES,
    CANDIDATE_TRANSITIONS,
    Candidate,
    CandidateState,
    Operation,
    Release,
    ScenarioSummary,
)

__all__ = [
    # -- release chain
    "CANDIDATE_STATES",
    "CANDIDATE_TRANSITIONS",
    "HEADS_CHANNEL",
    "MAX_PAGE",
    "Candidate",
    "CandidateNotFoundError",
    "CandidateState",
    "EscalationRules",
    "InvalidTransitionError",
    "ModelComponent",
    "Operation",
    "Release",
    "ReleaseChain",
    "ReleaseConflictError",
    "ReleaseManifest",
    "ReleaseNotFoundError",
    "RoutingComponent",
    "ScenarioHasNoReleaseError",
    "ScenarioHoldings",
    "ScenarioInUseError",
    "ScenarioNotFoundError",
    "ScenarioSummary",
    "TeacherEndpoint",
    "listen_heads",
    "watch_heads",
]

# -- artifacts
__all__ += [
    "ArtifactCorruptError",
    "ArtifactInfo",
    "ArtifactLayout",
    "ArtifactNotFoundError",
    "ArtifactStore",
    "ArtifactTransferError",
    "FsspecArtifactStore",
    "InvalidDigestError",
    "collect_garbage",
    "open_artifact_store",
]

# -- fingerprints
__all__ += [
    "BUILTIN_PROMPTS",
    "FINGERPRINT_FILE",
    "FINGERPRINT_META_KEY",
    "FINGERPRINT_TOLERANCE",
    "MAX_NEW_TOKENS",
    "Dtype",
    "Fingerprint",
    "FingerprintMismatch",
    "FingerprintProbe",
    "ProbeAnswer",
    "compare_fingerprint",
    "distinguishes_base",
    "parse_probe_answer",
    "probe_prompts",
    "probe_request",
    "read_fingerprint",
    "serving_tolerance",
]
