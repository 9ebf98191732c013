"""The one emitter of generated source (nbjit/core/codegen.py `Source`) and the
one object that knows a resident slot's layout (nbjit/host/slots.py
`SlotLayout`).

Every generator builds its code from statements and nested blocks; only
`Source` lays out indentation. tests/test_generated_code.py checks the code
the generators build; this checks the emitter itself.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from nbjit.core.codegen import Source, generated_source, run_source
from nbjit.host.layout import LeafLayout, lay_out
from nbjit.host.slots import ResidentSlots, SlotLayout


def test_a_block_indents_what_it_holds_one_level_and_ends_with_the_with():
    src = Source()
    with src.block("def f(x):"):
        with src.block("if x > 1:"):
            with src.block("for i in range(x):"):
                src.line("x += i")
            src.line("return x")
        src.line("return -x")
    src.line("g = f")
    assert src.text() == ("def f(x):\n"
                          "    if x > 1:\n"
                          "        for i in range(x):\n"
                          "            x += i\n"
                          "        return x\n"
                          "    return -x\n"
                          "g = f\n")
    assert run_source(src.text(), "test f", {}, __name__)["g"](3) == 6


def test_a_block_left_by_an_exception_gives_its_depth_back():
    src = Source()
    with pytest.raises(RuntimeError), src.block("if x:"):
        raise RuntimeError
    src.line("y = 1")
    assert src.text() == "if x:\ny = 1\n"


def test_extend_nests_another_source_at_the_current_depth():
    inner = Source()
    with inner.block("try:"):
        inner.line("a = b")
    inner.line("c = a")
    outer = Source()
    with outer.block("def f(b):"):
        outer.extend(inner).lines(["return c"])
    assert outer.text() == "def f(b):\n    try:\n        a = b\n    c = a\n    return c\n"
    assert not Source() and outer


def test_statements_keep_their_own_text():
    """A statement is written as given: comments, quotes and long lines stay."""
    src = Source()
    long = "x = (" + " + ".join(f"a{i}" for i in range(40)) + ")  # one line, whatever its length"
    with src.block("if s == '    ':  # spaces inside a string are not indentation"):
        src.line(long)
    assert src.text().splitlines() == ["if s == '    ':  # spaces inside a string are not "
                                       "indentation", "    " + long]


def test_a_reused_source_is_shown_again_after_linecache_is_cleared():
    """Tracebacks and `inspect.getsource` read a generated function's text from
    linecache; a `linecache.clearcache()` (tools call it) must not leave a
    function whose compiled code is reused without its text."""
    import inspect
    import linecache

    source = "def made_here():\n    return 41 + 1\n"
    fn = run_source(source, "cleared", {}, __name__)["made_here"]
    linecache.clearcache()
    again = run_source(source, "cleared", {}, __name__)["made_here"]
    assert again.__code__ is fn.__code__  # the compiled code is reused
    assert again() == 42 and inspect.getsource(again) == source
    linecache.clearcache()  # and a function not made again: its text is still known
    assert generated_source(fn.__code__.co_filename) == source
    assert inspect.getsource(fn) == source


def test_slot_layout_indices():
    layout = SlotLayout(3)
    assert [layout.array(j) for j in range(3)] == [1, 2, 3]
    assert [layout.view(j) for j in range(3)] == [4, 5, 6]
    assert [layout.address(j) for j in range(3)] == [7, 8, 9]
    assert (SlotLayout.FENCE, SlotLayout.STAGING) == (0, -1)


@pytest.mark.cpu_host_memory  # tests/conftest.py
def test_a_pools_slots_are_laid_out_as_its_slot_layout_says():
    """Each leaf's device array aliases its view, whose address the slot keeps;
    the fence comes first, the staging buffer last and holds every view."""
    shapes = [((3,), np.float32), ((2, 2), np.int32), ((), np.uint8)]
    layouts = lay_out([LeafLayout(j, 0, shape, np.dtype(dtype), False, None)
                       for j, (shape, dtype) in enumerate(shapes)])
    device = jax.devices("cpu")[0]
    pool = ResidentSlots(layouts, jax.sharding.make_single_device_sharding(device), 0, 0)
    slot = pool.new_slot()
    assert slot is not None
    layout = pool.slot_layout
    assert len(slot) == 1 + 3 * len(layouts) + 1 and slot[layout.FENCE] is None
    staging = slot[layout.STAGING]
    arrays = layout.arrays(slot)
    assert len(arrays) == 3 and all(a is slot[layout.array(j)] for j, a in enumerate(arrays))
    for j, s in enumerate(layouts):
        view, address = slot[layout.view(j)], slot[layout.address(j)]
        assert view.shape == s.shape and view.dtype == s.dtype
        assert view.ctypes.data == address == staging.ctypes.data + s.offset
        assert slot[layout.array(j)].unsafe_buffer_pointer() == address


def test_generated_sources_are_named_in_their_emitters_folder():
    """A binder is named under nbjit/core/, a resident prepare and fence under
    nbjit/host/ (tracebacks point at the folder whose code wrote them)."""
    import os

    import numpy as np
    from _host import CALLS, fresh_pair, node_of

    import nbjit

    root = os.path.dirname(os.path.abspath(nbjit.__file__))
    f = nbjit.jit(lambda a, b: a * b)
    for i in range(CALLS):
        f(*fresh_pair(i))
    record = node_of(f, *fresh_pair(0)).record
    binder = f._binders[2]
    assert os.path.dirname(binder.__code__.co_filename) == os.path.join(root, "core")
    if record.fence is not None:  # (resident: the CPU's host memory)
        for made in (record.prepare, record.fence):
            assert os.path.dirname(made.__code__.co_filename) == os.path.join(root, "host")
    plain = nbjit.jit(lambda x: x + 1)
    plain(np.ones(2, np.float32))
    prepare = node_of(plain, np.ones(2, np.float32)).record.prepare
    assert os.path.dirname(prepare.__code__.co_filename) == os.path.join(root, "core")
