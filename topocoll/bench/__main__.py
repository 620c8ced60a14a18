"""``python -m topocoll.bench ...`` (for ``torchrun -m topocoll.bench``): same as ``topocoll-bench``."""

from topocoll.bench.cli import run_as_script

if __name__ == "__main__":
    run_as_script()
