"""Which counter counts a profile's samples: the fast rule (core/counting/tokens.py) for a profile that has one, else
the folder's own processor (core/counting/procount.py). Every stage that counts (token_lengths, the audit's recount,
`pack-assets count`) asks here, so neither counter knows of the other."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

from ..reasons import ReasonError
from . import procount
from .profiles import ModelProfile
from .tokens import TokenCounter


class Counter(Protocol):
    profile: ModelProfile

    def count_many(self, items: Iterable[tuple[list[dict], list, list]]) -> Iterator[dict | ReasonError]:
        """(messages, image_sizes [[w, h]], videos [meta]) -> counts, or a ReasonError, in input order."""


def counter_for(profile: ModelProfile, **fast_options) -> Counter:
    """The counter of ``profile``'s rule (the processor's is built once per profile and process);
    ``fast_options`` go to the fast rule's `TokenCounter` (backend, chunk_cache)."""
    if profile.rule == "processor":
        return procount.processor_counter(profile)
    return TokenCounter(profile, **fast_options)
