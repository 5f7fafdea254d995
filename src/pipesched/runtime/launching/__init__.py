"""Launching and watching ranks: local processes or torchrun, and their ends.

- ``launch``: start ranks (spawn or torchrun), hand them their work, bring back rank 0's result;
- ``lifeline``: ranks that die with their launcher;
- ``rank_start``: ranks forked from the launcher (or spawned), a word when they outnumber the cores;
- ``rank_watch``: the ranks' results, a failure named in one line, the other ranks stopped;
- ``rendezvous``: joining torchrun's group bounded by the run's timeout, naming the address.

Imports torch and the planning core; nothing else of the runtime.
"""
