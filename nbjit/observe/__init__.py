"""Seeing dispatch: statistics and slow reasons (`stats`), explained and
ranked misses (`explain`, `distance`), per-phase timing (`profile`), the
run report (`report`) and the names everything prints (`names`).

Importing this package registers the hit path's timed (`profile`) and traced
(`spans`) flavours into the core (`nbjit.core.flavours`)."""

from nbjit.observe import profile, spans  # noqa: F401
