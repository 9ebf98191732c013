"""Inputs onto devices: sharding plans that slice host values on the host
(`plans`) and the staging buffers they copy into (`staging`)."""
