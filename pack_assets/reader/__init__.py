"""Training-side reader for packed shards (numpy; torch only in the collator and masks).

``iter_packs(paths)`` (packs.py) yields each pack with its sub-samples (conversation, source record, media
bytes, and the bytes of ``extra`` members the record does not name), from an output folder of either mode or
from tar paths; ``pack_from_parts`` makes one from a WebDataset sample's parts (Megatron-Energon).

``PackEncoder(profile).encode(pack)`` (encode.py) turns a pack into what a trainer feeds the model, for every
family with a fast rule, each sub-sample encoded as the model's processor encodes it alone:

- ``input_ids`` (int64): the chat template rendered, each image/video placeholder written out as the
  processor writes it (Qwen-VL: pads, Qwen3-VL videos with their timestamps, qwen.py; InternVL: tiles and
  frames in ``<img>`` wrappers, LLaVA-OneVision: anyres feature counts, Gemma 3: 256 soft tokens per image
  and crop, media_families.py);
- ``labels``: what the label policy trains (core/labels.py), -100 elsewhere and on each sub-sample's first
  token; ``loss_weights``: 1 per trainable token (``token``), 1/n_i (``sample``) or 1/sqrt(n_i) (``sqrt``);
- ``cu_seqlens`` (int32 ``[0, l1, l1+l2, ...]``), ``cu_seqlens_padded`` (the same with each length padded to
  the plan's ``sample_multiple`` for context parallelism: thd.py lays packs out so) and ``position_ids``
  restarting at 0 per sub-sample;
  Qwen-VL also ``rope_position_ids`` (int64 ``(3, T)``, per sub-sample ``get_rope_index`` of it alone);
- ``mm_token_type_ids``: 0 text, 1 at each per-visual-token image placeholder, 2 at video ones; Gemma 3 also
  ``token_type_ids`` (what its forward reads for its bidirectional image blocks);
- per sub-sample ``images`` / ``videos`` (bytes, model order), ``visual_order``, and the family's media
  facts (Qwen-VL ``image_grid_thw`` / ``video_grid_thw`` / ``second_per_grid_ts``; the others
  ``image_tokens`` / ``video_frames``); ``family``.

Each length is checked against the plan's ``sample_token_lens`` (a count that differs raises instead of
overflowing a pack at training time).

``PackCollator`` (collate.py) turns a list of encoded packs into padded (or flattened) tensors with the packing
in compact form (``seq_idx``, ``cu_seqlens`` / ``cu_seq_lens_q``…, ``padding_mask``) and the pixel inputs from
the model's processor; masks.py builds masks from that form where one is needed. The proof that a pack so fed
gives each sub-sample's own logits is ``tests/test_packed_equals_unpacked.py`` (and test_family_encoders.py).
"""

from ._core import IndexSourceChanged, SourceFiles
from .collate import PackCollator
from .encode import PackEncoder, iter_encoded, loss_weights
from .masks import attention_mask, flex_block_mask
from .packs import iter_packs, pack_from_parts, shard_paths
from .qwen import mrope_positions

__all__ = ["IndexSourceChanged", "PackCollator", "PackEncoder", "SourceFiles", "attention_mask", "flex_block_mask",
           "iter_encoded", "iter_packs", "loss_weights", "mrope_positions", "pack_from_parts", "shard_paths"]
