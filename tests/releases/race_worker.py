"""A publisher in its own process, for the CAS race tests.

Usage: ``python race_worker.py STORE_URL``. Prints ``ready`` once imported and
connected. Then, for each race: reads one JSON command line
(``{"op": "publish"|"rollback", ...}``), prints ``armed``, waits for a ``go`` line (the
starting gun, fired once every racer is armed), runs the command and answers one JSON
line: ``{"won": release_id}`` or ``{"conflict": current_head}`` or ``{"error": text}``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from reef.releases import ReleaseChain, ReleaseConflictError


def run(chain: ReleaseChain, command: dict[str, Any]) -> dict[str, Any]:
    try:
        if command["op"] == "publish":
            release = chain.publish(
                command["candidate"], command["expected"], command["actor"], "race"
            )
        else:
            release = chain.rollback(
                command["scenario"], command["to"], command["expected"], command["actor"], "race"
            )
    except ReleaseConflictError as error:
        return {"conflict": error.current}
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"}
    return {"won": release.id}


def main() -> None:
    chain = ReleaseChain.from_url(sys.argv[1], migrate=False)
    chain.heads_snapshot()  # connect before the race, not during it
    print("ready", flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        print("armed", flush=True)
        if sys.stdin.readline().strip() != "go":
            break
        print(json.dumps(run(chain, command)), flush=True)
    chain.close()


if __name__ == "__main__":
    main()
