"""Measuring and predicting collectives.

- ``topocoll-bench`` (:mod:`topocoll.bench.cli`): runs a collective under ``mpirun``,
  ``torchrun`` or plain ``env://`` variables and prints nccl-tests' table, with the baseline
  backend's numbers, the speedup and the cut bound on every line.
- ``topocoll simulate`` (:mod:`topocoll.bench.simulate_cli`): the same table predicted by the
  α-β model for topocoll's schedule and the baselines, before the machines exist.
- :mod:`topocoll.bench.collective_table`: the table of collectives (sizes, counts, options; no
  torch); :mod:`topocoll.bench.operations`: how each is filled, issued and checked with torch;
  :mod:`topocoll.bench.report`: text, JSON, CSV and plot output.
"""
