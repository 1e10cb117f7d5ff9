"""What decides a count besides a profile's files: the counting packages' versions and, for the processor
rule, the processor's effective settings (its image and video processors' ``to_dict()``, which holds the
class defaults a folder's files leave unset). Both go into the profile's fingerprint, so an upgraded
environment is a different profile (its shards are counted again) instead of silently the same plan."""

from __future__ import annotations

import functools
import hashlib
import json

# what each rule's counts can depend on: the fast rules render the template with jinja2 and tokenize with
# tokenizers / tiktoken (they never run transformers: a transformers upgrade cannot change their counts, the
# drift guard checks it still agrees); the processor rule runs transformers' processor (which renders with
# jinja2), whose image and video paths use torch
_PACKAGES = {"fast": ("jinja2", "tokenizers", "tiktoken"),
             "processor": ("transformers", "jinja2", "tokenizers", "torch", "torchvision", "pillow")}


@functools.lru_cache(maxsize=4)
def versions(rule: str) -> str:
    """``name==version`` of the packages the rule depends on ("name==" when absent), one line each."""
    from importlib import metadata

    out = []
    for name in _PACKAGES.get(rule, _PACKAGES["processor"]):
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(f"{name}==")
    return "\n".join(out)


@functools.lru_cache(maxsize=2)  # one per worker process: the counter and the fingerprint share the build
def build_processor(model_dir: str, trust_remote_code: bool = False):
    """transformers' AutoProcessor for a local folder, offline (raises what transformers raises)."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_dir, local_files_only=True, trust_remote_code=trust_remote_code)


def _plain(value):
    """A JSON-able copy of a settings value (tensors, dtypes and enums as their text)."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


@functools.lru_cache(maxsize=8)
def processor_settings(model_dir: str, trust_remote_code: bool = False) -> str:
    """sha256 of the processor's effective settings: its class, each sub-processor's class and ``to_dict()``
    (the folder's values over the class defaults of this transformers version), its own plain attributes
    (image token, tokens per image, ...). "unbuilt: <error>" where transformers cannot build it here."""
    try:
        proc = build_processor(model_dir, trust_remote_code)
    except Exception as e:  # counting then fails or falls back on its own; the fingerprint names why
        return f"unbuilt: {type(e).__name__}"
    doc = {"class": type(proc).__name__,
           "own": _plain({k: v for k, v in vars(proc).items()
                          if isinstance(v, (str, int, float, bool, type(None), list, dict)) and k != "chat_template"})}
    for name in getattr(proc, "get_attributes", lambda: [])():
        part = getattr(proc, name, None)
        doc[name] = {"class": type(part).__name__,
                     "settings": _plain(part.to_dict()) if name != "tokenizer" and hasattr(part, "to_dict") else None}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
