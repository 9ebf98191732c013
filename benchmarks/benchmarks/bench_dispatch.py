"""Per-call dispatch: nbjit.jit against jax.jit, one class per scenario family.

Every class times scenarios of `nbjit.bench.scenarios()` (the matrix of
``python -m nbjit compare``), so the dashboard and the command measure the
same functions on the same inputs. ``time_dispatch`` returns as soon as the
call has been dispatched; ``time_call`` waits for the outputs. A scenario
that a commit does not have is skipped on that commit.

Timing settings (`_Timed`): a case is built by the first timed call
(`common.Prepared`: asv_runner >= 0.3 would rerun a `setup` before every
call), in 1 s of unsampled warm-up; then 20-40 samples of a fixed `number`
of calls per process, two processes (four for `Workloads`); asv takes the
median. Two full runs of one commit agreed within +-10% on 41 of 44
jax-side combinations on a quiet 2-core machine, and on 27 of 44 on a VM
whose CPU alternated between two speeds (README, "Benchmarks over time";
``benchmarks/machine_speed.py`` tells which kind of machine you have, and
``bench_machine``'s control row shows the machine's speed beside these).
`--quick` takes one sample of one call, the first: it checks that the suite
runs, its numbers mean nothing.
"""

from . import common
from .common import IMPLS


class _Timed(common.Prepared):
    """asv timing settings shared by the dispatch classes (not a benchmark: the name is private).

    A class names its scenario (`scenario(*params)`); the `common.Call` for it is
    built on the first timed call (`common.Prepared`: no `setup`). `number`, calls per
    sample, targets 5-20 ms samples on the class's common case.
    """

    number = 500  # calls per sample: 4-12 ms at the 7-25 us of the one- and two-argument rows
    warmup_time = 1.0  # the first ~0.5 s of a process runs up to 2x slow
    repeat = (20, 40, 4.0)  # (min, max samples per process, seconds per process)
    rounds = 2  # processes
    timeout = 120

    def scenario(self, *params):
        raise NotImplementedError

    def prepare(self, *params):
        return common.Call(self.scenario(*params), params[-1])


class TrivialDispatch(_Timed):
    """api_benchmark jit_trivial(_dispatch): swap two outputs of a previous call."""

    params = [IMPLS]
    param_names = ["impl"]

    def scenario(self, impl):
        return "jit_trivial"

    def time_dispatch(self, impl):
        (self.run or self.start(impl)).dispatch()

    def time_call(self, impl):
        (self.run or self.start(impl)).call()


class SimpleDispatch(_Timed):
    """api_benchmark jit_simple(_dispatch): add two device scalars."""

    params = [IMPLS]
    param_names = ["impl"]

    def scenario(self, impl):
        return "jit_simple"

    def time_dispatch(self, impl):
        (self.run or self.start(impl)).dispatch()

    def time_call(self, impl):
        (self.run or self.start(impl)).call()


class ManyArgs(_Timed):
    """api_benchmark jit_simple_many_args(_dispatch): sum a list of n device scalars."""

    params = [[10, 100, 1000], IMPLS]
    param_names = ["n_args", "impl"]
    number = 50  # 12-600 us a call
    timeout = 180  # compiling the 1000-way sum takes seconds

    def scenario(self, n_args, impl):
        return f"jit_simple_many_args_{n_args}"

    def time_dispatch(self, n_args, impl):
        (self.run or self.start(n_args, impl)).dispatch()

    def time_call(self, n_args, impl):
        (self.run or self.start(n_args, impl)).call()


class PrunedArgs(_Timed):
    """api_benchmark jit_simple_pruned_args(_dispatch): n args, only the first is used."""

    params = [[10, 100, 1000], IMPLS]
    param_names = ["n_args", "impl"]
    number = 50  # 10-270 us a call

    def scenario(self, n_args, impl):
        return f"jit_simple_pruned_args_{n_args}"

    def time_dispatch(self, n_args, impl):
        (self.run or self.start(n_args, impl)).dispatch()

    def time_call(self, n_args, impl):
        (self.run or self.start(n_args, impl)).call()


class Transfer(_Timed):
    """api_benchmark jit_dispatch_with(out)_transfer: x + 1 on 128 images of 224x224.

    Timed per call until the result is ready, as compare's rows are
    (`sync_each`: their us and ratio are that; the time until the call
    returns is beside them in compare's JSON and notes). Dispatching 25 MB of
    work after 25 MB of work measures how long the queue has grown, which
    differed 4x between runs; and on an accelerator jax.jit returns before
    its transfer is done, nbjit after its copy.
    """

    params = [[False, True], IMPLS]
    param_names = ["transfer", "impl"]
    number = 5
    repeat = (5, 20, 5.0)

    def scenario(self, transfer, impl):
        return "jit_dispatch_with_transfer" if transfer else "jit_dispatch_without_transfer"

    def time_call(self, transfer, impl):
        (self.run or self.start(transfer, impl)).call()


