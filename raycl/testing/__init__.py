"""Test and benchmark scaffolding: doubles and switches the test suite and ``bench/`` hand to the product through
its typed seams. Nothing in the product imports this package (``tests/test_layers.py``: it stands above every
floor)."""
