"""``PackEncoder``: a pack as the model takes it, each sub-sample encoded as its processor would encode it alone
(the family's sample encoder: qwen.py, media_families.py), concatenated, and checked against the plan."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np

from ._core import ModelProfile, PackMeta, TokenCounter, canonical, cu_seqlens, labels, resolve_profile, tokenizer_for
from .media_families import MediaSamples
from .packs import iter_packs
from .qwen import QwenSamples

# per-token arrays concatenated over the sub-samples; every other per-sub-sample key is kept as a list of them
_TOKEN_KEYS = ("mm_token_type_ids", "token_type_ids")


class PackEncoder:
    """``chat_template_kwargs``: the template variables to render with; None (the default): each pack's own, as
    its ``_meta`` records them (what its lengths were counted with). ``label_policy``: which tokens train (a
    policy name or dataset -> name, core/labels.py); None: each sub-sample's as its pack's ``_meta`` records.
    Works for every family with a fast rule (``pack-assets profiles``); a processor-rule profile is refused."""

    def __init__(
        self,
        profile: ModelProfile | str | None = None,
        model_dir: str | None = None,
        loss_weighting: str = "token",
        chat_template_kwargs: str | dict | None = None,
        label_policy: str | dict | None = None,
    ):
        if loss_weighting not in ("token", "sample", "sqrt"):
            raise ValueError("loss_weighting is one of token, sample, sqrt")
        self.profile = profile if isinstance(profile, ModelProfile) else resolve_profile(profile, model_dir)
        if self.profile.rule != "fast":
            raise ValueError(
                f"{self.profile.name} is counted by its processor (no fast rule): PackEncoder has no "
                "encoder for it; use the model's own processor on each sample of the pack"
            )
        self.template_kwargs = None if chat_template_kwargs is None else canonical(chat_template_kwargs)
        self.label_policy = None if label_policy is None else labels.meta_value(labels.canonical(label_policy))
        self._counters: dict[str, TokenCounter] = {}
        self.counter = self._counter(self.template_kwargs or self.profile.chat_template_kwargs)
        self.tok = tokenizer_for(self.profile)
        self.weighting = loss_weighting
        self.samples = (MediaSamples if self.profile.media is not None else QwenSamples)(self.profile, self.tok)

    def _counter(self, kwargs: str) -> TokenCounter:
        """The renderer for one set of template variables (canonical JSON text)."""
        if kwargs not in self._counters:
            self._counters[kwargs] = TokenCounter(
                replace(self.profile, chat_template_kwargs=kwargs), backend="tokenizers"
            )
        return self._counters[kwargs]

    def encode_sample(self, messages: list[dict], media: list[tuple[str, bytes]], label_policy: str = "all",
                      split: dict | None = None) -> dict:
        """One sub-sample alone: ``input_ids`` as the model's processor makes them for it, ``labels`` (-100 on
        its first token: nothing before it in the sub-sample predicts it), ``mm_token_type_ids`` and the
        family's keys. ``split``: a piece's record in ``_meta`` (core/split.py): its carried turns never train."""
        carried = labels.carried_turns(messages, split)
        out = self.samples.encode(self.counter, messages, media, label_policy, carried)
        if out["labels"]:
            out["labels"][0] = -100
        return out

    def encode(self, pack: dict) -> dict:
        meta = PackMeta.from_dict(pack["_meta"])
        kwargs = self.template_kwargs
        self.counter = self._counter(canonical(meta.context.get("chat_template_kwargs")) if kwargs is None else kwargs)
        recorded = meta.context.get("label_policy") if self.label_policy is None else self.label_policy
        split = {src.sample_id: src.split for src in meta.sources}  # a piece of a split sample: its carried turns
        subs = [
            self.encode_sample(s["messages"], s["media"], labels.policy_for(recorded, sid), split.get(sid))
            for s, sid in zip(pack["samples"], meta.sample_ids)
        ]
        lens = [len(s["input_ids"]) for s in subs]
        if lens != meta.sample_token_lens or sum(lens) != meta.total_token_len:
            raise ValueError(
                f"pack {meta.pack_id}: encoded lengths {lens} differ from the plan's "
                f"{meta.sample_token_lens} (profile {self.profile.name} vs {meta.context.get('profile')})"
            )
        out = {
            "pack_id": meta.pack_id,
            "sample_ids": meta.sample_ids,
            "family": self.profile.family,
            "input_ids": _cat([s["input_ids"] for s in subs]),
            "labels": _cat([s["labels"] for s in subs]),
            "cu_seqlens": cu_seqlens(lens),
            # context parallelism: where each sub-sample starts once each is padded to the plan's multiple
            "cu_seqlens_padded": cu_seqlens(lens, int(meta.context.get("sample_multiple", 1))),
            "position_ids": _cat([np.arange(n) for n in lens]),
            "loss_weights": loss_weights([s["labels"] for s in subs], self.weighting),
            "media": [[data for _, data in s["media"]] for s in pack["samples"]],
        }
        for key in _TOKEN_KEYS:
            if subs and key in subs[0]:
                out[key] = _cat([s[key] for s in subs])
        if isinstance(self.samples, QwenSamples):
            out["rope_position_ids"] = (
                np.concatenate([s["rope_position_ids"] for s in subs], axis=1) if subs else np.zeros((3, 0), np.int64)
            )
        lists = [
            k for k in (subs[0] if subs else {}) if k not in out and k not in _TOKEN_KEYS and k != "rope_position_ids"
        ]
        out.update({k: [s[k] for s in subs] for k in lists})
        return out


def _cat(parts: list) -> np.ndarray:
    return np.concatenate([np.asarray(p, dtype=np.int64) for p in parts]) if parts else np.zeros(0, np.int64)


def loss_weights(sub_labels: list[list[int]], weighting: str) -> np.ndarray:
    """Per token: 1 per trainable token (``token``), 1/n_i (``sample``) or 1/sqrt(n_i) (``sqrt``), n_i the
    trainable tokens of sub-sample i; 0 where a token does not train."""
    weights: list[float] = []
    for lab in sub_labels:
        n = sum(t != -100 for t in lab)
        w = (1.0 if weighting == "token" else 1.0 / n if weighting == "sample" else 1.0 / math.sqrt(n)) if n else 0.0
        weights += [w if t != -100 else 0.0 for t in lab]
    return np.asarray(weights, dtype=np.float32)


def iter_encoded(
    paths: str | Path | Iterable[str | Path],
    profile: str | None = None,
    model_dir: str | None = None,
    loss_weighting: str = "token",
    source_root: str | Path | Mapping | None = None,
    chat_template_kwargs: str | dict | None = None,
    label_policy: str | dict | None = None,
) -> Iterator[dict]:
    """``PackEncoder(profile, model_dir, ...).encode`` of every pack ``iter_packs(paths)`` yields."""
    enc = PackEncoder(profile, model_dir, loss_weighting, chat_template_kwargs, label_policy)
    for pack in iter_packs(paths, source_root=source_root):
        yield enc.encode(pack)
