"""TIR passes and analyses on each layer's PrimFunc (mechanism B; docs/architecture.md).

- `progress`: progress counters (blocks completed per layer) the runtime reads for its scheduler and preemption.
- `preempt_flag`: a host-set flag every kernel checks, skipping its remaining work when it is set.
- `idempotence`: whether a kernel may run again after a partial run (REEF's reset-based preemption needs it).
- `grid_limit`: a GPU kernel restricted to about k SMs by launching only the blocks they hold at once.
- `launch_geometry`: a scheduled kernel's thread blocks (GPU) or parallel extent (CPU).
- `tir_edit` / `script_edit`: how the passes change a PrimFunc (statements through tvm-ffi's structural mutator; the
  printed TVMScript's syntax tree, for grid_limit).

The compile pipeline (`tvmsched/pipeline.py`) applies them; none of them imports the runtime."""
