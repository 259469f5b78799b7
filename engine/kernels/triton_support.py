"""What every Triton kernel module here shares: triton imported when it is installed (AVAILABLE
False, triton and tl None on CPU-only installs; kernels/__init__.py then never selects a kernel
module), and the power-of-two block sizes tl.arange needs."""

from __future__ import annotations

try:
    import triton
    import triton.language as tl

    AVAILABLE = True
except ImportError:  # CPU-only installs
    triton = None
    tl = None
    AVAILABLE = False


def pow2(n: int) -> int:
    """The smallest power of two at least n, and at least 2."""
    return 1 << max(1, (n - 1).bit_length())
