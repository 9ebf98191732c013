"""Inputs onto devices, the core's own path: what a host value is (`values`),
the input steps a record runs (`steps`), sharding plans that slice host
values on the host (`plans`) and their staging buffers (`staging`), and the
one table that chooses each platform's input strategy (`platforms`)."""
