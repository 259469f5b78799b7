"""What every Triton kernel module here shares: triton imported when it is installed (AVAILABLE
False, triton and tl None on CPU-only installs; kernels/__init__.py then never selects a kernel
module), and the power-of-two block sizes tl.arange needs."""

from __future__ import annotations

import time

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


class CompileLog:
    """The Triton kernels compiled while it is open (`with CompileLog() as c:`; then
    c.compiled: (kernel name, seconds) each), through Triton's JIT hooks (triton >= 3.4; an
    older triton, or none, records nothing). A kernel specialised on a value that changes from
    one graph bucket to the next compiles in each: the log names it."""

    def __init__(self) -> None:
        self.compiled: list[tuple[str, float]] = []
        self._started: dict[object, float] = {}
        self._saved: tuple | None = None

    def __enter__(self) -> CompileLog:
        runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
        if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
            return self
        self._saved = (runtime, runtime.jit_cache_hook, runtime.jit_post_compile_hook)
        before, after = self._saved[1], self._saved[2]

        def on_start(*, key, fn, **kw):
            self._started[id(key)] = time.perf_counter()
            return before(key=key, fn=fn, **kw) if before else None

        def on_done(*, key, fn, **kw):
            t0 = self._started.pop(id(key), None)
            self.compiled.append((fn.name, time.perf_counter() - t0 if t0 is not None else 0.0))
            return after(key=key, fn=fn, **kw) if after else None

        runtime.jit_cache_hook, runtime.jit_post_compile_hook = on_start, on_done
        return self

    def __exit__(self, *exc) -> None:
        if self._saved is not None:
            runtime, runtime.jit_cache_hook, runtime.jit_post_compile_hook = self._saved
            self._saved = None

    def summary(self) -> str:
        """'name xN (s), ...' of what compiled, slowest first; '' when nothing did."""
        by: dict[str, list[float]] = {}
        for name, s in self.compiled:
            by.setdefault(name, []).append(s)
        return ", ".join(f"{n} x{len(v)} ({sum(v):.2f} s)" for n, v in sorted(by.items(), key=lambda kv: -sum(kv[1])))
