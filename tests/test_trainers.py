"""docs/training.md's HF Trainer and TRL SFTTrainer recipes run as they are written: a tiny random Qwen2.5-VL
(the real configs and vocabulary, saved as a checkpoint folder with its processor) trains a few steps on CPU
from a packed output, on exactly the label tokens of the packs the steps took, in the plan's order."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
from conftest import needs, small_dataset
from pack_helpers import MODELS, pack_shards
from test_packed_equals_unpacked import one_thread  # noqa: F401 (autouse: torch on one thread)
from test_training_docs import _example

from pack_assets.reader import iter_encoded

missing = [m for m in ("torch", "accelerate", "datasets", "trl") if importlib.util.find_spec(m) is None]
pytestmark = needs(bool(missing), f"{', '.join(missing)} not installed (extra `train`)")

CHECKPOINT = "Qwen2.5-VL-7B-Instruct"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """``packed/`` (Qwen2.5-VL packs of text, one- and two-image samples, 200 tokens at most) and the checkpoint
    folder the recipes name: a tiny random model from the real config (the real vocabulary: the packs' ids go in
    as they are) and the processor built from the bundled tokenizer and the real preprocessor config."""
    from tiny_models import tiny_model
    from transformers import PreTrainedTokenizerFast, Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    from pack_assets.core.counting.profiles import load_profile
    from pack_assets.core.counting.tokenizers import tokenizer_for

    root = tmp_path_factory.mktemp("trainers")
    # short packs: the real vocabulary's output layer (152k rows) makes every trained token costly; the four
    # packs the recipes' two steps of two take still hold a text, a one-image and two two-image samples, and
    # a pack of two samples (checked below, so a change of the data or the planner cannot drop one unseen)
    packs = pack_shards(small_dataset(root / "in"), root, "qwen2.5-vl", max_len=200, out=root / "packed")
    taken = [[len(s["media"]) for s in p["samples"]] for p in packs[:4]]
    assert {n for t in taken for n in t} == {0, 1, 2} and max(map(len, taken)) >= 2, taken
    model, _ = tiny_model("qwen2.5-vl", None)
    model.save_pretrained(root / CHECKPOINT)
    profile = load_profile("qwen2.5-vl")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer_for(profile), pad_token="<|endoftext|>",
                                        eos_token="<|im_end|>")
    Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessor.from_pretrained(MODELS / CHECKPOINT), tokenizer=tokenizer,
                        video_processor=Qwen2VLVideoProcessor(), chat_template=profile.chat_template
                        ).save_pretrained(root / CHECKPOINT)
    return root


def train_recipe(section: str, folder, monkeypatch) -> tuple[dict, list[tuple[int, int | None]]]:
    """Run the recipe under ``section``; (its namespace, per training step: the label tokens of the batch and
    ``num_items_in_batch``, the tokens the Trainer divides the loss by where it counts them; for Qwen2.5-VL
    (``accepts_loss_kwargs = False``) it does not, and the loss is the mean over the batch's label tokens)."""
    from transformers import Trainer

    seen: list[tuple[int, int | None]] = []
    ns: dict = {}
    step = Trainer.training_step

    def counted(self, model, inputs, num_items_in_batch=None):
        if not seen:
            ns["before"] = {k: v.detach().clone() for k, v in model.named_parameters()}
        seen.append(
            (int((inputs["labels"] != -100).sum()), None if num_items_in_batch is None else int(num_items_in_batch))
        )
        return step(self, model, inputs, num_items_in_batch)

    monkeypatch.setattr(Trainer, "training_step", counted)  # SFTTrainer's calls it too
    monkeypatch.chdir(folder)
    exec(compile(_example(section), "training.md", "exec"), ns)
    return ns, seen


def check_trained(ns: dict, seen: list[tuple[int, int | None]], folder) -> None:
    import torch

    args, state = ns["args"], ns["trainer"].state
    taken = args.max_steps * args.per_device_train_batch_size
    packs = list(iter_encoded(folder / "packed", "qwen2.5-vl"))[:taken]  # the plan's first packs, in order
    per_step = [
        sum(int((p["labels"] != -100).sum()) for p in packs[i : i + args.per_device_train_batch_size])
        for i in range(0, taken, args.per_device_train_batch_size)
    ]
    assert state.global_step == args.max_steps and [s for s, _ in seen] == per_step
    assert all(n in (None, s) for s, n in seen)
    losses = [h["loss"] for h in state.log_history if "loss" in h]
    assert len(losses) == args.max_steps and all(math.isfinite(x) for x in losses)
    after = dict(ns["model"].named_parameters())
    assert all(not torch.equal(v, after[k]) for k, v in ns["before"].items())  # the optimizer moved every weight


def test_the_hf_trainer_recipe_trains_on_the_packs_label_tokens(folder, monkeypatch):
    ns, seen = train_recipe("With the HF Trainer", folder, monkeypatch)
    check_trained(ns, seen, folder)


def test_the_trl_sft_trainer_recipe_trains_on_the_packs_label_tokens(folder, monkeypatch):
    ns, seen = train_recipe("With TRL's SFTTrainer", folder, monkeypatch)
    check_trained(ns, seen, folder)
    assert type(ns["trainer"]).__module__.startswith("trl.") and np.isfinite(
        ns["trainer"].state.log_history[0]["entropy"]
    )
