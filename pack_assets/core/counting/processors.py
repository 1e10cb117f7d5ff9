"""The processor a ``--model-dir`` folder's counter runs (core/counting/procount.py): transformers' own,
built offline from the folder (without its video part where that needs torchvision: `NoVideo`), its image and
video processors wrapped to compute shapes only and to remember them per input shape, since a count never
depends on the pixels."""

from __future__ import annotations

import copy
import functools
import inspect
import json
import re
from pathlib import Path

import numpy as np

from . import environment
from .profiles import ProfileError, check_remote_code

CACHE_MAX = 4096  # distinct size lists kept (metadata only; pixel arrays are zero-stride views)
EXTRA_HINT = "pip install 'pack_assets[processor]'"


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


_ELEMENTWISE = ("rescale", "normalize")  # shape-preserving per-pixel steps: they never decide a count
_UNSET = object()


def _same(image, *args, **kwargs):
    return image


def _shapes_only(inner, images, args, kwargs, names=_ELEMENTWISE):
    """The image processor's output with its per-pixel arithmetic (rescale, normalize) skipped: the shapes and
    metadata are the real ones (the stand-in images are blank anyway); tests compare with real images. A
    processor that objects gets the real run."""
    saved = {n: inner.__dict__.get(n, _UNSET) for n in names if hasattr(inner, n)}
    try:
        for n in saved:
            setattr(inner, n, _same)
        return inner(images, *args, **kwargs)
    except Exception:
        pass
    finally:
        for n, v in saved.items():
            if v is _UNSET:
                inner.__dict__.pop(n, None)
            else:
                setattr(inner, n, v)
    return inner(images, *args, **kwargs)


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
            out = _shapes_only(self._inner, images, args, kwargs)
            object.__setattr__(self, "misses", self.misses + 1)
            if len(self._cache) >= CACHE_MAX:
                self._cache.pop(next(iter(self._cache)))
            hit = (type(out), {k: _hollow(v) for k, v in out.items()}, getattr(out, "tensor_type", None))
            self._cache[key] = hit
        cls, data, _ = hit
        return cls(dict(data))  # a fresh container: processors pop keys from it


def _meta_key(meta) -> tuple:
    """A VideoMetadata (or dict) as a hashable key: every field the video processor can read."""
    if meta is None:
        return (None,)
    get = meta.get if hasattr(meta, "get") else (lambda k, d=None: getattr(meta, k, d))
    return tuple((k, repr(get(k))) for k in ("total_num_frames", "fps", "width", "height", "duration",
                                                "video_backend", "frames_indices"))


def _video_key(videos, kwargs) -> tuple:
    """The shapes of a video batch and its metadata: all the video processor's output depends on."""
    metas = kwargs.get("video_metadata")
    rest = repr(sorted(((k, v) for k, v in kwargs.items() if k != "video_metadata"), key=lambda kv: kv[0]))
    metas = list(metas) if isinstance(metas, (list, tuple)) else [metas]
    return (_shape_key_video(videos), tuple(_meta_key(m) for m in metas), rest)


def _shape_key_video(videos):
    if isinstance(videos, (list, tuple)):
        return tuple(_shape_key_video(v) for v in videos)
    return (type(videos).__name__, tuple(getattr(videos, "shape", ())), str(getattr(videos, "dtype", "")))


def _hollow_any(value):
    """_hollow for torch tensors too (video processors return them)."""
    if type(value).__module__.startswith("torch") and hasattr(value, "expand") and value.numel() > 64:
        import torch

        return torch.zeros((), dtype=value.dtype).expand(value.shape)
    if isinstance(value, list):
        return [_hollow_any(v) for v in value]
    return _hollow(value)


class _CachedVideoProcessor(_CachedImageProcessor):
    """Stands in for ``processor.video_processor``: calls memoized by frame shapes and video metadata (the
    stand-in frames are blank; the metadata decides the sampling). The metadata objects the processor returns
    (it writes the sampled ``frames_indices`` into them, Qwen3-VL reads them for its timestamps) are copied
    per call."""

    def __call__(self, videos=None, *args, **kwargs):
        key = (_video_key(videos, kwargs), repr(args))
        hit = self._cache.get(key)
        if hit is None:
            # a fresh copy of the metadata for the run: the processor writes the sampled frames_indices into it
            run_kw = {**kwargs, "video_metadata": copy.deepcopy(kwargs["video_metadata"])} \
                if "video_metadata" in kwargs else kwargs
            out = _shapes_only(self._inner, videos, args, run_kw, _ELEMENTWISE + ("rescale_and_normalize",))
            object.__setattr__(self, "misses", self.misses + 1)
            if len(self._cache) >= CACHE_MAX:
                self._cache.pop(next(iter(self._cache)))
            hit = (type(out), {k: _hollow_any(v) for k, v in out.items()})
            self._cache[key] = hit
        cls, data = hit
        return cls({k: copy.deepcopy(v) if k == "video_metadata" else v for k, v in data.items()})


