"""Host inputs: numpy arrays and Python scalars onto devices. Sharding plans
and staging buffers (`plan`, public as `nbjit.sharding`), and fresh host
values without a transfer per leaf (`packing`: resident slots, else packing)."""
