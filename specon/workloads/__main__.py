"""``python -m specon.workloads``: run one training job (see ``specon.workloads.runner``)."""

import os
import sys

# One thread per job, fixed before torch starts its thread pools; ``--threads N`` raises it
# (torch.set_num_threads overrides the environment; bench_threads measures what that costs).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

from specon.workloads.runner import main  # after the environment is set

sys.exit(main())
