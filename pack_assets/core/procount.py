"""The processor rule: counts from a checkpoint folder's own transformers processor, no weights.

A sample's length is ``len(input_ids)`` of the processor's chat path (render with its template and the
record's tools, then ``processor(text=..., images=..., add_special_tokens=False)``, as
``apply_chat_template(tokenize=True)`` does), so it is exact by construction. Only the pixel work is
memoized: the image processor's output depends on nothing but the image sizes, so it runs once per list of
sizes (blank images stand in for the real ones) and later calls get the cached metadata with zero-memory
pixel arrays of the same shapes. The processor's own text expansion and tokenizer run for every sample.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import numpy as np

from .profiles import ModelProfile, ProfileError
from .reasons import ReasonError

_CACHE_MAX = 4096  # distinct size lists kept (metadata only; pixel arrays are zero-stride views)


def _shape_key(images):
    """The nesting and sizes of an image batch: all the image processor's output depends on."""
    if isinstance(images, (list, tuple)):
        return tuple(_shape_key(i) for i in images)
    size = getattr(images, "size", None)
    return tuple(size) if isinstance(size, tuple) else (type(images).__name__, getattr(images, "shape", None))


def _hollow(value):
    """The same shapes and dtypes without the memory (processors read shapes and metadata, not pixels)."""
    if isinstance(value, np.ndarray) and value.size > 64:
        return np.broadcast_to(np.zeros((), value.dtype), value.shape)
    if isinstance(value, list):
        return [_hollow(v) for v in value]
    return value


class _CachedImageProcessor:
    """Stands in for ``processor.image_processor``: same attributes, calls memoized by image sizes."""

    def __init__(self, inner):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_cache", {})
        object.__setattr__(self, "misses", 0)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __call__(self, images=None, *args, **kwargs):
        key = (_shape_key(images), repr(args), repr(sorted(kwargs.items(), key=lambda kv: kv[0])))
        hit = self._cache.get(key)
        if hit is None:
            out = self._inner(images, *args, **kwargs)
            object.__setattr__(self, "misses", self.misses + 1)
            if len(self._cache) >= _CACHE_MAX:
                self._cache.pop(next(iter(self._cache)))
            hit = (type(out), {k: _hollow(v) for k, v in out.items()}, getattr(out, "tensor_type", None))
            self._cache[key] = hit
        cls, data, _ = hit
        return cls(dict(data))  # a fresh container: processors pop keys from it


@functools.lru_cache(maxsize=2)
def load_processor(model_dir: str, trust_remote_code: bool = False):
    """AutoProcessor for a local folder, offline; a clear error when transformers (or torch) is missing."""
    try:
        from transformers import AutoProcessor
    except ImportError as e:
        raise ProfileError(f"the processor rule needs transformers: pip install 'pack-assets[processor]' ({e})") from None
    try:
        proc = AutoProcessor.from_pretrained(model_dir, local_files_only=True, trust_remote_code=trust_remote_code)
    except ImportError as e:  # e.g. a video processor that needs torch/torchvision
        raise ProfileError(f"the processor of {model_dir} needs a package that is not installed: {e}; "
                           "install the extra: pip install 'pack-assets[processor]' (torch, torchvision)") from None
    except ValueError as e:
        hint = "" if trust_remote_code else " (a remote-code model needs --trust-remote-code)"
        raise ProfileError(f"transformers cannot build a processor from {model_dir}: {e}{hint}") from None
    if getattr(proc, "image_processor", None) is not None:
        proc.image_processor = _CachedImageProcessor(proc.image_processor)
    return proc


@functools.lru_cache(maxsize=32)  # stand-ins for real images; big ones are big, keep few
def _blank(width: int, height: int):
    from PIL import Image

    return Image.new("RGB", (width, height))


class ProcessorCounter:
    """``count_many`` of the processor rule (TokenCounter delegates here for such profiles)."""

    def __init__(self, profile: ModelProfile):
        self.profile = profile
        self.processor = load_processor(profile.model_dir, profile.trust_remote_code)
        if getattr(self.processor, "tokenizer", None) is None:
            raise ProfileError(f"the processor of {profile.model_dir} has no tokenizer")
        # the tokenizer's own media token ids where it names them (Gemma 3's processor calls its placeholder,
        # <start_of_image>, the image token; the repeated one is the tokenizer's <image_soft_token>)
        tok = self.processor.tokenizer
        ids = (getattr(tok, a, None) if isinstance(getattr(tok, a, None), int) else getattr(self.processor, a, None)
               for a in ("image_token_id", "video_token_id"))
        self._media_ids = frozenset(i for i in ids if isinstance(i, int))

    def count_many(self, items: Iterable[tuple[list[dict], list, list]]):
        for messages, image_sizes, videos in items:
            try:
                yield self.count(messages, image_sizes, videos)
            except ReasonError as e:
                yield e

    def count(self, messages: list[dict], image_sizes: list, videos: list) -> dict:
        if videos:  # decoding video metadata into frames the processor accepts is not done yet
            raise ReasonError("processor_error", "videos are not counted by the processor rule yet")
        tools = messages[0].get("tools") if messages else None
        msgs = [{k: v for k, v in m.items() if k != "tools"} for m in messages]
        try:
            text = self.processor.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=False)
            images = [_blank(int(w), int(h)) for w, h in image_sizes] or None
            out = self.processor(text=[text], images=[images] if images else None, add_special_tokens=False)
        except ReasonError:
            raise
        except Exception as e:  # the processor's own refusal (bad aspect ratio, template error, ...)
            raise ReasonError("processor_error", f"{type(e).__name__}: {e}") from None
        ids = out["input_ids"][0]
        # image_tokens: the processor's image token ids (its wrappers, e.g. <start_of_image>, count as text);
        # the tokenizer runs once per sample, inside the processor
        image = sum(1 for i in ids if i in self._media_ids) if images else 0
        return {"text_tokens": len(ids) - image, "image_tokens": image, "video_tokens": 0,
                "total_tokens": len(ids), "counted_by": "processor"}
