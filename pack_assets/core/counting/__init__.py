"""Exact token counts for a target model: what the token_lengths stage, the audit's recount, `pack-assets count`
and the training reader count with. The modules, each on the ones before it:

| module | owns |
|---|---|
| `environment.py` | what decides a count besides a profile's files (package versions, the processor's build) |
| `profiles.py` | model profiles (`ModelProfile`, `FAMILIES`, the media rules) from `bundled/` or a `--model-dir` |
| `tokenizers.py` | a profile's tokenizer, built offline, and its tiktoken twin (rank tables cached between processes) |
| `chunkcount.py` | the chunk -> count cache, where its proof holds for the tokenizer |
| `vision.py` | image and video tokens from sizes and metadata alone |
| `tokens.py` | the fast rule (`TokenCounter`) |
| `processors.py`, `procount.py` | the processor rule: the folder's processor; counting with it (`ProcessorCounter`) |
| `counters.py` | the one place that picks a profile's counter (`counter_for`) |
| `token_lengths.py`, `count.py`, `drift.py` | the token_lengths stage; `pack-assets count`; the drift guard |

``bundled/`` holds the built-in profiles' chat templates and processor configs (package data).
"""
