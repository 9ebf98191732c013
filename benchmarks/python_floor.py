"""How close can a Python hit path come to jaxlib's? One jax.Array argument, side by side.

Run: python benchmarks/python_floor.py [--quick] [--host]

Times, as every nbjit number is (`nbjit.bench.interleave`, paired rounds,
ratio to jax.jit per round), one call ``f(x)`` of a one-argument function
(the compare matrix's args_1) by:

  * ``jax.jit`` and ``nbjit.jit``;
  * ``nbjit binder``: nbjit's generated binder for this call shape, called
    directly (everything but the entry layer: the class ``__call__`` with
    ``*args, **kwargs``, deferred-garbage collection, the binder lookup);
  * ``hand, every check``: a hand-written hit function for exactly this call
    doing what a hit must do and jaxlib's C++ does too: free deferred
    garbage, key ``(aval, committed)``, read the trace context, look the key
    up, compare shardings and trace context, check the post hook, touch the
    LRU, count the hit, execute, consume the outputs;
  * the same without one check at a time (``- trace context`` compares the
    node's context by identity), to show what each costs;
  * ``floor``: execute + consume only.

What it answers: a ratio nbjit cannot go below with the checks it must make,
and which check costs most. The hand-written function is a measuring
instrument, not a dispatcher: it knows its one signature.

With ``--host``, the same question for host inputs new on every call (the
compare matrix's numpy_args_2_new_values: ``a + b`` on two float32[8] numpy
arrays, the next pair of a pool of 64 each call): ``jax.jit``, ``nbjit.jit``,
its binder, ``prepare + execute`` (the record's input preparation, execute,
outputs: all of a hit after the lookup), ``floor: 2 puts + execute`` (one
``batched_device_put`` per input, copied during the call as nbjit does, then
execute + outputs: no key, no lookup, no checks) and ``floor: execute only``
(the inputs already on the device). The second floor is what any Python
dispatcher pays for two new host inputs, since jaxlib exposes no cheaper
way in than ``batched_device_put``.
"""

from __future__ import annotations

import argparse
import itertools
import operator
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import nbjit
from nbjit import _jax, bench

_EVERY_CHECK = """\
def hit(x):
    collect_garbage()
    key = (x.aval, x._committed)
    shardings = [x._sharding]
    context = trace_context()
    node = lookup(key)
    while node is not None and (node.shardings != shardings or node.context != context):
        node = node.next
    if node is None or (record := node.record) is None or post_hook.value is not None:
        raise RuntimeError("not a hit")
    node.shardings = shardings
    touch(node)
    outs = consume(record.execute([x]), record.out_handlers)
    node.hits += 1
    return outs[0]
"""

# check -> (the line(s) as written above, what replaces them)
_WITHOUT = {
    "garbage collection": ("    collect_garbage()\n", ""),
    "trace context": ("context = trace_context()", "context = node_context"),
    "post hook": (" or post_hook.value is not None", ""),
    "LRU touch": ("    touch(node)\n", ""),
    "hit count": ("    node.hits += 1\n", ""),
}


def contenders(x: jax.Array) -> list[tuple[str, object]]:
    def fn(a):
        return a + 1

    f_jax, f_nb = jax.jit(fn), nbjit.jit(fn)
    f_jax(x), f_nb(x)
    node, _ = f_nb._entry_for((x,), {})
    record = node.record
    scope = {
        "collect_garbage": _jax.collect_garbage, "trace_context": _jax.trace_context,
        "post_hook": _jax.post_hook_state, "consume": _jax.ExecuteResults.consume_with_handlers,
        "lookup": f_nb._namespace.entries.get, "touch": f_nb._namespace.cache.mark_recent,
        "node_context": node.context,
    }
    hands = []
    for label, (old, new) in [("every check", ("", "")), *_WITHOUT.items()]:
        source = _EVERY_CHECK.replace(old, new) if old else _EVERY_CHECK
        if label == "trace context":
            source = source.replace("node.context != context", "node.context is not context")
        namespace = dict(scope)
        exec(source, namespace)
        hands.append((f"hand, every check{'' if not old else ' - ' + label}", namespace["hit"]))
    execute, handlers = record.execute, record.out_handlers
    consume = _jax.ExecuteResults.consume_with_handlers

    def floor(a):
        return consume(execute([a]), handlers)[0]

    binder, args, kwargs = f_nb._binders[1], (x,), {}

    def nbjit_binder(a):
        return binder(f_nb, args, kwargs)

    out = [("jax.jit", f_jax), ("nbjit.jit", f_nb), ("nbjit binder", nbjit_binder), *hands,
           ("floor", floor)]
    return [(name, (lambda fn=fn: fn(x))) for name, fn in out]


