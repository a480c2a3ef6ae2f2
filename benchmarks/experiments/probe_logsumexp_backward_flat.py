"""Timing probe, not a candidate: what keeps the default logsumexp gradient at ~97% of a copy on
16-bit reductions over a non-last dim (4096x4096:0 bfloat16: 25.0 us against torch.compile's 24.2)?

The default (``fused_logsumexp_backward``) runs ``logsumexp_backward_flat_<dtype>_vec_x2`` there:
each thread loads its two 16-byte packs of x, then per pack loads dy and lse (16 bytes each, from
L1/L2), computes and stores. ``store_pack`` is an ``asm volatile`` store with a "memory" clobber, so
the second pack's dy / lse loads cannot move above the first pack's store: their L2 latency is
paid once per pack, serially. The hoisted variants load every pack's x, dy and lse first (as the
rows form does with its one dy / lse), then compute and store; ``cs``: x read and dx written with
streaming hints (ld/st.global.cs), dy / lse left cached; ``serial``: the library's code before it
hoisted its loads the same way (the ``logsumexp_backward_flat_*`` rows: the library's code as
checked out). Same harness for all (CUDA-graph replay of
40 calls over 8 rotating buffers, median) and a same-size copy (x read, dx written). Results
checked against float64 torch. ``PYTHONPATH=src python benchmarks/experiments/probe_logsumexp_backward_flat.py``
"""
import sys

import torch

from probe_timing import ProbeModule, timed

PROBE = r'''
namespace {
template <typename T, int VEC, int PACKS, bool CS>
__device__ __forceinline__ void flat_hoisted(const T* dy, const T* x, const T* lse, T* dx, long long slice,
                                             long long inner, long long tiles) {
  constexpr int TILE = BLOCK * VEC * PACKS;
  const long long o = blockIdx.x / tiles;
  const long long start = (blockIdx.x - o * tiles) * TILE;
  const long long offset = o * slice + start;
  const int left = slice - start < TILE ? static_cast<int>(slice - start) : TILE;
  const unsigned first = static_cast<unsigned>(start % inner);
  const bool pow2 = (inner & (inner - 1)) == 0;
  Pack<T, VEC> pk[PACKS], g[PACKS], l[PACKS];
#pragma unroll
  for (int u = 0; u < PACKS; ++u) {
    const int s = (u * BLOCK + static_cast<int>(threadIdx.x)) * VEC;
    if (s < left) {
      if constexpr (CS) {
        const uint4 w = __ldcs(reinterpret_cast<const uint4*>(x + offset + s));
        pk[u] = *reinterpret_cast<const Pack<T, VEC>*>(&w);
      } else {
        pk[u] = *reinterpret_cast<const Pack<T, VEC>*>(x + offset + s);
      }
      const unsigned at = first + static_cast<unsigned>(s);
      const long long j = o * inner + (pow2 ? at & (static_cast<unsigned>(inner) - 1) : at % static_cast<unsigned>(inner));
      g[u] = *reinterpret_cast<const Pack<T, VEC>*>(dy + j);
      l[u] = *reinterpret_cast<const Pack<T, VEC>*>(lse + j);
    }
  }
#pragma unroll
  for (int u = 0; u < PACKS; ++u) {
    const int s = (u * BLOCK + static_cast<int>(threadIdx.x)) * VEC;
    if (s >= left) break;
    Pack<T, VEC> r;
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      r.v[k] = from_float<T>(to_float(g[u].v[k]) * grad_exp<T>(to_float(pk[u].v[k]), to_float(l[u].v[k])));
    if constexpr (CS) {
      __stcs(reinterpret_cast<uint4*>(dx + offset + s), *reinterpret_cast<const uint4*>(&r));
    } else {
      store_pack(dx + offset + s, r);
    }
  }
}

// The library's columns branch before the hoisting: dy / lse loaded per pack, after the previous store
template <typename T, int VEC, int PACKS>
__device__ __forceinline__ void flat_serial(const T* dy, const T* x, const T* lse, T* dx, long long slice,
                                            long long inner, long long tiles) {
  constexpr int TILE = BLOCK * VEC * PACKS;
  const long long o = blockIdx.x / tiles;
  const long long start = (blockIdx.x - o * tiles) * TILE;
  const long long offset = o * slice + start;
  const int left = slice - start < TILE ? static_cast<int>(slice - start) : TILE;
  Pack<T, VEC> pk[PACKS];
#pragma unroll
  for (int u = 0; u < PACKS; ++u) {
    const int s = (u * BLOCK + static_cast<int>(threadIdx.x)) * VEC;
    if (s < left) pk[u] = *reinterpret_cast<const Pack<T, VEC>*>(x + offset + s);
  }
  const unsigned first = static_cast<unsigned>(start % inner);
  const bool pow2 = (inner & (inner - 1)) == 0;
#pragma unroll
  for (int u = 0; u < PACKS; ++u) {
    const int s = (u * BLOCK + static_cast<int>(threadIdx.x)) * VEC;
    if (s >= left) break;
    const unsigned at = first + static_cast<unsigned>(s);
    const long long j = o * inner + (pow2 ? at & (static_cast<unsigned>(inner) - 1) : at % static_cast<unsigned>(inner));
    const Pack<T, VEC> g = *reinterpret_cast<const Pack<T, VEC>*>(dy + j);
    const Pack<T, VEC> l = *reinterpret_cast<const Pack<T, VEC>*>(lse + j);
    Pack<T, VEC> r;
#pragma unroll
    for (int k = 0; k < VEC; ++k) r.v[k] = from_float<T>(to_float(g.v[k]) * grad_exp<T>(to_float(pk[u].v[k]), to_float(l.v[k])));
    store_pack(dx + offset + s, r);
  }
}
}  // namespace

#define PROBE_SERIAL(name, T, PACKS)                                                                     \
  extern "C" __global__ void __launch_bounds__(BLOCK)                                                  \
      name(const T* dy, const T* x, const T* lse, T* dx, long long slice, long long inner, long long tiles) { \
    flat_serial<T, 16 / sizeof(T), PACKS>(dy, x, lse, dx, slice, inner, tiles);                        \
  }
PROBE_SERIAL(serial_x2_bf16, __nv_bfloat16, 2)
PROBE_SERIAL(serial_x2_f16, __half, 2)

#define PROBE_FLAT(name, T, PACKS, CS)                                                                   \
  extern "C" __global__ void __launch_bounds__(BLOCK)                                                  \
      name(const T* dy, const T* x, const T* lse, T* dx, long long slice, long long inner, long long tiles) { \
    flat_hoisted<T, 16 / sizeof(T), PACKS, CS>(dy, x, lse, dx, slice, inner, tiles);                   \
  }
PROBE_FLAT(hoisted_x1_bf16, __nv_bfloat16, 1, false)
PROBE_FLAT(hoisted_x2_bf16, __nv_bfloat16, 2, false)
PROBE_FLAT(hoisted_x4_bf16, __nv_bfloat16, 4, false)
PROBE_FLAT(hoisted_x2_cs_bf16, __nv_bfloat16, 2, true)
PROBE_FLAT(hoisted_x2_f16, __half, 2, false)
PROBE_FLAT(hoisted_x4_f16, __half, 4, false)
'''

