"""Probe: which host leaf dtypes pack on this backend (the packed program
constrains each unpacked leaf to its original parameter's layout), and why a
packed compile gives up where it does.

    python benchmarks/probes/packed_dtypes.py

Per case, an f32 (8, 128) leaf beside a leaf of the dtype: the compiled
parameter layouts, the policy's stage after 24 calls with new values, the
exception a failed packed compile raised, and whether every output equalled
jax.jit's bit for bit.
"""

from __future__ import annotations

import traceback

import jax
import jax.numpy as jnp
import numpy as np

import nbjit
from nbjit import _jax
from nbjit.host import packing, policy

failures: list = []
_compile = packing.compile_packed


def _recording(watched, record, leaves):
    try:
        return _compile(watched, record, leaves)
    except Exception as error:
        failures.append("".join(traceback.format_exception_only(error)).strip()[:600])
        raise


packing.compile_packed = _recording
CASES = {
    "f32 (13,)": lambda r: r.standard_normal(13).astype(np.float32),
    "f32 (300, 700)": lambda r: r.standard_normal((300, 700)).astype(np.float32),
    "bool (13,)": lambda r: r.integers(0, 2, 13).astype(bool),
    "int8 (5,)": lambda r: r.integers(-9, 9, 5).astype(np.int8),
    "f16 (5,)": lambda r: r.standard_normal(5).astype(np.float16),
    "c64 (13,)": lambda r: (r.standard_normal(13) + 1j * r.standard_normal(13)).astype(
        np.complex64),
    "int32 (4, 3)": lambda r: r.integers(-9, 9, (4, 3)).astype(np.int32),
}


def main() -> None:
    print(jax.devices()[0].device_kind, jax.__version__, flush=True)
    for name, make in CASES.items():
        failures.clear()
        fn = lambda a, b: (a * 2.0, b, jnp.sum(a))  # noqa: E731
        f, g = nbjit.jit(fn), jax.jit(fn)
        rng = np.random.default_rng(0)
        equal = True
        for i in range(3 * policy.PACK_AFTER):
            if i == 2 * policy.PACK_AFTER:
                packing.wait(120)
            args = (rng.standard_normal((8, 128)).astype(np.float32), make(rng))
            equal &= all(np.array_equal(np.asarray(x), np.asarray(y))
                         for x, y in zip(f(*args), g(*args), strict=True))
        node, _ = f._entry_for(args, {})
        plan = node.host_policy
        layouts = _jax.parameter_layouts(g.lower(*args).compile()._executable.xla_executable)
        print(f"{name}: stage {getattr(plan, 'stage', None)}, equal {equal}, "
              f"layouts {layouts}, failures {failures}", flush=True)


if __name__ == "__main__":
    main()
