"""Per-call dispatch: nbjit.jit against jax.jit, one class per scenario family.

Every class times scenarios of `nbjit._compare.scenarios()` (the matrix of
``python -m nbjit compare``), so the dashboard and the command measure the
same functions on the same inputs. ``time_dispatch`` returns as soon as the
call has been dispatched; ``time_call`` waits for the outputs. A scenario
that a commit does not have is skipped on that commit.

Timing settings (`_Timed`): about 40 samples of ~10 ms per process, two
processes, after 0.3 s of warm-up; from these asv takes the median. Two full
runs of one commit on a quiet 2-core machine agree within +-10% on 39 of 44
jax-side combinations; four processes of 10-20 samples did no better (also
39 of 44) at 1.7x the time (README, "Benchmarks over time"). `--quick` takes
one sample of one call: it checks that the suite runs, its numbers mean
nothing.
"""

from . import common
from .common import IMPLS


class _Timed:
    """asv timing settings shared by the dispatch classes (not a benchmark: the name is private)."""

    sample_time = 0.01
    warmup_time = 0.3
    repeat = (20, 40, 4.0)  # (min, max samples per process, seconds per process)
    min_run_count = 20
    rounds = 2  # processes
    timeout = 120

    def _setup(self, name, impl):
        self.run = common.Call(name, impl)

    def teardown(self, *params):
        # asv calls teardown after a skipped setup too: nothing to wait for then.
        run = getattr(self, "run", None)
        if run is not None:
            common.block(run.dispatch())


class TrivialDispatch(_Timed):
    """api_benchmark jit_trivial(_dispatch): swap two outputs of a previous call."""

    params = [IMPLS]
    param_names = ["impl"]

    def setup(self, impl):
        self._setup("jit_trivial", impl)

    def time_dispatch(self, impl):
        self.run.dispatch()

    def time_call(self, impl):
        self.run.call()


class SimpleDispatch(_Timed):
    """api_benchmark jit_simple(_dispatch): add two device scalars."""

    params = [IMPLS]
    param_names = ["impl"]

    def setup(self, impl):
        self._setup("jit_simple", impl)

    def time_dispatch(self, impl):
        self.run.dispatch()

    def time_call(self, impl):
        self.run.call()


class ManyArgs(_Timed):
    """api_benchmark jit_simple_many_args(_dispatch): sum a list of n device scalars."""

    params = [[10, 100, 1000], IMPLS]
    param_names = ["n_args", "impl"]
    timeout = 180  # compiling the 1000-way sum takes seconds

    def setup(self, n_args, impl):
        self._setup(f"jit_simple_many_args_{n_args}", impl)

    def time_dispatch(self, n_args, impl):
        self.run.dispatch()

    def time_call(self, n_args, impl):
        self.run.call()


class PrunedArgs(_Timed):
    """api_benchmark jit_simple_pruned_args(_dispatch): n args, only the first is used."""

    params = [[10, 100, 1000], IMPLS]
    param_names = ["n_args", "impl"]

    def setup(self, n_args, impl):
        self._setup(f"jit_simple_pruned_args_{n_args}", impl)

    def time_dispatch(self, n_args, impl):
        self.run.dispatch()

    def time_call(self, n_args, impl):
        self.run.call()


class Transfer(_Timed):
    """api_benchmark jit_dispatch_with(out)_transfer: x + 1 on 128 images of 224x224."""

    params = [[False, True], IMPLS]
    param_names = ["transfer", "impl"]
    # Each call queues 25 MB of work: few calls per sample, so the queue stays short.
    number = 5
    repeat = (1, 10, 5.0)
    min_run_count = 2
    warmup_time = 0.0

    def setup(self, transfer, impl):
        self._setup("jit_dispatch_with_transfer" if transfer else "jit_dispatch_without_transfer",
                    impl)

    def time_dispatch(self, transfer, impl):
        self.run.dispatch()


class PjitSimple(_Timed):
    """api_benchmark pjit_simple_4_devices: a list of n arrays sharded over 4 devices."""

    params = [[1, 10, 100], IMPLS]
    param_names = ["n_args", "impl"]

    def setup(self, n_args, impl):
        self._setup(f"pjit_simple_4_devices_{n_args}_args", impl)

    def time_dispatch(self, n_args, impl):
        self.run.dispatch()

    def time_call(self, n_args, impl):
        self.run.call()


_KIND_SCENARIO = {"jax.Array": "args_2", "numpy": "numpy_args_2",
                  "python_scalar": "python_scalars_2"}


class InputKinds(_Timed):
    """Two arguments of each kind (device scalars, numpy vectors, Python scalars), same values."""

    params = [list(_KIND_SCENARIO), IMPLS]
    param_names = ["kind", "impl"]

    def setup(self, kind, impl):
        self._setup(_KIND_SCENARIO[kind], impl)

    def time_dispatch(self, kind, impl):
        self.run.dispatch()

    def time_call(self, kind, impl):
        self.run.call()


class InputKindsNewValues(_Timed):
    """Two host arguments with new values on every call (the host-input memo never hits)."""

    params = [["numpy", "python_scalar"], IMPLS]
    param_names = ["kind", "impl"]

    def setup(self, kind, impl):
        self._setup("numpy_args_2_new_values" if kind == "numpy"
                    else "python_scalars_2_new_values", impl)

    def time_dispatch(self, kind, impl):
        self.run.dispatch()


class StaticArgsKwargs(_Timed):
    """A static positional arg, a static kwarg and an array kwarg."""

    params = [IMPLS]
    param_names = ["impl"]

    def setup(self, impl):
        self._setup("static_args_kwargs", impl)

    def time_dispatch(self, impl):
        self.run.dispatch()

    def time_call(self, impl):
        self.run.call()


class ParamDict100(_Timed):
    """A 100-leaf parameter dict in, a 100-leaf dict out."""

    params = [IMPLS]
    param_names = ["impl"]

    def setup(self, impl):
        self._setup("dict_100_leaves", impl)

    def time_dispatch(self, impl):
        self.run.dispatch()

    def time_call(self, impl):
        self.run.call()


class ShardedNumpy(_Timed):
    """A numpy 64x64 input with NamedSharding P('x', 'y') over 8 host devices."""

    params = [IMPLS]
    param_names = ["impl"]

    def setup(self, impl):
        self._setup("numpy_sharded_8_devices", impl)

    def time_dispatch(self, impl):
        self.run.dispatch()

    def time_call(self, impl):
        self.run.call()


class Workloads(_Timed):
    """The loops people write, host values new on every call (compare's ``workload_*`` rows)."""

    params = [["train_step", "optimizer_update", "env_step", "static_config",
               "data_parallel_8_devices"], IMPLS]
    param_names = ["workload", "impl"]

    def setup(self, workload, impl):
        self._setup(f"workload_{workload}", impl)

    def time_dispatch(self, workload, impl):
        self.run.dispatch()


class CacheMiss:
    """A new function on every call: trace, lower, compile, run."""

    params = [IMPLS]
    param_names = ["impl"]
    number = 1
    repeat = (1, 10, 10.0)

    def setup(self, impl):
        compare = common.compare_module()
        self.case = common.scenario("cache_miss").build()
        self.fresh_copy = compare._fresh_copy
        self.jit = common.get_jit(impl)

    def time_miss(self, impl):
        case = self.case
        common.block(self.jit(self.fresh_copy(case.fun), **case.jit_options)(*case.args))