#: (label, shape, reduced dim, dtype)
CASES = [("4096x4096:0", (4096, 4096), 0, torch.bfloat16), ("32x4096x128:1", (32, 4096, 128), 1, torch.bfloat16),
         ("4096x4096:0", (4096, 4096), 0, torch.float16)]


def main() -> int:
    mod = ProbeModule("logsumexp_backward.cu", PROBE, "probe_flat")
    print(f"# {torch.cuda.get_device_name()}, us per call (graph replay, 8 rotating buffers, median)")
    for label, shape, dim, dtype in CASES:
        sfx = {torch.bfloat16: "bf16", torch.float16: "f16"}[dtype]
        xs = [torch.randn(shape, device="cuda", dtype=dtype) * 3 for _ in range(8)]
        lses = [torch.logsumexp(x.float(), dim).to(dtype) for x in xs]
        dys = [torch.randn_like(lse) for lse in lses]
        outs = [torch.empty_like(x) for x in xs]
        outer = 1
        for s in shape[:dim]:
            outer *= s
        inner = 1
        for s in shape[dim + 1:]:
            inner *= s
        slice_ = shape[dim] * inner
        ref = (dys[0].double().unsqueeze(dim) * torch.exp(xs[0].double() - lses[0].double().unsqueeze(dim)))
        copy_us = timed(lambda i: outs[i % 8].copy_(xs[i % 8]))
        rows = [("copy (x read, dx written)", copy_us, None)]
        names = [f"logsumexp_backward_flat_{sfx}_vec", f"logsumexp_backward_flat_{sfx}_vec_x2"] + [
            n for n in ("serial_x2", "hoisted_x1", "hoisted_x2", "hoisted_x4", "hoisted_x2_cs") if f"{n}_{sfx}" in PROBE]
        names = [n if n.startswith("logsumexp") else f"{n}_{sfx}" for n in names]
        for name in names:
            packs = 4 if "_x4" in name else 2 if "_x2" in name else 1
            tiles = -(-slice_ // (256 * (16 // xs[0].element_size()) * packs))

            def run(i, name=name, tiles=tiles):
                j = i % 8
                mod.launch(name, outer * tiles, 256, dys[j], xs[j], lses[j], outs[j], slice_, inner, tiles)

            outs[0].fill_(float("nan"))
            run(0)
            torch.cuda.synchronize()
            err = (outs[0].double() - ref).abs().max().item()
            rows.append((name, timed(run), err))
        print(f"## {label} {dtype}")
        for name, us, err in rows:
            extra = "" if err is None else f"  max err {err:.3g}"
            print(f"{name:40s} {us:7.2f} us  {100 * copy_us / us:5.1f}% of copy{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
