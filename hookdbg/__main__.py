"""``python -m hookdbg`` (what torchrun runs: ``torchrun -m hookdbg record ...``)."""

from hookdbg.cli import main

main()
