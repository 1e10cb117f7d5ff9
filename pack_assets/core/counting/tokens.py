"""The fast rule: exact token counts for the target model, from headers and text only (proven equal to the
model's processor; a family without it is counted by its processor: core/counting/procount.py, and
core/counting/counters.py
picks the rule).

total = len(tokenize(render(chat_template, messages))) + Σ(N_image − 1) + Σ(N_video − 1): the
conversation is rendered once with one pad placeholder per media item, then each placeholder grows to its
real token count. ``text_tokens`` excludes those placeholders (it keeps the vision start/end tokens).
A ``MediaRule`` family (InternVL, LLaVA-OneVision, Gemma 3) first has each placeholder written out as its
processor writes it, with one image token and the wrappers (``<img>``/``</img>``, Gemma's "\\n\\n" +
``<start_of_image>``/``<end_of_image>`` + "\\n\\n"), so the wrappers are tokenized in context.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections.abc import Iterable, Iterator
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from ..reasons import ReasonError
from .chunkcount import ChunkCounts, tokenizer_rule
from .profiles import ModelProfile
from .rendermemo import ShapeMemo, memo_for
from .tokenizers import byte_level_chunk_rule, fast_counter_for, load_tokenizer, tokenizer_for
from .vision import VideoCount, image_tokens, media_crops, media_image_tokens, sampled_frames, video_count

_BATCH = 512


def batched(items: Iterable, size: int) -> Iterator[list]:
    """Lists of up to ``size`` items in order (itertools.batched from Python 3.12)."""
    batch: list = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask tag): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


_DICT_ATTRS = frozenset(dir(dict))
_PLAIN = frozenset((str, int, float, bool, type(None), list, dict, tuple))
_MISSING = object()


class _ChatSandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox, with shortcuts that give what its own checks give, without them:
    - ``message.content`` on a plain dict is the dict's item, as the sandbox's own ``getattr`` finds it (a
      plain dict has no attribute of that name, so its lookup fails and it takes the item) without raising
      and catching that AttributeError on every access of a render;
    - ``ns.value`` on a ``namespace()`` (no leading "_") holding plain data is that value: the sandbox finds
      the attribute safe (not internal, not a mutating method, not a ``str.format``) after several checks;
    - ``namespace(...)`` itself is called as ``Context.call`` calls it (it takes no context; Jinja's own
      ``_loop_vars``/``_block_vars`` dropped) without the callable checks, which pass for it."""

    def getattr(self, obj, attribute):
        if type(obj) is dict and attribute not in _DICT_ATTRS:
            try:
                return obj[attribute]
            except (TypeError, LookupError):
                return self.undefined(obj=obj, name=attribute)
        if type(obj) is Namespace and attribute[:1] != "_":
            value = getattr(obj, attribute, _MISSING)
            if value is _MISSING:  # the sandbox then tries obj[attribute], which a namespace refuses
                return self.undefined(obj=obj, name=attribute)
            if type(value) in _PLAIN:
                return value
        return super().getattr(obj, attribute)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (the sandbox's own signature)
        if __obj is Namespace:
            kwargs.pop("_block_vars", None)
            kwargs.pop("_loop_vars", None)
            return Namespace(*args, **kwargs)
        return super().call(__context, __obj, *args, **kwargs)


# compiled once per process, not per shard: a Template renders reentrantly
@functools.lru_cache(maxsize=8)
def _template(source: str) -> jinja2.Template:
    template = _environment().from_string(source)
    # Its globals are a ChainMap over the environment's, which every render copies into a new context key by
    # key in Python (about a third of a short render). The environment is built here and never changed
    # after, so a plain dict of the same items gives every render the same context.
    template.globals = dict(template.globals)
    return template


@functools.lru_cache(maxsize=8)  # per process: every shard's counter shares the shapes learned
def _render_memo(profile: ModelProfile) -> ShapeMemo | None:
    return memo_for(profile.chat_template, _environment, _variables(profile))


def _variables(profile: ModelProfile) -> dict:
    """What the template is rendered with besides messages and tools, as transformers renders: the tokenizer's
    named tokens, then chat_template_kwargs over them."""
    return {**dict(profile.template_vars), **profile.template_kwargs}


def _environment() -> _ChatSandbox:
    """The Jinja environment transformers' ``apply_chat_template`` renders with."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = _ChatSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _Generation])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _plain_lengths(tokenizer, texts: list[str]) -> list[int]:
    return [len(e) for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]


@functools.lru_cache(maxsize=8)
def _special_split(enc) -> re.Pattern:
    names = sorted(enc.special_tokens_set, key=len, reverse=True)
    return re.compile("(" + "|".join(map(re.escape, names)) + ")")


def _nfc(enc, text: str) -> str:
    """NFC as HF applies it: after the added tokens are split off ("<|vision_end|>\u0338" must not compose
    '>' + U+0338 into '≯' and break the token)."""
    if unicodedata.is_normalized("NFC", text):
        return text
    pieces = _special_split(enc).split(text)  # odd positions are the special tokens
    return "".join(p if i % 2 else unicodedata.normalize("NFC", p) for i, p in enumerate(pieces))


def _tiktoken_lengths(enc, texts: list[str]) -> list[int]:
    encode = enc.encode
    return [len(encode(_nfc(enc, t), allowed_special="all")) for t in texts]


@functools.lru_cache(maxsize=8)  # as _chunk_counts, with tiktoken counting the chunks not seen yet
def _tiktoken_chunk_counts(enc, path: str, last_added_id: int) -> ChunkCounts | None:
    rule = byte_level_chunk_rule(path, last_added_id)
    return ChunkCounts(rule[0], functools.partial(_tiktoken_lengths, enc), rule[1]) if rule else None


@functools.lru_cache(maxsize=8)  # one per tokenizer and worker process: every shard it counts shares the cache
def _chunk_counts(path: str, last_added_id: int) -> ChunkCounts | None:
    tok = load_tokenizer(path, last_added_id)
    pattern, glue = tokenizer_rule(tok)
    return ChunkCounts(pattern, functools.partial(_plain_lengths, tok), glue) if pattern else None


class TokenCounter:
    """Counts for one profile of the fast rule; batches the tokenizer calls (a profile of the processor rule is
    refused: `counters.counter_for` gives each profile its counter).

    Token counts come from tiktoken built from the profile's own tokenizer.json where that file is a plain
    byte-level BPE (the Qwen family): same ids as Hugging Face ``tokenizers`` (tested), several times
    faster. Any other tokenizer file, or a byte-level BPE with ``backend="tokenizers"``, is run by
    ``tokenizers`` itself. Either goes through the chunk -> count cache where its proof holds for that file
    (Gemma 3, byte-level BPE; core/counting/chunkcount.py): a chunk's count is the tokenizer's (tiktoken's
    equals it on any text), so the sums are the same either way.
    """

    def __init__(self, profile: ModelProfile, backend: str = "auto", chunk_cache: bool = True,
                 render_memo: bool = True):
        if profile.rule == "processor":
            raise ValueError(f"{profile.name} is counted by its own processor (core/counting/procount.py), not the "
                             "fast rule: count with counters.counter_for(profile)")
        self.profile = profile
        self._use_chunks = chunk_cache  # False: every text through the tokenizer (benchmarks' "before")
        self.template = _template(profile.chat_template)
        self._variables = _variables(profile)
        # plain messages rendered from their shape (core/counting/rendermemo.py): the same text, without a render
        self._memo = _render_memo(profile) if render_memo else None
        self.fast = fast_counter_for(profile) if backend in ("auto", "tiktoken") else None
        if backend == "tiktoken" and self.fast is None:
            raise ValueError(f"the tokenizer of {profile.name} cannot run on tiktoken")
        self.backend = "tiktoken" if self.fast is not None else "tokenizers"
        self._media_cache: dict[tuple[int, int, bool], int] = {}  # sizes repeat: hashing a MediaRule does not pay
        self._image_cache: dict[tuple[int, int], int] = {}  # (width, height) -> image_tokens (the same reason)
        self._labels: list[int] = [0, 0]  # InternVL videos: [k] = tokens of "\nFrame2: " ... "\nFrame{k}: "
        self._first_label = 0  # tokens of "Frame1: " on its own

    @functools.cached_property
    def tokenizer(self):
        """The profile's ``tokenizers`` tokenizer, built on first use (a tiktoken counter never needs it)."""
        return tokenizer_for(self.profile)

    @functools.cached_property
    def chunks(self) -> ChunkCounts | None:
        """The chunk -> count cache (core/counting/chunkcount.py) where its proof holds for this tokenizer, else
        None."""
        if not self._use_chunks:
            return None
        if self.fast is not None:
            return _tiktoken_chunk_counts(self.fast, self.profile.tokenizer_file, self.profile.last_added_id)
        return _chunk_counts(self.profile.tokenizer_file, self.profile.last_added_id)

    def lengths(self, texts: list[str]) -> list[int]:
        if self.chunks is not None:
            return self.chunks.lengths(texts)
        if self.fast is not None:
            return _tiktoken_lengths(self.fast, texts)
        return _plain_lengths(self.tokenizer, texts)

    def render(self, messages: list[dict], tools: list | None = None) -> str:
        if tools is None and messages and messages[0].get("tools"):
            tools = messages[0]["tools"]  # the record's tools ride on the first message (see conversation.py)
        if tools is None and self._memo is not None:
            text = self._memo.render(messages)
            if text is not None:
                return text
        return self.template.render(messages=messages, tools=tools, add_generation_prompt=False, **self._variables)

    def _expand(self, text: str, image_sizes) -> tuple[str, int, int]:
        """A media rule's text: each placeholder as the processor writes it with one image token per image
        block (its wrappers and, with Gemma 3 crops, its words tokenized in context); the image tokens of all
        images; how many image tokens the text holds."""
        rule = self.profile.media
        if text.count(rule.placeholder) != len(image_sizes):  # the processor would refuse the sample
            raise ReasonError("placeholder_mismatch", f"the template wrote {text.count(rule.placeholder)} "
                              f"{rule.placeholder} for {len(image_sizes)} image(s)")
        n = len(image_sizes)
        img = 0
        crops = []
        for w, h in image_sizes:
            key = (int(w), int(h), n == 1)  # the rule depends on the size and on one image or several
            got = self._media_cache.get(key)
            if got is None:
                if len(self._media_cache) >= 65536:  # bounded: a set of all-distinct sizes stays small
                    self._media_cache.clear()
                got = self._media_cache[key] = (media_image_tokens(int(w), int(h), n, rule),
                                                media_crops(int(w), int(h), rule))
            img += got[0]
            crops.append(got[1])
        block = rule.prefix + rule.token + rule.suffix
        if not any(crops):
            return (text.replace(rule.placeholder, block) if n else text), img, n
        # split, not replace: the replacement holds the placeholder (<start_of_image>) itself
        parts = text.split(rule.placeholder)
        out = [parts[0]]
        for k, part in zip(crops, parts[1:]):
            # Gemma3Processor.replace_image_token's text, one image token per block
            out += [f"Here is the original image {block} and here are some crops to help you see better "
                    + " ".join([block] * k) if k else block, part]
        return "".join(out), img, n + sum(crops)

    def _expand_videos(self, text: str, videos: list[dict]) -> tuple[str, int, int]:
        """A media rule's videos: (text, video tokens, tokens to add to the text's length). InternVL: each
        placeholder becomes its first frame, "Frame1: <img><IMG_CONTEXT></img>", tokenized in context (it
        touches the text before it); the rest is added: the other context tokens and frames 2..n, whose
        "\nFrame{i}: " sits between two special tokens, so its length is the same everywhere (cached).
        LLaVA-OneVision: the one <video> token stays and grows to n · frame_tokens + 1."""
        rule = self.profile.media
        if text.count(rule.video) != len(videos):
            raise ReasonError("placeholder_mismatch", f"the template wrote {text.count(rule.video)} {rule.video} "
                              f"for {len(videos)} video(s)")
        if not videos:
            return text, 0, 0
        frames = [sampled_frames(v, self.profile.video) for v in videos]
        if rule.kind == "anyres":
            return text, sum(n * rule.frame_tokens + 1 for n in frames), sum(n * rule.frame_tokens for n in frames)
        if len(set(frames)) > 1:  # InternVLProcessor stacks the videos of a sample into one tensor
            raise ReasonError("video_frames_differ", f"videos of {', '.join(map(str, frames))} frames in one sample")
        self._frame_labels(frames[0])
        per = rule.frame_tokens + 2  # the context tokens and <img> </img>
        # "Frame1: " counts in video_tokens on its own; the total takes it in context
        video = sum(self._first_label + self._labels[n] + n * per for n in frames)
        extra = sum(rule.frame_tokens - 1 + self._labels[n] + (n - 1) * per for n in frames)
        return text.replace(rule.video, f"Frame1: {rule.prefix}{rule.token}{rule.suffix}"), video, extra

    def _frame_labels(self, n: int) -> None:
        """Grow the cumulative label lengths to n frames."""
        if not self._first_label:
            self._first_label = self.lengths(["Frame1: "])[0]
        have = len(self._labels)
        if n >= have:
            more = self.lengths([f"\nFrame{i}: " for i in range(have, n + 1)])
            for k in more:
                self._labels.append(self._labels[-1] + k)

    def _vision(self, image_sizes, videos) -> tuple[int, int, list[VideoCount]]:
        if self.profile.media is not None:
            if videos and not self.profile.media.video:
                raise ReasonError("video_not_supported", f"{self.profile.family}: the model takes no video")
            return 0, len(image_sizes), []
        img = sum(self._image_tokens(w, h) for w, h in image_sizes)
        vids = [video_count(v, self.profile.video) for v in videos]
        return img, len(image_sizes), vids

    def _image_tokens(self, width: int, height: int) -> int:
        got = self._image_cache.get((width, height))
        if got is None:  # (a size the rule refuses raises each time: never kept)
            if len(self._image_cache) >= 65536:  # bounded: a set of all-distinct sizes stays small
                self._image_cache.clear()
            got = self._image_cache[width, height] = image_tokens(width, height, self.profile.image)
        return got

    def count_many(self, items: Iterable[tuple[list[dict], list, list]]) -> Iterator[dict | ReasonError]:
        """(messages, image_sizes [[w, h]], videos [meta]) -> counts, or a ReasonError, in input order."""
        for batch in batched(items, _BATCH):
            yield from self._count_batch(batch)

    def _count_batch(self, batch) -> list[dict | ReasonError]:
        prepared: list = []
        texts: list[str] = []
        for messages, image_sizes, videos in batch:
            media_video = None  # a media rule's (video tokens, tokens added to the text's length)
            try:
                img, n_img, vids = self._vision(image_sizes, videos)
                text = self.render(messages)
                if self.profile.media is not None:
                    text, img, n_img = self._expand(text, image_sizes)
                    media_video = (0, 0)
                    if self.profile.media.video:
                        text, *media_video = self._expand_videos(text, videos)
            except ReasonError as e:
                prepared.append(e)
                continue
            except jinja2.exceptions.TemplateError as e:
                prepared.append(ReasonError("template_error", str(e)))
                continue
            first = len(texts)
            texts.append(text)
            for v in vids:
                texts.extend(v.timestamps)
            prepared.append((first, len(texts), img, n_img, vids, media_video))
        lengths = self.lengths(texts) if texts else []
        out: list[dict | ReasonError] = []
        for p in prepared:
            if isinstance(p, ReasonError):
                out.append(p)
                continue
            first, end, img, n_img, vids, media_video = p
            rendered = lengths[first]
            if media_video is not None:  # one image token per image in the text; videos added whole
                video, extra = media_video
                text_tokens = rendered - n_img + extra - video
            else:
                stamps = sum(lengths[first + 1 : end])
                video = sum(v.pad_tokens for v in vids) + stamps
                text_tokens = rendered - n_img - len(vids)
            out.append(
                {
                    "text_tokens": text_tokens,
                    "image_tokens": img,
                    "video_tokens": video,
                    "total_tokens": text_tokens + img + video,
                    "counted_by": "fast",
                }
            )
        return out
