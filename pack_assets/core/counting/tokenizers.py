"""The tokenizer of a profile, built offline from its ``tokenizer.json`` (or a Qwen2Tokenizer folder's vocab and
merges) and trimmed to the model's own added tokens; and, where that file is a plain byte-level BPE, the
tiktoken encoding equal to it (same ids, several times faster), its rank table cached between processes
(``$PACK_ASSETS_CACHE``)."""

from __future__ import annotations

import functools
import hashlib
import json
import marshal
import os
from pathlib import Path

from tokenizers import Tokenizer

from .profiles import ModelProfile, bundled_tokenizer_file, cached_sha256, read_json


def _tokenizer_spec(source: str) -> dict:
    """tokenizer.json as a dict. A folder (a Qwen2Tokenizer's vocab.json + merges.txt): transformers' own
    Qwen2 build (NFC, the Qwen split regex, byte-level), i.e. the bundled Qwen tokenizer.json's pipeline with the
    folder's vocabulary, merges and added tokens (tokenizer_config.json ``added_tokens_decoder``)."""
    if not Path(source).is_dir():
        return json.loads(Path(source).read_text(encoding="utf-8"))
    folder = Path(source)
    spec = json.loads(bundled_tokenizer_file().read_text(encoding="utf-8"))
    spec["model"]["vocab"] = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    lines = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
    spec["model"]["merges"] = [ln.split(" ") for ln in lines if ln and not ln.startswith("#version")]
    decoder = read_json(folder / "tokenizer_config.json").get("added_tokens_decoder", {})
    spec["added_tokens"] = [
        {"id": int(i), "content": t["content"], "single_word": t.get("single_word", False),
         "lstrip": t.get("lstrip", False), "rstrip": t.get("rstrip", False),
         "normalized": t.get("normalized", False), "special": t.get("special", True)}
        for i, t in sorted(decoder.items(), key=lambda kv: int(kv[0]))]
    return spec


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str, last_added_id: int) -> Tokenizer:
    spec = _tokenizer_spec(path)
    # Qwen2/2.5-VL share Qwen3's vocabulary but not its later added tokens (<think>, <tool_response>, ...):
    # in those models such strings are ordinary text and split into several tokens.
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["id"] <= last_added_id]
    return Tokenizer.from_str(json.dumps(spec))


def tokenizer_for(profile: ModelProfile) -> Tokenizer:
    return load_tokenizer(profile.tokenizer_file, profile.last_added_id)


def _byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level alphabet: the printable character that stands for each byte in the vocabulary."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


@functools.lru_cache(maxsize=8)
def _fast_counter(path: str, last_added_id: int):
    """A tiktoken encoding equal to the tokenizer.json (ids = BPE ranks, same split regex, same added
    tokens), or None when the file is not a plain byte-level BPE of that shape. tests/ prove equal ids."""
    try:
        import tiktoken
    except ImportError:
        return None
    parts = _cached_ranks(path, last_added_id)
    if parts is None:
        parts = _bpe_ranks(_tokenizer_spec(path), last_added_id)
        if parts is None:
            return None
        _save_ranks(path, last_added_id, *parts)
    pattern, ranks, special = parts
    return tiktoken.Encoding(f"pack_assets:{Path(path).name}", pat_str=pattern, mergeable_ranks=ranks,
                             special_tokens=special)


def _bpe_ranks(spec: dict, last_added_id: int) -> tuple[str, dict[bytes, int], dict[str, int]] | None:
    """tiktoken's three inputs (split regex, byte string -> rank, added tokens) from a tokenizer.json, or None
    when it is not a plain byte-level BPE whose rank order is its merge order."""
    model, pre = spec.get("model", {}), spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [])
    if (model.get("type") != "BPE" or (spec.get("normalizer") or {}).get("type") not in (None, "NFC")
            or len(steps) != 2 or steps[0].get("type") != "Split" or steps[1].get("type") != "ByteLevel"
            or steps[1].get("use_regex") or "Regex" not in steps[0].get("pattern", {})):
        return None
    vocab = model["vocab"]
    merges = model.get("merges", [])
    # rank order must be merge order: true when each merge result's id grows with the merge's position
    ids = [vocab.get("".join(m) if isinstance(m, list) else m.replace(" ", "", 1)) for m in merges[:1000]]
    if any(i is None for i in ids) or ids != sorted(ids):
        return None
    # each symbol to the byte it stands for, in C (str.translate + latin-1) rather than a generator per token;
    # a character outside the alphabet maps past latin-1, so the encode fails as the lookup would have
    table = dict.fromkeys(range(256), "\uffff") | {ord(ch): b for ch, b in _byte_decoder().items()}
    try:
        ranks = {tok.translate(table).encode("latin-1"): i for tok, i in vocab.items()}
    except UnicodeEncodeError:
        return None
    special = {t["content"]: t["id"] for t in spec.get("added_tokens", []) if t["id"] <= last_added_id}
    return steps[0]["pattern"]["Regex"], ranks, special


# Reading a large tokenizer.json and building the rank table costs every process that counts (the CLI's
# helpers, its audit's recount) a good part of a second; the table, kept in the user's cache folder under the
# file's content hash, loads in a tenth of that (docs/benchmarks.md). A file there is used only when its
# checksum holds and it holds bytes -> int; anything else is rebuilt. Bump RANKS_FORMAT whenever
# `_bpe_ranks` changes what it returns.
CACHE_ENV = "PACK_ASSETS_CACHE"
RANKS_FORMAT = 1


