"""Launch records: host inputs put by jaxlib's own C++ path, into jax.jit's own executable.

On a device with memory of its own (an accelerator) every host leaf is a
transfer, and a put made from Python (`batched_device_put`) costs the
calling thread more than jaxlib's C++ put of the same buffer, the one
jax.jit's fast path makes for each numpy argument (docs/host-inputs.md,
"Accelerators"). So there a record whose host leaves are bound for its
executable's one device gets a *launcher*: a jaxlib `PjitFunction` over the
call's flat leaves (`_jax.jaxlib_launcher`, what JAX's own
`_pjit_call_impl` makes), whose miss hands back the fast-path data JAX's
miss gave this record. Its hits are jaxlib's C++: key the leaves, put each
host leaf (zero copy), run that same executable, build the outputs. The
program is jax.jit's for the signature, always; what nbjit changes is what
each host leaf's put reads (`HostInput.launch_value`):

  * a writeable array: a private copy in its step's `StagingRing`, so a
    write right after the call never reaches the transfer;
  * an array no one can write (`staging.immutable`): itself, zero copy;
  * a scalar: a private 0-d copy (jaxlib's own scalar put waits for its
    transfer), or itself where numpy would not convert it as jaxlib does;
  * a value the step's memo saw before, or a big array (read during the
    call: `Staged.DIRECT_MIN_BYTES`): a device array of nbjit's own.

A multi-device sharding plan's leaf is put by its plan (`_Planned`); an
array on another device goes to jaxlib as it is (it copies it, as for
jax.jit). The launcher's own miss (its first call, or a leaf given in
another form: a memo's device array where a copy went before) runs the
record's per-leaf steps once and returns the same fast-path data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from nbjit import _jax
from nbjit.core.codegen import Source, run_source
from nbjit.core.inputs.steps import InputStep

__all__ = ["LAUNCH_SPAN", "LaunchRefused", "launch_for"]

# Up to this many leaves a record's stager is generated code (each host
# leaf's private copy inline); past it, a loop over the host leaves.
STAGE_UNROLL_MAX = 16

LAUNCH_SPAN = "nbjit launch: "  # what a launcher's name starts with (its profiler spans)

ArrayImpl = _jax.ArrayImpl
_consume = _jax.ExecuteResults.consume_with_handlers

# One jaxlib cache for every launcher's entries (each launcher is keyed by
# its own function object there, and its entries go when it is collected).
_CACHE = _jax.jaxlib_launcher_cache(4096)


class LaunchRefused(Exception):
    """The launcher's own miss could not run the call: a leaf's put failed
    (`inputs` None: a transfer guard forbids it, say; the call goes to JAX's
    own path, as a hit's refused inputs do), or the executable refused the
    inputs it was given (a deleted array, say: `error` and `inputs` are what
    the hit path's `_execute_failed` takes, so the call goes where a refused
    execution goes)."""

    def __init__(self, error: Exception, inputs: list | None) -> None:
        super().__init__(error)
        self.error = error
        self.inputs = inputs


def launch_for(name: str, fastpath: Any, consts: tuple, kept: tuple[int, ...] | None,
               n_leaves: int, steps: dict[int, InputStep], execute: Callable[[Sequence[Any]], Any],
               out_handlers: list, single_output: bool
               ) -> tuple[Callable[[Sequence[Any]], Sequence[Any]], Callable[..., Any]]:
    """``(stage, launch)`` for a record: ``launch(*stage(leaves))`` is a hit.

    `steps`: input index -> step, as the record's (consts first, then the
    kept leaves); `execute`, `out_handlers`: the record's, for the
    launcher's own miss.
    """
    n_consts = len(consts)
    leaf_of = range(n_leaves) if kept is None else kept
    # leaf -> the step that makes the launcher's argument for it: host leaves only
    stagers = {leaf_of[i - n_consts]: step for i, step in sorted(steps.items())
               if i >= n_consts and step.puts_host_values}
    stage = _stager(n_leaves, stagers)
    out_tree = fastpath.out_pytree_def
    applied = sorted(steps.items())

    def run(*staged: Any) -> Any:
        """The call on the record's own per-leaf path (the launcher's miss)."""
        inputs = [*consts, *(staged if kept is None else [staged[j] for j in kept])]
        try:
            for i, step in applied:
                x = inputs[i]
                if type(x) is not ArrayImpl or not step.puts_host_values:
                    inputs[i] = step.value(x)
        except Exception as error:  # JAX's own path says what is wrong
            raise LaunchRefused(error, None) from error
        try:
            results = execute(inputs)
        except Exception as error:
            raise LaunchRefused(error, inputs) from error
        outs = _consume(results, out_handlers)
        return outs[0] if single_output else out_tree.unflatten(outs)

    def cache_miss(*staged: Any) -> tuple:
        return run(*staged), fastpath, False

    # Its spans in a profile read ``PjitFunction(nbjit launch: <name>)``, inside
    # the call's own ``PjitFunction(<name>)`` pair, which stays jax.jit's count.
    return stage, _jax.jaxlib_launcher(f"{LAUNCH_SPAN}{name}", run, cache_miss, _CACHE)


def _stager(n_leaves: int, stagers: dict[int, InputStep]) -> Callable[[Sequence[Any]], Sequence]:
    """``stage(leaves)``: the launcher's arguments, each host leaf (`stagers`:
    leaf -> its step) replaced by what its step hands jaxlib's put. Generated
    for up to `STAGE_UNROLL_MAX` leaves (no list, no loop, no call per leaf
    but the copy's: `InputStep.launch_inline`)."""
    if n_leaves <= STAGE_UNROLL_MAX:
        src, names = Source(), {}
        with src.block("def stage(leaves):"):
            if n_leaves:
                src.line(f"{''.join(f'x{j}, ' for j in range(n_leaves))}= leaves")
            args = []
            for j in range(n_leaves):
                if j in stagers:
                    expression, read = stagers[j].launch_inline(f"x{j}", j)
                    names.update(read)
                    args.append(expression)
                else:
                    args.append(f"x{j}")
            src.line(f"return ({''.join(a + ', ' for a in args)})")
        return run_source(src.text(), "stage", names, __name__)["stage"]
    values = tuple((leaf, step.launch_value) for leaf, step in sorted(stagers.items()))

    def stage(leaves: Sequence[Any]) -> list:
        staged = list(leaves)
        for leaf, launch_value in values:
            staged[leaf] = launch_value(staged[leaf])
        return staged

    return stage
