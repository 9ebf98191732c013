"""Seeing dispatch: statistics and slow reasons (`stats`), explained and
ranked misses (`explain`, over `descriptions` and their `distance`),
per-phase timing (`profile`), the run report (`report`) and the names
everything prints (`names`).

What the core calls of it is registered here, on import: the miss's
description and explanation and `stats()` (`plug`), the hit path's timed
(`profile`) and traced (`spans`) flavours (`nbjit.core.flavours`), what a
call does in a profiler session (`spans`, `nbjit.core.profiler`) and the
listener of new functions (`stats`, `nbjit.core.live`)."""

from nbjit.observe import plug as _plug
from nbjit.observe import profile, spans  # noqa: F401

_plug.register()
