"""The scheduler's two policy seams, chosen by name from EngineConfig: the queue order
(queue.py) and the preemption victim and mode (preemption.py). They sit below config so that
config can check a name against the registry itself: a new policy is one class and its
registry entry, in one file, plus its test."""