def host_contenders(pool: Sequence[tuple[Any, Any]]) -> list[tuple[str, Callable]]:
    """``(name, fn(a, b))`` for two host inputs, each computing ``a + b`` (see --host)."""
    f_jax, f_nb = jax.jit(operator.add), nbjit.jit(operator.add)
    for a, b in pool[:3]:
        f_jax(a, b), f_nb(a, b)
    node, _ = f_nb._entry_for(tuple(pool[0]), {})
    record = node.record
    put, semantics = _jax.batched_device_put, _jax.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL
    puts = [(step.aval, step.sharding, step.devices) for step in record.step_objects()]
    (aval_a, sharding_a, devices_a), (aval_b, sharding_b, devices_b) = puts
    execute, handlers = record.execute, record.out_handlers
    consume = _jax.ExecuteResults.consume_with_handlers
    binder = f_nb._binders[2]
    floor = bench.floor_call(f_nb, *pool[0])  # inputs put once, here

    def nbjit_binder(a, b):
        return binder(f_nb, (a, b), {})

    def prepare_execute(a, b):
        return consume(execute(record.prepare([a, b])), handlers)[0]

    def puts_execute(a, b):
        x = put(aval_a, sharding_a, [a], devices_a, False, False, semantics)
        y = put(aval_b, sharding_b, [b], devices_b, False, False, semantics)
        return consume(execute([x, y]), handlers)[0]

    def execute_only(a, b):  # always the first pair's sum: the floor of a hit with no puts
        return floor()[0]

    return [("jax.jit", f_jax), ("nbjit.jit", f_nb), ("nbjit binder", nbjit_binder),
            ("prepare + execute", prepare_execute), ("floor: 2 puts + execute", puts_execute),
            ("floor: execute only", execute_only)]


def _cycling(pool: Sequence[tuple[Any, Any]], fn: Callable) -> Callable[[], Any]:
    pairs = itertools.cycle(pool)  # each contender walks the pool on its own
    return lambda: fn(*next(pairs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (~10 s)")
    parser.add_argument("--host", action="store_true",
                        help="two numpy inputs new every call instead of one jax.Array")
    options = parser.parse_args()
    settings = bench.Settings.quick() if options.quick else bench.Settings(max_seconds=60.0)
    if options.host:
        pool = bench.scenario("numpy_args_2_new_values").build().arg_pool
        timed = bench.interleave([(name, _cycling(pool, fn)) for name, fn
                                  in host_contenders(pool)], settings,
                                 sync=jax.block_until_ready)
        what = "two numpy float32[8] inputs new every call (a + b)"
    else:
        x = jnp.ones((8,), jnp.float32)
        timed = bench.interleave(contenders(x), settings, sync=jax.block_until_ready)
        what = "one jax.Array argument (float32[8], x + 1)"
    print(textwrap.dedent(f"""\
        {what}; jax {jax.__version__}; {len(timed.per_call_s)}
        paired rounds of {timed.calls_per_batch} calls; ratio = median per-round ratio to jax.jit
        """))
    print(f"{'contender':40s} {'us':>7s} {'ratio':>6s}  p10-p90")
    for name in timed.names:
        ratio = timed.ratio(name, "jax.jit")
        print(f"{name:40s} {timed.median_us(name):7.2f} {ratio.median:6.3f}  "
              f"{ratio.p10:.3f}-{ratio.p90:.3f}")


if __name__ == "__main__":
    main()
