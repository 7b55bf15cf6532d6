"""Third-party libraries' notices about their own API changes, kept out of Reef's output.

transformers (and its neighbours) raise ``FutureWarning`` when Reef's code, a model's
files or another library use an API they plan to change (a renamed argument or method).
Someone running ``reef serve`` can do nothing about them, so the process entries
(``reef``, and the children ``reef serve`` starts: ``python -m reef.engine``, ``python
-m reef.learning.trainers``) hide them, narrowly: that category, raised from
those libraries' modules. Reef's own warnings and every other category still show, and
the test suite keeps turning warnings into errors.
"""

from __future__ import annotations

import warnings

# The libraries whose deprecation notices are theirs to act on, not an operator's.
QUIET_LIBRARIES = ("transformers", "huggingface_hub", "peft", "trl", "accelerate")


def filter_third_party_warnings() -> None:
    """Ignore ``FutureWarning`` raised from a module of :data:`QUIET_LIBRARIES` (for the
    rest of this process)."""
    for library in QUIET_LIBRARIES:
        warnings.filterwarnings("ignore", category=FutureWarning, module=rf"{library}(\.|$)")
