"""The guard against drift: recount samples with the model's real processor and report every difference.

Counts are proven against one transformers version; a user's environment moves on (a processor default that
changes between versions, a rule that misses a case). ``pack-assets count --check N`` recounts the first N
counted records of its input with the real processor of the ``--model-dir`` folder (transformers'
``apply_chat_template`` with the same template variables, then the whole ``processor(text=..., images=...,
videos=...)`` call), each image as transformers' ``load_image`` gives it (decoded, EXIF orientation applied:
only its size decides a count, so a blank image of that size stands in) and each video by its container
metadata, as the processor rule counts videos (core/counting/procount.py). Any difference is a failure naming the
sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..jsonrecords import RecordItem, record_items
from ..reasons import ReasonError
from .procount import ProcessorCounter
from .profiles import ModelProfile, ProfileError, processor_profile


@dataclass(frozen=True)
class Difference:
    sample: str
    counted: int
    reference: int | None  # None: the processor refused the sample (``detail`` says why)
    detail: str = ""

    def line(self) -> str:
        got = self.detail if self.reference is None else f"the processor counts {self.reference}"
        return f"{self.sample}: counted {self.counted} tokens, {got}"


@dataclass
class CheckReport:
    processor: str  # the reference processor's class
    checked: int = 0
    differences: list[Difference] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences

    def summary(self) -> str:
        return (f"check: {self.checked} sample(s) recounted with {self.processor}: "
                f"{len(self.differences) or 'none'} differ")


def reference_counter(profile: ModelProfile, flag: str = "--check"):
    """The real processor of the profile's checkpoint folder, rendering with the profile's template variables;
    ProfileError where there is none to build (a built-in profile has no folder). ``flag``: what asked for
    it, for the message."""
    if not profile.model_dir:
        raise ProfileError(f"{flag} recounts with the model's processor, which needs a checkpoint folder: pass "
                           f"--model-dir (profile {profile.name} is built in)")
    ref = replace(processor_profile(profile.model_dir, profile.trust_remote_code),
                  chat_template_kwargs=profile.chat_template_kwargs)
    return ProcessorCounter(ref)


def loaded_size(path: Path) -> list[int]:
    """[width, height] of the image as transformers' ``load_image`` returns it (EXIF orientation applied)."""
    from transformers.image_utils import load_image

    return list(load_image(str(path)).size)


def check_records(profile: ModelProfile, items: Iterable[tuple[RecordItem, int]], n: int) -> CheckReport:
    """Recount the first ``n`` (record, counted total) pairs with the real processor."""
    counter = reference_counter(profile)
    report = CheckReport(type(counter.processor).__name__)
    for item, counted in items:
        if report.checked >= n:
            break
        report.checked += 1
        try:
            sizes = [loaded_size(p) for p in item.image_paths]
            ref = counter.count(item.messages, sizes, item.videos)["total_tokens"]
        except ReasonError as e:
            report.differences.append(Difference(str(item.id), counted, None, f"the processor refuses it: {e.reason}: "
                                                                                f"{e.detail}"))
            continue
        except Exception as e:  # load_image cannot decode an image the header probe read
            report.differences.append(Difference(str(item.id), counted, None, f"not loadable: {type(e).__name__}: {e}"))
            continue
        if ref != counted:
            report.differences.append(Difference(str(item.id), counted, ref))
    return report


def check_file(path: Path, media_root: Path | None, profile: ModelProfile, rows: list[dict], n: int) -> CheckReport:
    """``check_records`` on the records of a JSON(L) file that `count_records` counted (``rows``, in order)."""
    pairs = ((item, row["total_tokens"]) for item, row in zip(record_items(path, media_root), rows)
             if "total_tokens" in row)
    return check_records(profile, pairs, n)


def audit_check(con, profile: Callable[[], ModelProfile], n: int):
    """The audit's optional step (setting ``check_samples``): the first ``n`` counted samples of every shard
    (by sample id), recounted with the real processor from their manifest rows (images as blank stand-ins of
    the recorded size, which is the size ``load_image`` gives; videos by their metadata). ``profile``: resolves
    the plan's profile (its ``--model-dir`` folder may be gone since). Returns what records the outcome in the
    audit's result: a ``processor_mismatch`` violation per sample that differs, or
    ``processor_check_unavailable`` when no processor can be built."""
    import json

    if n <= 0:
        return lambda result: None
    try:
        counter = reference_counter(profile(), "check_samples")
    except (ProfileError, ImportError) as e:
        unavailable = str(e)
        return lambda result: result.add("processor_check_unavailable", unavailable)
    rows = con.execute(
        "SELECT sample_id, conversation, image_sizes, videos, total_tokens FROM (SELECT s.*, t.total_tokens, "
        "row_number() OVER (PARTITION BY s.shard ORDER BY s.sample_id) AS k FROM manifest_samples s "
        "JOIN token_lengths t USING (sample_id) WHERE t.status = 'ok') WHERE k <= ? ORDER BY sample_id", [n]).fetchall()
    diffs = []
    for sid, conv, sizes, videos, counted in rows:
        try:
            ref = counter.count(json.loads(conv), sizes or [], json.loads(videos or "[]"))["total_tokens"]
        except ReasonError as e:
            diffs.append(Difference(sid, counted, None, f"the processor refuses it: {e.reason}: {e.detail}"))
            continue
        if ref != counted:
            diffs.append(Difference(sid, counted, ref))

    def record(result) -> None:
        for d in diffs:
            result.add("processor_mismatch", d.line(), sample_id=d.sample)
        result.stats["processor_checked"] = len(rows)
        result.stats["processor"] = type(counter.processor).__name__

    return record
