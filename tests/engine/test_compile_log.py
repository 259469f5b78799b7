"""CompileLog: the Triton compiles behind a graph capture, named and timed, through Triton's
JIT hooks, which it chains to and gives back."""

from types import SimpleNamespace

import pytest

from dsv4bench.engine.kernels import triton_support
from dsv4bench.engine.kernels.triton_support import CompileLog

runtime = getattr(getattr(triton_support.triton, "knobs", None), "runtime", None)
pytestmark = pytest.mark.skipif(
    runtime is None or not hasattr(runtime, "jit_post_compile_hook"), reason="needs a triton with JIT hooks (>= 3.4)"
)


def _compile(name: str) -> None:
    """What Triton's JIT does around one compile: the cache hook, then the post-compile hook,
    with the same key."""
    key, fn = object(), SimpleNamespace(name=name)
    if runtime.jit_cache_hook:
        assert not runtime.jit_cache_hook(
            key=key, repr=name, fn=fn, compile={}, is_manual_warmup=False, already_compiled=False
        )
    if runtime.jit_post_compile_hook:
        runtime.jit_post_compile_hook(
            key=key, repr=name, fn=fn, compile={}, is_manual_warmup=False, already_compiled=False
        )


def test_it_records_the_compiles_inside_and_chains_to_hooks_already_set():
    seen = []
    runtime.jit_post_compile_hook = lambda **kw: seen.append(kw["fn"].name)
    try:
        _compile("before")
        with CompileLog() as log:
            _compile("topk")
            _compile("topk")
            _compile("attention")
        _compile("after")
        assert [n for n, _ in log.compiled] == ["topk", "topk", "attention"]
        assert all(s >= 0.0 for _, s in log.compiled)
        assert log.summary().count("x2") == 1 and "topk x2" in log.summary()
        assert seen == ["before", "topk", "topk", "attention", "after"]  # the user's hook still ran
    finally:
        runtime.jit_post_compile_hook = None


def test_it_gives_the_hooks_back_and_says_nothing_when_nothing_compiled():
    with CompileLog() as log:
        pass
    assert runtime.jit_cache_hook is None and runtime.jit_post_compile_hook is None
    assert log.compiled == [] and log.summary() == ""
