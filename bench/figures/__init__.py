"""The benchmark's figures, one module per measurement; each ``<name>_measure(bench)``
adds its rows to ``bench.table`` (``bench.run`` chooses and orders them)."""
