"""A torchrun-style script, unchanged: it reads its ranks from the environment and writes what it
saw to the file named by its first argument (suffixed with its rank). Exit status from argv."""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    out, status = sys.argv[1], int(sys.argv[2])
    seen = {
        "argv": sys.argv,
        "name": __name__,
        "env": {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")},
    }
    with open(f"{out}.{os.environ['RANK']}", "w") as f:
        json.dump(seen, f)
    return status


if __name__ == "__main__":
    sys.exit(main())
