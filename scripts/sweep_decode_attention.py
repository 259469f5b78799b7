"""Launch settings of the bf16 decode-attention kernel (kernels/triton_ops.py), swept on a GPU.

    python scripts/sweep_decode_attention.py

The 1B benchmark config's shapes at a decode batch of 256 (16 heads of 128, RoPE on 64 dims,
128 window and 64 compressed keys a row, at random slots of a large pool): every (key tile,
warps, stages), timed as CUDA-graph replays (triton.testing.do_bench_cudagraph), fastest first,
with each one's relative difference from the tiles-of-32 output (bf16 probabilities rounded
per tile). The winner is triton_ops._DECODE_DOT_LAUNCH.
"""

import itertools

import torch
import triton

from dsv4bench.engine.model.rope import Rope  # the model package first: the kernels' import order
from dsv4bench.engine.kernels import triton_ops as T  # noqa: E402

torch.manual_seed(0)
S,H,HD,W,KC = 256,16,128,128,64
dev='cuda'
rope = Rope(64, 10000.0, 8192)
cos, sin = rope.cos.to(dev).float(), rope.sin.to(dev).float()
NS = 300000
kv = torch.randn(NS, HD, device=dev).bfloat16()
ckv = torch.randn(NS//4, HD, device=dev).bfloat16()
q = torch.randn(S,H,HD, device=dev).bfloat16()
win = torch.randint(0, NS, (S,W), device=dev, dtype=torch.int32)
winpos = torch.randint(0, 8000, (S,W), device=dev, dtype=torch.int32)
cid = torch.randint(0, NS//4, (S,KC), device=dev, dtype=torch.int32)
cpos = torch.randint(0, 8000, (S,KC), device=dev, dtype=torch.int32)
sink = torch.zeros(H, device=dev)
half=32; rest=64
def launch(out, bk, nw, ns):
    T._sparse_decode_dot_kernel[(S,)](q, kv, win, winpos, ckv, cid, cpos, sink, cos, sin, out, W, KC, cos.shape[0], 0.088,
        H=H, HD=HD, HALF=half, REST=rest, BLOCK_H=16, BLOCK_K=bk, num_warps=nw, num_stages=ns)
ref = torch.empty_like(q); launch(ref, 32, 4, 3)
print('default-ish (32, 4 warps) ok')
res=[]
for bk, nw, ns in itertools.product([16,32,64,128],[2,4,8],[1,2,3,4]):
    out = torch.empty_like(q)
    try:
        launch(out, bk, nw, ns); torch.cuda.synchronize()
    except Exception as e:
        print(bk,nw,ns,'failed',str(e)[:80]); continue
    err = ((out.float()-ref.float()).norm()/ref.float().norm()).item()
    t = triton.testing.do_bench_cudagraph(lambda: launch(out, bk, nw, ns), rep=50)
    res.append((t*1e3, bk, nw, ns, err))
for r in sorted(res)[:12]: print('%.2f us  BLOCK_K %d warps %d stages %d err %.1e' % r)
print('in use:', T._DECODE_DOT_LAUNCH, '; tiles of 32, 4 warps, 3 stages:', [r for r in res if r[1:4] == (32, 4, 3)])
