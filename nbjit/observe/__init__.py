"""Seeing dispatch: statistics and slow reasons (`stats`), explained and
ranked misses (`explain`, `distance`), per-phase timing (`profile`), the
run report (`report`) and the names everything prints (`names`). What the
core calls of it is registered here, on import (`plug`)."""

from nbjit.observe import plug as _plug

_plug.register()
