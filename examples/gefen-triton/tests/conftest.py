"""Where the kernels run: CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``, set before
pytest starts), else the first CUDA device. With neither, the session stops at once and says so."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def device() -> torch.device:
    from gefen_triton import launch

    if launch.interpreted():
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    pytest.exit(
        "gefen-triton's tests run the kernels on CPU tensors under Triton's interpreter "
        "(run them with TRITON_INTERPRET=1) or on a CUDA device (none here)",
        returncode=4,
    )
