"""A publisher in its own process, for the CAS race tests.

Usage: ``python race_worker.py STORE_URL``. Prints ``ready`` once imported and
connected, then runs one JSON command per stdin line and answers one JSON line each:
``{"op": "publish"|"rollback", "start_at": epoch_seconds, ...}`` ->
``{"won": release_id}`` or ``{"conflict": current_head}`` or ``{"error": text}``.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from reef.releases import ReleaseChain, ReleaseConflictError


def run(chain: ReleaseChain, command: dict[str, Any]) -> dict[str, Any]:
    time.sleep(max(0.0, command["start_at"] - time.time()))
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
        print(json.dumps(run(chain, json.loads(line))), flush=True)
    chain.close()


if __name__ == "__main__":
    main()
