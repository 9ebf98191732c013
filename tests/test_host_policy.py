"""The host-input policy (nbjit/host/policy.py, armed by nbjit/host/watch.py):
one compare-and-swap of a node's record, along its table; on a miss it
watches the signature with a record built with `on_fresh`, and never
raises into the miss path.
"""

from __future__ import annotations

import jax
import pytest
from _diff import assert_same_outputs
from _host import CALLS, fresh_pair, is_resident, node_of, run_fresh

import nbjit
from nbjit.host.policy import TRANSITIONS, Stage

pytestmark = pytest.mark.cpu_host_memory  # tests/conftest.py


def test_the_policy_swaps_in_its_watching_record_built_with_on_fresh():
    """On the miss the policy replaces the miss's record with one whose host
    steps were built with `on_fresh` (never patched on afterwards)."""
    f = nbjit.jit(lambda a, b: a * b)
    args = fresh_pair(0)
    f(*args)
    node = node_of(f, *args)
    policy = node.host_policy
    assert policy.stage is Stage.PER_LEAF and node.record is policy.per_leaf
    hosts = [s for s in node.record.step_objects() if type(s).__name__ == "HostInput"]
    assert len(hosts) == 2 and all(h.on_fresh is not None for h in hosts)
    assert all(h.on_fresh() == policy.fresh for h in hosts)  # weak: the policy's method
    for i in range(1, CALLS):
        f(*fresh_pair(i))
    assert policy.stage is Stage.RESIDENT and is_resident(f, *args)


def test_the_swap_is_a_compare_and_swap_along_the_table():
    f, args = run_fresh(lambda a, b: a + b, fresh_pair)
    node = node_of(f, *args)
    policy, resident = node.host_policy, node.record
    assert policy.stage is Stage.RESIDENT
    # Not what the node holds: refused, nothing changes.
    assert not policy._swap(policy.builder, Stage.GIVEN_UP, policy.per_leaf)
    assert node.record is resident and policy.stage is Stage.RESIDENT
    # A move the table does not have: refused.
    assert (Stage.RESIDENT, Stage.ARMING) not in TRANSITIONS
    assert not policy._swap(resident, Stage.ARMING, policy.per_leaf)
    assert node.record is resident and policy.stage is Stage.RESIDENT
    # Its own move: made.
    assert policy._swap(resident, Stage.GIVEN_UP, policy.per_leaf)
    assert node.record is policy.per_leaf and policy.stage is Stage.GIVEN_UP
    g = jax.jit(lambda a, b: a + b)
    for i in range(4):  # given up: per-leaf puts, for good
        assert_same_outputs(f(*fresh_pair(i)), g(*fresh_pair(i)))
    assert policy.stage is Stage.GIVEN_UP and not is_resident(f, *args)


def test_only_the_cache_assigns_a_nodes_record():
    """`node.record` is set when the node is made (cache.Node) and replaced by the
    cache's `Namespace.replace_record` (which the policy's `_swap` calls); nowhere
    else in nbjit."""
    import pathlib
    import re

    root = pathlib.Path(nbjit.__file__).parent
    places = sorted(f"{p.relative_to(root)}:{line.strip()}"
                    for p in root.rglob("*.py")
                    for line in p.read_text().splitlines()
                    if re.search(r"\.record(: [^=]*)? = ", line))
    assert places == ["core/cache.py:node.record = new",
                      "core/cache.py:self.record: FastPath | None = record  "
                      "# replaced only by `Namespace.replace_record`"], places


def test_on_miss_never_raises_into_the_miss_path():
    """`on_miss` is what the miss path calls after a compile with a record: a
    jitted object it cannot read, or no node, leaves the miss alone."""
    import types

    from nbjit.host import watch

    assert watch.on_miss(object()) is None
    f = nbjit.jit(lambda a, b: a + b)
    args = fresh_pair(0)
    f(*args)
    node = node_of(f, *args)
    record = node.record
    outcome = types.SimpleNamespace(jitted=f, node=node, record=None, fastpath=None,
                                    leaves=list(args), args=args, kwargs={})
    assert watch.on_miss(outcome) is None
    assert node.record is record  # nothing swapped
