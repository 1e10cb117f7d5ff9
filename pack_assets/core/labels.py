"""Label policies: which tokens of a sub-sample train (``PackEncoder``'s ``labels`` and ``loss_weights``).

A policy is chosen per dataset (the ``label_policy`` setting: one name, or in a recipe one per dataset) and
recorded in each pack's ``_meta``. On a rendered Qwen-style chat (``<|im_start|>assistant\\n ... <|im_end|>``):

- ``all`` (default): every assistant turn, its reasoning, tool calls and closing ``<|im_end|>``;
- ``last_turn``: only the sub-sample's last assistant turn;
- ``no_tool_results``: as ``all``, but nothing inside ``<tool_response>...</tool_response>`` ever trains (data
  that writes tool outputs into assistant turns; the templates put tool turns outside them anyway);
- ``no_earlier_reasoning``: as ``all``, but the ``<think>...</think>`` block (and the blank lines after it) of
  every assistant turn except the last does not train (with ``preserve_thinking`` templates, which keep it).

A piece of a split sample (core/split.py) carries earlier turns as context: whatever the policy, they do not
train (``carried_turns``; ``trainable_spans(..., carried=)``).
"""

from __future__ import annotations

import json
import re

POLICIES = ("all", "last_turn", "no_tool_results", "no_earlier_reasoning")
DEFAULT = "all"
ASSISTANT = re.compile(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", re.S)
_TOOL_RESULT = re.compile(r"<tool_response>.*?</tool_response>", re.S)
_THINK = re.compile(r"<think>.*?</think>\s*", re.S)


def canonical(value) -> str:
    """A policy name, or a mapping dataset -> name (a dict, or its JSON text), as one canonical text."""
    if value is None or value == "":
        return DEFAULT
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"label_policy {value!r} is not JSON: {e}") from None
    if isinstance(value, dict):
        for name, policy in value.items():
            _check(policy, f" (dataset {name!r})")
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return _check(value, "")


def _check(policy, where: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"label_policy {policy!r}{where}: expected one of {', '.join(POLICIES)}")
    return policy


def check_datasets(setting: str, datasets: list[str] | None) -> None:
    """Refuse a mapping (``canonical`` text) that names a dataset the run does not have, rather than train
    that dataset under ``all`` unsaid: without a recipe there are no datasets (``datasets`` None), with one
    every key must be one of its dataset names."""
    if not setting.startswith("{"):
        return
    if datasets is None:
        raise ValueError(f"label_policy {setting}: a policy per dataset needs a recipe's datasets (--recipe); "
                         f"without one give a single policy: {', '.join(POLICIES)}")
    unknown = sorted(set(json.loads(setting)) - set(datasets))
    if unknown:
        raise ValueError(f"label_policy names {', '.join(map(repr, unknown))}, not a dataset of the recipe; its "
                         f"datasets: {', '.join(sorted(datasets))}")


def meta_value(setting: str) -> str | dict:
    """What a pack's ``_meta`` records: the policy name, or the mapping dataset -> name."""
    return json.loads(setting) if setting.startswith("{") else setting


def policy_for(recorded, sample_id: str) -> str:
    """The policy of one sub-sample, from what ``_meta`` records (a recipe's sample ids start with the dataset)."""
    if isinstance(recorded, dict):
        return recorded.get(sample_id.split("/", 1)[0], DEFAULT)
    return recorded or DEFAULT


def carried_turns(messages: list[dict], split: dict | None) -> int:
    """How many assistant turns of a sub-sample's messages are carried context: those among the leading
    ``context_messages`` of a piece (its ``_meta`` source's ``split``); 0 for a whole sample."""
    n = (split or {}).get("context_messages", 0)
    return sum(m.get("role") == "assistant" for m in messages[:n])


def _minus(spans: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for a, b in spans:
        for h0, h1 in holes:
            if h1 <= a or h0 >= b:
                continue
            if h0 > a:
                out.append((a, h0))
            a = max(a, h1)
        if a < b:
            out.append((a, b))
    return out


def trainable_spans(text: str, policy: str = DEFAULT, assistant: re.Pattern = ASSISTANT,
                    carried: int = 0) -> list[tuple[int, int]]:
    """Character ranges of a rendered chat whose tokens train under ``policy``; ``assistant``: the template's
    assistant turn, its group 1 what trains (default: the Qwen/ChatML turn; Gemma's is the reader's).
    ``carried``: the first assistant turns are context a piece of a split sample carries (core/split.py): they
    never train, and the policy applies to the turns after them."""
    spans = [m.span(1) for m in assistant.finditer(text)][carried:]
    if policy == "last_turn":
        return spans[-1:]
    if policy == "no_tool_results":
        return _minus(spans, [m.span() for m in _TOOL_RESULT.finditer(text)])
    if policy == "no_earlier_reasoning" and len(spans) > 1:
        last = spans[-1][0]
        return _minus(spans, [m.span() for m in _THINK.finditer(text) if m.start() < last])
    return spans
