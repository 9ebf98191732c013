"""Multi-controller runs: processes that call one process-spanning function agree
on its signature and on the program compiled for it on every miss (`agreement`,
`program`), checked before anything runs: the check is registered into the core
here, on import."""

from nbjit.core import hooks as _hooks
from nbjit.multiprocess import agreement as _agreement

_hooks.add_compile_check(_agreement.check)
