"""The logsumexp probes' timer (benchmarks/probe_logsumexp_*.py): microseconds per call from CUDA
events around the replay of a CUDA graph of n calls, call i on buffer i % 8 of the caller's
rotation (8 buffers of 64-128 MiB: L2-cold), median of the replays after the first."""
import statistics

import torch


def timed(fn, n=40, reps=7) -> float:
    """us per call: CUDA-graph replay of n calls of ``fn(i)``, median of reps - 1."""
    fn(0)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            fn(i)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / n)
    return statistics.median(times[1:])


class ProbeModule:
    """A probe's CUDA C kernels (appended to a library source, so they use its fold and reductions),
    compiled by the library's NVRTC path for sm_90 and launched through the driver on torch's
    current stream. Needs cuda.bindings (the device image has it)."""

    def __init__(self, library_source: str, probe_source: str, name: str):
        import ctypes

        from cuda.bindings import driver

        from tunekit.backends import nvrtc

        self.ctypes, self.driver = ctypes, driver
        cubin = nvrtc.compile_cubin(nvrtc.source(library_source) + probe_source, name, "sm_90", (), use_cache=False)
        torch.cuda.current_stream()  # torch's context first: the module loads into it
        err, self.module = driver.cuModuleLoadData(cubin)
        assert int(err) == 0, err
        self.fns = {}

    def fn(self, name):
        if name not in self.fns:
            err, self.fns[name] = self.driver.cuModuleGetFunction(self.module, name.encode())
            assert int(err) == 0, (name, err)
        return self.fns[name]

    def registers(self, name, block: int) -> tuple[int, int]:
        """(registers per thread, resident blocks per SM) of kernel ``name`` at ``block`` threads."""
        d = self.driver
        _, regs = d.cuFuncGetAttribute(d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, self.fn(name))
        _, blocks = d.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.fn(name), block, 0)
        return regs, blocks

    def launch(self, name, grid: int, block: int, *args):
        """Tensors pass as device pointers, ints as 64-bit integers."""
        c = self.ctypes
        holders = [c.c_uint64(a.data_ptr()) if torch.is_tensor(a) else c.c_int64(a) for a in args]
        array = (c.c_void_p * len(args))(*[c.addressof(h) for h in holders])
        (err,) = self.driver.cuLaunchKernel(self.fn(name), grid, 1, 1, block, 1, 1, 0,
                                            torch.cuda.current_stream().cuda_stream, c.addressof(array), 0)
        assert int(err) == 0, (name, err)


def row_buffers(dtype, rows: int, nbytes: int = 64 << 20):
    """(cols, 8 rotating (rows, cols) inputs of randn * 3 filling ``nbytes`` each, float64 logsumexp
    of the first over its rows): the row probes' data."""
    cols = nbytes // dtype.itemsize // rows
    bufs = [torch.randn(rows, cols, device="cuda", dtype=dtype) * 3 for _ in range(8)]
    return cols, bufs, torch.logsumexp(bufs[0].double(), -1)


def library_candidate(name: str, bufs, dims: tuple[int, ...]):
    """(us per call, the result on the first buffer) of the library's logsumexp candidate ``name``
    on the probe's buffers, in the same harness; None where it declines them."""
    from tunekit.ops.logsumexp import LogsumexpParams, logsumexp_op

    c = logsumexp_op.candidate(name)
    ps = [LogsumexpParams(b, dims, False) for b in bufs]
    for p in ps:
        p.out = p.new_outputs()["out"]
    if c.supports(ps[0]) is not None:
        return None
    ps[0].out.fill_(float("nan"))
    c.run(ps[0])
    torch.cuda.synchronize()
    got = ps[0].out.clone()
    return timed(lambda i: c.run(ps[i % len(ps)])), got
