"""Settings for the whole test run: the unit tests and every notebook kernel that nbval starts (kernels
inherit this process's environment)."""

import os

# One PyTorch thread per process unless you set it yourself. On a machine whose cores other jobs are using, a
# second OpenMP thread makes every operation wait for a busy core: a training step of notebook 09's model took
# 340-385 ms with 2 threads against 67-84 ms with 1, and notebook 09 ran past nbval's cell timeout (README,
# Performance). Must be set before torch is imported, which is why it lives here and not in a fixture.
for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(variable, "1")
