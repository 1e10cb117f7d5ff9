"""Tiny randomly initialised Qwen2.5-VL and Qwen3-VL models built from the real config files (shrunken: two
text layers, hidden size 64, one vision block; nothing downloaded), and the vocabulary renumbered to the ids
a test uses so that the output layer stays small (the model is random: which row an id gets is immaterial), or
kept whole where the model must take the ids as a trainer feeds them."""

from __future__ import annotations

import numpy as np
import torch
from pack_helpers import MODELS
from transformers import AutoConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLForConditionalGeneration

CHECKPOINTS = {"qwen2.5-vl": "Qwen2.5-VL-7B-Instruct", "qwen3-vl": "Qwen3-VL-8B-Instruct"}
_CLASSES = {"qwen2.5-vl": Qwen2_5_VLForConditionalGeneration, "qwen3-vl": Qwen3VLForConditionalGeneration}
_TOKEN_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


class Vocab:
    """Real ids → rows 0..n-1 of the tiny model's embedding (the special vision ids first)."""

    def __init__(self, ids: np.ndarray, special: list[int]):
        real = list(dict.fromkeys(special + np.unique(ids).tolist()))
        self.size = len(real)
        self.table = dict(zip(real, range(self.size)))
        self.table[-100] = -100  # labels' "ignore" stays itself

    def __call__(self, ids) -> torch.Tensor:
        return torch.tensor([self.table[int(t)] for t in np.asarray(ids).ravel()]).reshape(np.shape(ids))


def tiny_model(profile: str, vocab_ids: np.ndarray | None, seed: int = 0):
    """(model in float32 eval mode, Vocab) for ``profile``; ``vocab_ids=None``: the real vocabulary, no Vocab."""
    cfg = AutoConfig.from_pretrained(MODELS / CHECKPOINTS[profile])
    vocab = None if vocab_ids is None else Vocab(vocab_ids, [getattr(cfg, k) for k in _TOKEN_KEYS])
    if vocab is not None:
        for k in _TOKEN_KEYS:
            setattr(cfg, k, vocab.table[getattr(cfg, k)])
        cfg.text_config.vocab_size = vocab.size
    t = cfg.text_config
    t.num_hidden_layers, t.hidden_size, t.intermediate_size = 2, 64, 128
    t.num_attention_heads, t.num_key_value_heads, t.head_dim = 4, 2, 16
    t.layer_types = ["full_attention"] * 2
    t.initializer_range = v_range = 0.3  # logits of order 1, not 0.01: a tolerance of 1e-4 then means something
    # sums to head_dim / 2, as 16+24+24 does to 64
    t.rope_parameters = {**t.rope_parameters, "mrope_section": [2, 3, 3]}
    v = cfg.vision_config
    v.depth, v.hidden_size, v.intermediate_size, v.num_heads, v.out_hidden_size = 1, 32, 64, 2, 64
    v.initializer_range = v_range
    if profile == "qwen3-vl":
        v.deepstack_visual_indexes = [0]
    else:
        v.fullatt_block_indexes = [0]
    torch.manual_seed(seed)
    model = _CLASSES[profile]._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    return model.eval(), vocab


# the config keys naming a token the forward looks for (InternVL, LLaVA-OneVision, Gemma 3)
_FAMILY_TOKEN_KEYS = ("image_token_id", "video_token_id", "image_token_index", "video_token_index",
                      "boi_token_index", "eoi_token_index")


def tiny_family_model(folder, vocab_ids: np.ndarray, seed: int = 0, sliding_window: int = 48):
    """(model, Vocab) of an InternVL / LLaVA-OneVision / Gemma 3 checkpoint folder's config, shrunken the same
    way (two text layers of hidden size 64, one vision layer of 32). Gemma 3: one sliding and one full layer,
    the window ``sliding_window`` tokens so that it cuts through a pack's images."""
    from transformers import AutoModelForImageTextToText

    cfg = AutoConfig.from_pretrained(folder, local_files_only=True)
    ids = {k: getattr(cfg, k) for k in _FAMILY_TOKEN_KEYS if isinstance(getattr(cfg, k, None), int)}  # read all first:
    vocab = Vocab(vocab_ids, list(ids.values()))  # some keys are aliases of others (attribute_map)
    for k, real in ids.items():
        setattr(cfg, k, vocab.table[real])
    t, v = cfg.text_config, cfg.vision_config
    t.num_hidden_layers, t.hidden_size, t.intermediate_size = 2, 64, 128
    t.num_attention_heads, t.num_key_value_heads, t.head_dim, t.vocab_size = 4, 2, 16, vocab.size
    t.layer_types = ["sliding_attention", "full_attention"] if cfg.model_type == "gemma3" else ["full_attention"] * 2
    if cfg.model_type == "gemma3":
        t.sliding_window = sliding_window
    v.num_hidden_layers, v.hidden_size, v.intermediate_size, v.num_attention_heads = 1, 32, 64, 2
    t.initializer_range = v.initializer_range = cfg.initializer_range = 0.3
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    return model.eval(), vocab
