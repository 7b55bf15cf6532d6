"""``python -m reef.engine serve …``: how ``reef serve`` starts the engine as a child
(``reef.engine.command``)."""

import sys

from reef.core.third_party import filter_third_party_warnings
from reef.engine.command import main

if __name__ == "__main__":
    # Its stderr is ``reef serve``'s: the same notices are hidden as there.
    filter_third_party_warnings()
    sys.exit(main())
