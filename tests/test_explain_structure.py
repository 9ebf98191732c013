"""A miss of a changed pytree structure is explained by the path of the node
that changed, in one statement of at most 120 characters, never a treedef
dump: in the log (`nbjit.explain_misses`) and in `nbjit.ranked_misses()`,
under `nbjit.jit` and `nbjit.filter_jit` alike."""

import collections
import dataclasses
import logging
import re

import jax
import jax.numpy as jnp
import pytest
from jax import tree_util

import nbjit
from nbjit.observe import names as _names

eqx = pytest.importorskip("equinox")

P = collections.namedtuple("P", "a b")
Q = collections.namedtuple("Q", "a b")


class Net(eqx.Module):
    w: jax.Array
    scale: float = eqx.field(static=True)


class Block(eqx.Module):
    w: jax.Array
    activation: str = eqx.field(static=True)


class Stack(eqx.Module):
    blocks: list


@dataclasses.dataclass
class Struct:  # what flax.struct.dataclass registers: a dataclass, meta fields in the aux data
    w: jax.Array
    features: int


tree_util.register_dataclass(Struct, data_fields=["w"], meta_fields=["features"])


@dataclasses.dataclass
class Marked:  # flax's own marking: struct.field(pytree_node=False)
    w: jax.Array
    features: int = dataclasses.field(metadata={"pytree_node": False})


tree_util.register_dataclass(Marked, data_fields=["w"], meta_fields=["features"])


class Custom:
    def __init__(self, x, aux):
        self.x, self.aux = x, aux


tree_util.register_pytree_node(Custom, lambda c: ((c.x,), c.aux),
                               lambda aux, ch: Custom(ch[0], aux))

x = jnp.ones(2)


def _stack(activation):
    return Stack([Block(x, "relu"), Block(x, "relu"), Block(x, activation)])


# (name, first call's argument, second call's argument, the statement expected)
CASES = [
    ("equinox static field", Net(x, 1.0), Net(x, 2.0), "tree.scale (static field): 1.0 -> 2.0"),
    ("nested static field", _stack("tanh"), _stack("gelu"),
     "tree.blocks[2].activation (static field): 'tanh' -> 'gelu'"),
    ("flax-style struct field", Struct(x, 4), Struct(x, 8),
     "tree.features (static field): 4 -> 8"),
    ("pytree_node=False field", Marked(x, 4), Marked(x, 8),
     "tree.features (static field): 4 -> 8"),
    ("namedtuple type", P(x, x), Q(x, x), "tree: P -> Q (namedtuple)"),
    ("dict key added", {"a": x}, {"a": x, "b": x}, "tree['b']: added"),
    ("dict key removed", {"a": x, "b": x}, {"a": x}, "tree['b']: removed"),
    ("list length", [x, x], [x, x, x], "tree: list of 2 -> 3"),
    ("None for an array", {"m": x}, {"m": None}, "tree['m']: float32[2] -> None"),
    ("array for None", {"m": None}, {"m": x}, "tree['m']: None -> float32[2]"),
    ("custom aux data", Custom(x, {"k": 3, "j": 1}), Custom(x, {"k": 4, "j": 1}),
     "tree (Custom aux data['k']): 3 -> 4"),
    ("list for tuple", [x, x], (x, x), "tree: list of 2 -> tuple of 2"),
]


@pytest.fixture
def records(caplog):
    caplog.set_level(logging.WARNING, logger="nbjit")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "nbjit"]


@pytest.mark.parametrize("jit", [nbjit.jit, nbjit.filter_jit], ids=["jit", "filter_jit"])
@pytest.mark.parametrize("name, first, second, expected", CASES, ids=[c[0] for c in CASES])
def test_structure_change_named_by_its_path(records, jit, name, first, second, expected):
    nbjit.reset_ranked_misses()  # every case's lambda is one code: its rows fold together
    f = jit(lambda tree, y: y * 2)
    f(first, x)
    before = len(records())
    with nbjit.explain_misses():
        f(second, x)
    logged = records()[before:]
    assert len(logged) == 1
    message = logged[0]
    assert f": {expected}; JAX" in message, message
    assert "PyTreeDef" not in message and len(expected) <= _names.STATEMENT_MAX
    field = expected.split(": ")[0] if "->" in expected else expected
    function, site = _named(message)
    rows = [r for r in nbjit.ranked_misses() if (r.function, r.site) == (function, site)
            and r.fields != ("first call",)]
    assert len(rows) == 1 and rows[0].count == 1, rows
    assert rows[0].fields[0].startswith(field.split(" (")[0]), rows[0].fields
    assert all("PyTreeDef" not in f and len(f) <= _names.STATEMENT_MAX for f in rows[0].fields)
    assert expected in rows[0].example


def _named(message: str) -> tuple[str, str]:
    """(function, call site) that a logged miss names; the function as
    `ranked_misses` names it (by its code, without stats()' ``#N`` per object)."""
    head = message.split(": ", 1)[0].removeprefix("nbjit cache miss of ")
    function, site = head.rsplit(" at ", 1)
    return re.sub(r"#\d+$", "", function), site


def test_ranked_misses_group_by_the_path():
    """Two misses on one field of one call site, another on another field:
    two groups, each by its path."""
    f = nbjit.jit(lambda tree: tree.w * 2)
    calls = []
    for scale in (1.0, 2.0, 3.0):
        calls.append(f(Net(x, scale)))
    g = nbjit.jit(lambda tree: tree["a"])
    for tree in ({"a": x}, {"a": x, "b": x}, {"a": x, "c": x}):
        g(tree)
    ranked = collections.Counter()
    for r in nbjit.ranked_misses():
        if "test_ranked_misses_group_by_the_path" in r.function:
            ranked[r.fields] += r.count
    assert ranked == {("first call",): 2, ("tree.scale (static field)",): 2,
                      ("tree['b']: added",): 1, ("tree['c']: added",): 1}


