"""The dispatcher's public module path, kept for code and pickles that name it.

The dispatcher lives in `nbjit.core.dispatch`; pickles made by nbjit 0.1.0
refer to `nbjit.dispatch._rebuild`, which this module keeps.
"""

from nbjit.core.dispatch import PjitFunction, PjitFunctionCache, jit, rebuild

__all__ = ["PjitFunction", "PjitFunctionCache", "jit"]
_rebuild = rebuild  # pickles of 0.1.0 load through this name
