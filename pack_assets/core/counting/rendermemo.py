"""A chat template's render of plain messages from their shape: the template rendered once per shape with
stand-ins for the texts, then each text written where its stand-in was (about 1-2 µs against ~16 for a render).

A message is plain when it is ``{"role": str, "content": str | [part, ...]}`` (keys in that order) and each part is
``{"type": "image"}``, ``{"type": "video"}`` or ``{"type": "text", "text": str}``. Its shape is all of it but the
texts: the roles, which content is a string, the parts' types. With no ``tools``, such a render's inputs are the
shape, the texts and the counter's fixed variables.

Why the render by shape is the render (exact, not a guess). The stand-in render sees the same lists and dicts
with each text replaced by a ``_Text``, an object on which every operation raises ``_Touched`` (a BaseException:
no ``except Exception`` in Jinja, the sandbox or a filter can swallow it): comparing, hashing, ``len``, truth,
iterating, indexing, ``in`` on either side, ``+``, ``%``, ``str``, ``repr``, ``format``, any attribute (so
``isinstance`` too, which reads ``__class__``), ``tojson`` (a TypeError). A ``{{ ... }}`` that writes a text goes
through the environment's ``finalize``, which alone turns a ``_Text`` into a marker; ``is string`` is answered
True for it without looking. So when the stand-in render ends without any exception, the template took no
decision on a text's content: it took the same path for every text, and wrote each text only as itself (a
filter, a concatenation or a test would have raised). Output captured and then reused (``{% set %}...{% endset
%}``, ``{% filter %}``, macros, call blocks, blocks, recursive loops, includes) could carry a marker into a test
or filter without touching a ``_Text``: a template holding any of them gets no memo (``memo_for``), nor one
using ``strftime_now`` or ``lipsum`` (the time, chance), nor ``is sameas`` (identity). Every marker must come out
exactly once, in order, and no other NUL anywhere, else the shape is not memoized. tests/test_rendermemo.py
compares with the plain render, templates that look at their texts included.
"""

from __future__ import annotations

import threading

from jinja2 import nodes

_MAX_SHAPES = 4096
_CAPTURES = (nodes.AssignBlock, nodes.FilterBlock, nodes.Macro, nodes.CallBlock, nodes.Block, nodes.Include,
             nodes.Import, nodes.FromImport, nodes.Extends, nodes.Scope, nodes.OverlayScope,
             nodes.EvalContextModifier, nodes.ScopedEvalContextModifier)
_UNSURE_NAMES = frozenset(("strftime_now", "lipsum", "caller", "super", "self"))
_MEDIA = frozenset(("image", "video"))
_ROLE_CONTENT, _TYPE_TEXT, _TYPE = ("role", "content"), ("type", "text"), ("type",)


class _Touched(BaseException):
    """A template did more with a text than write it."""


def _touched(*_a, **_k):
    raise _Touched


class _Text:
    """A text's stand-in: it can only be written (``finalize``); anything else raises ``_Touched``."""

    __slots__ = ("index",)

    def __getattribute__(self, name):
        raise _Touched

    __setattr__ = __delattr__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = _touched
    __bool__ = __len__ = __iter__ = __reversed__ = __contains__ = __getitem__ = __str__ = __repr__ = _touched
    __format__ = __add__ = __radd__ = __mul__ = __rmul__ = __mod__ = __rmod__ = __index__ = _touched
    __int__ = __float__ = __iadd__ = __bytes__ = __round__ = _touched


def _text(index: int) -> _Text:
    t = object.__new__(_Text)
    object.__setattr__(t, "index", index)
    return t


def memo_for(source: str, environment_factory, variables: dict) -> ShapeMemo | None:
    """A memo for this template source rendered with ``variables`` besides the messages, or None when the
    template could reuse what it wrote (see above)."""
    env = environment_factory()
    try:
        tree = env.parse(source)
    except Exception:  # noqa: BLE001 (the plain render reports the template's own error)
        return None
    if any(True for _ in tree.find_all(_CAPTURES)) or any(f.recursive for f in tree.find_all(nodes.For)):
        return None
    if any(n.name in _UNSURE_NAMES for n in tree.find_all(nodes.Name)) \
            or any(t.name == "sameas" for t in tree.find_all(nodes.Test)):
        return None
    return ShapeMemo(source, env, variables)