def test_ties_name_each_entry_briefly(records):
    f = nbjit.jit(lambda tree: tree.w)
    f(Net(x, 1.0))
    f(Net(x, 3.0))
    before = len(records())
    with nbjit.explain_misses():
        f(Net(x, 2.0))
    (message,) = records()[before:]
    assert "2 of 2 cached signatures are equally close" in message
    assert "(tree.scale (static field): 3.0 -> 2.0); or " \
           "(tree.scale (static field): 1.0 -> 2.0)" in message
    assert len(message) < 400


def test_long_values_are_cut_to_the_statement_limit():
    old = tree_util.tree_structure(Custom(x, "a" * 500))
    new = tree_util.tree_structure(Custom(x, "b" * 500))
    field, text = _names.structure_difference("args[0]", old, new, str, str)
    assert field == "args[0] (Custom aux data)"
    assert len(text) <= _names.STATEMENT_MAX and "aaa" in text and "bbb" in text


def test_a_wide_module_is_still_one_short_statement():
    """The issue's 2,544-character dump of a wider MLP: now its path."""
    mlp = eqx.nn.MLP(16, 16, 64, 4, key=jax.random.key(0))
    old, new = (tree_util.tree_structure({"mlp": mlp, "head": Net(x, s)}) for s in (1.0, 2.0))
    assert len(str(old)) > 300
    field, text = _names.structure_difference("args[0]", old, new, str, str)
    assert text == "args[0]['head'].scale (static field): 1.0 -> 2.0"


def test_a_static_function_is_named_without_its_address():
    class Act(eqx.Module):
        w: jax.Array
        fn: object = eqx.field(static=True)

    old, new = (tree_util.tree_structure(Act(x, fn)) for fn in (jax.nn.relu, jnp.tanh))
    field, text = _names.structure_difference("args[0]", old, new, str, str)
    assert field == "args[0].fn (static field)" and "0x" not in text, text


def test_nothing_differs_gives_none():
    tree = tree_util.tree_structure({"a": [x, Net(x, 1.0)]})
    assert _names.structure_difference("args[0]", tree, tree, str, str) is None


class Scaled(eqx.Module):
    w: jax.Array
    scale: float = eqx.field(static=True)

    def __call__(self, y):
        return self.w * y * self.scale


def test_filter_jits_wrapped_module_named_by_its_field():
    """filter_jit splits the wrapped callable too: a static field of a Module
    used as the function is named by its path under `fun`."""
    for scale in (1.0, 2.0):
        nbjit.filter_jit(Scaled(x, scale))(x)
    fields = [r.fields for r in nbjit.ranked_misses() if "Scaled" in r.function]
    assert ("fun.scale (static field)",) in fields, fields


# -- every static field that changed is named, and counted (issue 46) ----------


class Layer(eqx.Module):
    w: jax.Array
    scale: float = eqx.field(static=True)
    activation: object = eqx.field(static=True)


def _layers(s0, a0, s1, a1):
    return Stack([Layer(x, s0, a0), Layer(x, s1, a1)])


def _records_of(call, records):
    before = len(records())
    with nbjit.explain_misses():
        call()
    (message,) = records()[before:]
    return message


@pytest.mark.parametrize("jit", [nbjit.jit, nbjit.filter_jit], ids=["jit", "filter_jit"])
def test_every_changed_static_field_of_a_module_is_named(records, jit):
    f = jit(lambda m: m.blocks[0].w * m.blocks[1].scale)
    f(_layers(1.0, jax.nn.relu, 1.0, jax.nn.relu))
    message = _records_of(lambda: f(_layers(1.0, jax.nn.gelu, 3.0, jax.nn.relu)), records)
    assert ("m.blocks[0].activation (static field): <function relu> -> <function gelu>; "
            "m.blocks[1].scale (static field): 1.0 -> 3.0") in message, message


@pytest.mark.parametrize("jit", [nbjit.jit, nbjit.filter_jit], ids=["jit", "filter_jit"])
def test_an_entry_one_field_away_is_closer_than_one_two_fields_away(records, jit):
    f = jit(lambda m: m.blocks[0].w * m.blocks[1].scale)
    f(_layers(1.0, jax.nn.relu, 1.0, jax.nn.relu))  # two fields away from the call
    f(_layers(1.0, jax.nn.gelu, 2.0, jax.nn.relu))  # one field away
    message = _records_of(lambda: f(_layers(1.0, jax.nn.gelu, 3.0, jax.nn.relu)), records)
    assert "against the closest of 2 cached signatures: m.blocks[1].scale (static " \
           "field): 2.0 -> 3.0;" in message, message


@pytest.mark.parametrize("jit", [nbjit.jit, nbjit.filter_jit], ids=["jit", "filter_jit"])
def test_equally_close_entries_each_named_once(records, jit):
    f = jit(lambda m: m.blocks[0].w * m.blocks[1].scale)
    f(_layers(1.0, jax.nn.relu, 1.0, jax.nn.relu))
    f(_layers(1.0, jax.nn.relu, 2.0, jax.nn.relu))
    message = _records_of(lambda: f(_layers(1.0, jax.nn.gelu, 3.0, jax.nn.relu)), records)
    assert "2 of 2 cached signatures are equally close" in message
    alternatives = message.split(": ", 2)[2].split("; or ")
    assert len(alternatives) == len(set(alternatives)) == 2, message
    assert all("scale (static field)" in a and "activation" in a for a in alternatives), message
