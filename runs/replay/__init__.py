"""Using a run's recorded history: reproduce it, fork it, re-deliver its events to a
consumer, rebuild its state from its events, and move it between installations.

Each use is a module of its own (``reproduce``, ``fork``, ``redeliver``, ``fold``,
``archive``); the rows they keep are in ``records``.
"""
