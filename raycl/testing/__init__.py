"""Test and benchmark doubles: what tests/ and bench/ plug into raycl's typed seams — miner faults
(:class:`raycl.distributed.miner_pool.MinerFaults`), miner kinds (:class:`raycl.miners.registry.MinerKind`), the
loop's hooks (:class:`raycl.training.task.LoopHook`: a crash switch, a state probe, in ``loop_hooks``).

No product module imports this package (``tests/test_layers.py`` checks it); a test or benchmark that imports it
registers its miner kinds and sends its doubles to the actors, which import it when they unpickle them.
"""
