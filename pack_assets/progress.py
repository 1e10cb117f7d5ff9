"""Progress of the shard runs on stderr: a tqdm bar (shards/s, samples/s, ETA) on a terminal; otherwise
plain lines, one per shard for a few shards and at most MAX_LINES in all for many (logs stay readable)."""

from __future__ import annotations

import sys
import time

MAX_LINES = 20


def _eta(seconds: float) -> str:
    m, s = divmod(int(seconds + 0.5), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class ShardProgress:
    """`update(key, samples)` after each shard run. With a `log` function (library use, tests) only plain
    lines go to it; otherwise the bar is used when `stream` (default stderr) is a terminal."""

    def __init__(self, total: int, log=None, stream=None) -> None:
        stream = sys.stderr if stream is None else stream
        self.total, self.done, self.samples, self.t0 = total, 0, 0, time.perf_counter()
        self.log = log or (lambda msg: print(msg, file=stream, flush=True))
        self.bar = None
        isatty = getattr(stream, "isatty", None)
        if log is None and total and isatty is not None and isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="shard", desc="shards", file=stream, dynamic_ncols=True)

    def update(self, key: str, samples: int | None = None) -> None:
        self.done += 1
        self.samples += samples or 0
        took = time.perf_counter() - self.t0
        rate = self.samples / took if took > 0 else 0.0
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self.samples} samples, {rate:.0f} samples/s", refresh=False)
            self.bar.update(1)
        elif self.total <= MAX_LINES:
            self.log(f"[{self.done}/{self.total}] scanned and counted {key}")
        elif self.done * MAX_LINES // self.total > (self.done - 1) * MAX_LINES // self.total:
            eta = took / self.done * (self.total - self.done)
            self.log(f"[{self.done}/{self.total}] shards scanned and counted ({self.done / self.total:.0%}), "
                     f"{self.samples} samples, {rate:.0f} samples/s, ETA {_eta(eta)}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> ShardProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