def cache_dir() -> Path:
    """$PACK_ASSETS_CACHE, else $XDG_CACHE_HOME/pack_assets, else ~/.cache/pack_assets."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pack_assets"


def _ranks_file(path: str, last_added_id: int) -> Path | None:
    """Where the table of this tokenizer file is kept, or None (a folder's vocab.json + merges.txt, which is
    built each time; no home folder to cache in)."""
    import tiktoken

    return _cache_file(path, last_added_id, f"tiktoken-ranks-v{RANKS_FORMAT}",
                       f"-tiktoken{getattr(tiktoken, '__version__', '')}-marshal{marshal.version}.bin")


def _cache_file(path: str, last_added_id: int, kind: str, suffix: str) -> Path | None:
    src = Path(path)
    if not src.is_file():
        return None
    try:
        folder = cache_dir()
    except RuntimeError:  # no $HOME and no passwd entry (some containers): no cache
        return None
    from ... import __version__

    digest = cached_sha256(str(src))[:24]  # as the profile's fingerprint hashed it (cached per process)
    return folder / f"{kind}-{digest}-{last_added_id}-pack_assets{__version__}{suffix}"


def _save_ranks(path: str, last_added_id: int, pattern: str, ranks: dict[bytes, int], special: dict[str, int]) -> None:
    """The rank table as: header length (8 bytes), JSON header (pattern, added tokens, the table's sha256),
    the table in `marshal` form. Best effort: a folder that cannot be written only means the next process
    builds the table again."""
    from ..safety import atomic_write_bytes

    try:
        target = _ranks_file(path, last_added_id)
        if target is None:
            return
        table = marshal.dumps(ranks)
        header = json.dumps({"pattern": pattern, "special": special,
                             "sha256": hashlib.sha256(table).hexdigest()}).encode()
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, len(header).to_bytes(8, "little") + header + table)
    except OSError:
        pass


def _cached_ranks(path: str, last_added_id: int) -> tuple[str, dict[bytes, int], dict[str, int]] | None:
    """The saved table when its file is there and intact (its checksum holds), else None."""
    try:
        target = _ranks_file(path, last_added_id)
        if target is None or not target.exists():
            return None
        data = target.read_bytes()
        hlen = int.from_bytes(data[:8], "little")
        header, table = json.loads(data[8:8 + hlen]), data[8 + hlen:]
        if hashlib.sha256(table).hexdigest() != header["sha256"]:
            return None
        ranks = marshal.loads(table)
        if not (isinstance(ranks, dict) and all(type(k) is bytes and type(v) is int for k, v in ranks.items())):
            return None
        return header["pattern"], ranks, header["special"]
    except (OSError, ValueError, KeyError, TypeError, EOFError):
        return None


def fast_counter_for(profile: ModelProfile):
    return _fast_counter(profile.tokenizer_file, profile.last_added_id)


# Whether chunkcount's proof B holds for a tiktoken-capable tokenizer file is decided on its definition (the
# tests check the answer is the loaded tokenizer's) and kept in the cache folder beside the rank table, under the
# file's content hash and the library versions: reading the file costs a process a good part of a second. Only
# "holds" is kept: the one rule a byte-level BPE can have is BYTE_LEVEL_CHUNK.
CHUNK_RULE_FORMAT = 1


def _chunk_rule_file(path: str, last_added_id: int) -> Path | None:
    import tokenizers

    return _cache_file(path, last_added_id, f"chunk-rule-v{CHUNK_RULE_FORMAT}",
                       f"-tokenizers{tokenizers.__version__}.json")


@functools.lru_cache(maxsize=8)
def byte_level_chunk_rule(path: str, last_added_id: int) -> tuple[str, str] | None:
    """(chunk regex, glue) of chunkcount's proof B for this tokenizer file, or None where it does not hold."""
    from .chunkcount import BYTE_LEVEL_CHUNK, WHITESPACE

    target = _chunk_rule_file(path, last_added_id)
    try:
        holds = json.loads(target.read_text())["holds"] if target is not None and target.exists() else None
    except (OSError, ValueError, KeyError, TypeError):
        holds = None
    if not isinstance(holds, bool):
        holds = _rule_holds(path, last_added_id)
        if target is not None:
            from ..safety import atomic_write_bytes

            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(target, json.dumps({"holds": holds}).encode())
            except OSError:
                pass
    return (BYTE_LEVEL_CHUNK, WHITESPACE) if holds else None


_ADDED_FLAGS = ("normalized", "lstrip", "rstrip", "single_word")


def _rule_holds(path: str, last_added_id: int) -> bool:
    """Proof B decided on the file's definition, as `_bpe_ranks` reads it. ``tokenizers`` itself refuses a
    file whose added token leaves out a flag; one such is refused here too (no default is guessed)."""
    from .chunkcount import BYTE_LEVEL_CHUNK, split_rule

    spec = _tokenizer_spec(path)
    spec["added_tokens"] = [t for t in spec.get("added_tokens") or [] if t["id"] <= last_added_id]
    if not all(all(k in t for k in _ADDED_FLAGS) for t in spec["added_tokens"]):
        return False
    return split_rule(spec)[0] == BYTE_LEVEL_CHUNK
