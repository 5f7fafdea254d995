"""CPU (user + sys, every process) of starting N ranks that import torch and build an optimizer:
the `spawn` start method (each rank imports all) against `forkserver` with torch preloaded.

    python benchmarks/rank_start.py spawn 2; python benchmarks/rank_start.py forkserver 2
"""
import multiprocessing as mp, multiprocessing.forkserver as fs, resource, sys, time

def rank(q):
    import torch
    torch.set_num_threads(1)
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    q.put(time.process_time())

def run(method, n):
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["torch", "torch._dynamo", "torch.distributed"])
    q = ctx.Queue()
    procs = [ctx.Process(target=rank, args=(q,)) for _ in range(n)]
    for p in procs: p.start()
    for p in procs: p.join()
    if method == "forkserver":
        fs._forkserver._stop()

if __name__ == "__main__":
    method, n = sys.argv[1], int(sys.argv[2])
    run(method, n)
    r = resource.getrusage(resource.RUSAGE_CHILDREN); s = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{method} n={n}: children {r.ru_utime + r.ru_stime:.1f} s, launcher {s.ru_utime + s.ru_stime:.1f} s")
