"""The process that hashes the kept output shards for `filedigest.EarlyDigests`: started by it with
``python -m pack_assets.core.earlyproc THREADS``, given the paths as one JSON list on its stdin, it answers one
JSON line per file as each is hashed: ``[path, digest, identity]``, digest and identity null where the file could
not be read or changed while it was read (`filedigest.identified_digest`). A process of its own, not threads of
the command's: its threads' every read would take the command's GIL back, and the plan's and the writer's
small reads, waiting on that GIL between their own, ran at half their speed beside them. It ends when its
stdin closes (the command closed it, or ended), whatever it is reading."""

from __future__ import annotations

import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from .filedigest import identified_digest


def _answer(path: str, lock: threading.Lock) -> None:
    got = identified_digest(path)
    line = json.dumps([path, *(got or (None, None))]) + "\n"
    with lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def _end_with_stdin() -> None:
    sys.stdin.read()  # returns at EOF: the command closed our stdin, or is gone
    os._exit(0)


def main(threads: int) -> None:
    paths = json.loads(sys.stdin.readline())
    threading.Thread(target=_end_with_stdin, daemon=True).start()
    lock = threading.Lock()
    with ThreadPoolExecutor(max(1, threads)) as pool:
        list(pool.map(lambda p: _answer(p, lock), paths))


if __name__ == "__main__":
    main(int(sys.argv[1]))
