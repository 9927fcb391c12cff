"""SDPA forward and backward time by mask, dropout and head dimension (batch 8, 2,048 tokens, model dimension 1,024,
bf16), on a GPU host and under `phantora run --gpus-per-node 1 -- python sdpa_variants.py`: each case prints its
forward and its backward (the forward and backward loop less the forward) in ms, means of 10 after one warm-up.
"""
import time,torch,torch.nn.functional as F
S=torch.cuda.synchronize
B,T=8,2048
for d in (64,128):
 h=1024//d
 q,k,v=[torch.randn(B,h,T,d,device="cuda",dtype=torch.bfloat16,requires_grad=True) for _ in range(3)]
 m=torch.ones(T,T,dtype=torch.bool,device="cuda").tril()
 for name,kw in [("causal",dict(is_causal=True)),("mask",dict(attn_mask=m)),("none",{})]:
  for p in (0.0,0.1):
   f=lambda:F.scaled_dot_product_attention(q,k,v,dropout_p=p,**kw)
   o=f();g=torch.ones_like(o);o.backward(g);S()
   t=time.perf_counter()
   for _ in range(10):o=f()
   S();tf=(time.perf_counter()-t)/10
   t=time.perf_counter()
   for _ in range(10):o=f();o.backward(g)
   S();tb=(time.perf_counter()-t)/10-tf
   print(d,name,p,"fwd %.3f bwd %.3f ms"%(tf*1e3,tb*1e3),flush=True)
