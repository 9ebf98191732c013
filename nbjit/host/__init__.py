"""Host inputs: numpy arrays and Python scalars onto devices.

`values` (what a host value is; private copies for JAX's path), `steps`
(how each input of a record reaches its device), `plan` and `staging`
(host-side sharding plans and their staging buffers; public as
`nbjit.sharding`), and fresh host values without a transfer per leaf:
`policy` (one `HostPolicy` per watched signature, the only code that
replaces a node's record), `resident` (slots), `packing` (one put and a
second executable), `layout` (what those two share).
"""
