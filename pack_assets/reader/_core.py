"""Every name the reader takes from ``pack_assets.core``, in one place (the core's modules move; the reader's
imports of them change here only)."""

from __future__ import annotations

from ..core import labels
from ..core.chatkw import canonical
from ..core.counting.profiles import ModelProfile, resolve_profile
from ..core.counting.tokenizers import tokenizer_for
from ..core.counting.tokens import TokenCounter
from ..core.counting.vision import image_grid, media_crops, media_image_tokens, sampled_frames, video_count
from ..core.cpad import cu_seqlens
from ..core.indexmode import INDEX_PART, IndexSourceChanged, SourceFiles
from ..core.media import VIDEO_EXTS, probe_image, probe_video
from ..core.records import PackMeta
from ..core.tario import iter_pack_parts

__all__ = ["INDEX_PART", "VIDEO_EXTS", "IndexSourceChanged", "ModelProfile", "PackMeta", "SourceFiles",
           "TokenCounter", "canonical", "cu_seqlens", "image_grid", "iter_pack_parts", "labels", "media_crops",
           "media_image_tokens", "probe_image", "probe_video", "resolve_profile", "sampled_frames", "tokenizer_for",
           "video_count"]
