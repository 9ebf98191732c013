"""The hit path: `PjitFunction` and its miss path (`dispatch`), the generated
binders that key a call and run it (`binders`, `keys`, `codegen`), the
executable cache (`cache`) and each cached signature's record (`record`). The rooms built on
the core register into its registries (`hooks`); the core imports none of them."""