class ShapeMemo:
    """``render(messages)`` of plain messages from their shape, else None (the caller renders). Shared by the
    process's counters of one template: a shape is learned under a lock (its stand-ins' markers are numbered in
    the memo), a learned one is only read."""

    def __init__(self, source: str, env, variables: dict) -> None:
        self._variables = dict(variables)
        self._written: list[int] = []
        env.finalize = self._finalize
        plain_string = env.tests["string"]
        env.tests["string"] = lambda v: type(v) is _Text or plain_string(v)
        for name in ("strftime_now", "lipsum"):
            env.globals[name] = _touched
        self._template = env.from_string(source)
        self._template.globals = dict(self._template.globals)
        self._shapes: dict[tuple, tuple[list[str], list[int]] | None] = {}
        self._lock = threading.Lock()

    def _finalize(self, value):
        if type(value) is _Text:
            self._written.append(object.__getattribute__(value, "index"))
            return f"\0{len(self._written) - 1}\0"
        return value

    def render(self, messages: list[dict]) -> str | None:
        shape, texts = _shape(messages)
        if shape is None:
            return None
        got = self._shapes.get(shape, False)
        if got is False:
            with self._lock:
                got = self._learn(shape)
        if got is None:
            return None
        literals, order = got
        out = [literals[0]]
        for i, lit in zip(order, literals[1:]):
            out += (texts[i], lit)
        return "".join(out)

    def _learn(self, shape: tuple) -> tuple[list[str], list[int]] | None:
        if len(self._shapes) >= _MAX_SHAPES:
            self._shapes.clear()
        self._written = []
        got = None
        try:
            pieces = self._template.render(messages=_stand_ins(shape), tools=None, add_generation_prompt=False,
                                           **self._variables).split("\0")
            order = self._written
            if len(pieces) == 2 * len(order) + 1 and pieces[1::2] == [str(k) for k in range(len(order))]:
                got = (pieces[0::2], order)
        except BaseException as e:  # noqa: BLE001 (any: the shape is rendered plainly, which meets its own error)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
        self._shapes[shape] = got
        return got


def _shape(messages: list[dict]) -> tuple[tuple | None, list[str]]:
    """(the messages' shape, their texts in order), or (None, ...) when a message is not plain. The shape is flat:
    per message its role, then None for a string content, else each part's type and the number of parts."""
    shape: list = []
    texts: list[str] = []
    add, add_text = shape.append, texts.append
    for m in messages:
        if type(m) is not dict or tuple(m) != _ROLE_CONTENT:
            return None, texts
        role, content = m.values()
        if type(role) is not str:
            return None, texts
        add(role)
        if type(content) is str:
            add_text(content)
            add(None)
            continue
        if type(content) is not list:
            return None, texts
        for p in content:
            if type(p) is not dict:
                return None, texts
            keys = tuple(p)
            if keys == _TYPE_TEXT:
                kind, text = p.values()
                if kind != "text" or type(text) is not str:
                    return None, texts
                add_text(text)
            elif keys != _TYPE or (kind := p["type"]) not in _MEDIA:
                return None, texts
            add(kind)
        add(len(content))
    return tuple(shape), texts


def _stand_ins(shape: tuple) -> list[dict]:
    """The messages of a shape with ``_Text`` stand-ins, numbered in text order."""
    out: list[dict] = []
    n, i = 0, 0
    while i < len(shape):
        role, i = shape[i], i + 1
        if shape[i] is None:
            out.append({"role": role, "content": _text(n)})
            n, i = n + 1, i + 1
            continue
        content = []
        while type(shape[i]) is str:
            if shape[i] == "text":
                content.append({"type": "text", "text": _text(n)})
                n += 1
            else:
                content.append({"type": shape[i]})
            i += 1
        out.append({"role": role, "content": content})
        i += 1  # the number of parts
    return out
