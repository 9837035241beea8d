"""Memory that graphs can rely on: a persistent arena, shared scratch, a paged KV cache, mapped
host memory that kernels write a step's outputs into, and a ledger of what each graph pins.
Graphs freeze addresses, so memory is planned, not allocated on the way."""
