"""Inputs onto devices, the core's own path: what a host value is (`values`),
the input steps a record runs (`steps`), sharding plans that slice host
values on the host (`plans`, their copy into staging: `copying`), the pools
that reuse host buffers (`pools`), an accelerator's private copies
(`staging`, `stream`) and launch records (`launch`), and the one table that
chooses each platform's input strategy (`platforms`)."""
