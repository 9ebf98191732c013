"""Seeing dispatch: statistics and slow reasons (`stats`), explained and
ranked misses (`explain`, `distance`), per-phase timing (`profile`), the
run report (`report`) and the names everything prints (`names`)."""
