"""``python -m reef.engine serve …``: how ``reef serve`` starts the engine as a child
(``reef.engine.command``)."""

import sys

from reef.engine.command import main

if __name__ == "__main__":
    sys.exit(main())
