"""What a stage is: its blocks, what crosses its edges, its copies, its precision, its batch.

- ``partition``: blocks to stages, seeded building, the context argument a block may take;
- ``boundary``: what crosses a stage edge (a tensor, tuple or dict of entries; which carry gradients);
- ``batch_context``: a step's batch cut into microbatches, and its per-microbatch context;
- ``precision``: bf16 autocast and the wire dtype;
- ``copies``: DualPipe's model copies (which model stage a schedule stage runs), balanced block counts.

Imports torch and the planning core; of the runtime, only ``metering`` below it.
"""
