"""Memory that graphs can rely on: a persistent arena, shared scratch, a paged KV cache, and a
ledger of what each graph pins. Graphs freeze addresses, so memory is planned, not allocated
on the way."""
