"""Reason codes: why a shard, a sample or a record is rejected. One registry, one exception.

The codes are a stable interface: they land in the ``rejected`` table, in ``convert_rejected.jsonl`` and in
``pack-assets count`` output, and docs/formats.md lists every one (a test keeps the two in step).
"""

from __future__ import annotations

REASONS: dict[str, str] = {  # in the order of the table in docs/formats.md
    # manifest
    "not_a_tar": "the file is not a tar archive",
    "compressed_tar": "the .tar file holds compressed bytes (gzip, zstd, ...): decompress it first",
    "empty_shard": "the shard holds no samples (not an error)",
    "unreadable_shard": "the shard could not be opened (permission, I/O error)",
    "truncated_tar": "the archive ends inside this sample; samples before it are kept",
    "missing_json": "the sample has no .json member (and no caption member)",
    "invalid_json": "the .json member does not parse",
    "json_not_object": "the .json member (or a record) is not a JSON object",
    "invalid_utf8": "a text member is not UTF-8",
    "no_conversation": "no messages/conversations/caption in the record",
    "bad_turn": "a conversation turn is not an object with a role",
    "unknown_role": "a conversation turn has a role we do not know",
    "missing_media": "media the record names is not among the sample's members (convert: no such file)",
    "placeholder_mismatch": "<image>/<video> placeholders do not match the media",
    "media_token_in_text": "text holds a model's literal media token (<|image_pad|>, <image_soft_token>, ...)",
    "bad_tools": "the record's 'tools' is not a list of function objects (or JSON of one)",
    "bad_image": "an image is zero bytes or its header cannot be read",
    "bad_video": "a video has no readable video stream",
    "duplicate_key": "the key already appeared earlier in the same shard",
    "unsafe_member_name": "a member name is absolute or contains '..'",
    "unsupported_member_type": "a member is a link, device or fifo (never followed)",
    "member_too_large": "a member is over the configured size limit",
    "too_many_media": "the sample has more media than the configured limit",
    "shard_changed": "the shard changed while it was scanned (it is rescanned on the next run)",
    "bad_tar_header": "a tar header or PAX record is malformed (bad number or length field); samples before it are "
                      "kept",
    "scan_error": "an unexpected error while scanning (the detail names it); the rest of the shard and run go on",
    # token_lengths
    "image_aspect_ratio": "an image's aspect ratio is over 200: the processor refuses it",
    "video_aspect_ratio": "a video's aspect ratio is over 200: the processor refuses it",
    "video_too_short": "a video has fewer frames than the temporal patch size",
    "template_error": "the chat template raised an error for this conversation",
    "processor_error": "the model's own processor (--model-dir, processor rule) refused the sample",
    "missing_dependency": "the model's processor needs a package that is not installed for this sample (the detail "
                          "names it and the extra)",
    "video_memory_budget": "processor rule: counting the sample's videos would make the video processor hold more "
                           "than PACK_ASSETS_VIDEO_BUDGET_GB (per worker); sample fewer frames or raise the budget",
    "video_not_supported": "the model takes no video (Gemma 3; a processor without a video processor): a video "
                           "sample is not guessed",
    "video_sampling": "the processor's frame sampling (num_frames / fps in its video config) refuses this video, e.g. "
                      "more frames asked than it has",
    "video_frames_differ": "InternVL: the videos of one sample keep different frame counts, which its processor "
                           "cannot stack",
    # count (records outside shards)
    "bad_media": "a media file of a record cannot be decoded (Pillow/PyAV error)",
    # convert
    "remote_media": "media is a URL; nothing is downloaded",
    "unsupported_media": "audio or another media kind that is not packed",
    "not_an_object": "the record is not a JSON object",
    "unknown_shape": "a table's columns match no shape convert knows (map them with --columns NAME=COLUMN)",
    "unreadable_file": "a Parquet or Arrow file cannot be read (pyarrow's error in the detail); rows before the "
                       "damage are kept",
    "bad_row": "a table row holds a value of an unexpected type (the detail names it); the other rows go on",
}


class ReasonError(ValueError):
    """A rejection: ``reason`` is a code from REASONS, ``detail`` says what was found."""

    def __init__(self, reason: str, detail: str):
        if reason not in REASONS:  # a typo here would become a code no user or doc knows
            raise LookupError(f"reason code {reason!r} is not registered in pack_assets.core.reasons.REASONS")
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
