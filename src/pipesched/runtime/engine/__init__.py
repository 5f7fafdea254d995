"""The engine, its handlers and the stage runners: what executes a rank's program.

- ``engine``: a table from ``Op`` to a short handler, and the loop over the program;
- ``stage_runner``: a ``StageRunner`` per owned stage: its F, I, W, B, the state a microbatch's
  actions hand each other, deallocation, loss scaling, recomputation, autocast;
- ``shapes``: every edge's boundary per microbatch shape, inferred on meta, cached;
- ``split_backward``: Linears whose weight gradients wait for ``W``;
- ``tied_sums``: a tied weight held on two stages of a rank, each stage's gradient summed apart,
  and a whole stage's part in the program (``WholeStage``);
- ``recompute``: block-by-block activation recomputation;
- ``overlap_streams``: an overlapped pair's forward half on a CUDA stream of its own;
- ``pair_turns``: an overlapped pair's halves interleaved at their expert all-to-alls;
- ``local_transport``: several ranks' engines in one process (in-memory links, threads).

Imports torch, the planning core, and of the runtime ``program``, ``metering``, ``stages`` and
``comm`` (a transport's failure type). Never the runtime's executor: the engine is built from parts.
"""
