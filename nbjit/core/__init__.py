"""The hit path: `PjitFunction` and its miss path (`dispatch`), the generated
binders that key a call and run it (`binders`, `keys`, `codegen`), the
executable cache (`cache`), each cached signature's record (`record`) and
its inputs put on devices (`inputs`). The rooms built on the core plug in
what is optional (`hooks`, `flavours`, `profiler`, `live`,
`inputs.platforms`); the core imports none of them."""
