"""Progress of a `pack-assets run` on stderr, shown only when stderr is a terminal: a line at start-up, a
tqdm bar for the shard runs (shards/s, samples/s, ETA), then one bar per pack stage as its events come
(events.py): the plan, the write (packs written) and the audit (members re-hashed). Off a terminal
(a log file, CI) nothing is shown: the summary says it all. A library caller that passes its own `log`
gets plain lines for the shards instead, one per shard for a few and at most MAX_LINES in all for many."""

from __future__ import annotations

import sys
import time

from ..events import AUDIT, PLAN, WRITE, Progress

MAX_LINES = 20


def _eta(seconds: float) -> str:
    m, s = divmod(int(seconds + 0.5), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def on_terminal(stream=None) -> bool:
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


def _bar(stream, **kw):
    from tqdm import tqdm

    return tqdm(file=stream, dynamic_ncols=True, **kw)


# a pack stage's bar: units done of all (`?` until the first is done), elapsed time, the stage's count
STAGE_FORMAT = "{desc}: {n_fmt}/{total_fmt} {unit} |{bar}| {elapsed}{postfix}"


class ShardProgress:
    """`update(key, samples)` after each shard run. With a `log` function (library use, tests) only plain
    lines go to it; otherwise a bar when `stream` (default stderr) is a terminal, and nothing when not."""

    def __init__(self, total: int, log=None, stream=None) -> None:
        stream = sys.stderr if stream is None else stream
        self.total, self.done, self.samples, self.t0 = total, 0, 0, time.perf_counter()
        self.log, self.bar = log, None
        if log is None and total and on_terminal(stream):
            self.bar = _bar(stream, total=total, unit="shard", desc="shards")

    def update(self, key: str, samples: int | None = None) -> None:
        self.done += 1
        self.samples += samples or 0
        took = time.perf_counter() - self.t0
        rate = self.samples / took if took > 0 else 0.0
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self.samples} samples, {rate:.0f} samples/s", refresh=False)
            self.bar.update(1)
        elif self.log is None:
            return
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


class StageBars:
    """An events listener (`events.listening`): a bar per pack stage on a terminal, the stage's count beside
    it; `line` for what is not a bar (start-up). Does nothing when `stream` is not a terminal."""

    STAGES = (PLAN, WRITE, AUDIT)

    def __init__(self, stream=None) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.on = on_terminal(self.stream)
        self.stage, self.bar = None, None

    def line(self, msg: str) -> None:
        if self.on:
            print(msg, file=self.stream, flush=True)

    def __call__(self, e: Progress) -> None:
        if not self.on or e.stage not in self.STAGES:
            return
        if e.stage != self.stage:
            self.close()
            self.stage = e.stage
            self.bar = _bar(self.stream, total=e.total or None, unit=e.unit, desc=e.stage, bar_format=STAGE_FORMAT)
        if e.total and self.bar.total != e.total:  # known once the stage's first unit is done
            self.bar.total = e.total
        self.bar.n = e.done
        self.bar.set_postfix_str(f"{e.count} {e.count_unit}", refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.stage, self.bar = None, None
