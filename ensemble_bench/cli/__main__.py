"""``python -m ensemble_bench.cli``: the ``ensbench`` command."""

from ensemble_bench.cli.main import main

if __name__ == "__main__":
    main()