class PjitSimple(_Timed):
    """api_benchmark pjit_simple_4_devices: a list of n arrays sharded over 4 devices."""

    params = [[1, 10, 100], IMPLS]
    param_names = ["n_args", "impl"]
    number = 20  # 130-1000 us a call

    def scenario(self, n_args, impl):
        return f"pjit_simple_4_devices_{n_args}_args"

    def time_dispatch(self, n_args, impl):
        (self.run or self.start(n_args, impl)).dispatch()

    def time_call(self, n_args, impl):
        (self.run or self.start(n_args, impl)).call()


_KIND_SCENARIO = {"jax.Array": "args_2", "numpy": "numpy_args_2",
                  "python_scalar": "python_scalars_2"}


class InputKinds(_Timed):
    """Two arguments of each kind (device scalars, numpy vectors, Python scalars), same values."""

    params = [list(_KIND_SCENARIO), IMPLS]
    param_names = ["kind", "impl"]

    def scenario(self, kind, impl):
        return _KIND_SCENARIO[kind]

    def time_dispatch(self, kind, impl):
        (self.run or self.start(kind, impl)).dispatch()

    def time_call(self, kind, impl):
        (self.run or self.start(kind, impl)).call()


class InputKindsNewValues(_Timed):
    """Two host arguments with new values on every call (the host-input memo never hits)."""

    params = [["numpy", "python_scalar"], IMPLS]
    param_names = ["kind", "impl"]

    def scenario(self, kind, impl):
        return ("numpy_args_2_new_values" if kind == "numpy"
                else "python_scalars_2_new_values")

    def time_dispatch(self, kind, impl):
        (self.run or self.start(kind, impl)).dispatch()


class StaticArgsKwargs(_Timed):
    """A static positional arg, a static kwarg and an array kwarg."""

    params = [IMPLS]
    param_names = ["impl"]

    def scenario(self, impl):
        return "static_args_kwargs"

    def time_dispatch(self, impl):
        (self.run or self.start(impl)).dispatch()

    def time_call(self, impl):
        (self.run or self.start(impl)).call()


class ParamDict100(_Timed):
    """A 100-leaf parameter dict in, a 100-leaf dict out."""

    params = [IMPLS]
    param_names = ["impl"]
    number = 40  # ~200-250 us a call

    def scenario(self, impl):
        return "dict_100_leaves"

    def time_dispatch(self, impl):
        (self.run or self.start(impl)).dispatch()

    def time_call(self, impl):
        (self.run or self.start(impl)).call()


class ShardedNumpy(_Timed):
    """A numpy 64x64 input with NamedSharding P('x', 'y') over 8 host devices."""

    params = [IMPLS]
    param_names = ["impl"]
    number = 20  # ~450 us a call

    def scenario(self, impl):
        return "numpy_sharded_8_devices"

    def time_dispatch(self, impl):
        (self.run or self.start(impl)).dispatch()

    def time_call(self, impl):
        (self.run or self.start(impl)).call()


class Workloads(_Timed):
    """The loops people write, host values new on every call (compare's ``workload_*`` rows)."""

    params = [["train_step", "optimizer_update", "env_step", "static_config",
               "data_parallel_8_devices"], IMPLS]
    param_names = ["workload", "impl"]
    number = 100  # 25-840 us a call
    rounds = 4  # a process's calls sit 10-20% apart from another's: more processes
    repeat = (10, 20, 2.0)

    def scenario(self, workload, impl):
        return f"workload_{workload}"

    def time_dispatch(self, workload, impl):
        (self.run or self.start(workload, impl)).dispatch()


class HostArrays(_Timed):
    """`f(params, x)`, x a float32 numpy array of 8 KiB to 1 MiB: the same array
    every call (off or on a 64-byte boundary) or one of four in turn, timed to
    the result (compare's ``host_array_*`` rows), and an MNIST-sized training
    loop with a new 392 KiB batch (``workload_mnist_train_step``)."""

    params = [["same_8k", "same_64k", "same_1m", "same_8k_aligned", "same_64k_aligned",
               "same_1m_aligned", "fresh_8k", "fresh_64k", "fresh_1m", "fresh_8k_aligned",
               "fresh_64k_aligned", "fresh_1m_aligned", "mnist_train_step"], IMPLS]
    param_names = ["row", "impl"]
    number = 40  # ~15-300 us a call

    def scenario(self, row, impl):
        return "workload_mnist_train_step" if row == "mnist_train_step" else f"host_array_{row}"

    def time_call(self, row, impl):
        (self.run or self.start(row, impl)).call()


class CacheMiss:
    """A new function on every call: trace, lower, compile, run."""

    params = [IMPLS]
    param_names = ["impl"]
    number = 1
    repeat = (1, 10, 10.0)

    def setup(self, impl):
        bench = common.bench_module()
        self.case = common.scenario("cache_miss").build()
        self.fresh_copy = bench.fresh_copy
        self.jit = common.get_jit(impl)

    def time_miss(self, impl):
        case = self.case
        common.block(self.jit(self.fresh_copy(case.fun), **case.jit_options)(*case.args))
