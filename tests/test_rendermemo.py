"""core/counting/rendermemo.py: a render from the messages' shape is the template's own render, for every
template the project ships or tests, for texts built to break it, and for templates that look at their texts
(those get no memo, or none for the shapes where they look)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pack_assets.core.counting import tokens
from pack_assets.core.counting.profiles import BUILTIN_PROFILES, _read_template, load_profile
from pack_assets.core.counting.rendermemo import _shape, memo_for
from pack_assets.core.counting.tokens import TokenCounter

FIXTURES = Path(__file__).parent / "fixtures"
_TEMPLATES = {name: load_profile(name).chat_template for name in BUILTIN_PROFILES}
_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")
_TEMPLATES |= {p.name: _read_template(p) for p in sorted((FIXTURES / "models").iterdir())
               if p.is_dir() and any((p / f).exists() for f in _FILES)}
_TEMPLATES |= {p.name: p.read_text() for p in sorted((FIXTURES / "templates").glob("*.jinja"))}

# texts a template might look at: its own tags, markers of the memo (NUL), empty, whitespace, quotes, non-ASCII
_PIECES = ["", " ", "\n", "\0", "\0" + "0" + "\0", "<think>", "</think>", "<tool_response>", "</tool_response>",
           "<image>", "<|im_end|>", "a", "中文", '"', "\\", "{{ x }}", "None", "0"]
_TEXT = st.lists(st.sampled_from(_PIECES), max_size=5).map("".join)
_PART = st.one_of(st.just({"type": "image"}), st.just({"type": "video"}),
                  _TEXT.map(lambda t: {"type": "text", "text": t}))
_MESSAGE = st.builds(lambda role, content: {"role": role, "content": content},
                     st.sampled_from(["system", "user", "assistant", "tool", "other"]),
                     st.one_of(_TEXT, st.lists(_PART, max_size=3)))
_MESSAGES = st.lists(_MESSAGE, min_size=1, max_size=4)


def _plain(source: str, messages: list[dict], variables: dict | None = None) -> str | Exception:
    try:
        return tokens._environment().from_string(source).render(messages=messages, tools=None,
                                                                add_generation_prompt=False, **(variables or {}))
    except Exception as e:  # noqa: BLE001 (the memo must then give nothing, and the counter the same error)
        return e


def _check(source: str, messages: list[dict], variables: dict | None = None) -> bool:
    """The memo's text is the plain render's, or the memo gives none; True when it gave one."""
    memo = memo_for(source, tokens._environment, variables or {})
    got = None if memo is None else memo.render(messages)
    want = _plain(source, messages, variables)
    if got is not None:
        assert not isinstance(want, Exception), want
        assert got == want
    return got is not None


@pytest.mark.parametrize("name", sorted(_TEMPLATES))
@settings(max_examples=25, deadline=None)
@given(messages=_MESSAGES)
def test_the_memo_gives_the_templates_own_render(name, messages):
    _check(_TEMPLATES[name], messages)


def test_the_shipped_templates_are_memoized_and_thinking_templates_are_not():
    two = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "q"}]},
           {"role": "assistant", "content": [{"type": "text", "text": "a"}]}]
    for name in BUILTIN_PROFILES:
        assert _check(_TEMPLATES[name], two), name
    # its macro's output is tested ('</think>' in content): a stand-in could not see that
    assert memo_for(_TEMPLATES["qwen3-vl-thinking.jinja"], tokens._environment, {}) is None


@pytest.mark.parametrize("source", [
    "{% for m in messages %}{% if '<think>' in m.content %}T{% endif %}{{ m.content }}{% endfor %}",
    "{% for m in messages %}{% if m.content in 'abc' %}T{% endif %}{{ m.content }}{% endfor %}",
    "{% for m in messages %}{{ m.content | trim }}{{ m.content | length }}{% endfor %}",
    "{% for m in messages %}{{ m.content ~ '!' }}{{ m.content + '!' }}{% endfor %}",
    "{% for m in messages %}{% if m.content %}x{% endif %}{{ m.content.startswith('a') }}{% endfor %}",
    "{% for m in messages %}{{ m.content | tojson }}{{ m | string }}{{ m.content | e }}{% endfor %}",
    "{% for m in messages %}{% set c %}{{ m.content }}{% endset %}{% if 'a' in c %}A{% endif %}{{ c }}{% endfor %}",
    "{% for m in messages %}{% filter upper %}{{ m.content }}{% endfilter %}{% endfor %}",
    "{% macro f(c) %}{{ c }}{% endmacro %}{% for m in messages %}{{ f(m.content) | upper }}{% endfor %}",
    "{% for m in messages %}{{ m.content is sameas messages[0].content }}{{ strftime_now('%Y') }}{% endfor %}",
    "{% for m in messages %}{% set ns = namespace(c=m.content) %}{{ ns.c }}{{ ns.c == 'a' }}{% endfor %}",
    "{% for m in messages %}{{ m.content is sequence }}{{ m.content is mapping }}{{ m.content[0] }}{% endfor %}",
    "{% for m in messages %}{% for ch in m.content %}{{ ch }}{% endfor %}{{ m.content | list }}{% endfor %}",
    "{% for m in messages %}{{ '%s' % m.content }}{{ [m.content] }}{{ {m.content: 1} }}{% endfor %}",
    "{% for m in messages %}{{ m.content if m.content is string else 'L' }}{{ m.content is string }}{% endfor %}",
])
def test_templates_that_look_at_their_texts_render_as_they_would(source):
    for texts in (["a", "b"], ["", "<think>x"], ["abc", "a"], ["A\0" + "0\0", "中"]):
        messages = [{"role": "user", "content": texts[0]}, {"role": "assistant", "content": texts[1]}]
        _check(source, messages)
    # one that only writes its texts is memoized (the last): the others never take the memo
    written = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert _check(source, written) == source.startswith("{% for m in messages %}{{ m.content if")


def test_only_plain_messages_have_a_shape():
    class Text(str):
        pass

    plain = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "q"}]},
             {"role": "assistant", "content": "a"}]
    assert _shape(plain) == (("user", "image", "text", 2, "assistant", None), ["q", "a"])
    for bad in ([{"content": "a", "role": "user"}], [{"role": "user", "content": "a", "tools": []}],
                [{"role": "user", "content": Text("a")}], [{"role": "user", "content": [{"type": "text"}]}],
                [{"role": "user", "content": [{"text": "a", "type": "text"}]}], [{"role": 1, "content": "a"}],
                [{"role": "user", "content": [{"type": "image", "image": "a.jpg"}]}], [{"role": "user", "content": 5}]):
        assert _shape(bad)[0] is None, bad


def test_the_counter_renders_by_shape_what_it_renders_plainly_and_tools_go_plainly():
    profile = load_profile("qwen3-vl")
    memo, plain = TokenCounter(profile), TokenCounter(profile, render_memo=False)
    assert memo._memo is not None and plain._memo is None
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "<think>"}]},
                {"role": "assistant", "content": [{"type": "text", "text": ""}]}]
    assert memo.render(messages) == plain.render(messages)
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert memo.render(messages, tools) == plain.render(messages, tools) != plain.render(messages)
    kwargs = dataclasses.replace(profile, chat_template="{{ flag }}{% for m in messages %}{{ m.content }}{% endfor %}",
                                 chat_template_kwargs='{"flag": "F"}')
    strings = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert TokenCounter(kwargs).render(strings) == "Fqa" and TokenCounter(kwargs)._memo._shapes
