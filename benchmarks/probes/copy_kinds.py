"""The copy a safe host input makes: np.copyto against non-temporal stores.

    python benchmarks/probes/copy_kinds.py [--mib 0.375 3 12] [--reps 200]

A candidate for the per-step floor of a large host batch on an accelerator
(docs/host-inputs.md): nbjit copies each new host value into a warm staging
buffer before it returns, and at 3 MiB that copy competes with the runtime
reading the buffers of earlier steps. A copy with non-temporal stores
(`vmovntps`, written here as a Numba kernel with LLVM's `!nontemporal`
metadata) skips the read-for-ownership of the destination and leaves the
caches alone, so it moves a third less memory traffic; whether that makes it
faster depends on the host's memcpy (glibc switches to non-temporal stores
itself above a size it derives from the cache).

For each size it prints the median microseconds of a copy of one of 8 source
batches (as a loader hands them out) into one aligned buffer: alone, and
while `jax.device_put` transfers of two other batches of that size are in
flight (the runtime reading host memory, as in a no-block loop).
"""

from __future__ import annotations

import argparse
import time

import jax
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_VECTOR = ir.VectorType(ir.IntType(64), 4)  # 32 bytes


@intrinsic
def _stream_64(typingctx, dst, src, i):
    """Copies the 64 bytes at byte offset 64*i of `src` to `dst` with non-temporal stores."""
    def codegen(context, builder, sig, args):
        d = context.make_array(sig.args[0])(context, builder, value=args[0])
        s = context.make_array(sig.args[1])(context, builder, value=args[1])
        byte = ir.IntType(8).as_pointer()
        dp, sp = builder.bitcast(d.data, byte), builder.bitcast(s.data, byte)
        offset = builder.mul(args[2], ir.Constant(ir.IntType(64), 64))
        nontemporal = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        for k in (0, 32):
            at = builder.add(offset, ir.Constant(ir.IntType(64), k))
            value = builder.load(builder.bitcast(builder.gep(sp, [at]), _VECTOR.as_pointer()),
                                 align=8)
            store = builder.store(value, builder.bitcast(builder.gep(dp, [at]),
                                                         _VECTOR.as_pointer()), align=32)
            store.set_metadata("nontemporal", nontemporal)
    return types.void(dst, src, i), codegen


@intrinsic
def _fence(typingctx):
    def codegen(context, builder, sig, args):
        builder.fence("seq_cst")  # the streamed stores are visible before anyone reads them
    return types.void(), codegen


@numba.njit(nogil=True, boundscheck=False)
def stream_copy(dst, src):
    """dst[:] = src for uint8 arrays of one size, a multiple of 64; dst 64-byte aligned."""
    for i in range(src.shape[0] // 64):
        _stream_64(dst, src, i)
    _fence()


def aligned(nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + 64, np.uint8)
    skip = -raw.__array_interface__["data"][0] % 64
    return raw[skip:skip + nbytes]


def median_us(copy, pool, dst, reps: int, others: list | None) -> float:
    times = []
    for i in range(reps):
        pending = [jax.device_put(o) for o in others] if others else None
        start = time.perf_counter()
        copy(dst, pool[i % len(pool)])
        times.append(time.perf_counter() - start)
        if pending:
            jax.block_until_ready(pending)
    times.sort()
    return times[len(times) // 2] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, nargs="+", default=[0.375, 3, 12])
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    device = jax.devices()[0]
    print(f"{device.platform} {device.device_kind}, jax {jax.__version__}, "
          f"median us of {args.reps} copies")
    print("| MiB | np.copyto | streamed | ratio | np.copyto, puts in flight | streamed, "
          "puts in flight | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    rng = np.random.default_rng(0)
    for mib in args.mib:
        nbytes = int(mib * 2**20) // 64 * 64
        pool = [rng.integers(0, 255, nbytes, dtype=np.uint8) for _ in range(8)]
        others = [rng.integers(0, 255, nbytes, dtype=np.uint8) for _ in range(2)]
        dst = aligned(nbytes)
        stream_copy(dst, pool[1])
        assert np.array_equal(dst, pool[1])
        row = []
        for busy in (None, others):
            a = median_us(np.copyto, pool, dst, args.reps, busy)
            b = median_us(stream_copy, pool, dst, args.reps, busy)
            row += [f"{a:.1f}", f"{b:.1f}", f"{b / a:.2f}"]
        print(f"| {mib:g} | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