def _missing(e: BaseException) -> str:
    """The package an ImportError names (transformers' own 'requires the Torchvision library' messages too)."""
    name = getattr(e, "name", None)
    text = str(e)
    for pkg in ("torchvision", "torch", "av", "decord", "timm", "einops", "sentencepiece", "protobuf"):
        if re.search(rf"\b{pkg}\b", text, re.IGNORECASE):
            return pkg
    return name or text.strip().splitlines()[0][:120]


class NoVideo:
    """Where the folder's video processor cannot be built here (it needs torchvision): images still count,
    every video is refused with the reason and the extra that fixes it."""

    def __init__(self, why: str):
        self.why = why


def _image_only(model_dir: str, trust_remote_code: bool, err: ImportError):
    """The folder's processor without its video processor (the one part that needs torchvision)."""
    import transformers
    from transformers import AutoImageProcessor, AutoTokenizer
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    cfg = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8")) \
        if (Path(model_dir) / "config.json").exists() else {}
    cls = getattr(transformers, PROCESSOR_MAPPING_NAMES.get(cfg.get("model_type", ""), "") or "", None)
    if cls is None or "video_processor" not in cls.get_attributes():
        raise err
    from transformers.video_processing_utils import BaseVideoProcessor  # importable without torchvision

    no_video = type("NoVideoProcessor", (BaseVideoProcessor,), {})
    stand_in = no_video.__new__(no_video)  # never called: NoVideo replaces it once the processor is built
    kw = dict(local_files_only=True, trust_remote_code=trust_remote_code)
    parts = {"image_processor": AutoImageProcessor.from_pretrained(model_dir, **kw),
             "tokenizer": AutoTokenizer.from_pretrained(model_dir, **kw), "video_processor": stand_in}
    if set(cls.get_attributes()) - set(parts):
        raise err
    processor_dict, _ = cls.get_processor_dict(model_dir, **kw)
    proc = cls.__new__(cls)
    # the base class checks each part's type against a registry that needs torchvision to import; the
    # stand-in is the one part it cannot resolve, every other part is still checked
    check = cls.check_argument_for_proper_class
    proc.check_argument_for_proper_class = lambda name, arg: None if arg is stand_in else check(proc, name, arg)
    named = set(inspect.signature(cls.__init__).parameters)  # what from_pretrained would pass it, by name
    init_kw = {k: v for k, v in processor_dict.items() if k in named and k not in parts}
    cls.__init__(proc, *[parts[a] for a in cls.get_attributes()], **init_kw)
    del proc.check_argument_for_proper_class
    proc.video_processor = NoVideo(f"the video processor of {Path(model_dir).name} needs {_missing(err)}, which is "
                                    f"not installed: {EXTRA_HINT}")
    return proc


@functools.lru_cache(maxsize=2)  # one per worker process: every shard and sample it counts reuses it
def load_processor(model_dir: str, trust_remote_code: bool = False):
    """AutoProcessor for a local folder, offline; a clear error when transformers (or torch) is missing."""
    check_remote_code(model_dir, trust_remote_code)
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        raise ProfileError(f"the processor rule needs transformers: {EXTRA_HINT} ({e})") from None
    try:
        # a copy: the build is shared with the profile's fingerprint (core/counting/environment.py); the wrappers
        # are ours
        proc = copy.copy(environment.build_processor(model_dir, trust_remote_code))
    except ImportError as e:  # e.g. a video processor that needs torchvision: count images without it
        try:
            proc = _image_only(model_dir, trust_remote_code, e)
        except ImportError as e2:
            raise ProfileError(f"the processor of {model_dir} needs {_missing(e2)}, which is not installed: "
                               f"{EXTRA_HINT} ({str(e2).strip().splitlines()[0][:200]})") from None
    except ValueError as e:
        if re.search(r"requires .*(installed|library)", str(e)):  # e.g. InternVL: "requires `torchvision` ..."
            raise ProfileError(f"the processor of {model_dir} needs {_missing(e)}, which is not installed: "
                               f"{EXTRA_HINT} ({str(e).strip().splitlines()[0][:200]})") from None
        hint = " (a remote-code model needs --trust-remote-code)" if "trust_remote_code" in str(e) else ""
        raise ProfileError(f"transformers cannot build a processor from {model_dir}: {e}{hint}") from None
    if getattr(proc, "image_processor", None) is not None:
        proc.image_processor = _CachedImageProcessor(proc.image_processor)
    vp = getattr(proc, "video_processor", None)
    if vp is not None and not isinstance(vp, NoVideo):
        proc.video_processor = _CachedVideoProcessor(vp)
    return proc
