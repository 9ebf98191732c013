"""Routing existing code to nbjit: `patch_jax` (`patch`), `python -m nbjit run`
(`run`) and the host devices a run asks for (`devices`)."""
