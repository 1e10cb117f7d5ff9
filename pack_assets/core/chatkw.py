"""``chat_template_kwargs``: extra variables the chat template is rendered with (``enable_thinking``,
``preserve_thinking``, ...), as ``apply_chat_template(messages, tools=tools, **chat_template_kwargs)`` passes
them. One canonical JSON text (sorted keys) so that equal settings give equal profile fingerprints."""

from __future__ import annotations

import json

# apply_chat_template's own parameters (and what the counter passes itself): never template variables
RESERVED = frozenset(("messages", "conversation", "tools", "documents", "add_generation_prompt", "chat_template",
                      "continue_final_message", "tokenize", "return_dict", "return_tensors", "processor_kwargs",
                      "return_assistant_tokens_mask"))


def canonical(value) -> str:
    """The setting as canonical JSON text ("" when empty): a mapping, or JSON text of one (CLI, Launchpad)."""
    if value is None or value == "" or value == {}:
        return ""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"chat_template_kwargs {value!r} is not JSON: {e}") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"chat_template_kwargs must be a JSON object of template variables, got {value!r}")
    if bad := sorted(RESERVED & set(value)):
        raise ValueError(f"chat_template_kwargs cannot set {', '.join(bad)}: apply_chat_template's own arguments")
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")) if value else ""


def as_dict(text: str) -> dict:
    """The template variables of a canonical text."""
    return json.loads(text) if text else {}
