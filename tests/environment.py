"""The environment every test runs in, pinned by tests/conftest.py before anything else is imported.

A user's shell may set ensbench's own variables; the tests expect them unset, so that no result depends
on where the clone sits or who runs it (the Makefile, for one, sets ENSBENCH_BBH_DIR when a ../shared
folder sits beside the checkout). The tests that read BIG-Bench-Hard take the folder the shell named
from ``BBH_FOLDER`` and skip without one; every other test sees BBH as a fresh clone does.
"""

import os

from ensemble_bench.settings import BBH_DIR, THREADS

BBH_FOLDER = os.environ.pop(BBH_DIR, "").strip() or None
NO_BBH = f"needs BIG-Bench-Hard data: set {BBH_DIR} to a folder of its <task>.json files"
os.environ.pop(THREADS, None)
for switch in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # never the model hub
    os.environ.setdefault(switch, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
